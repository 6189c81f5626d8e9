-- The NIC inventory the last run used (addr, host, gpu, leaf, pod): what the capacity reports
-- count as the fleet. Prism fills in @WAREHOUSE@.
CREATE OR REPLACE VIEW topology AS
SELECT * FROM read_parquet('@WAREHOUSE@/topology/data.parquet');
