"""A trace read against its task graph (``Spec.graph``, ``timeline.contract.graph``): which
producer released every task's wait, the slack of every other edge, the tasks that
saw data before it could exist (causality violations), and the exact critical path.

Definitions, per task (its waves merged: one row per (rank, launch, stage, task)):
``start`` its earliest stamp, ``end`` its latest, ``wait_start`` / ``wait_end`` the
spec's declared wait (``Spec.wait``; a missing phase inherits), ``ready`` the last
phase before ``end`` (its results are published between ``ready`` and ``end``).

Edges into a consumer: one ``data`` edge per producer task its rules name (an
``all-reduce`` rule: that task on every rank of the launch), and the implicit
``cta-order`` edge from the task its CTA ran just before. The **gating** edge is the
data edge of the latest-ending producer when that end is after the consumer began
waiting (it held the wait), else the ``cta-order`` edge (the CTA was busy: the
producers were ready first), else none (the task opened its CTA's launch). Ties go
to the producer earliest in (rank, stage, task) order. An edge's ``slack_ns``: how
much later its producer could have ended without moving the consumer (0 for the
gating edge). A consumer whose ``wait_end`` is before a data producer's ``ready``
is a **causality violation**: a wrong graph, a wrong declared wait, or ranks not
aligned.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.contract import clocks as K
from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.analysis import AnalysisError
from timeline.contract.graph import EDGE_LABELS, EdgeKind, hands_off

KINDS = EDGE_LABELS  # an edge's kind in the edges table, by EdgeKind value
EDGES_SCHEMA = pa.schema([
    ("rank", pa.int16()), ("launch", pa.int32()), ("stage", pa.string()), ("task", pa.int32()),
    ("producer_rank", pa.int16()), ("producer_stage", pa.string()), ("producer_task", pa.int32()),
    ("kind", pa.string()), ("producer_end_ns", pa.int64()), ("slack_ns", pa.int64()), ("gating", pa.bool_()),
])


class Tasks(NamedTuple):
    """A trace's tasks, waves merged, as numpy arrays (one entry per task)."""

    rank: np.ndarray
    launch: np.ndarray
    stage: np.ndarray  # stage index
    task: np.ndarray
    cta: np.ndarray  # -1 where unknown
    start: np.ndarray
    end: np.ndarray
    wait_start: np.ndarray
    wait_end: np.ndarray
    ready: np.ndarray

    @property
    def n(self) -> int:
        return len(self.rank)


class Graph(NamedTuple):
    """``edges``' answer: the merged tasks, every edge as parallel arrays (consumer and
    producer task indices, ``EdgeKind``, slack, gating), each task's
    gating edge (-1: none), the tasks whose wait ended before a producer was ready
    (``violations``; ``cross_rank``: those with such a producer on another rank,
    beyond the two ranks' alignment uncertainty), and data edges whose producer has
    no row (``missing``)."""

    tasks: Tasks
    consumer: np.ndarray
    producer: np.ndarray
    kind: np.ndarray  # EdgeKind values (int8)
    slack: np.ndarray
    gating: np.ndarray  # per edge
    gate: np.ndarray  # per task: its gating edge, -1 for none
    violations: np.ndarray  # task indices
    missing: int
    cross_rank: np.ndarray = np.zeros(0, dtype=np.int64)  # the violations with a producer on another rank


