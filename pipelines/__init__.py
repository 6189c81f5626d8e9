"""Beam pipelines: composite PTransforms over prism_core, and the hourly run."""

import logging


class _WithoutApitoolsNotice(logging.Filter):
    """Drops the warning Beam logs on the root logger when `apache_beam` is imported without
    its GCP extras ("apitools not found, and bigquery client libraries are not available"):
    Prism uses no BigQuery client, so it is noise on every command. Only that record goes;
    every other root-logger record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("apitools not found")


# Installed here, before any module of this package imports Beam; orchestration imports this
# package first for the same reason.
logging.getLogger().addFilter(_WithoutApitoolsNotice())
