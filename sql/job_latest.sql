-- One row per job over every hour of the warehouse: the job as of its latest hour (status,
-- degrees, hosts), with first_seen from its first hour and the number of hours it was seen in.
-- `jobs` itself has a row per job per hour. Prism creates this view when `jobs` has partitions.
CREATE OR REPLACE VIEW job_latest AS
SELECT
    * REPLACE (min(first_seen) OVER whole_job AS first_seen),
    count(*) OVER whole_job AS hours_seen
FROM jobs
WINDOW whole_job AS (PARTITION BY job_id)
QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY date DESC, hour DESC) = 1;
