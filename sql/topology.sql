-- The NIC inventory the last run used (addr, host, gpu, leaf, pod): what the capacity reports
-- count as the fleet. One row per GPU a NIC serves (a NIC serving two GPUs has two rows); a NIC
-- serving none (storage server, CPU host) has one row with a NULL gpu. Prism fills in @WAREHOUSE@.
CREATE OR REPLACE VIEW topology AS
SELECT * FROM read_parquet('@WAREHOUSE@/topology/data.parquet');
