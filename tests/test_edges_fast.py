"""The task graph's edges computed per group (``timeline.analysis.producers``: a
barrier or all-reduce is one grouped maximum, not its producer x consumer pairs)
against the former computation that listed every edge, kept here as the reference:
on random small graphs of every rule kind (every, all-reduce, same / div / block /
mod / tiles, a shared ``tiles`` row, listed edges, listed all-reduce edges) over 1-3
ranks, 1-2 launches, missing rows, tied ends and unwritten phases, the gating edge
of every task, the edge list and its slack, the causality violations and their
anomaly rows, the missing count, every launch's exact critical path (any rank and
each rank), the first gating edge out of a set of tasks (explain's culprit edge),
the grouped maximum of any per-task value, and the what-if replay to the ns (with
random changes) must be the same."""

from __future__ import annotations

import types

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bufkit import empty, put
from timeline import collect, merge
from timeline.analysis import AnalysisError
from timeline.analysis import edges as E
from timeline.analysis import producers as PD
from timeline.analysis import whatif as W
from timeline.contract import graph as G
from timeline.contract import schema as S
from timeline.contract.graph import EdgeKind, hands_off
from timeline.core import rows as R


# -- the reference: every edge listed (the computation before the grouped one) --------------------
def ref_task_index(m, first, rows):
    ranks, launches = int(m.rank.max()) + 1, int(m.launch.max()) + 1
    table = np.full((ranks, launches, rows), -1, dtype=np.int64)
    table[m.rank, m.launch, first[m.stage] + m.task] = np.arange(m.n)

    def lookup(rank, launch, row):
        ok = (rank >= 0) & (rank < ranks)
        out = np.full(len(row), -1, dtype=np.int64)
        out[ok] = table[rank[ok], launch[ok], row[ok]]
        return out

    return lookup, ranks


def ref_rule_producers(rule, m, c, producer_count):
    n = rule.n(producer_count)
    return np.repeat(c, n), np.repeat(np.asarray(rule.lo(m.task[c])), n) + np.tile(np.arange(n), c.size)


def ref_listed_producers(rule, m, c):
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


def ref_data_edges(spec, m):
    counts = [c for _, c in spec.stages]
    first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    lookup, ranks = ref_task_index(m, first, int(sum(counts)))
    cons, prod, kind, missing = [], [], [], 0
    for consumer, rules in spec.graph.items():
        c = np.flatnonzero(m.stage == spec.stage_index(consumer))
        for rule in rules:
            ps = spec.stage_index(rule.stage)
            rep, ptask = (ref_listed_producers(rule, m, c) if rule.listed
                          else ref_rule_producers(rule, m, c, counts[ps]))
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


def ref_cta_order(m):
    known = np.flatnonzero(m.cta >= 0)
    order = known[np.lexsort((m.task[known], m.stage[known], m.start[known], m.cta[known], m.launch[known],
                              m.rank[known]))]
    same = ((m.rank[order][1:] == m.rank[order][:-1]) & (m.launch[order][1:] == m.launch[order][:-1])
            & (m.cta[order][1:] == m.cta[order][:-1]))
    return order[1:][same], order[:-1][same]


def ref_latest_producers(m, dc, dp):
    latest = np.full(m.n, R.MISSING, dtype=np.int64)
    if not dc.size:
        return np.zeros(0, dtype=np.int64), latest
    pend = m.end[dp]
    np.maximum.at(latest, dc, pend)
    top = np.flatnonzero(pend == latest[dc])
    first = np.full(m.n, m.n, dtype=np.int64)
    np.minimum.at(first, dc[top], dp[top])
    top = top[dp[top] == first[dc[top]]]
    _, at = np.unique(dc[top], return_index=True)
    return top[at], latest


def ref_tolerance(trace, m, dc, dp):
    from timeline.contract import clocks as K

    u = K.uncertainty_by_rank(trace)
    per_rank = np.zeros(int(max(m.rank.max(), max(u, default=0))) + 1)
    for r, v in u.items():
        per_rank[r] = v
    table = np.ceil(per_rank[:, None] + per_rank[None, :]).astype(np.int64)
    np.fill_diagonal(table, 0)
    return table[m.rank[dc], m.rank[dp]]


