"""A whole run, not one capture: a directory of Hive-partitioned Parquet holding the
task rows, per-launch aggregates, stage reports and anomalies of many captures of many
ranks (docs/RUN.md, docs/FORMAT.md). ``append`` adds a ``Trace`` (atomic, append-only,
safe with concurrent writers), ``append_file`` a trace file streamed block by block
(bounded memory); ``open_run`` reads it: ``Run.launches()``,
``Run.launch(step, layer)`` -> ``Trace``, ``Run.sql(query)`` (DuckDB, embedded).
A wing after ``ingest``: it imports contract, core, analysis and ingest, never the
``timeline`` command (every command reads a run as it reads a trace file,
``timeline.cli.source``; ``run add`` / ``run info`` are ``timeline.cli.run_commands``).
The names are imported on first use."""

_LAZY = {"RunError": "layout", "Run": "read", "open_run": "read", "append": "write", "create": "write",
         "append_file": "stream"}

__all__ = ["Run", "RunError", "append", "append_file", "create", "open_run"]


def __getattr__(name):
    """``timeline.run.open_run`` and the others of ``_LAZY``, from their modules on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'timeline.run' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"timeline.run.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
