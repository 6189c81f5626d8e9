-- Issue log: every issue that overlaps the range, of one job (variable job_id) or of all jobs,
-- with the GPU-hours it wasted inside the range (its waste spread evenly over its duration).
-- Needs base.sql; parameters: report_start, report_end, job_id.
WITH in_range AS (
    SELECT issue_id, sum(wasted_gpu_s) / 3600 AS wasted_gpu_h FROM issue_waste_hours GROUP BY issue_id
)
SELECT
    i.issue_id,
    i.job_id,
    i.kind,
    i.subject,
    timezone('UTC', i.started) AS started,
    timezone('UTC', i.ended) AS ended,
    i.severity,
    i.confidence,
    coalesce(w.wasted_gpu_h, 0) AS wasted_gpu_h,
    i.evidence
FROM range_issues AS i
LEFT JOIN in_range AS w USING (issue_id)
WHERE getvariable('job_id') IS NULL OR i.job_id = getvariable('job_id')
ORDER BY i.started, i.issue_id;
