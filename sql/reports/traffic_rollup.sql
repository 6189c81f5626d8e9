-- Traffic over time: the 1-minute flow aggregates (flow_minutes) rolled up to buckets of
-- `bucket_minutes` minutes (default 5; 60 gives hours): flows, bytes, mean throughput over the
-- bucket and the busiest minute's throughput, distinct NIC pairs and sending NICs.
-- Needs base.sql; parameters: report_start, report_end, bucket_minutes.
WITH pair_minutes AS (
    SELECT
        time_bucket(to_minutes(coalesce(getvariable('bucket_minutes'), 5)::INTEGER), minute) AS bucket,
        minute,
        src_addr,
        dst_addr,
        flows,
        bytes
    FROM range_flow_minutes
),
busiest AS (
    SELECT bucket, max(bytes) AS peak_minute_bytes
    FROM (SELECT bucket, minute, sum(bytes) AS bytes FROM pair_minutes GROUP BY bucket, minute)
    GROUP BY bucket
)
SELECT
    timezone('UTC', p.bucket) AS bucket,
    count(DISTINCT p.minute) AS minutes_with_flows,
    sum(p.flows)::BIGINT AS flows,
    sum(p.bytes)::BIGINT AS bytes,
    sum(p.bytes) * 8 / (60 * coalesce(getvariable('bucket_minutes'), 5)) / 1e9 AS mean_gbit_s,
    any_value(b.peak_minute_bytes) * 8 / 60 / 1e9 AS peak_minute_gbit_s,
    count(DISTINCT (p.src_addr, p.dst_addr)) AS pairs,
    count(DISTINCT p.src_addr) AS senders
FROM pair_minutes AS p
JOIN busiest AS b USING (bucket)
GROUP BY p.bucket
ORDER BY p.bucket;
