-- Issue log: every issue with rows in the range, of one job (variable job_id) or of all jobs,
-- with the GPU-hours it wasted inside the range.
-- Needs base.sql; parameters: report_start, report_end, job_id.
SELECT
    issue_id,
    job_id,
    kind,
    subject,
    timezone('UTC', started) AS started,
    timezone('UTC', ended) AS ended,
    severity,
    confidence,
    wasted_gpu_s / 3600 AS wasted_gpu_h,
    evidence
FROM range_issues
WHERE getvariable('job_id') IS NULL OR job_id = getvariable('job_id')
ORDER BY started, issue_id;