def ref_edges(trace):
    """The former ``edges.edges``: every edge listed, as a namespace of its arrays."""
    spec = trace.spec
    m = E.merged_tasks(trace)
    dc, dp, dk, missing = ref_data_edges(spec, m)
    oc, op = ref_cta_order(m)
    cons = np.concatenate([dc, oc])
    prod = np.concatenate([dp, op])
    kind = np.concatenate([dk, np.full(oc.size, EdgeKind.CTA_ORDER, dtype=np.int8)])
    lead, latest = ref_latest_producers(m, dc, dp)
    data_gated = latest > m.wait_start
    gate = np.full(m.n, -1, dtype=np.int64)
    gate[dc[lead][data_gated[dc[lead]]]] = lead[data_gated[dc[lead]]]
    cta_gated = ~data_gated[oc]
    gate[oc[cta_gated]] = dc.size + np.flatnonzero(cta_gated)
    deadline_data = np.where(data_gated, latest, m.wait_start)
    slack = np.where(hands_off(kind), deadline_data[cons] - m.end[prod],
                     m.start[cons] - m.end[prod] + np.maximum(latest[cons] - m.wait_start[cons], 0) * data_gated[cons])
    gating = np.zeros(cons.size, dtype=bool)
    gating[gate[gate >= 0]] = True
    slack[gating] = 0
    bad = m.wait_end[dc] < m.ready[dp] - ref_tolerance(trace, m, dc, dp)
    cross = m.rank[dc] != m.rank[dp]
    held_by, held_kind = np.full(m.n, -1, dtype=np.int64), np.full(m.n, -1, dtype=np.int64)
    held_by[gate >= 0], held_kind[gate >= 0] = prod[gate[gate >= 0]], kind[gate[gate >= 0]]
    return types.SimpleNamespace(tasks=m, consumer=cons, producer=prod, kind=kind, slack=slack, gating=gating,
                                 gate=gate, violations=np.unique(dc[bad]), missing=missing,
                                 cross_rank=np.unique(dc[bad & cross]), held_by=held_by, held_kind=held_kind)


def ref_chain(old, launch, rank=None):
    """The former ``edges.chain``: ``(task, producer, kind)`` along the gating edges."""
    m = old.tasks
    pick = (m.launch == launch) & ((m.rank == rank) if rank is not None else True)
    if not pick.any():
        return []
    cur = int(np.flatnonzero(pick)[np.argmax(m.end[pick])])
    out, seen = [], set()
    while cur >= 0 and cur not in seen:
        seen.add(cur)
        e = int(old.gate[cur])
        out.append((cur, int(old.producer[e]) if e >= 0 else -1, int(old.kind[e]) if e >= 0 else None))
        cur = int(old.producer[e]) if e >= 0 else -1
    return out


def ref_replay(trace, old, changes, task_ns):
    """The former ``whatif.plan`` + ``replay``: each wait over its producers one by one."""
    m = old.tasks
    rec = W._merged_phases(trace, m)
    w0, w1 = (trace.phases.index(p) for p in trace.spec.wait)
    data = hands_off(old.kind)
    dc, dp = old.consumer[data], old.producer[data]
    order_e = np.argsort(dc, kind="stable")
    dc, dp = dc[order_e], dp[order_e]
    lo = np.searchsorted(dc, np.arange(m.n))
    hi = np.searchsorted(dc, np.arange(m.n), side="right")
    prev = np.full(m.n, -1, dtype=np.int64)
    cta = old.kind == EdgeKind.CTA_ORDER
    prev[old.consumer[cta]] = old.producer[cta]
    latest_rec = np.full(m.n, R.MISSING, dtype=np.int64)
    np.maximum.at(latest_rec, dc, rec[dp, -1])
    held = (hi > lo) & (latest_rec > rec[:, w0])
    handoff = rec[:, w1] - latest_rec
    own = rec[:, w1] - rec[:, w0]
    floor = W._per_stage_min(m.stage, own, ~held & (hi > lo))
    floor[~np.isfinite(floor)] = 0.0
    hmin = W._per_stage_min(m.stage, handoff, held)
    # a stage its data never held: its shortest hand-off seen (whatif.plan's rule since the GPU scripts' fix)
    hmin = np.where(np.isfinite(hmin), hmin, W._per_stage_min(m.stage, handoff, ~held & (hi > lo)))
    order = np.lexsort((np.arange(m.n), rec[:, 0], rec[:, w1])).tolist()
    scale, add = W._factors(trace, m, changes)
    end = rec[:, -1]
    add = add + task_ns
    handoff = handoff + task_ns[:, w1 - 1]
    own = np.maximum(own + task_ns[:, w1 - 1], 0)
    dur = np.maximum(np.diff(rec, axis=1) * scale + add, 0)
    before = np.concatenate((np.zeros((m.n, 1)), np.cumsum(dur[:, :w0], axis=1)), axis=1)
    after = np.concatenate((np.zeros((m.n, 1)), np.cumsum(dur[:, w1:], axis=1)), axis=1)
    start, wait_end = np.zeros(m.n), np.zeros(m.n)
    sim = end.astype(np.float64)
    gap = (rec[:, 0] - end[np.maximum(prev, 0)]).astype(np.float64)
    fl, hm = floor[m.stage], hmin[m.stage]
    for i in order:
        q = prev[i]
        t0 = float(rec[i, 0]) if q < 0 else sim[q] + gap[i]
        ws = t0 + before[i, -1]
        if hi[i] > lo[i]:
            latest = float(sim[dp[lo[i]:hi[i]]].max())
            if held[i]:
                we = max(latest + handoff[i], ws + min(own[i], fl[i]))
            else:
                we = max(ws + own[i], latest + min(hm[i], handoff[i]))
        else:
            we = ws + own[i]
        start[i], wait_end[i] = t0, we
        sim[i] = we + after[i, -1]
    out = np.zeros_like(rec, dtype=np.float64)
    out[:, :w0 + 1] = start[:, None] + before
    out[:, w1:] = wait_end[:, None] + after
    return out


