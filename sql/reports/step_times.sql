-- Step-time series: every step that ended in the range, of one job (variable job_id) or of all
-- jobs, with its DP synchronization phase and attempt (0 before the first restart).
-- Needs base.sql; parameters: report_start, report_end, job_id.
SELECT
    job_id,
    step,
    attempt,
    timezone('UTC', started) AS started,
    timezone('UTC', ended) AS ended,
    duration_s,
    timezone('UTC', sync_started) AS sync_started,
    sync_s
FROM range_steps
WHERE getvariable('job_id') IS NULL OR job_id = getvariable('job_id')
ORDER BY job_id, step;
