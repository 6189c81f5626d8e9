-- Building blocks shared by every report in sql/reports/: run this file once per session, before
-- any report (DuckDB CLI: `.read sql/reports/base.sql`). It only creates TEMP views, so it also
-- works on a read-only connection to prism.duckdb.
--
-- Needs the warehouse views (flows, flow_minutes, jobs, job_gpus, comm_pairs, steps, issues) and
-- `topology` (the NIC inventory: addr, host, gpu, leaf, pod).
--
-- Report range: the variables report_start and report_end (UTC instants, end exclusive), e.g.
--     SET VARIABLE report_start = TIMESTAMPTZ '2026-11-22 09:00:00+00';
-- Unset, the range is every hour that has flow_minutes. Set the variables before reading this
-- file or after: the views read them whenever a report runs.
--
-- Inside the reports times are naive UTC TIMESTAMPs, so hour and day boundaries do not depend on
-- the session's TimeZone setting; results give instants back as TIMESTAMPTZ.

-- The report range, [range_start, range_end): from the variables, else the minutes that have
-- flow_minutes (read only when a variable is unset), so that an hour the data covers for a few
-- minutes does not count as an hour of idle GPUs.
CREATE OR REPLACE TEMP VIEW report_range AS
WITH stored AS (
    SELECT
        min(timezone('UTC', minute)) AS first_minute,
        max(timezone('UTC', minute)) + INTERVAL 1 MINUTE AS end_minute
    FROM flow_minutes
    WHERE getvariable('report_start') IS NULL OR getvariable('report_end') IS NULL
)
SELECT
    coalesce(timezone('UTC', getvariable('report_start')::TIMESTAMPTZ), first_minute) AS range_start,
    coalesce(timezone('UTC', getvariable('report_end')::TIMESTAMPTZ), end_minute) AS range_end
FROM stored;

