"""Issue records and the `issues` table.

An issue that crosses an hour boundary keeps its id (a hash of job, kind, subject and start) and
each hour's row carries that hour's waste, so the sum over rows with one `issue_id` is the
issue's total.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from prism_core.schema import ISSUES

from .params import DEFAULT_PARAMS, DiagnosisParams

ALWAYS_CRITICAL = ("hang", "restart")  # the whole job stands still


@dataclass(frozen=True)
class Issue:
    """One row of the ISSUES table."""

    issue_id: str
    job_id: str
    kind: str
    subject: str
    start: int  # ns
    end: int  # ns
    severity: str
    confidence: float
    wasted_gpu_s: float
    evidence: str  # JSON

    @classmethod
    def of(cls, job_id: str, kind: str, subject: str, start_ns: int, end_ns: int, *, share: float,
           confidence: float, wasted_gpu_s: float, evidence: dict, params: DiagnosisParams) -> Issue:
        """An issue whose impact is `share` of the step time (its severity band), with its evidence
        as JSON (floats to 6 significant digits)."""
        return cls(
            issue_id=issue_id(job_id, kind, subject, start_ns),
            job_id=job_id,
            kind=kind,
            subject=subject,
            start=int(start_ns),
            end=int(max(end_ns, start_ns)),
            severity="critical" if kind in ALWAYS_CRITICAL else severity(share, params),
            confidence=float(np.clip(confidence, 0.0, 1.0)),
            wasted_gpu_s=float(wasted_gpu_s),
            evidence=json.dumps(_rounded(evidence), sort_keys=True),
        )


def issues_table(issues: list[Issue]) -> pa.Table:
    if not issues:
        return ISSUES.empty_table()
    columns = {field.name: [getattr(issue, field.name) for issue in issues] for field in fields(Issue)}
    for name in ("start", "end"):
        columns[name] = pa.array(columns[name], pa.int64()).cast(ISSUES.field(name).type)
    return pa.table(columns, schema=ISSUES)


def issue_id(job_id: str, kind: str, subject: str, start_ns: int) -> str:
    """Deterministic id: the same issue keeps its id on re-runs and across hours."""
    return hashlib.sha1(f"{job_id}|{kind}|{subject}|{int(start_ns)}".encode()).hexdigest()[:16]


def severity(share: float, params: DiagnosisParams = DEFAULT_PARAMS) -> str:
    """Band of an impact given as a share of the step time (see docs/waste.md)."""
    for limit, band in params.severity_bands:
        if share < limit:
            return band
    return "critical"


def confidence(margin: float) -> float:
    """0.5 at the detection threshold (margin 1), approaching 1 as the evidence grows."""
    return float(1.0 - 0.5 * np.exp(-max(margin - 1.0, 0.0)))


def _rounded(value):
    """Evidence with floats rounded to 6 significant digits and numpy scalars made plain."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(f"{float(value):.6g}") if np.isfinite(value) else None
    return value