# -- random graphs and traces ----------------------------------------------------------------------
RULES = ("every", "allreduce", "same", "div", "block", "mod", "tiles", "row", "listed", "listed_allreduce")


@st.composite
def cases(draw):
    """A spec with a random DAG task graph over 2-4 stages (producers: earlier stages),
    and per rank its records ``(launch, stage, task, cta, ticks)``: causal times (every
    wait ends after every earlier stage's ``ready``: no violation, replayable) or
    free ones (violations likely); tight tick ranges so that ends tie."""
    counts = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    names = [f"s{i}" for i in range(len(counts))]
    stages = list(zip(names, counts))
    ranks, launches = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    graph = {}
    for ci in range(1, len(counts)):
        rules = []
        for _ in range(draw(st.integers(0, 3))):
            pi = draw(st.integers(0, ci - 1))
            x, pn, cn = names[pi], counts[pi], counts[ci]
            kind = draw(st.sampled_from(RULES))
            k = draw(st.integers(1, 4))
            rule = {"every": lambda: G.every(x), "allreduce": lambda: G.allreduce(x), "same": lambda: G.same(x),
                    "div": lambda: G.div(x, k), "block": lambda: G.block(x, k), "mod": lambda: G.mod(x, min(k, pn)),
                    "tiles": lambda: G.tiles(x, min(k, pn), div=k, mul=draw(st.integers(0, 2))),
                    "row": lambda: G.tiles(x, draw(st.integers(1, pn)), mul=0, offset=0),
                    "listed": None, "listed_allreduce": None}[kind]
            if rule is None:
                pairs = draw(st.lists(st.tuples(st.integers(-1, launches - 1), st.integers(0, cn - 1),
                                                st.integers(0, pn - 1)), min_size=1, max_size=8))
                rule = lambda: G.listed(x, pairs, allreduce=kind == "listed_allreduce")  # noqa: E731
            rule = rule()
            try:
                G.check_graph({names[ci]: [rule]}, stages)
            except G.GraphError:
                continue
            rules.append(rule)
        if rules:
            graph[names[ci]] = rules
    if not graph:
        graph = {names[1]: [G.every(names[0])]}
    causal = draw(st.booleans())
    records = [[] for _ in range(ranks)]
    for la in range(launches):
        bar = 100
        for name, n in stages:
            top = bar
            for r in range(ranks):
                for t in range(n):
                    if draw(st.integers(0, 9)) == 0:
                        continue  # an absent row
                    if causal:
                        s0 = draw(st.integers(max(bar - 6, 100), bar + 2))
                        w1 = max(s0, bar) + draw(st.integers(0, 2))
                        c = w1 + draw(st.integers(0, 2))
                        ticks = [s0, w1, c, c + draw(st.integers(0, 2)), 0]
                        ticks[4] = ticks[3] + draw(st.integers(0, 2))
                        top = max(top, ticks[3])
                    else:
                        ticks = sorted(draw(st.lists(st.integers(100, 130), min_size=5, max_size=5)))
                    if draw(st.integers(0, 7)) == 0:
                        ticks[2] = 0  # an unwritten phase (inherits)
                    records[r].append((la, name, t, draw(st.integers(0, 2)), ticks))
            bar = top  # a wait may end as its producers are ready: simulation order then by start
    for mine in records:  # every rank's first stamp at tick 100: merge places each rank by its first stamp
        if mine:
            min(mine, key=lambda rec: rec[4][0])[4][0] = 100
    return S.Spec("rand", stages, world=ranks, launches=launches, graph=graph), records, causal


