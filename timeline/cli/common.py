"""What every ``timeline`` command shares: its usage error, the checks of the files
a command line names (an output trace path, an output folder, a spec), loading a
trace with its notes, and the title line above a report. The command modules
(``commands``, ``graph_commands``, ``info_commands``) import these; none imports
another command module's helpers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from timeline.contract import schema as S
from timeline.core.trace import TRACE_EXTENSIONS, file_format
from timeline.errors import TimelineError

__all__ = ["SYNTH_MAX_ROWS", "UsageError", "load_spec", "load_trace", "out_dir_exists", "stage_list", "trace_out"]



SYNTH_MAX_ROWS = 20_000_000  # synth's model holds every row in memory: bound what one command asks


class UsageError(TimelineError):
    """A command line that names something the input does not have."""


def trace_out(path: str) -> Path:
    """An output trace path: a known extension and an existing folder."""
    p = Path(path)
    if p.suffix.lower() not in TRACE_EXTENSIONS:
        raise UsageError(f"output {path!r}: a trace file ends in .arrow (Arrow IPC) or .parquet")
    out_dir_exists(p)
    return p


def out_dir_exists(p: Path):
    """An output path the command can write without blocking: its folder exists and
    it is a new or regular file (not a FIFO, whose open would wait for a reader)."""
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {str(p)!r}: folder {str(parent)!r} does not exist")
    if p.exists() and not p.is_file():
        raise UsageError(f"cannot write {str(p)!r}: it is not a regular file (a folder, FIFO or device); "
                         "give a file name")


def load_trace(path: str):
    """``timeline.load``, its notes (what it could not check) printed to stderr."""
    from timeline.core.trace import load

    trace = load(path)
    for note in trace.notes:
        print(f"note: {note}", file=sys.stderr)
    return trace


def load_spec(path: str) -> S.Spec:
    """A Spec from a JSON file (``Spec.to_json`` / docs/FORMAT.md), or from an existing
    trace file's metadata."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"spec file {path!r} does not exist")
    if p.is_dir():
        raise UsageError(f"spec {path!r} is a folder; give the spec JSON file")
    if file_format(p) is not None:
        return load_trace(path).spec
    try:
        d = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"spec file {path!r} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or "kernel" not in d or "stages" not in d:
        raise UsageError(
            f"spec file {path!r} is not a timeline spec: it needs at least \"kernel\" and "
            "\"stages\" ([[name, task_count], ...]); see docs/FORMAT.md or Spec.to_json()")
    try:
        return S.Spec.from_dict(d)
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, S.SpecError):
            raise
        raise S.SpecError(f"spec file {path!r}: {e}") from None


def stage_list(text: str):
    """``qkv_a:164,cache:1,...`` as ``[(name, count), ...]`` (``--stages`` of import-legacy and run add)."""
    out = []
    for part in text.split(","):
        name, _, count = part.strip().partition(":")
        if not name or not count.strip().isdigit():
            raise UsageError(f"--stages {text!r}: give NAME:COUNT pairs, e.g. qkv_a:164,cache:1")
        out.append((name, int(count)))
    return out


def source_of(path: str, args):
    """The trace file or run at ``path`` (``timeline.query.source``) read as the command
    line says (``--skip-damaged``, ``--engine`` ...), what opening it left out or could
    not check said on stderr."""
    from timeline.query.source import Options, open_source

    opts = Options(skip_damaged=bool(getattr(args, "skip_damaged", False)), engine=getattr(args, "engine", None) or
                   "local", scheduler=getattr(args, "scheduler", None), workers=getattr(args, "workers", None))
    src = open_source(path, opts)
    for note in src.notes:
        print(f"{'warning' if src.kind == 'run' else 'note'}: {note}", file=sys.stderr)
    return src


def selection_of(args, *, stages: bool = False, launches: bool = True):
    """The ``Selection`` the command line's --launch / --step / --layer / --rank (and
    ``--stage`` with ``stages``) name (``launches=False``: --launch left out)."""
    from timeline.query.source import Selection

    return Selection(getattr(args, "launch", None) if launches else None, getattr(args, "step", None),
                     getattr(args, "layer", None), getattr(args, "rank", None),
                     getattr(args, "stage", None) if stages else None)


def confidence_of(args) -> float:
    """The level ``--confidence`` gives (``gate.parse_confidence``'s grammar; default
    ``stats.LEVEL``)."""
    from timeline.analysis import gate as GT
    from timeline.analysis import stats as ST

    text = getattr(args, "confidence", None)
    return ST.LEVEL if text is None else GT.parse_confidence(text)


def reproduce(args) -> str:
    """The command line that gives this command's document again, as printed (the
    arguments as given, ``--json`` added where missing)."""
    import shlex

    argv = list(getattr(args, "argv", []))
    return "timeline " + shlex.join(argv + ([] if "--json" in argv else ["--json"]))
