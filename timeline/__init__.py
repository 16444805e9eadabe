"""mono-timeline's core: the stamp-buffer contract (``schema``), the collector into
Arrow tables (``collect``), trace files (``load`` / ``Trace.save``), multi-rank merge,
analyses, exports and the ``timeline`` CLI. The names below are imported on first use
(``timeline --help`` needs none of numpy or pyarrow)."""

import sys
import types

from timeline._version import __version__  # noqa: F401

_LAZY = {
    "CLOCKS": "schema", "DEFAULT_PHASES": "schema", "Clock": "schema", "Layout": "schema", "Spec": "schema",
    "layout_of": "schema", "Trace": "trace", "TraceFileError": "trace", "load": "trace",
    "CollectError": "collect", "collect": "collect", "MergeError": "merge", "merge": "merge",
    "open_run": "run", "RunError": "run",
}


def __getattr__(name):
    """``timeline.Spec`` and the others of ``_LAZY``, from their modules on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'timeline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"timeline.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


class _Package(types.ModuleType):
    """The package keeps ``timeline.collect`` and ``timeline.merge`` the functions, as
    they always were, when their submodules of the same names are first imported (the
    import system then binds the submodule to the package: this takes its function)."""

    def __setattr__(self, name, value):
        if name in ("collect", "merge") and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
