-- Waste: GPU-hours lost to diagnosed issues per period, by issue kind and by job; an issue that
-- spans hours counts in each hour with the waste of that hour. Rows with kind '(all)' total a
-- job; rows with job_id '(all)' total a kind; kind = job_id = '(all)' is the period's total.
-- Needs base.sql; parameters: report_start, report_end, waste_period ('hour' (default) or 'day').
WITH periods AS (
    SELECT
        date_trunc(coalesce(getvariable('waste_period'), 'hour'), hour) AS period,
        issue_id,
        job_id,
        kind,
        wasted_gpu_s
    FROM issue_waste_hours
)
SELECT
    timezone('UTC', period) AS period,
    CASE WHEN grouping(kind) = 1 THEN '(all)' ELSE kind END AS kind,
    CASE WHEN grouping(job_id) = 1 THEN '(all)' ELSE job_id END AS job_id,
    count(DISTINCT issue_id) AS issues,
    sum(wasted_gpu_s) / 3600 AS wasted_gpu_h
FROM periods
GROUP BY GROUPING SETS ((period, kind, job_id), (period, kind), (period, job_id), (period))
ORDER BY period, kind = '(all)', job_id = '(all)', wasted_gpu_h DESC, kind, job_id;
