-- One view per warehouse table over its hive-partitioned Parquet files
-- (<warehouse>/<table>/date=YYYY-MM-DD/hour=HH/data.parquet). Prism fills in @TABLE@ and
-- @WAREHOUSE@ for each table that has partitions; `date` and `hour` come from the directory names.
CREATE OR REPLACE VIEW @TABLE@ AS
SELECT *
FROM read_parquet(
    '@WAREHOUSE@/@TABLE@/*/*/data.parquet',
    hive_partitioning = true,
    hive_types = {'date': DATE, 'hour': INTEGER}
);
