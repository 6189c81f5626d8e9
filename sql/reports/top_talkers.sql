-- Top talkers: the `top_n` hosts (default 10) that sent the most bytes in the range, from the
-- 1-minute flow aggregates, then one 'other' row for all the rest. Addresses outside the
-- inventory (storage, management servers) count as hosts of their own.
-- Needs base.sql; parameters: report_start, report_end, top_n.
WITH by_host AS (
    SELECT
        coalesce(i.host, fm.src_addr) AS host,
        sum(fm.bytes)::BIGINT AS bytes,
        sum(fm.flows)::BIGINT AS flows,
        count(DISTINCT fm.dst_addr) AS peers
    FROM range_flow_minutes AS fm
    LEFT JOIN inventory AS i ON i.addr = fm.src_addr
    GROUP BY 1
),
ranked AS (
    SELECT *, row_number() OVER (ORDER BY bytes DESC, host) AS rank FROM by_host
),
labelled AS (
    SELECT
        CASE WHEN rank <= coalesce(getvariable('top_n'), 10) THEN rank END AS rank,
        CASE WHEN rank <= coalesce(getvariable('top_n'), 10) THEN host ELSE 'other' END AS talker,
        bytes,
        flows,
        peers
    FROM ranked
)
SELECT
    rank,
    talker,
    count(*) AS hosts,
    sum(bytes)::BIGINT AS bytes,
    sum(bytes) / sum(sum(bytes)) OVER () AS byte_share,
    sum(flows)::BIGINT AS flows,
    CASE WHEN rank IS NULL THEN NULL ELSE any_value(peers) END AS peers
FROM labelled
GROUP BY rank, talker
ORDER BY rank NULLS LAST;
