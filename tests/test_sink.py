"""The warehouse sink on a real in-process Beam runner: partitions streamed from staged pieces,
and an hour's state written only once every one of its partitions is in place."""

from datetime import timedelta

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipelines import warehouse
from pipelines.sink import HourTables, WriteTables
from prism_core.minutes import MINUTE_NS
from prism_core.schema import QUARANTINE
from test_pipeline_ingest import HOUR0, T0, flow, flows_table, staged_flows
from test_warehouse import quarantine_rows

HOUR1 = HOUR0 + timedelta(hours=1)


def write(root, hours: list[HourTables]) -> None:
    with BeamTestPipeline(runner="FnApiRunner") as pipeline:
        written = pipeline | beam.Create(hours) | WriteTables(str(root))
        assert_that(written, equal_to([h.hour for h in hours]))


def test_partitions_stream_from_staged_and_in_memory_pieces_then_the_state(tmp_path, monkeypatch):
    monkeypatch.setattr(warehouse, "ROW_GROUP_ROWS", 4)
    minutes = [flows_table([flow(T0 + m * MINUTE_NS + i) for i in range(3)]) for m in range(3)]
    staged = [staged_flows(str(tmp_path), [table], kept=[0, 1, 2]) for table in minutes]
    root = tmp_path / "wh"
    write(root, [
        HourTables(HOUR0, {"flows": staged, "quarantine": [quarantine_rows(2, "a"), quarantine_rows(1, "b")]},
                   state={"ingest": {"flows": 9}}),
        HourTables(HOUR1, {"flows": [], "quarantine": [QUARANTINE.empty_table()]}, state={"ingest": {"flows": 0}}),
    ])
    flows = pq.ParquetFile(warehouse.partition_file(root, "flows", HOUR0))
    assert [flows.metadata.row_group(i).num_rows for i in range(flows.num_row_groups)] == [4, 4, 1]
    assert flows.read().equals(pa.concat_tables(minutes).combine_chunks())
    assert warehouse.read_partition(root, "quarantine", HOUR0)["reason"].to_pylist() == ["a", "a", "b"]
    empty = pq.ParquetFile(warehouse.partition_file(root, "flows", HOUR1))
    assert (empty.num_row_groups, empty.metadata.num_rows) == (1, 0)  # still one (empty) row group
    assert [warehouse.read_stats(root, h, "ingest") for h in (HOUR0, HOUR1)] == [{"flows": 9}, {"flows": 0}]


class LostRows:
    """Staged rows whose file is gone when the partition is written."""

    num_rows = 3

    def read(self) -> pa.Table:
        raise FileNotFoundError("staged file removed")


def test_an_hour_whose_partition_cannot_be_written_keeps_its_previous_state(tmp_path):
    root = tmp_path / "wh"
    write(root, [HourTables(HOUR0, {"quarantine": [quarantine_rows(1, "old")]},
                            state={"analysis_counts": {"quarantine": 1}, "analysis": {"run": "old"}})])
    with pytest.raises(FileNotFoundError, match="staged file removed"):
        write(root, [HourTables(HOUR0, {"quarantine": [quarantine_rows(3, "new")], "flows": [LostRows()]},
                                state={"analysis_counts": {"quarantine": 3}, "analysis": {"run": "new"}})])
    # the next hour would continue from the state of the run whose tables are all in place
    assert warehouse.read_stats(root, HOUR0, "analysis") == {"run": "old"}
    assert warehouse.read_stats(root, HOUR0, "analysis_counts") == {"quarantine": 1}
