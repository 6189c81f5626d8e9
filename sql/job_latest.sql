-- One row per job over every hour of the warehouse: the job as of its latest hour (status,
-- hosts; degrees as last known), with first_seen from its first hour and the number of hours it was seen in.
-- `jobs` itself has a row per job per hour. Prism creates this view when `jobs` has partitions.
CREATE OR REPLACE VIEW job_latest AS
SELECT
    * REPLACE (
        min(first_seen) OVER whole_job AS first_seen,
        -- an hour without the job's traffic (a hang) shows no degrees: its latest known ones
        last_value(dp IGNORE NULLS) OVER in_order AS dp,
        last_value(pp IGNORE NULLS) OVER in_order AS pp,
        last_value(tp IGNORE NULLS) OVER in_order AS tp
    ),
    count(*) OVER whole_job AS hours_seen
FROM jobs
WINDOW whole_job AS (PARTITION BY job_id),
    in_order AS (PARTITION BY job_id ORDER BY date, hour ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY date DESC, hour DESC) = 1;
