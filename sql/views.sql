-- One view per warehouse table over its hive-partitioned Parquet files
-- (<warehouse>/<table>/date=YYYY-MM-DD/hour=HH/data.parquet). Prism fills in @TABLE@,
-- @WAREHOUSE@ and @COLUMNS@ for each table that has partitions; `date` and `hour` come from the
-- directory names. @COLUMNS@ is `*` with the table's nanosecond instants cast to TIMESTAMPTZ
-- (microseconds): DuckDB clients before 2.0 cannot open a catalog whose views carry TIMESTAMPTZ_NS.
-- Columns are matched by name, so partitions written before a column was added read it as NULL.
CREATE OR REPLACE VIEW @TABLE@ AS
SELECT @COLUMNS@
FROM read_parquet(
    '@WAREHOUSE@/@TABLE@/*/*/data.parquet',
    hive_partitioning = true,
    union_by_name = true,
    hive_types = {'date': DATE, 'hour': INTEGER}
);
