-- GPU time by job size, in the manner of the Acme study (NSDI 2024), where 1-3% of the jobs,
-- the large pretraining ones, held 70-94% of the GPU time: jobs alive in the range grouped by
-- GPU count, with their share of the jobs and of the GPU-hours held in the range.
-- Jobs the network cannot see (single-host jobs) are not here; fleet_capacity counts their GPUs
-- among those without traffic.
-- Needs base.sql; parameters: report_start, report_end.
WITH sized AS (
    SELECT
        *,
        CASE
            WHEN n_gpus <= 8 THEN 1
            WHEN n_gpus <= 32 THEN 2
            WHEN n_gpus <= 128 THEN 3
            WHEN n_gpus <= 512 THEN 4
            ELSE 5
        END AS size_order,
        n_gpus * seen_s / 3600 AS gpu_h
    FROM jobs_in_range
),
waste AS (
    SELECT job_id, sum(wasted_gpu_s) / 3600 AS wasted_gpu_h FROM issue_waste_hours GROUP BY job_id
)
SELECT
    ['1-8', '9-32', '33-128', '129-512', '513+'][size_order] AS size_class,
    count(*) AS jobs,
    count(*) / sum(count(*)) OVER () AS job_share,
    sum(gpu_h) AS gpu_h,
    sum(gpu_h) / sum(sum(gpu_h)) OVER () AS gpu_time_share,
    coalesce(sum(w.wasted_gpu_h), 0) AS wasted_gpu_h,
    median(epoch(ended - started)) / 3600 AS median_lifetime_h
FROM sized
LEFT JOIN waste AS w USING (job_id)
GROUP BY size_order
ORDER BY size_order;
