"""Addresses: validated and normalized to one spelling (IPv4-mapped IPv6 as IPv4), each distinct
address once, so a NIC has one name whichever way an exporter writes it."""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prism_core.ingest.columns import _dictionary, _holds_text, _valid

MAX_ADDRESS_TEXT = 64  # longest IPv6 text is 45 characters, plus a scope id


@dataclass
class _Addresses:
    normalized: pa.ChunkedArray  # dictionary-encoded text, null where absent or invalid
    family: np.ndarray  # 4 or 6; 0 absent; -1 invalid

    @property
    def present(self) -> np.ndarray:
        return self.family != 0

    @property
    def ok(self) -> np.ndarray:
        return self.family > 0


def _address_column(chunks: list[pa.Array], n: int) -> _Addresses:
    if not chunks:
        return _address_chunk(pa.nulls(n))
    parts = [_address_chunk(chunk) for chunk in chunks]
    return _Addresses(
        pa.chunked_array([c for p in parts for c in p.normalized.chunks], ADDRESS_TYPE),
        np.concatenate([p.family for p in parts]),
    )


ADDRESS_TYPE = pa.dictionary(pa.int32(), pa.string())
NO_ADDRESSES = pa.array([], pa.string())


def _address_chunk(array: pa.Array) -> _Addresses:
    """Validate and normalize each distinct address once (dictionary encoding), not each row."""
    if not _holds_text(array):
        no_text = pa.DictionaryArray.from_arrays(pa.nulls(len(array), pa.int32()), NO_ADDRESSES)
        invalid = np.where(_valid(array), -1, 0).astype(np.int8)
        return _Addresses(pa.chunked_array([no_text]), invalid)
    encoded = _dictionary(array)
    checked = [_normalize_address(text) for text in encoded.dictionary.to_pylist()]
    normalized = pa.array([text for text, _ in checked], pa.string())
    families = np.array([family for _, family in checked] + [0], dtype=np.int8)
    indices = encoded.indices.cast(pa.int32())
    absent_as_last = indices if indices.null_count == 0 else indices.fill_null(len(checked))
    return _Addresses(
        pa.chunked_array([pa.DictionaryArray.from_arrays(indices, normalized)]),
        families[absent_as_last.to_numpy()],
    )


def _normalize_address(text: str) -> tuple[str | None, int]:
    # each file's dictionary holds a few dozen addresses, ~100 k lookups an hour: through the
    # cache, but text longer than any address (junk, or padding) is checked without it
    return _checked_address(text) if len(text) <= MAX_ADDRESS_TEXT else _checked_address.__wrapped__(text)


def canonical_address(text: str) -> str | None:
    """The one spelling of an address that flows are stored with (compressed lowercase IPv6,
    IPv4-mapped IPv6 as IPv4), or None when it is not an address: for inventories to match."""
    return _normalize_address(text)[0]


# Flow files of one cluster repeat the same few thousand addresses: remember them across files.
@functools.lru_cache(maxsize=1 << 16)
def _checked_address(text: str) -> tuple[str | None, int]:
    text = text.strip()
    if not text:
        return None, 0
    if len(text) > MAX_ADDRESS_TEXT:
        return None, -1
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None, -1
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address), address.version
