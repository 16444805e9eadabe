"""One error root: every documented error of the installed packages is a
``TimelineError`` (a ``ValueError``), none shadows a builtin, and the command line and
the dashboard tell a documented error from a bug with that one ``isinstance``."""

from __future__ import annotations

import ast
import builtins
import importlib

import pytest

from timeline.cli.parser import documented, main
from timeline.errors import TimelineError
from test_imports import module_files
from viewer import state as VS
from viewerkit import component_text


def error_classes() -> list:
    """``(module, class name)`` of every class named ``*Error`` the packages define."""
    out = []
    for module, path in module_files().items():
        if module.endswith("__main__"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                out.append((module, node.name))
    return out


def test_every_documented_error_is_a_timeline_error():
    found = error_classes()
    names = {name for _, name in found}
    # the ones the docs name, each found where it is defined
    assert {"SpecError", "CollectError", "LegacyError", "TraceFileError", "MergeError", "SelectionError",
            "AnalysisError", "ExportError", "UsageError", "GraphError", "ClockError", "SpanError",
            "InstrumentError", "StampBufferError", "ViewError", "SourceError", "BundleError",
            "RequestError"} <= names
    not_rooted = [f"{m}.{n}" for m, n in found
                  if not issubclass(getattr(importlib.import_module(m), n), TimelineError)]
    assert not not_rooted, f"documented errors outside the root: {not_rooted}"
    assert issubclass(TimelineError, ValueError)


def test_no_error_shadows_a_builtin():
    shadowing = [f"{m}.{n}" for m, n in error_classes() if hasattr(builtins, n)]
    assert not shadowing


def test_the_cli_tells_documented_errors_from_bugs(capsys, tmp_path):
    from timeline.analysis import AnalysisError
    from timeline.ingest import CollectError

    assert documented(AnalysisError("x")) and documented(CollectError("x"))
    assert not documented(ValueError("x")) and not documented(KeyError("x"))
    # a documented error from deep inside a command is one line, exit status 2
    assert main(["summary", str(tmp_path / "none.arrow")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("timeline summary: error:") and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("error, shown", [
    (TimelineError("the stage 'x' is not in this trace"), "on something: the stage 'x' is not in this trace"),
    (ValueError("zero-size array"), "on something: ValueError: zero-size array"),
])
def test_the_dashboard_shows_a_documented_error_as_is_and_a_bug_by_type(error, shown):
    @VS.guarded(VS.NO, VS.ERROR)
    def on_something(x):
        raise error

    out = on_something(1)
    assert out[0] is VS.NO and component_text(out[1]) == shown
