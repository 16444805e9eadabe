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

import functools
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.contract import clocks as K
from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.analysis import AnalysisError
from timeline.analysis import producers as PD
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


class Graph:
    """``edges``' answer. Per task (index into ``tasks``): ``held_by``, the producer of
    its gating edge (-1: none), and ``held_kind`` its ``EdgeKind`` (-1: none);
    ``latest``, its latest data producer's end (``MISSING``: none); ``violations``, the
    tasks whose wait ended before a producer was ready (``cross_rank``: those with such
    a producer on another rank, beyond the two ranks' alignment uncertainty);
    ``missing``, the data edges whose producer has no row; ``producers``, the compact
    data producers (``timeline.analysis.producers``). The edge list (``consumer``,
    ``producer``, ``kind``, ``slack``, ``gating`` per edge, ``gate`` per task: its
    gating edge's index, -1 for none) is built on first use only: the edges table
    needs it, the critical path, explain and the replay do not (an all-reduce names
    millions of edges)."""

    def __init__(self, spec, tasks, prod, held_by, held_kind, latest, previous, violations, missing, cross_rank,
                 order):
        self.spec, self.tasks, self.producers = spec, tasks, prod
        self.held_by, self.held_kind, self.latest = held_by, held_kind, latest
        self.previous = previous  # per task: the task its CTA ran just before (-1: none)
        self.violations, self.missing, self.cross_rank = violations, missing, cross_rank
        self.gate_order = order  # per task: its gating edge's place in the edges table's order (-1: none)

    @property
    def edge_count(self) -> int:
        """How many rows the edge list has, without building it."""
        p = self.producers
        if p is None:
            return 0
        size = np.bincount(p.member_group, minlength=p.groups)
        return int((p.group < 0).sum() + size[p.group[p.group >= 0]].sum() + (self.previous >= 0).sum())

    @functools.cached_property
    def _listed(self):
        return _edge_list(self)

    consumer = property(lambda self: self._listed[0])
    producer = property(lambda self: self._listed[1])
    kind = property(lambda self: self._listed[2])  # EdgeKind values (int8)
    slack = property(lambda self: self._listed[3])
    gating = property(lambda self: self._listed[4])  # per edge
    gate = property(lambda self: self._listed[5])  # per task: its gating edge, -1 for none


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


def _data_edges(spec, m: Tasks):
    """Every data / all-reduce edge ``(consumer, producer, kind)`` of the graph, in the
    edges table's order: per consumer stage and rule in the graph's order (an
    all-reduce rule: per producer rank), consumer-major, producers in task order."""
    first, rows = PD.stage_rows(spec)
    lookup, ranks = PD.task_lookup(m, first, rows)
    counts = [c for _, c in spec.stages]
    cons, prod, kind = [], [], []
    for consumer, rules in spec.graph.items():
        c = np.flatnonzero(m.stage == spec.stage_index(consumer))
        for rule in rules:
            ps = spec.stage_index(rule.stage)
            rep, ptask = PD.listed_pairs(rule, m, c) if rule.listed else PD.rule_pairs(rule, m, c, counts[ps])
            for r in (range(ranks) if rule.allreduce else [None]):
                rank = m.rank[rep] if r is None else np.full(rep.size, r, dtype=np.int64)
                p = lookup(rank, m.launch[rep], first[ps] + ptask)
                cons.append(rep[p >= 0])
                prod.append(p[p >= 0])
                kind.append(np.full(int((p >= 0).sum()), EdgeKind.ALL_REDUCE if rule.allreduce else EdgeKind.DATA,
                                    dtype=np.int8))
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    return cat(cons, np.int64), cat(prod, np.int64), cat(kind, np.int8)


def cta_order(m: Tasks):
    """The implicit edges: each task's predecessor on its (rank, launch, CTA), by start."""
    known = np.flatnonzero(m.cta >= 0)
    order = known[np.lexsort((m.task[known], m.stage[known], m.start[known], m.cta[known], m.launch[known],
                              m.rank[known]))]
    same = ((m.rank[order][1:] == m.rank[order][:-1]) & (m.launch[order][1:] == m.launch[order][:-1])
            & (m.cta[order][1:] == m.cta[order][:-1]))
    return order[1:][same], order[:-1][same]


