"""Dagster definitions: hourly partitioned assets over the Prism pipelines (docs/orchestration.md)."""

# Before any orchestration module imports Beam: `pipelines` filters out the apitools warning
# that Beam logs at import.
import pipelines  # noqa: F401