def trace_of(spec, records):
    """The ranks' records collected and merged onto one time axis."""
    out = []
    for r, mine in enumerate(records):
        sp = spec.replace(rank=r)
        buf = empty(sp)
        for la, stage, task, cta, ticks in mine:
            put(buf, sp, stage=stage, task=task, ticks=ticks, cta=cta, launch=la)
        out.append(collect(buf, sp))
    return out[0] if len(out) == 1 else merge(out)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), st.data())
def test_grouped_edges_match_every_edge_listed(case, data):
    """Gate, edge list, slack, violations, anomalies, missing, critical paths, the
    culprit edge, grouped maxima and the replay: the same as with every edge listed."""
    spec, records, causal = case
    trace = trace_of(spec, records)
    if trace.tasks.num_rows == 0:
        return
    g, old = E.edges(trace), ref_edges(trace)
    m = g.tasks
    for name in ("held_by", "held_kind", "violations", "cross_rank", "consumer", "producer", "kind", "slack",
                 "gating", "gate"):
        assert np.array_equal(getattr(g, name), getattr(old, name)), name
    assert g.missing == old.missing and g.edge_count == old.consumer.size
    assert E.edges_table(trace, g).equals(E.edges_table(trace, old))
    assert E.causality_anomalies(trace, g).equals(E.causality_anomalies(trace, old))
    for launch in np.unique(m.launch).tolist():
        for rank in [None, *np.unique(m.rank).tolist()]:
            steps = [(s.task, s.producer, None if s.kind is None else int(s.kind)) for s in E.chain(g, launch, rank)]
            assert steps == ref_chain(old, launch, rank)
            assert E.exact_path(trace, launch=launch, rank=rank, g=g).equals(
                E.exact_path(trace, launch=launch, rank=rank, g=old))
    some = np.flatnonzero(np.array(data.draw(st.lists(st.booleans(), min_size=m.n, max_size=m.n)), dtype=bool))
    hit = np.flatnonzero(old.gating & np.isin(old.producer, some))
    want = None if not hit.size else (int(old.producer[hit[0]]), int(old.consumer[hit[0]]), int(old.kind[hit[0]]))
    got = E.first_gated_by(g, some)
    assert (None if got is None else (got[0], got[1], int(got[2]))) == want
    value = np.array(data.draw(st.lists(st.integers(-5, 5), min_size=m.n, max_size=m.n)), dtype=np.float64)
    d = hands_off(old.kind)
    latest = np.full(m.n, -np.inf)
    np.maximum.at(latest, old.consumer[d], value[old.producer[d]])
    assert np.array_equal(PD.maximum(g.producers, value, -np.inf).value, latest)
    if old.violations.size:
        assert not causal  # every wait ends after every earlier stage was ready
        try:
            W.plan(trace, g)
            raise AssertionError("a trace with causality violations was replayed")
        except AnalysisError:
            return
    stage = data.draw(st.sampled_from(spec.stage_names))
    changes = [W.Change(stage, data.draw(st.sampled_from([None, "staged", "compute", "end"])),
                        data.draw(st.sampled_from([0.0, 0.5, 2.0])), data.draw(st.integers(0, 40)))]
    task_ns = np.zeros((m.n, len(trace.phases) - 1))
    task_ns[data.draw(st.integers(0, m.n - 1))] = data.draw(st.integers(0, 50))
    r = W.replay(trace, changes, g, task_ns=task_ns)
    assert np.array_equal(r.simulated, ref_replay(trace, old, changes, task_ns))
    plain = W.replay(trace, (), g)
    assert np.array_equal(plain.simulated, ref_replay(trace, old, (), np.zeros_like(task_ns)))


def test_glm5_launch_groups_instead_of_pairs():
    """An 8-rank GLM-5 launch (SYNTHETIC): millions of edges listed, a few thousand
    references computed, and the same gating, violations and critical path."""
    from timeline.ingest import synth_graph as SG

    trace = SG.graph_trace(SG.glm5_spec(world=8, launches=1), grid=16, seed=3)
    g, old = E.edges(trace), ref_edges(trace)
    assert g.producers.consumer.size < old.consumer.size / 20  # the point: references, not pairs
    assert np.array_equal(g.held_by, old.held_by) and np.array_equal(g.held_kind, old.held_kind)
    assert np.array_equal(g.violations, old.violations) and g.missing == old.missing == 0
    steps = [(s.task, s.producer, None if s.kind is None else int(s.kind)) for s in E.chain(g, 0)]
    assert steps == ref_chain(old, 0)
    change = W.Change("o", None, 1.0, 500.0)
    assert np.array_equal(W.replay(trace, [change], g).simulated,
                          ref_replay(trace, old, [change], np.zeros((g.tasks.n, len(trace.phases) - 1))))