def edges(trace) -> Graph:
    """The trace against its spec's task graph (see the module docstring), linear in
    the tasks: a rule naming every task of a stage is one grouped maximum
    (``timeline.analysis.producers``), never a list of its edges."""
    spec = trace.spec
    if not spec.graph:
        raise AnalysisError(f"spec {spec.kernel!r} declares no task graph (Spec(graph=...), timeline.contract.graph); "
                            "attach one with `timeline set-graph` or Trace.with_graph")
    m = merged_tasks(trace)
    z = np.zeros(0, dtype=np.int64)
    if m.n == 0:
        return Graph(spec, m, None, z, z, z, z, z, 0, z, z)
    prod = PD.producers(spec, m)
    top = PD.maximum(prod, m.end, R.MISSING)  # the latest producer (ties: the first in (rank, stage, task))
    latest = top.value
    data_gated = latest > m.wait_start
    oc, op = cta_order(m)
    prev = np.full(m.n, -1, dtype=np.int64)
    prev[oc] = op
    held_by = np.where(data_gated, top.producer, prev)
    held_kind = np.where(data_gated, prod.rule_kind[np.maximum(top.rule, 0)],
                         np.where(prev >= 0, int(EdgeKind.CTA_ORDER), -1)).astype(np.int64)
    order = _gate_order(m, prod, top, data_gated, oc)
    bad, cross = _violations(trace, m, prod)
    return Graph(spec, m, prod, held_by, held_kind, latest, prev, bad, prod.missing, cross, order)


def _gate_order(m: Tasks, prod, top, data_gated: np.ndarray, oc: np.ndarray) -> np.ndarray:
    """Per task, a key ordering the gating edges as the edges table lists them: data
    edges by (rule, producer rank for an all-reduce rule, consumer), then the
    ``cta-order`` edges in their order; -1 for a task nothing gated."""
    ranks = int(m.rank.max()) + 1
    rule = np.maximum(top.rule, 0)
    sub = np.where(prod.rule_ranked[rule] if prod.rule_ranked.size else False, m.rank[np.maximum(top.producer, 0)], 0)
    out = np.where(data_gated, (rule * ranks + sub) * m.n + np.arange(m.n), -1)
    cta = ~data_gated[oc]
    out[oc[cta]] = prod.rule_kind.size * ranks * m.n + np.flatnonzero(cta)
    return out


def _violations(trace, m: Tasks, prod):
    """The tasks whose wait ended before a producer was ``ready`` (beyond the ranks'
    alignment uncertainty), and those with such a producer on another rank."""
    ready, _ = PD.reference_values(prod, m.ready, R.MISSING)
    cons = prod.consumer
    late = ready - _tolerance(trace, m, m.rank[cons], prod.rank)
    bad = m.wait_end[cons] < late
    return np.unique(cons[bad]), np.unique(cons[bad & (m.rank[cons] != prod.rank)])


def _edge_list(g: Graph):
    """The edge list ``(consumer, producer, kind, slack, gating, gate)`` of ``g`` (see
    ``Graph``): every data edge then every ``cta-order`` edge, one row each."""
    m = g.tasks
    if m.n == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z.astype(np.int8), z, z.astype(bool), z
    dc, dp, dk = _data_edges(g.spec, m)
    oc, op = cta_order(m)
    cons = np.concatenate([dc, oc])
    prod = np.concatenate([dp, op])
    kind = np.concatenate([dk, np.full(oc.size, EdgeKind.CTA_ORDER, dtype=np.int8)])
    data_gated = g.latest > m.wait_start
    gate = np.full(m.n, -1, dtype=np.int64)
    lead = np.flatnonzero(data_gated[dc] & (dp == g.held_by[dc]))
    _, at = np.unique(dc[lead], return_index=True)  # the first edge to the gating producer
    gate[dc[lead[at]]] = lead[at]
    cta_gated = ~data_gated[oc]
    gate[oc[cta_gated]] = dc.size + np.flatnonzero(cta_gated)
    # slack: how much later the producer could end with the consumer unmoved
    latest = g.latest
    deadline_data = np.where(data_gated, latest, m.wait_start)
    slack = np.where(hands_off(kind), deadline_data[cons] - m.end[prod],
                     m.start[cons] - m.end[prod] + np.maximum(latest[cons] - m.wait_start[cons], 0) * data_gated[cons])
    gating = np.zeros(cons.size, dtype=bool)
    gating[gate[gate >= 0]] = True
    slack[gating] = 0
    return cons, prod, kind, slack, gating, gate


def first_gated_by(g: Graph, tasks) -> tuple | None:
    """The first gating edge, in the edges table's order, whose producer is one of
    ``tasks``: ``(producer, consumer, EdgeKind)``, or None."""
    hit = np.flatnonzero((g.gate_order >= 0) & np.isin(g.held_by, tasks))
    if not hit.size:
        return None
    c = int(hit[np.argmin(g.gate_order[hit])])
    return int(g.held_by[c]), c, EdgeKind(int(g.held_kind[c]))


