"""Parse, validate and type one flow file: bytes in, clean flows and quarantined records out.

Every record read ends in exactly one place: `rows_read == clean.num_rows + quarantine.num_rows`.

Containers and formats
- `.gz` / `.zst` payloads are decompressed, recognised by suffix or by magic bytes; a suffix that
  promises compression the bytes do not have, or a truncated/corrupt stream, rejects the file.
- Parquet is recognised by its `PAR1` magic or suffix; JSON lines by `.json`/`.jsonl`/`.ndjson`;
  CSV by `.csv`; otherwise text starting with `{` is JSON lines and any other text is CSV.
- Text is UTF-8; a UTF-8 BOM is skipped and a UTF-16/32 BOM transcodes the file. A line that is
  not valid UTF-8 is quarantined alone (`unparseable:encoding`); a text file holding NUL bytes is
  binary, not flow text, and is rejected whole.

Records and positions
- A record is a non-blank line of JSON lines, a non-blank line after the header of CSV (quoted
  fields cannot span lines), or a row of Parquet. `row` in the quarantine is the record's 0-based
  position among the file's records (blank lines are not counted).
- A file that cannot be read at all becomes one quarantine row with `row = -1` and counts as one
  record read: `corrupt_file:<stage>: <error>` with the file's first bytes as `raw`. So does a
  Parquet or CSV file whose schema/header lacks a required column (`missing_field:<col>`, `raw` =
  its column names): the defect belongs to the file, not to each of its records. In JSON lines
  every record carries its own fields, so a missing field quarantines that record only.
- An empty file (0 bytes, blank lines only, a bare CSV header, a Parquet file with no rows) reads
  0 records and quarantines nothing.
- A line that does not parse is quarantined alone with `unparseable:<json_syntax | not_an_object |
  csv_syntax | field_count | encoding>`; the rest of the file goes on.
- `raw` is the JSON or CSV line as it is, or a Parquet row rendered as JSON, cut at RAW_LIMIT
  bytes. `quarantine_start_ns` is the record's start time when it parses and is in range, else -1.
  Clean rows keep the order of the file.

Values
- Integer fields take integers, or text holding a decimal integer (`"1500"`, `" -7 "`), the same
  in JSON, CSV and Parquet string columns, since CSV is all text. Fractions (`1.5`, even `1500.0`),
  exponents, booleans, hex and anything that does not fit int64 are `bad_type:<col>`; so are
  Parquet columns of float, boolean, timestamp or nested types (times are int64 epoch ns).
- Null, absent, empty or blank text is missing: `missing_field:<col>` for required columns,
  null in the clean table for optional ones.
- Addresses (`src_addr`, `dst_addr`, and `sampler_address` when present) must be IPv4 or IPv6
  text. They are normalized to Python's canonical form (IPv6 compressed lowercase), and
  IPv4-mapped IPv6 (`::ffff:10.0.0.1`) becomes plain IPv4, so a NIC has one name whichever way an
  exporter writes it; both ends of a flow must then be of one family.
- `proto` is a number 0..255 or a name as goflow2 prints it (`UDP`, `TCP`, `ICMPv6`, ...,
  case-insensitive).
- `sampling_rate` 0 or absent means unsampled (goflow2 writes 0 when unknown) and is stored as 1;
  `bytes` and `packets` are multiplied by it when it is above 1, before the size bounds apply.
- Several problems on one record: the first in `CHECK_ORDER` is reported.

Speed: Parquet is read column-wise with addresses dictionary-encoded, so each distinct address is
validated once. Text is read by Arrow's streaming readers; only the lines Arrow stops at (and a few
after them) are parsed in Python, so a clean file costs one Arrow pass and a dirty one little more.
"""

from prism_core.ingest.addresses import canonical_address
from prism_core.ingest.dedupe import dedupe, deduplicated_order
from prism_core.ingest.parquet import parquet_time_bounds
from prism_core.ingest.parse import parse_flow_file
from prism_core.ingest.records import RAW_LIMIT
from prism_core.ingest.validate import (
    CHECK_ORDER,
    MAX_FLOW_BYTES,
    MAX_TIME_NS,
    MIN_TIME_NS,
    ParsedFile,
)

__all__ = [
    "CHECK_ORDER",
    "MAX_FLOW_BYTES",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "RAW_LIMIT",
    "ParsedFile",
    "canonical_address",
    "dedupe",
    "deduplicated_order",
    "parquet_time_bounds",
    "parse_flow_file",
]
