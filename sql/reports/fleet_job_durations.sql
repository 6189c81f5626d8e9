-- Job duration distribution (Acme study, NSDI 2024): jobs alive in the range by lifetime (first
-- to last traffic), with the cumulative share of jobs and the GPU-hours each class held in the
-- range. Jobs still running at the end of the range are counted by their life so far
-- (`still_running`), so their class is a lower bound.
-- Needs base.sql; parameters: report_start, report_end.
WITH classed AS (
    SELECT
        *,
        CASE
            WHEN ended - started < INTERVAL 10 MINUTE THEN 1
            WHEN ended - started < INTERVAL 30 MINUTE THEN 2
            WHEN ended - started < INTERVAL 1 HOUR THEN 3
            WHEN ended - started < INTERVAL 6 HOUR THEN 4
            WHEN ended - started < INTERVAL 24 HOUR THEN 5
            ELSE 6
        END AS duration_order
    FROM jobs_in_range
)
SELECT
    ['< 10 min', '10-30 min', '30-60 min', '1-6 h', '6-24 h', '>= 24 h'][duration_order] AS duration_class,
    count(*) AS jobs,
    count(*) / sum(count(*)) OVER () AS job_share,
    sum(count(*)) OVER (ORDER BY duration_order) / sum(count(*)) OVER () AS cumulative_job_share,
    sum(n_gpus * seen_s) / 3600 AS gpu_h,
    sum(n_gpus * seen_s) / sum(sum(n_gpus * seen_s)) OVER () AS gpu_time_share,
    count(*) FILTER (WHERE status = 'running') AS still_running
FROM classed
GROUP BY duration_order
ORDER BY duration_order;
