"""mono-timeline's core, in wings by layer (each imports only the ones above it):

- ``timeline.contract``: the stamp-buffer contract (``schema``: ``Spec``, layout,
  placement word, Arrow schemas, ticks to ns), task graphs, clocks, known kernels;
- ``timeline.core``: ``Trace`` and its file (``load`` / ``Trace.save``), the row rules,
  grouped numpy primitives;
- ``timeline.ingest``: buffers and legacy tensors into a ``Trace`` (``collect``),
  multi-rank ``merge``, the synthetic model;
- ``timeline.analysis``: stage report, critical path, task-graph edges, what-if, compare;
- ``timeline.export``: Chrome JSON and Perfetto;
- ``timeline.cli``: the ``timeline`` command.

The names below are imported on first use (``timeline --help`` needs none of numpy
or pyarrow)."""

from timeline._version import __version__

# name -> the module that defines it (imported on first use)
_FACE = {
    "TimelineError": "timeline.errors",
    "CLOCKS": "timeline.contract.schema",
    "DEFAULT_PHASES": "timeline.contract.schema",
    "Clock": "timeline.contract.schema",
    "Layout": "timeline.contract.schema",
    "Spec": "timeline.contract.schema",
    "layout_of": "timeline.contract.schema",
    "Trace": "timeline.core.trace",
    "TraceFileError": "timeline.core.trace",
    "load": "timeline.core.trace",
    "CollectError": "timeline.ingest",
    "collect": "timeline.ingest.collect",
    "MergeError": "timeline.ingest.merge",
    "merge": "timeline.ingest.merge",
    "open_run": "timeline.run",
    "RunError": "timeline.run",
}

__all__ = ["__version__", *_FACE]


def __getattr__(name):
    """``timeline.Spec`` and the others of ``_FACE``, from their modules on first use."""
    if name not in _FACE:
        raise AttributeError(f"module 'timeline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_FACE[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_FACE))