-- Every hour of the range, with the part of it the range covers: [covered_from, covered_until),
-- covered_s seconds (3600 but at the range's edges).
CREATE OR REPLACE TEMP VIEW report_hours AS
SELECT
    hour,
    greatest(hour, range_start) AS covered_from,
    least(hour + INTERVAL 1 HOUR, range_end) AS covered_until,
    epoch(least(hour + INTERVAL 1 HOUR, range_end) - greatest(hour, range_start)) AS covered_s
FROM (
    SELECT unnest(range(date_trunc('hour', range_start), range_end, INTERVAL 1 HOUR)) AS hour, range_start, range_end
    FROM report_range
);

-- True for the partitions (date, hour) that can hold rows of the report range. It only uses the
-- variables, so DuckDB skips the other partitions without opening them (the end is exclusive:
-- its partition is the one of the instant just before it).
CREATE OR REPLACE TEMP MACRO in_report_partitions(partition_date, partition_hour) AS
    (getvariable('report_start') IS NULL OR (
        partition_date >= CAST(timezone('UTC', getvariable('report_start')::TIMESTAMPTZ) AS DATE)
        AND (partition_date > CAST(timezone('UTC', getvariable('report_start')::TIMESTAMPTZ) AS DATE)
             OR partition_hour >= hour(timezone('UTC', getvariable('report_start')::TIMESTAMPTZ)))))
    AND (getvariable('report_end') IS NULL OR (
        partition_date <= CAST((timezone('UTC', getvariable('report_end')::TIMESTAMPTZ) - INTERVAL 1 MICROSECOND) AS DATE)
        AND (partition_date < CAST((timezone('UTC', getvariable('report_end')::TIMESTAMPTZ) - INTERVAL 1 MICROSECOND) AS DATE)
             OR partition_hour <= hour((timezone('UTC', getvariable('report_end')::TIMESTAMPTZ) - INTERVAL 1 MICROSECOND)))));

-- The flows and flow_minutes of the range.
CREATE OR REPLACE TEMP VIEW range_flows AS
SELECT f.*
FROM flows AS f, report_range AS r
WHERE in_report_partitions(f.date, f.hour)
    AND f.time_flow_start_ns >= epoch_ns(r.range_start)
    AND f.time_flow_start_ns < epoch_ns(r.range_end);

CREATE OR REPLACE TEMP VIEW range_flow_minutes AS
SELECT fm.* REPLACE (timezone('UTC', fm.minute) AS minute)
FROM flow_minutes AS fm, report_range AS r
WHERE in_report_partitions(fm.date, fm.hour)
    AND timezone('UTC', fm.minute) >= r.range_start
    AND timezone('UTC', fm.minute) < r.range_end;

-- GPU NICs of the inventory; a pod-less inventory is one pod.
CREATE OR REPLACE TEMP VIEW inventory AS
SELECT DISTINCT addr, host, gpu, leaf, coalesce(pod, 'all') AS pod
FROM topology
WHERE gpu >= 0;

-- One row per job over all hours: its life from first to last traffic, the latest value of every
-- attribute (an hour's `jobs` row describes the job as of that hour), and until when it held its
-- GPUs: a hung job holds them, silent, until the end of its hang issue.
CREATE OR REPLACE TEMP VIEW job_life AS
WITH lives AS (
    SELECT
        job_id,
        timezone('UTC', min(first_seen)) AS started,
        timezone('UTC', max(last_seen)) AS ended,
        arg_max(status, date + to_hours(hour)) AS status,  -- as of the job's latest hour
        max(n_gpus) AS n_gpus,
        max(n_hosts) AS n_hosts,
        arg_max(dp, date + to_hours(hour)) FILTER (WHERE dp IS NOT NULL) AS dp,
        arg_max(pp, date + to_hours(hour)) FILTER (WHERE pp IS NOT NULL) AS pp,
        arg_max(tp, date + to_hours(hour)) FILTER (WHERE tp IS NOT NULL) AS tp,
        coalesce(max(restarts), 0) AS restarts
    FROM jobs
    GROUP BY job_id
),
hangs AS (
    SELECT job_id, max(timezone('UTC', "end")) AS hang_ended FROM issues WHERE kind = 'hang' GROUP BY job_id
)
SELECT l.*, greatest(l.ended, h.hang_ended) AS held_until
FROM lives AS l
LEFT JOIN hangs AS h USING (job_id);

-- Jobs that held GPUs during the range, with the part of that time inside it.
CREATE OR REPLACE TEMP VIEW jobs_in_range AS
SELECT
    j.*,
    greatest(j.started, r.range_start) AS seen_from,
    least(j.held_until, r.range_end) AS seen_until,
    epoch(least(j.held_until, r.range_end) - greatest(j.started, r.range_start)) AS seen_s
FROM job_life AS j, report_range AS r
WHERE j.started < r.range_end AND j.held_until >= r.range_start;

-- Every GPU NIC a job used (over all hours; a replaced host stays listed), with its host's stage.
CREATE OR REPLACE TEMP VIEW job_members AS
SELECT job_id, addr, host, min(pp_stage) AS pp_stage
FROM job_gpus
GROUP BY job_id, addr, host;

-- Steps that end inside the range, one row per (job, step) even if two hours wrote it.
CREATE OR REPLACE TEMP VIEW range_steps AS
SELECT
    s.job_id,
    s.step,
    s.attempt,
    timezone('UTC', s.start) AS started,
    timezone('UTC', s."end") AS ended,
    s.duration_s,
    timezone('UTC', s.sync_start) AS sync_started,
    s.sync_s
FROM steps AS s, report_range AS r
WHERE timezone('UTC', s."end") >= r.range_start AND timezone('UTC', s."end") < r.range_end
QUALIFY row_number() OVER (PARTITION BY s.job_id, s.step ORDER BY s."end" DESC) = 1;

-- Issue rows with the hour whose waste they carry. An issue that spans hours has one row per hour
-- (same issue_id, same start, the end as known in that hour) carrying that hour's waste, so a
-- row counts in the hour its end falls in (an end on the hour boundary closes the hour before).
CREATE OR REPLACE TEMP VIEW issue_hours AS
SELECT
    issue_id,
    job_id,
    kind,
    subject,
    timezone('UTC', start) AS started,
    timezone('UTC', "end") AS ended,
    severity,
    confidence,
    coalesce(wasted_gpu_s, 0) AS wasted_gpu_s,
    evidence,
    date_trunc('hour', greatest(timezone('UTC', start), timezone('UTC', "end") - INTERVAL 1 MICROSECOND)) AS hour
FROM issues;

-- Wasted GPU-seconds of each issue in each hour of the range.
CREATE OR REPLACE TEMP VIEW issue_waste_hours AS
SELECT i.issue_id, i.job_id, i.kind, i.hour, sum(i.wasted_gpu_s) AS wasted_gpu_s
FROM issue_hours AS i
JOIN report_hours AS h USING (hour)
GROUP BY i.issue_id, i.job_id, i.kind, i.hour;

-- One row per issue with rows in the range: from its start to its latest end there, with the
-- waste of its rows there and the latest severity, confidence and evidence.
CREATE OR REPLACE TEMP VIEW range_issues AS
SELECT
    i.issue_id,
    any_value(i.job_id) AS job_id,
    any_value(i.kind) AS kind,
    arg_max(i.subject, i.ended) AS subject,
    min(i.started) AS started,
    max(i.ended) AS ended,
    arg_max(i.severity, i.ended) AS severity,
    arg_max(i.confidence, i.ended) AS confidence,
    sum(i.wasted_gpu_s) AS wasted_gpu_s,
    arg_max(i.evidence, i.ended) AS evidence
FROM issue_hours AS i
JOIN report_hours AS h USING (hour)
GROUP BY i.issue_id;
