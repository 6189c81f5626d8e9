-- Restarts and failures and what they cost (Acme study, NSDI 2024: about 40% of jobs fail, and
-- infrastructure failures take most of the failed jobs' GPU time): jobs alive in the range by
-- outcome - hung (stopped mid-step and never resumed), restarted (resumed after a failure, at
-- least once), running, ended - with their GPU-hours in the range and the GPU-hours lost to
-- restart and hang issues. The '(all)' row totals the fleet.
-- Needs base.sql; parameters: report_start, report_end.
WITH failure_waste AS (
    SELECT
        job_id,
        count(DISTINCT issue_id) FILTER (WHERE kind = 'hang') AS hangs,
        sum(wasted_gpu_s) FILTER (WHERE kind = 'restart') / 3600 AS restart_lost_gpu_h,
        sum(wasted_gpu_s) FILTER (WHERE kind = 'hang') / 3600 AS hang_lost_gpu_h
    FROM issue_waste_hours
    WHERE kind IN ('restart', 'hang')
    GROUP BY job_id
),
outcomes AS (
    SELECT
        j.*,
        CASE
            WHEN j.status = 'hung' OR f.hangs > 0 THEN 'hung'
            WHEN j.restarts > 0 THEN 'restarted'
            WHEN j.status = 'running' THEN 'running'
            ELSE 'ended'
        END AS outcome,
        j.n_gpus * j.seen_s / 3600 AS gpu_h,
        coalesce(f.restart_lost_gpu_h, 0) AS restart_lost_gpu_h,
        coalesce(f.hang_lost_gpu_h, 0) AS hang_lost_gpu_h
    FROM jobs_in_range AS j
    LEFT JOIN failure_waste AS f USING (job_id)
)
SELECT
    CASE WHEN grouping(outcome) = 1 THEN '(all)' ELSE outcome END AS outcome,
    count(*) AS jobs,
    count(*) / (SELECT count(*) FROM outcomes) AS job_share,
    sum(gpu_h) AS gpu_h,
    sum(gpu_h) / (SELECT sum(gpu_h) FROM outcomes) AS gpu_time_share,
    sum(restarts)::BIGINT AS restarts,
    sum(restart_lost_gpu_h) AS restart_lost_gpu_h,
    sum(hang_lost_gpu_h) AS hang_lost_gpu_h,
    (sum(restart_lost_gpu_h) + sum(hang_lost_gpu_h)) / nullif(sum(gpu_h), 0) AS lost_share
FROM outcomes
GROUP BY GROUPING SETS ((outcome), ())
ORDER BY grouping(outcome), list_position(['hung', 'restarted', 'running', 'ended'], outcome);
