-- Job summary: one row per job that held GPUs in the range, most wasteful first: size and
-- parallelism; life (first to last traffic over its whole life; a hung job holds its GPUs, silent,
-- until held_until); steps that ended in the range with their median and p99 time; issues in the
-- range and the GPU-hours they wasted there, against the GPU-hours the job held there.
-- Needs base.sql; parameters: report_start, report_end.
WITH step_stats AS (
    SELECT
        job_id,
        count(*) AS steps,
        quantile_cont(duration_s, 0.5) AS median_step_s,
        quantile_cont(duration_s, 0.99) AS p99_step_s
    FROM range_steps
    GROUP BY job_id
),
issue_stats AS (
    SELECT job_id, count(*) AS issues, string_agg(DISTINCT kind, ', ' ORDER BY kind) AS issue_kinds
    FROM range_issues
    GROUP BY job_id
),
waste AS (
    SELECT job_id, sum(wasted_gpu_s) / 3600 AS wasted_gpu_h
    FROM issue_waste_hours
    GROUP BY job_id
)
SELECT
    j.job_id,
    j.status,
    timezone('UTC', j.started) AS started,
    timezone('UTC', j.ended) AS ended,
    timezone('UTC', j.held_until) AS held_until,
    epoch(j.ended - j.started) / 3600 AS lifetime_h,
    j.n_gpus,
    j.n_hosts,
    j.dp,
    j.pp,
    j.tp,
    j.restarts,
    coalesce(s.steps, 0) AS steps,
    s.median_step_s,
    s.p99_step_s,
    coalesce(i.issues, 0) AS issues,
    coalesce(i.issue_kinds, '') AS issue_kinds,
    j.n_gpus * j.seen_s / 3600 AS gpu_h,
    coalesce(w.wasted_gpu_h, 0) AS wasted_gpu_h,
    coalesce(w.wasted_gpu_h, 0) / nullif(j.n_gpus * j.seen_s / 3600, 0) AS waste_share
FROM jobs_in_range AS j
LEFT JOIN step_stats AS s USING (job_id)
LEFT JOIN issue_stats AS i USING (job_id)
LEFT JOIN waste AS w USING (job_id)
ORDER BY wasted_gpu_h DESC, gpu_h DESC, j.job_id;
