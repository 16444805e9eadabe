"""The critical path of one launch: the chain of work, waits and idle time behind its
last end. ``critical_path`` is the one entry point: exact along the task graph's
gating edges when the trace declares one (``timeline.analysis.edges``), else a
documented heuristic (the stamps say when a wait ended, not which producer released
it). Both answer in one table schema, labelled with the method (``path_method``);
docs/CLI.md and docs/GRAPH.md give the two rules."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.analysis import AnalysisError
from timeline.analysis import edges as E
from timeline.contract import schema as S
from timeline.core import grouped as GR
from timeline.core import rows as R

_NULL = S.NS_MISSING
CRITICAL_PATH_SCHEMA = E.PATH_SCHEMA  # the one schema of a critical path, exact or heuristic
META_METHOD = b"mono_timeline.critical_path"  # schema metadata: how the path was found
EXACT, HEURISTIC = "exact", "heuristic"


def critical_path(trace, *, rank: int | None = 0, launch: int = 0, g=None) -> pa.Table:
    """The critical path of ``launch`` (``CRITICAL_PATH_SCHEMA``, rows in time order),
    labelled ``exact`` or ``heuristic`` (``path_method``). A trace with a task graph:
    ``edges.exact_path`` from the task that ends last on ``rank`` (any rank: None;
    ``g``: its ``edges.edges``, when already made). Without one: the heuristic walk
    inside ``rank`` (docs/CLI.md, "The analyses": its rule and its limits)."""
    if trace.spec.graph:
        return _labelled(E.exact_path(trace, launch=launch, rank=rank, g=g), EXACT)
    return _labelled(heuristic_path(trace, rank=rank, launch=launch), HEURISTIC)


def path_method(path: pa.Table) -> str:
    """``"exact"`` or ``"heuristic"``: how ``critical_path`` found ``path``."""
    return (path.schema.metadata or {}).get(META_METHOD, b"").decode()


def _labelled(path: pa.Table, method: str) -> pa.Table:
    return path.replace_schema_metadata({**(path.schema.metadata or {}), META_METHOD: method.encode()})


def heuristic_path(trace, *, rank: int | None = 0, launch: int = 0) -> pa.Table:
    """The heuristic critical path of one (rank, launch), for a trace without a task
    graph: walked back from the task that ends last (docs/CLI.md has the rule)."""
    spec = trace.spec
    if not spec.wait:
        raise AnalysisError(f"critical_path needs the spec's wait for producers (Spec(wait=(phase, next "
                            f"phase))); this trace declares none (phases {list(trace.phases)})")
    if rank is None:
        raise AnalysisError("the heuristic critical path stays inside one rank: give rank= (or declare the "
                            "task graph for the exact path across ranks)")
    tasks = R.select(trace.tasks, R.check(trace, [rank], [launch]))
    if tasks.num_rows == 0:
        return R.empty(CRITICAL_PATH_SCHEMA)
    m = _merged(trace, tasks)
    return _table(spec, rank, m, _walk(m, len(spec.stages)))


class _Tasks(NamedTuple):
    """One launch's tasks, waves merged (one row per (stage, task)): earliest start,
    latest end, earliest end of the wait (``hint``) and start of it (``wait``), CTA,
    stage index, and the ``(stage, task)`` keys."""

    start: np.ndarray
    end: np.ndarray
    hint: np.ndarray
    wait: np.ndarray
    cta: np.ndarray
    stage: np.ndarray
    keys: np.ndarray


def _merged(trace, tasks) -> _Tasks:
    """``_Tasks`` of the task rows, the wait read from the spec's declared ``wait``."""
    start, end = R.extent(R.phase_matrix(tasks, trace.phases))
    ff = R.inherited(R.phase_matrix(tasks, trace.phases))
    w0, w1 = (ff[:, trace.phases.index(p)] for p in trace.spec.wait)  # the wait's start, and its end
    w0 = np.where(w0 == _NULL, start, np.clip(w0, start, end))
    hint = np.where(w1 == _NULL, w0, np.clip(w1, w0, end))
    tid, nt, keys = GR.group_ids(R.column(tasks, "stage_index").astype(np.int64),
                                 R.column(tasks, "task").astype(np.int64))
    keys = np.stack(keys, axis=1)
    t_start, t_end = GR.group_min_max(tid, nt, start, end)
    t_cta = np.full(nt, R.NO_CTA, dtype=np.int64)  # a task none of whose rows has a CTA: NO_CTA
    np.maximum.at(t_cta, tid, R.column(tasks, "cta", fill=R.NO_CTA).astype(np.int64))
    return _Tasks(t_start, t_end, GR.group_min_max(tid, nt, hint, hint)[0], GR.group_min_max(tid, nt, w0, w0)[0],
                  t_cta, keys[:, 0], keys)


