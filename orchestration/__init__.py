"""Dagster definitions: hourly partitioned assets over the Prism pipelines (docs/orchestration.md)."""
