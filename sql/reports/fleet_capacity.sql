-- Fleet capacity per hour and pod: how many GPUs the inventory holds, how many were held by
-- recognized jobs (from first traffic to last, or to the end of a hang), how many sent or received traffic while in no recognized job, and how many
-- had no traffic at all (idle, or in a job the network cannot see: a single-host job keeps its
-- traffic on NVLink).
-- Figures are averages over the part of the hour the report range covers (GPU-hours per hour).
-- Rows with pod '(all)' add up the pods; rows with a NULL hour average over the whole range,
-- weighting each hour by the time it covers (idle_share there is the fleet's idle share).
-- Needs base.sql; parameters: report_start, report_end.
WITH job_busy AS (  -- seconds each GPU spent in recognized jobs, per hour
    SELECT
        h.hour,
        m.addr,
        least(
            sum(epoch(least(j.held_until, h.covered_until) - greatest(j.started, h.covered_from))),
            any_value(h.covered_s)
        ) AS busy_s
    FROM jobs_in_range AS j
    JOIN job_members AS m USING (job_id)
    JOIN report_hours AS h ON j.started < h.covered_until AND j.held_until > h.covered_from
    GROUP BY h.hour, m.addr
),
active_minutes AS (  -- minutes in which a GPU NIC sent or received a flow
    SELECT DISTINCT t.minute, t.addr
    FROM (
        SELECT minute, src_addr AS addr FROM range_flow_minutes
        UNION ALL
        SELECT minute, dst_addr AS addr FROM range_flow_minutes
    ) AS t
    JOIN inventory USING (addr)
),
traffic_only AS (  -- seconds with traffic outside every recognized job, per GPU and hour
    SELECT date_trunc('hour', a.minute) AS hour, a.addr, 60 * count(*) AS traffic_s
    FROM active_minutes AS a
    ANTI JOIN (
        SELECT m.addr, j.started, j.held_until FROM jobs_in_range AS j JOIN job_members AS m USING (job_id)
    ) AS busy
        ON busy.addr = a.addr
        AND a.minute < busy.held_until
        AND a.minute + INTERVAL 1 MINUTE > busy.started
    GROUP BY ALL
),
per_gpu AS (
    SELECT
        h.hour,
        i.pod,
        h.covered_s,
        coalesce(b.busy_s, 0) AS busy_s,
        least(coalesce(t.traffic_s, 0), h.covered_s - coalesce(b.busy_s, 0)) AS traffic_s
    FROM report_hours AS h
    CROSS JOIN inventory AS i
    LEFT JOIN job_busy AS b ON b.hour = h.hour AND b.addr = i.addr
    LEFT JOIN traffic_only AS t ON t.hour = h.hour AND t.addr = i.addr
),
totals AS (
    SELECT
        hour,
        CASE WHEN grouping(pod) = 1 THEN '(all)' ELSE pod END AS pod,
        count(DISTINCT hour) AS hours,
        count(*) / count(DISTINCT hour) AS inventory_gpus,
        -- GPU-seconds over the covered seconds of the range (each hour holds every GPU once)
        sum(busy_s) / (sum(covered_s) / (count(*) / count(DISTINCT hour))) AS busy_gpus,
        sum(traffic_s) / (sum(covered_s) / (count(*) / count(DISTINCT hour))) AS traffic_only_gpus
    FROM per_gpu
    GROUP BY GROUPING SETS ((hour, pod), (hour), (pod), ())
)
SELECT
    timezone('UTC', hour) AS hour,
    pod,
    hours,
    inventory_gpus,
    busy_gpus,
    traffic_only_gpus,
    inventory_gpus - busy_gpus - traffic_only_gpus AS no_traffic_gpus,
    busy_gpus / inventory_gpus AS busy_share,
    (inventory_gpus - busy_gpus - traffic_only_gpus) / inventory_gpus AS idle_share
FROM totals
ORDER BY hour NULLS LAST, pod = '(all)', pod;