def _walk(m: _Tasks, nstages: int) -> list:
    """The path's rows ``(task, start, end, kind)`` in time order: walked back from the
    task that ends last, to its producer (the latest-ending task of an earlier stage
    that ended after it started) or else to its CTA's previous task."""
    nt = len(m.start)
    by_end = np.lexsort((np.arange(nt), m.end))
    prod_sorted = [by_end[m.stage[by_end] < s] for s in range(nstages)]  # per stage: earlier stages by end
    own = np.lexsort((np.arange(nt), m.start, m.cta))  # the CTA's own tasks by (cta, start, index)
    pos_in_own = np.empty(nt, dtype=np.int64)
    pos_in_own[own] = np.arange(nt)
    rows, cur, seen = [], int(by_end[-1]), set()
    while cur not in seen:
        seen.add(cur)
        rows.append((cur, m.hint[cur], m.end[cur], "work"))
        ps = prod_sorted[m.stage[cur]]
        j = np.searchsorted(m.end[ps], m.hint[cur], side="right") - 1
        if j >= 0 and m.end[ps[j]] > m.start[cur]:
            rows.append((cur, m.end[ps[j]], m.hint[cur], "wait"))
            cur = int(ps[j])
            continue
        rows.append((cur, m.wait[cur], m.hint[cur], "wait"))
        if m.wait[cur] > m.start[cur]:  # the task's own work before its wait (hint -> staged waits)
            rows.append((cur, m.start[cur], m.wait[cur], "work"))
        k = pos_in_own[cur] - 1  # the CTA's task that started just before (ties: by index)
        if k < 0 or m.cta[cur] < 0 or m.cta[own[k]] != m.cta[cur]:  # no CTA: its previous task is unknown
            break
        rows.append((cur, m.end[own[k]], m.start[cur], "idle"))
        cur = int(own[k])
    rows.reverse()
    return rows


def _table(spec, rank: int, m: _Tasks, rows: list) -> pa.Table:
    """The rows tiled (a row starts no earlier than every row before it ends; empty
    waits and idles left out) as a ``CRITICAL_PATH_SCHEMA`` table (``via`` empty: the
    heuristic does not know what released a wait)."""
    s = np.array([r[1] for r in rows], dtype=np.int64)
    e = np.array([r[2] for r in rows], dtype=np.int64)
    before = np.maximum.accumulate(e)
    s[1:] = np.maximum(s[1:], before[:-1])
    e = np.maximum(e, s)
    keep = np.array([r[3] == "work" for r in rows]) | (e > s)
    rows = [r for r, k in zip(rows, keep) if k]
    s, e = s[keep], e[keep]
    idx = np.array([r[0] for r in rows], dtype=np.int64)
    return pa.table({
        "order": pa.array(np.arange(len(rows), dtype=np.int32)),
        "rank": pa.array(np.full(len(rows), rank, dtype=np.int16)),
        "stage": GR.stage_strings(spec, m.stage[idx]),
        "task": pa.array(m.keys[idx, 1].astype(np.int32)),
        "cta": R.arrow(m.cta[idx].astype(np.int32), m.cta[idx] < 0),  # null: the task has no CTA
        "start_ns": pa.array(s),
        "end_ns": pa.array(e),
        "kind": pa.array([r[3] for r in rows], pa.string()),
        "duration_ns": pa.array(e - s),
        "via": pa.array([""] * len(rows), pa.string()),
    }, schema=CRITICAL_PATH_SCHEMA)


def path_us(path: pa.Table) -> pa.Table:
    """A critical path (``critical_path``) for reading: its identity columns
    (``order, rank, kind, stage, task, cta, via``) and ``start_us, end_us,
    duration_us`` (µs from the path's first start)."""
    keep = [c for c in ("order", "rank", "kind", "stage", "task", "cta", "via") if c in path.column_names]
    if path.num_rows == 0:
        return pa.table({c: pa.array([], path.schema.field(c).type) for c in keep})
    t0 = min(path.column("start_ns").to_pylist())
    cols = {c: path.column(c) for c in keep}
    for c in ("start", "end"):
        cols[f"{c}_us"] = pa.array((R.numpy(path.column(f"{c}_ns")) - t0) / 1e3)
    cols["duration_us"] = pa.array(R.numpy(path.column("duration_ns")) / 1e3)
    return pa.table(cols)
