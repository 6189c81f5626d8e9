-- Per-host straggler table: how often each host was the last of its DP group to start the
-- gradient synchronization that closes a step, and the waiting that caused (GPU-seconds its peers
-- spent between their own start and its start), with its share of all such waiting; and the
-- straggler issues the diagnosis filed against the host, with the steps their evidence
-- (`late_steps`) found it late in. Worst first: hosts the diagnosis blamed,
-- by the GPU-hours their issues wasted, then by the waiting they caused.
-- A DP group is one pipeline stage of one job in one step: the hosts whose gradients are
-- synchronized together. A host is "in" a step's sync from its first DP flow at or after the
-- step's sync_start. A host behind a slow pipeline neighbour arrives late too: the issue columns
-- say which host the diagnosis blamed.
-- Needs base.sql; parameters: report_start, report_end.
WITH dp_pairs AS (  -- each DP pair of a job, with the host that sends on it
    SELECT DISTINCT p.job_id, p.src_addr, p.dst_addr, m.host
    FROM comm_pairs AS p
    JOIN job_members AS m ON m.job_id = p.job_id AND m.addr = p.src_addr
    WHERE p.kind = 'dp'
),
host_gpus AS (
    SELECT job_id, host, count(*) AS gpus, min(pp_stage) AS pp_stage
    FROM job_members
    GROUP BY job_id, host
),
dp_sends AS (  -- DP flows in the range, by job and sending host, with their 10 s bucket
    SELECT p.job_id, p.host, make_timestamp_ns(f.time_flow_start_ns) AS sent,
        f.time_flow_start_ns // 10_000_000_000 AS bucket
    FROM range_flows AS f
    JOIN dp_pairs AS p USING (src_addr, dst_addr)
),
synced_steps AS (  -- a row per 10 s bucket the step's sync spans, so sends join by equality
    SELECT job_id, step, sync_started, ended,
        unnest(range(epoch_ns(sync_started) // 10_000_000_000, epoch_ns(ended) // 10_000_000_000 + 1)) AS bucket
    FROM range_steps WHERE sync_started IS NOT NULL
),
arrivals AS (  -- when each host joined each step's sync
    SELECT s.job_id, s.step, d.host, min(d.sent) AS arrived
    FROM dp_sends AS d
    JOIN synced_steps AS s USING (job_id, bucket)
    WHERE d.sent BETWEEN s.sync_started AND s.ended
    GROUP BY s.job_id, s.step, d.host
),
groups AS (
    SELECT
        a.*,
        g.gpus,
        max(a.arrived) OVER dp_group AS last_arrival,
        arg_max(a.host, a.arrived) OVER dp_group AS last_host,
        count(*) OVER dp_group AS group_hosts
    FROM arrivals AS a
    JOIN host_gpus AS g USING (job_id, host)
    WINDOW dp_group AS (PARTITION BY a.job_id, a.step, coalesce(g.pp_stage, 0))
),
per_host AS (
    SELECT host, string_agg(DISTINCT job_id, ', ' ORDER BY job_id) AS jobs, count(*) AS syncs
    FROM groups
    WHERE group_hosts > 1
    GROUP BY host
),
caused AS (  -- waiting charged to the host that arrived last
    SELECT
        last_host AS host,
        count(DISTINCT (job_id, step)) AS times_last,
        sum(epoch(last_arrival - arrived) * gpus) AS wait_caused_gpu_s
    FROM groups
    WHERE group_hosts > 1
    GROUP BY last_host
),
blamed AS (  -- straggler issues against the host; their evidence counts the steps it was late in
    SELECT
        i.subject AS host,
        count(DISTINCT i.issue_id) AS straggler_issues,
        sum(i.wasted_gpu_s) / 3600 AS straggler_wasted_gpu_h,
        sum(json_extract(i.evidence, '$.late_steps')::BIGINT)::BIGINT AS diagnosed_late_steps
    FROM issue_hours AS i
    JOIN report_hours USING (hour)
    WHERE i.kind = 'straggler'
    GROUP BY i.subject
)
SELECT
    host,
    coalesce(h.jobs, '') AS jobs,
    coalesce(h.syncs, 0) AS syncs,
    coalesce(c.times_last, 0) AS times_last,
    coalesce(c.times_last, 0) / nullif(h.syncs, 0) AS last_share,
    coalesce(c.wait_caused_gpu_s, 0) AS wait_caused_gpu_s,
    coalesce(c.wait_caused_gpu_s / nullif(sum(c.wait_caused_gpu_s) OVER (), 0), 0) AS wait_share,
    coalesce(b.straggler_issues, 0) AS straggler_issues,
    coalesce(b.straggler_wasted_gpu_h, 0) AS straggler_wasted_gpu_h,
    coalesce(b.diagnosed_late_steps, 0) AS diagnosed_late_steps
FROM per_host AS h
FULL JOIN caused AS c USING (host)
FULL JOIN blamed AS b USING (host)
ORDER BY straggler_wasted_gpu_h DESC, wait_caused_gpu_s DESC, host;
