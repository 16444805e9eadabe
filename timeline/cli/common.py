"""What every ``timeline`` command shares: its usage error, the checks of the files
a command line names (an output trace path, an output folder, a spec), loading a
trace with its notes, and the title line above a report. The command modules
(``commands``, ``graph_commands``, ``info_commands``) import these; none imports
another command module's helpers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from timeline.contract import clocks as K
from timeline.contract import schema as S
from timeline.core.trace import TRACE_EXTENSIONS, file_format
from timeline.errors import TimelineError

__all__ = ["SYNTH_MAX_ROWS", "UsageError", "load_spec", "load_trace", "out_dir_exists", "title", "trace_out"]


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


def title(trace) -> str:
    sp = trace.spec
    mhz = sp.clock.hz / 1e6
    lines = [f"{sp.kernel} · {sp.arch} · clock {sp.clock.name} {mhz:g} MHz · ranks {trace.ranks} · "
             f"launches {trace.launches}"]
    if sp.cycles:
        lines.append(f"hybrid clock: phases on the {sp.cycles} cycle counter, placed on {sp.clock.name} "
                     "(timeline.ingest.hybrid)")
    if trace.synthetic:
        lines.append("SYNTHETIC trace (timeline.ingest.synth model): not measured on a GPU")
    if len(trace.ranks) > 1:
        aligned = K.alignment_of(trace)
        if all(a.measured for a in aligned):
            worst = max(a.uncertainty_ns for a in aligned)
            lines.append(f"ranks aligned by their measured clocks, each within ± {worst:,.0f} ns (`timeline info`)")
        else:
            lines.append(f"ranks aligned by {aligned[0].by}: ASSUMED, the skew between ranks is not measured "
                         "(`timeline info`)")
    n = trace.anomaly_count
    if n:
        lines.append(f"anomalies: {trace.anomaly_summary()} (see `timeline info`)")
    return "\n".join(lines)