def _tolerance(trace, m: Tasks, consumer_rank: np.ndarray, producer_rank: np.ndarray) -> np.ndarray:
    """Per edge, the ns by which its consumer's wait may end before its producer's
    ``ready`` and still be consistent: the two ranks' alignment uncertainties
    (``timeline.contract.clocks.uncertainty_by_rank``) where the edge crosses ranks, else 0
    (one rank, one clock)."""
    u = K.uncertainty_by_rank(trace)
    per_rank = np.zeros(int(max(m.rank.max(), max(u, default=0))) + 1)
    for r, v in u.items():
        per_rank[r] = v
    table = np.ceil(per_rank[:, None] + per_rank[None, :]).astype(np.int64)  # (consumer rank, producer rank)
    np.fill_diagonal(table, 0)
    return table[consumer_rank, producer_rank]


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
    return chain(g, launch, rank)[::-1]


def handoffs(g: Graph, launch: int, rank: int | None = None) -> list:
    """The hand-offs on ``launch``'s critical path, in time order: the ``Step``s whose
    producer's results ended the task's wait. The exact path's ``wait`` rows, the
    exports' flow arrows and the Gantt's arrows are these."""
    return [s for s in path_steps(g, launch, rank) if s.handoff]


def chain(g: Graph, launch: int, rank: int | None = None) -> list:
    """The critical path of ``launch`` as ``Step``s, from the task that ends last (on
    ``rank``, or any rank) back along gating edges to one nothing gated."""
    m = g.tasks
    pick = (m.launch == launch) & ((m.rank == rank) if rank is not None else True)
    if not pick.any():
        return []
    cur = int(np.flatnonzero(pick)[np.argmax(m.end[pick])])
    out, seen = [], set()
    while cur >= 0 and cur not in seen:
        seen.add(cur)
        p, k = int(g.held_by[cur]), int(g.held_kind[cur])
        out.append(Step(cur, p, EdgeKind(k)) if p >= 0 else Step(cur, -1, None))
        cur = p
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
        "order": R.arrow(np.arange(len(rows), dtype=np.int32)), "rank": R.arrow(m.rank[idx].astype(np.int16)),
        "stage": GR.stage_strings(spec, m.stage[idx]), "task": R.arrow(m.task[idx].astype(np.int32)),
        "cta": R.arrow(m.cta[idx].astype(np.int32), m.cta[idx] < 0), "start_ns": R.arrow(s), "end_ns": R.arrow(e),
        "kind": R.strings([r[3] for r in rows]), "duration_ns": R.arrow(e - s),  # R.*: pa.array imports pandas
        "via": R.strings([r[4] for r in rows]),
    }, schema=PATH_SCHEMA)


def path_shares(path: pa.Table) -> pa.Table:
    """Per stage on a path: its time on the path (µs, work and waits charged to the
    waiting stage) and its share of the path's length."""
    stage = path.column("stage").to_pylist()
    dur = R.numpy(path.column("duration_ns"))
    total = float(dur.sum()) or 1.0
    names = list(dict.fromkeys(stage))
    per = [float(dur[[s == n for s in stage]].sum()) for n in names]
    per = np.asarray(per, dtype=np.float64)  # R.*, not a table of lists: that imports pandas
    return pa.table({"stage": R.strings(names), "path_us": R.arrow(per / 1e3), "share": R.arrow(per / total)})


def edges_per_stage(trace, g: Graph) -> pa.Table:
    """Per stage: tasks, how many each kind of edge held, the median slack of the
    edges that did not, and the causality violations (``timeline edges``'s table, per
    launch of a run too)."""
    m = g.tasks
    held = g.held_kind
    rows = []
    for si, name in enumerate(trace.spec.stage_names):
        mine = m.stage == si
        if not mine.any():
            continue
        free = ~g.gating & (m.stage[g.consumer] == si)
        rows.append({"stage": name, "tasks": int(mine.sum()),
                     **{f"held by {k.label}": int((held[mine] == k).sum()) for k in EdgeKind},
                     "held by nothing": int((held[mine] < 0).sum()),
                     "slack p50_us": float(np.median(g.slack[free])) / 1e3 if free.any() else None,
                     "violations": int(np.isin(np.flatnonzero(mine), g.violations).sum())})
    return pa.Table.from_pylist(rows)