def merged_tasks(trace) -> Tasks:
    """``Tasks`` of the trace, the declared wait and ``ready`` read from its spec."""
    spec = trace.spec
    if not spec.wait:
        raise AnalysisError("the task graph's edges need the spec's wait for producers (Spec(wait=(phase, next "
                            f"phase))); this trace declares none (phases {list(trace.phases)})")
    t = trace.tasks
    ns = R.phase_matrix(t, trace.phases)
    start, end = R.extent(ns)
    ff = R.inherited(ns)
    w0, w1 = (ff[:, trace.phases.index(p)] for p in spec.wait)
    w0 = np.where(w0 == R.MISSING, start, np.clip(w0, start, end))
    w1 = np.where(w1 == R.MISSING, w0, np.clip(w1, w0, end))
    ready = ff[:, max(len(trace.phases) - 2, 0)]
    ready = np.where(ready == R.MISSING, end, np.minimum(ready, end))
    cols = [R.column(t, c).astype(np.int64) for c in ("rank", "launch", "stage_index", "task")]
    gid, ng, keys = GR.group_ids(*cols)
    lo, hi = GR.group_min_max(gid, ng, start, end)
    ws, _ = GR.group_min_max(gid, ng, w0, w0)
    we, rd = GR.group_min_max(gid, ng, w1, ready)
    cta = np.full(ng, R.NO_CTA, dtype=np.int64)  # any wave's CTA; NO_CTA where no row has one
    np.maximum.at(cta, gid, R.column(t, "cta", fill=R.NO_CTA).astype(np.int64))
    return Tasks(*keys, cta, lo, hi, ws, we, rd)


def _task_index(m: Tasks, first: np.ndarray, rows: int):
    """``lookup(rank, launch, row) -> task index`` (-1 where absent), ``row`` =
    ``first[stage] + task``, over a dense (rank, launch, row) array."""
    ranks, launches = int(m.rank.max()) + 1, int(m.launch.max()) + 1
    table = np.full((ranks, launches, rows), -1, dtype=np.int64)
    table[m.rank, m.launch, first[m.stage] + m.task] = np.arange(m.n)

    def lookup(rank, launch, row):
        ok = (rank >= 0) & (rank < ranks)
        out = np.full(len(row), -1, dtype=np.int64)
        out[ok] = table[rank[ok], launch[ok], row[ok]]
        return out

    return lookup, ranks


def _data_edges(spec, m: Tasks):
    """Every data / all-reduce edge ``(consumer, producer, kind)`` of the graph, and
    how many name a producer task with no row."""
    counts = [c for _, c in spec.stages]
    first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    lookup, ranks = _task_index(m, first, int(sum(counts)))
    cons, prod, kind, missing = [], [], [], 0
    for consumer, rules in spec.graph.items():
        c = np.flatnonzero(m.stage == spec.stage_index(consumer))
        for rule in rules:
            ps = spec.stage_index(rule.stage)
            rep, ptask = _listed_producers(rule, m, c) if rule.listed else _rule_producers(rule, m, c, counts[ps])
            row = first[ps] + ptask
            for r in (range(ranks) if rule.allreduce else [None]):
                rank = m.rank[rep] if r is None else np.full(rep.size, r, dtype=np.int64)
                p = lookup(rank, m.launch[rep], row)
                missing += int((p < 0).sum())
                cons.append(rep[p >= 0])
                prod.append(p[p >= 0])
                kind.append(np.full(int((p >= 0).sum()), EdgeKind.ALL_REDUCE if rule.allreduce else EdgeKind.DATA,
                                    dtype=np.int8))
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    return cat(cons, np.int64), cat(prod, np.int64), cat(kind, np.int8), missing


def _rule_producers(rule, m: Tasks, c: np.ndarray, producer_count: int):
    """``(consumer, producer task)`` of every edge a shaped rule gives consumers ``c``."""
    n = rule.n(producer_count)
    return np.repeat(c, n), np.repeat(np.asarray(rule.lo(m.task[c])), n) + np.tile(np.arange(n), c.size)


