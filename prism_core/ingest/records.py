"""Flow fields, errors and the parsed-record container shared by the readers and validation."""

from __future__ import annotations

import csv
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import zstandard

from prism_core.schema import FLOW_OPTIONAL, FLOW_REQUIRED

FLOW_FIELDS = FLOW_REQUIRED + FLOW_OPTIONAL
INT_FIELDS = (
    "time_flow_start_ns",
    "time_flow_end_ns",
    "bytes",
    "packets",
    "src_port",
    "dst_port",
    "time_received_ns",
    "sampling_rate",
)
ADDRESS_FIELDS = ("src_addr", "dst_addr", "sampler_address")

RAW_LIMIT = 2048  # bytes of a rejected record kept in `raw`
# Errors that mean "these bytes are not a readable file"; anything else is a bug and propagates.
READ_ERRORS = (
    pa.ArrowException,
    OSError,
    EOFError,
    zlib.error,
    zstandard.ZstdError,
    UnicodeError,
    csv.Error,
)


class _FileRejected(Exception):
    """The file as a whole cannot yield records."""

    def __init__(self, reason: str, raw: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


def _corrupt(stage: str, error: Exception) -> str:
    message = " ".join(str(error).split())[:160] or type(error).__name__
    return f"corrupt_file:{stage}: {message}"


def _text(raw: bytes) -> str:
    return raw[:RAW_LIMIT].decode("utf-8", "backslashreplace")


@dataclass
class _Records:
    """Parsed records of one file, before validation."""

    # Flow fields the file has, one value per record, in chunks whose Arrow types may differ
    # (Arrow reads integers where Python reads the odd line as text).
    columns: dict[str, list[pa.Array]]
    positions: np.ndarray  # each record's 0-based position in the file
    render: Callable[[np.ndarray], list[str]]  # raw text of records, by index into `columns`
    unparseable: list[tuple[int, str, str]] = field(default_factory=list)  # position, reason, raw

    @staticmethod
    def empty() -> _Records:
        return _Records({}, np.zeros(0, dtype=np.int64), lambda rows: [])

    @property
    def num_parsed(self) -> int:
        return len(self.positions)
