"""A whole run, not one capture: a directory of Hive-partitioned Parquet holding the
task rows, per-launch aggregates, stage reports and anomalies of many captures of many
ranks (docs/RUN.md, docs/FORMAT.md). ``append`` adds a ``Trace`` (atomic, append-only,
safe with concurrent writers); ``open_run`` reads it: ``Run.launches()``,
``Run.launch(step, layer)`` -> ``Trace``, ``Run.sql(query)`` (DuckDB, embedded)."""

from timeline.run.layout import RunError
from timeline.run.read import Run, open_run
from timeline.run.write import append, create

__all__ = ["Run", "RunError", "append", "create", "open_run"]
