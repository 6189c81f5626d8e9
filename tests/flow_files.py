"""Flow records written as the files an exporter would produce, for the ingest tests."""

from __future__ import annotations

import csv
import io
import json

from prism_core.schema import FLOW_OPTIONAL, FLOW_REQUIRED

FIELDS = FLOW_REQUIRED + FLOW_OPTIONAL


def field_text(value) -> str:
    """A record's value as it would stand in a CSV field."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def csv_file(records: list[dict], columns: tuple[str, ...] = FIELDS) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([field_text(record.get(name)) for name in columns])
    return out.getvalue().encode()
