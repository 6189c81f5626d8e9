"""Ingest against the simulator's noise record: every good record kept once, every malformed row
quarantined, every injected duplicate dropped."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from prism_core.evaluate.figures import Figure


def score(truth: dict[str, pa.Table], warehouse: dict[str, pa.Table], noise: dict) -> dict[str, Figure]:
    flows = warehouse["flows"].num_rows
    quarantined = warehouse["quarantine"].num_rows
    stats = warehouse.get("ingest_stats")
    duplicates = int(pc.sum(stats["duplicates"]).as_py() or 0) if stats is not None else 0
    records, malformed, injected = noise["records"], noise["malformed_total"], noise["duplicates"]
    return {
        "records_kept": Figure.share(flows, records, target=1.0),
        "flows_rows": Figure(flows),
        "malformed_quarantined": Figure.share(quarantined, malformed, target=1.0),
        "quarantine_rows": Figure(quarantined),
        "duplicates_dropped": Figure.share(duplicates, injected, target=1.0),
        "rows_unaccounted": Figure(
            abs(noise["rows_written"] - flows - quarantined - duplicates), target=0, at_most=True
        ),
    }