def _listed_producers(rule, m: Tasks, c: np.ndarray):
    """``(consumer, producer task)`` of every listed edge (``graph.listed``) whose
    (launch, consumer task) is one of consumers ``c``'s; launch -1 matches every launch."""
    p = np.array(rule.pairs, dtype=np.int64).reshape(-1, 3)
    every = p[p[:, 0] < 0]
    launches = np.unique(m.launch[c])
    p = np.concatenate([p[p[:, 0] >= 0], np.column_stack([np.repeat(launches, len(every)),
                                                          np.tile(every[:, 1:], (launches.size, 1))])])
    span = int(max(p[:, 1].max(initial=0), m.task[c].max(initial=0))) + 1
    key = p[:, 0] * span + p[:, 1]
    order = np.argsort(key, kind="stable")
    key, ptask = key[order], p[order, 2]
    ckey = m.launch[c] * span + m.task[c]
    left, right = np.searchsorted(key, ckey, "left"), np.searchsorted(key, ckey, "right")
    n = right - left
    at = np.repeat(left - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    return np.repeat(c, n), ptask[at]


def _cta_order(m: Tasks):
    """The implicit edges: each task's predecessor on its (rank, launch, CTA), by start."""
    known = np.flatnonzero(m.cta >= 0)
    order = known[np.lexsort((m.task[known], m.stage[known], m.start[known], m.cta[known], m.launch[known],
                              m.rank[known]))]
    same = ((m.rank[order][1:] == m.rank[order][:-1]) & (m.launch[order][1:] == m.launch[order][:-1])
            & (m.cta[order][1:] == m.cta[order][:-1]))
    return order[1:][same], order[:-1][same]


def edges(trace) -> Graph:
    """The trace against its spec's task graph (see the module docstring)."""
    spec = trace.spec
    if not spec.graph:
        raise AnalysisError(f"spec {spec.kernel!r} declares no task graph (Spec(graph=...), timeline.contract.graph); "
                            "attach one with `timeline set-graph` or Trace.with_graph")
    m = merged_tasks(trace)
    if m.n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Graph(m, z, z, z.astype(np.int8), z, z.astype(bool), z, z, 0)
    dc, dp, dk, missing = _data_edges(spec, m)
    oc, op = _cta_order(m)
    cons = np.concatenate([dc, oc])
    prod = np.concatenate([dp, op])
    kind = np.concatenate([dk, np.full(oc.size, EdgeKind.CTA_ORDER, dtype=np.int8)])
    # the latest data producer of every consumer (ties: the earliest in (rank, stage, task))
    lead, latest = _latest_producers(m, dc, dp)
    data_gated = latest > m.wait_start
    gate = np.full(m.n, -1, dtype=np.int64)
    gate[dc[lead][data_gated[dc[lead]]]] = lead[data_gated[dc[lead]]]
    cta_gated = ~data_gated[oc]
    gate[oc[cta_gated]] = dc.size + np.flatnonzero(cta_gated)
    # slack: how much later the producer could end with the consumer unmoved
    deadline_data = np.where(data_gated, latest, m.wait_start)
    slack = np.where(hands_off(kind), deadline_data[cons] - m.end[prod],
                     m.start[cons] - m.end[prod] + np.maximum(latest[cons] - m.wait_start[cons], 0) * data_gated[cons])
    gating = np.zeros(cons.size, dtype=bool)
    gating[gate[gate >= 0]] = True
    slack[gating] = 0
    bad = m.wait_end[dc] < m.ready[dp] - _tolerance(trace, m, dc, dp)
    cross = m.rank[dc] != m.rank[dp]
    return Graph(m, cons, prod, kind, slack, gating, gate, np.unique(dc[bad]), missing, np.unique(dc[bad & cross]))


def _latest_producers(m: Tasks, dc: np.ndarray, dp: np.ndarray):
    """Per consumer with data edges, the edge of its latest-ending producer (ties: the
    producer earliest in (rank, stage, task) order, which is task-index order within
    a launch), as edge indices in consumer order, and every task's latest producer
    end (``MISSING`` for none). Linear in the edges: no sort of them."""
    latest = np.full(m.n, R.MISSING, dtype=np.int64)
    if not dc.size:
        return np.zeros(0, dtype=np.int64), latest
    pend = m.end[dp]
    np.maximum.at(latest, dc, pend)
    top = np.flatnonzero(pend == latest[dc])
    first = np.full(m.n, m.n, dtype=np.int64)
    np.minimum.at(first, dc[top], dp[top])
    top = top[dp[top] == first[dc[top]]]
    _, at = np.unique(dc[top], return_index=True)  # one edge per consumer, the first listed
    return top[at], latest


def _tolerance(trace, m: Tasks, dc: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Per data edge, the ns by which its consumer's wait may end before its producer's
    ``ready`` and still be consistent: the two ranks' alignment uncertainties
    (``timeline.contract.clocks.uncertainty_by_rank``) where the edge crosses ranks, else 0
    (one rank, one clock)."""
    u = K.uncertainty_by_rank(trace)
    per_rank = np.zeros(int(max(m.rank.max(), max(u, default=0))) + 1)
    for r, v in u.items():
        per_rank[r] = v
    table = np.ceil(per_rank[:, None] + per_rank[None, :]).astype(np.int64)  # (consumer rank, producer rank)
    np.fill_diagonal(table, 0)
    return table[m.rank[dc], m.rank[dp]]


def causality_anomalies(trace, g: Graph | None = None) -> pa.Table:
    """The causality violations as anomaly rows (``ANOMALIES_SCHEMA``), one per (rank,
    launch, stage) of the consumers: ``cross_rank_causality`` where a producer on
    another rank was ready after the wait ended (beyond the alignment uncertainty: the
    rank clocks are placed wrong), ``causality`` for the rest (a wrong graph or wait)."""
    g = g or edges(trace)
    m, rows = g.tasks, []
    cross = np.isin(g.violations, g.cross_rank)
    for kind, which in (("causality", g.violations[~cross]), ("cross_rank_causality", g.violations[cross])):
        if not which.size:
            continue
        gid, ng, (rank, launch, stage) = GR.group_ids(m.rank[which], m.launch[which], m.stage[which])
        count = np.bincount(gid, minlength=ng)
        names = trace.spec.stage_names
        rows += [(int(r), kind, int(la), names[int(st)], "", int(n), 0) for r, la, st, n in zip(rank, launch, stage, count)]
    return R.anomalies_table(rows)


def edges_table(trace, g: Graph | None = None) -> pa.Table:
    """``edges(trace)`` as an Arrow table (``EDGES_SCHEMA``), one row per edge."""
    g = g or edges(trace)
    m, names = g.tasks, trace.spec.stage_names
    return pa.table({
        "rank": pa.array(m.rank[g.consumer].astype(np.int16)), "launch": pa.array(m.launch[g.consumer].astype(np.int32)),
        "stage": GR.stage_strings(trace.spec, m.stage[g.consumer]),
        "task": pa.array(m.task[g.consumer].astype(np.int32)),
        "producer_rank": pa.array(m.rank[g.producer].astype(np.int16)),
        "producer_stage": GR.stage_strings(trace.spec, m.stage[g.producer]) if names else pa.array([], pa.string()),
        "producer_task": pa.array(m.task[g.producer].astype(np.int32)),
        "kind": R.strings(KINDS).take(pa.array(g.kind.astype(np.int64))),
        "producer_end_ns": pa.array(m.end[g.producer]), "slack_ns": pa.array(g.slack),
        "gating": pa.array(g.gating),
    }, schema=EDGES_SCHEMA)


PATH_SCHEMA = pa.schema([
    ("order", pa.int32()), ("rank", pa.int16()), ("stage", pa.string()), ("task", pa.int32()), ("cta", pa.int32()),
    ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("kind", pa.string()), ("duration_ns", pa.int64()),
    ("via", pa.string()),
])


def exact_path(trace, *, launch: int, rank: int | None = None, g: Graph | None = None) -> pa.Table:
    """The critical path of ``launch``, exact along gating edges: from the task that
    ends last (on ``rank``, or on any rank when None) back to a task nothing gated.
    Rows in time order (``PATH_SCHEMA``; docs/GRAPH.md has the rule)."""
    g = g or edges(trace)
    m = g.tasks
    rows = []
    for step in path_steps(g, launch, rank):
        cur = step.task
        if step.handoff:
            rows.append((cur, m.end[step.producer], m.wait_end[cur], "wait", step.kind.label))
        else:
            if step.producer >= 0:
                rows.append((cur, m.end[step.producer], m.start[cur], "idle", step.kind.label))
            rows.append((cur, m.start[cur], m.wait_start[cur], "work", ""))
            rows.append((cur, m.wait_start[cur], m.wait_end[cur], "wait", ""))
        rows.append((cur, m.wait_end[cur], m.end[cur], "work", ""))
    if not rows:
        return R.empty(PATH_SCHEMA)
    return _path_table(trace.spec, m, rows)


class Step(NamedTuple):
    """A task on a launch's critical path and what released it: the producer of its
    gating edge and that edge's kind (-1 and None: nothing gated it)."""

    task: int  # index into Graph.tasks
    producer: int
    kind: EdgeKind | None

    @property
    def handoff(self) -> bool:
        """The producer's results ended this task's wait (a data or all-reduce edge)."""
        return self.kind is not None and bool(hands_off(self.kind))


def path_steps(g: Graph, launch: int, rank: int | None = None) -> list:
    """The critical path of ``launch`` as ``Step``s in time order: from the task
    that ends last (on ``rank``, or any rank) back along gating edges to one nothing
    gated, then reversed."""
    out = []
    for cur, e in reversed(chain(g, launch, rank)):
        out.append(Step(cur, int(g.producer[e]), EdgeKind(int(g.kind[e]))) if e >= 0 else Step(cur, -1, None))
    return out


def handoffs(g: Graph, launch: int, rank: int | None = None) -> list:
    """The hand-offs on ``launch``'s critical path, in time order: the ``Step``s whose
    producer's results ended the task's wait. The exact path's ``wait`` rows, the
    exports' flow arrows and the Gantt's arrows are these."""
    return [s for s in path_steps(g, launch, rank) if s.handoff]


def chain(g: Graph, launch: int, rank: int | None = None) -> list:
    """The critical path of ``launch`` as ``[(task, its gating edge or -1), ...]``,
    from the task that ends last (on ``rank``, or any rank) back along gating edges
    to one nothing gated."""
    m = g.tasks
    pick = (m.launch == launch) & ((m.rank == rank) if rank is not None else True)
    if not pick.any():
        return []
    cur = int(np.flatnonzero(pick)[np.argmax(m.end[pick])])
    out, seen = [], set()
    while cur >= 0 and cur not in seen:
        seen.add(cur)
        e = int(g.gate[cur])
        out.append((cur, e))
        cur = int(g.producer[e]) if e >= 0 else -1
    return out


def _path_table(spec, m: Tasks, rows) -> pa.Table:
    idx = np.array([r[0] for r in rows], dtype=np.int64)
    s = np.array([r[1] for r in rows], dtype=np.int64)
    e = np.array([r[2] for r in rows], dtype=np.int64)
    s = np.minimum(s, e)  # a hand-off seen before the producer's end stamp lasts 0
    keep = e > s
    rows = [r for r, k in zip(rows, keep) if k]
    idx, s, e = idx[keep], s[keep], e[keep]
    return pa.table({
        "order": pa.array(np.arange(len(rows), dtype=np.int32)), "rank": pa.array(m.rank[idx].astype(np.int16)),
        "stage": GR.stage_strings(spec, m.stage[idx]), "task": pa.array(m.task[idx].astype(np.int32)),
        "cta": R.arrow(m.cta[idx].astype(np.int32), m.cta[idx] < 0), "start_ns": pa.array(s), "end_ns": pa.array(e),
        "kind": pa.array([r[3] for r in rows], pa.string()), "duration_ns": pa.array(e - s),
        "via": pa.array([r[4] for r in rows], pa.string()),
    }, schema=PATH_SCHEMA)


def path_shares(path: pa.Table) -> pa.Table:
    """Per stage on a path: its time on the path (µs, work and waits charged to the
    waiting stage) and its share of the path's length."""
    stage = path.column("stage").to_pylist()
    dur = R.numpy(path.column("duration_ns"))
    total = float(dur.sum()) or 1.0
    names = list(dict.fromkeys(stage))
    per = [float(dur[[s == n for s in stage]].sum()) for n in names]
    return pa.table({"stage": names, "path_us": [p / 1e3 for p in per], "share": [p / total for p in per]})
