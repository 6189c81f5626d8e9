"""Row groups encoded apart and assembled into one Parquet file read back as one file written
whole would: the same rows, schema, row groups and statistics, in pyarrow and in DuckDB."""

import io
import struct

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import parquet_parts


def rows(n: int, first: int = 0) -> pa.Table:
    index = pa.array(range(first, first + n), pa.int64())
    return pa.table({"id": index, "name": pa.array([f"host-{i % 7}" for i in range(first, first + n)]),
                     "maybe": pa.array([None if i % 3 else i for i in range(first, first + n)], pa.int32()),
                     "at": pa.array([i * 60 * 10**9 for i in range(first, first + n)], pa.timestamp("ns", tz="UTC"))})


def part(table: pa.Table) -> pa.Buffer:
    out = pa.BufferOutputStream()
    pq.write_table(table, out, row_group_size=1000, compression="zstd")
    return out.getvalue()


def test_parts_assemble_into_one_file_in_order(tmp_path):
    pieces = [rows(1000, 0), rows(1000, 1000), rows(17, 2000)]
    path = tmp_path / "data.parquet"
    with open(path, "wb") as out:
        assembled = parquet_parts.PartsFile(out)
        for piece in pieces:
            assembled.add(part(piece))
        assembled.close()
    whole = pa.concat_tables(pieces)
    file = pq.ParquetFile(path)
    assert file.read().equals(whole) and file.schema_arrow.equals(whole.schema, check_metadata=False)
    assert [file.metadata.row_group(i).num_rows for i in range(file.num_row_groups)] == [1000, 1000, 17]
    assert file.read_row_group(1).equals(pieces[1])
    statistics = file.metadata.row_group(2).column(0).statistics
    assert (statistics.min, statistics.max, file.metadata.row_group(1).column(2).statistics.null_count) == (2000, 2016, 667)
    assert duckdb.sql(f"SELECT count(*), sum(id), count(maybe), max(name) FROM '{path}'").fetchall() == [(2017, 2033136, 673, "host-6")]


def test_a_footer_is_written_back_byte_for_byte():
    data = part(rows(10)).to_pybytes()
    (length,) = struct.unpack("<I", data[-8:-4])
    footer = data[-8 - length:-8]
    written = bytearray()
    parquet_parts._write_struct(written, parquet_parts._read_struct(parquet_parts._Reader(footer)))
    assert bytes(written) == footer


def test_what_is_not_parquet_is_refused():
    with pytest.raises(ValueError, match="not a Parquet file"):
        parquet_parts.PartsFile(io.BytesIO()).add(b"PAR1 nothing here")
    with pytest.raises(ValueError, match="at least one part"):
        parquet_parts.PartsFile(io.BytesIO()).close()
