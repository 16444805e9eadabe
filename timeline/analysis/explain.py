"""Why a launch was slow: which (rank, stage, CTA, phase) made it so, by how much,
and what fixing it buys.

A launch's kernel time (first start to last end over its ranks) is compared with a
typical launch's: the median of the trace's launches, or of a baseline's. Every
task's phase intervals are compared with that task's typical ones (the median over
the baseline launches of the same (rank, stage, task)); the wait for producers
counts only its hand-off (the wait after the latest producer ended, against the
stage's median hand-off in the launch): the rest of a wait is its producers' doing.
The excess cells are grouped into candidate culprits (one task, a CTA's tasks of a
stage, a rank's stage, a whole stage); a task's excess cells outside the wait go to
the group of its largest one, so a delay whose time moved across a stamp (the stamps
are no barriers) is one culprit over those intervals, named by the interval with the
most excess. Each is checked by the what-if replay
(``timeline.whatif``): the launch replayed with the candidate at its typical time;
the saving is how much earlier the launch ends, the replay's fidelity beside it. A
culprit is significant when its saving exceeds the launch-to-launch noise. The
launch's critical path (``timeline.edges.chain``) is decomposed into the excess of
the (rank, stage, CTA, phase) cells on it. The rank skew at every all-reduce rule:
per launch, which rank's producers finished last and by how much.

Without a task graph the gating edges, the savings and the skew cannot be
established; ``explain`` then says so and ranks the excess cells on the heuristic
critical path (``timeline.critical``), labelled a heuristic.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.analysis import edges as E
from timeline.analysis import launches as LA
from timeline.analysis import producers as PD
from timeline.contract.graph import hands_off
from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.analysis import whatif as W
from timeline.analysis import AnalysisError

SCHEMA = "timeline.explain/3"
CANDIDATES = 6  # candidate culprits checked by a replay each
SCOPES = ("task", "cta", "rank-stage", "stage")


class ExplainError(AnalysisError):
    """A launch that cannot be explained as asked (one launch and no baseline, an unknown launch)."""


class Typical(NamedTuple):
    """Per (rank, stage, task) key of a baseline: its median interval durations
    (``(keys, intervals)`` ns), the baseline's kernel times (ns, one per launch) and
    which launch each is (for leaving the explained launch out of the noise)."""

    rank: np.ndarray
    stage: np.ndarray
    task: np.ndarray
    durations: np.ndarray
    kernel_ns: np.ndarray
    source: str
    kernel_launches: np.ndarray | None = None  # the launch of each kernel time (None: not launches of one trace)
    parts: tuple = ()  # per launch it was made of: (rank, stage, task, durations) of its merged tasks


def kernel_times(trace) -> tuple:
    """``(launches, kernel ns)`` of a trace's launches: ``timeline.analysis.launches``'
    kernel time (the one definition), keyed by the trace's launch numbers."""
    t = LA.launch_times(LA.rank_rows(trace))
    ok = R.numpy(t.column("kernel_ns").is_valid())
    return (R.numpy(t.column("trace_launch")).astype(np.int64)[ok],
            R.numpy(R.filled(t.column("kernel_ns"), 0)).astype(np.int64)[ok])




def _durations(trace, m: E.Tasks) -> np.ndarray:
    """``(tasks, intervals)`` ns of the merged tasks ``m`` (``whatif``'s merged phases)."""
    return np.diff(W._merged_phases(trace, m), axis=1).astype(np.float64)


def typical(trace, launches=None, *, source: str = "") -> Typical:
    """The ``Typical`` of ``launches`` of ``trace`` (None: all of them)."""
    base = trace if launches is None else trace.filter(launches=list(launches))
    if base.tasks.num_rows == 0:
        raise ExplainError(f"the baseline {source or 'selection'} has no task rows")
    launch_ids, kernel = kernel_times(base)
    return typical_of([base], kernel, source or f"{len(base.launches)} launches")._replace(kernel_launches=launch_ids)


def typical_of(traces, kernel_ns, source: str) -> Typical:
    """The ``Typical`` of the launches of several traces of one kernel (a run's
    launches, each its own ``Trace``), with ``kernel_ns`` the kernel times whose
    spread is the noise."""
    parts = []
    for tr in traces:
        m = E.merged_tasks(tr)
        parts.append((m.rank, m.stage, m.task, _durations(tr, m)))
    rank, stage, task, dur = (np.concatenate([p[k] for p in parts]) for k in range(4))
    gid, ng, (rank, stage, task) = GR.group_ids(rank, stage, task)
    return Typical(rank, stage, task, group_median(gid, ng, dur), np.asarray(kernel_ns), source, parts=tuple(parts))


def group_median(gid: np.ndarray, ng: int, values: np.ndarray) -> np.ndarray:
    """Per group of ``ng`` (``gid`` dense ids), the median of each column of the
    non-negative integral ``values`` (``(rows, columns)``): one sort of ``gid * span +
    value`` per column (int64), the middle of each group's run."""
    counts = np.bincount(gid, minlength=ng)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    v = np.rint(values).astype(np.int64)
    span = int(v.max(initial=0)) + 1
    if ng * span >= 1 << 62:
        raise ExplainError(f"interval durations up to {span} ns over {ng} tasks overflow the median's sort key")
    med = np.empty((ng, v.shape[1]))
    for j in range(v.shape[1]):
        s = np.sort(gid.astype(np.int64) * span + v[:, j]) - np.repeat(np.arange(ng, dtype=np.int64) * span, counts)
        med[:, j] = (s[first + (counts - 1) // 2] + s[first + counts // 2]) / 2
    return med


def typical_for(typ: Typical, m: E.Tasks, measured: np.ndarray) -> np.ndarray:
    """``typ``'s durations for the tasks ``m`` (their own measured ones where the
    baseline lacks the key)."""
    span = int(max(typ.task.max(initial=0), m.task.max(initial=0))) + 1
    stages = int(max(typ.stage.max(initial=0), m.stage.max(initial=0))) + 1
    key_t = (typ.rank * stages + typ.stage) * span + typ.task
    key_m = (m.rank * stages + m.stage) * span + m.task
    at = np.searchsorted(key_t, key_m)
    hit = (at < key_t.size) & (key_t[np.minimum(at, key_t.size - 1)] == key_m)
    out = measured.copy()
    out[hit] = typ.durations[at[hit]]
    return out


class Culprit(NamedTuple):
    """A candidate culprit: its ``scope`` (``SCOPES``), rank (None: every rank),
    stage, task and CTA (None where the scope spans several), the interval ``phase``
    (of its intervals the one with the most excess), its tasks (indices into the
    launch's merged tasks), measured and typical ns summed over its cells, the
    replay's saving (ns) with them at their typical time, and its ``cells``:
    ``((interval, tasks), ...)``, ``phase``'s first, then any other interval its
    tasks ran over typical in (a delay that moved across a stamp)."""

    scope: str
    rank: int | None
    stage: int
    task: int | None
    cta: int | None
    phase: int
    tasks: np.ndarray
    measured_ns: float
    typical_ns: float
    saving_ns: float = 0.0
    cells: tuple = ()
    on_path_ns: float = 0.0  # its excess in cells on the launch's critical path

    @property
    def excess_ns(self) -> float:
        return self.measured_ns - self.typical_ns

    @property
    def per_task(self) -> tuple:
        """``(measured, typical, excess)`` ns a task: the sums over its cells, divided
        by its task count (a culprit of 192 tasks is not 192 times slower)."""
        n = max(int(self.tasks.size), 1)
        return self.measured_ns / n, self.typical_ns / n, self.excess_ns / n


class Explained(NamedTuple):
    """One launch explained: its kernel and typical kernel time (ns), the noise, the
    culprits (significant first, by saving), the saving of all candidates together,
    the critical path's excess per (rank, stage, CTA, phase) cell, the replay's
    fidelity, the gating edge out of each culprit, and the launch's merged tasks."""

    launch: int
    kernel_ns: int
    typical_ns: float
    noise_ns: float
    culprits: list
    together_ns: float
    path_cells: list
    fidelity: W.Fidelity | None
    gating: list
    tasks: E.Tasks
    exact: bool
    graph: E.Graph | None = None  # the launch's gating edges (None without a task graph)
    chain: list = ()  # its critical path (``edges.chain``)
    tests: tuple | None = None  # A/B: per culprit, its cells tested across both sides' launches (``sides.CellTest``)

    @property
    def slow(self) -> bool:
        """Whether the launch is slower than typical by more than the noise: only then
        can a culprit be significant."""
        return self.kernel_ns - self.typical_ns > self.noise_ns


def _excess(trace, g: E.Graph, rec: np.ndarray, typ_dur: np.ndarray) -> np.ndarray:
    """``(tasks, intervals)`` ns above typical; the wait interval counts its hand-off
    above its (rank, stage)'s median hand-off in the launch, never its producers' delay."""
    m = g.tasks
    dur = np.diff(rec, axis=1).astype(np.float64)
    ex = dur - typ_dur
    w = trace.phases.index(trace.spec.wait[0])
    latest = PD.maximum(g.producers, rec[:, -1].astype(np.float64), -np.inf).value
    hand = rec[:, w + 1] - np.maximum(rec[:, w], latest)
    gid, ng, _ = GR.group_ids(m.rank, m.stage)
    med = np.zeros(ng)
    for k in range(ng):  # few (rank, stage) groups
        med[k] = np.median(hand[gid == k])
    ex[:, w] = hand - med[gid]
    return ex


def _stage_groups(m: E.Tasks, hot: np.ndarray, wait: int, key: np.ndarray, groups: dict) -> None:
    """Into ``key`` (a group id per cell, -1 none): per interval, the hot cells of a
    stage where on every rank that runs it most (two or more, at least half) of its
    tasks are hot in it, else of each rank's stage where most of its are (one slow rank
    of two is that rank's stage, never the stage); one group per (scope, rank, stage)
    over the intervals besides the wait, one per interval for the wait."""
    for j in range(hot.shape[1]):
        for s in np.unique(m.stage[hot[:, j]]):
            mine = m.stage == s
            most = {}
            for r in np.unique(m.rank[mine]):
                rs = mine & (m.rank == r)
                most[int(r)] = bool(hot[rs, j].sum() > 1 and hot[rs, j].mean() >= 0.5)
            if all(most.values()):
                g = groups.setdefault(("stage", None, int(s), None, None, j == wait), len(groups))
                key[mine & hot[:, j], j] = g
                continue
            for r in [r for r, ok in most.items() if ok]:
                rs = mine & (m.rank == r)
                key[rs & hot[:, j], j] = groups.setdefault(("rank-stage", r, int(s), None, None, j == wait),
                                                           len(groups))


def _own_groups(m: E.Tasks, hot: np.ndarray, wait: int, key: np.ndarray, groups: dict) -> None:
    """Into ``key``: the hot cells no stage holds, per (rank, stage, CTA): a ``cta``
    group where two or more of its tasks are hot in one interval, else one group per
    task; the wait's cells apart from the other intervals'."""
    ii, jj = np.nonzero(hot & (key < 0))
    if ii.size == 0:
        return
    gid, ng, _ = GR.group_ids(m.rank[ii], m.stage[ii], m.cta[ii], jj)
    many = np.bincount(gid, minlength=ng)[gid] > 1
    for i, j, cta in zip(ii.tolist(), jj.tolist(), many.tolist()):
        task = None if cta else int(m.task[i])
        g = ("cta" if cta else "task", int(m.rank[i]), int(m.stage[i]), task, int(m.cta[i]), j == wait)
        key[i, j] = groups.setdefault(g, len(groups))


def _candidates(m: E.Tasks, ex: np.ndarray, floor: float, on_path: np.ndarray, wait: int,
                limit: int | None = None) -> list:
    """Groups of excess cells above ``floor`` (``Culprit``s without their saving), the
    most promising first: a whole stage or a rank's stage where most of its tasks
    carry an excess in one interval, else a CTA's tasks of a stage, else single tasks;
    cells on the critical path before the others. A task's hot cells outside the wait
    go together, to the group of its largest one (time a delay moved across a stamp
    stays with it); the wait's cells (hand-offs) are grouped on their own. Each as
    ``(scope, rank, stage, task, cta, interval, tasks, cells)``: the interval the one
    with the most excess, ``cells`` ``((interval, tasks), ...)`` that one first; the first
    ``limit`` alone made (ranked by columns: a slow launch has thousands of groups)."""
    hot = ex > floor
    key = np.full(ex.shape, -1, dtype=np.int64)
    groups: dict = {}
    _stage_groups(m, hot, wait, key, groups)
    _own_groups(m, hot, wait, key, groups)
    own = hot.copy()
    own[:, wait] = False
    best = np.argmax(np.where(own, ex, -np.inf), axis=1)
    key = np.where(own, key[np.arange(m.n), best][:, None], key)  # every task's own cells to its largest's group
    ii, jj = np.nonzero(key >= 0)
    if ii.size == 0:
        return []
    gk = key[ii, jj]
    order = np.lexsort((ii, jj, gk))  # by group, then interval, then task: one sort, no scan per group
    ii, jj, gk = ii[order], jj[order], gk[order]
    cut = np.flatnonzero(np.r_[True, (gk[1:] != gk[:-1]) | (jj[1:] != jj[:-1]), True])  # parts: (group, interval)
    sums = np.add.reduceat(ex[ii, jj], cut[:-1])
    part_group, part_j = gk[cut[:-1]], jj[cut[:-1]]
    gcut = np.flatnonzero(np.r_[True, part_group[1:] != part_group[:-1], True])  # a group's parts, adjacent
    total = np.add.reduceat(sums, gcut[:-1])
    on = np.logical_or.reduceat(np.logical_or.reduceat(on_path[ii], cut[:-1]), gcut[:-1])
    ranked = np.lexsort((np.arange(total.size), -total, -on.astype(np.int8)))  # on the path, then the most excess
    names = {g: k for k, g in groups.items()}
    out = []
    for g in ranked[:limit].tolist():
        parts = range(gcut[g], gcut[g + 1])
        parts = sorted(parts, key=lambda p: (float(sums[p]), int(part_j[p])), reverse=True)  # ties: later interval
        cells = tuple((int(part_j[p]), ii[cut[p]:cut[p + 1]]) for p in parts)
        scope, r, s_, task, c, _ = names[int(part_group[gcut[g]])]
        out.append((scope, r, s_, task, c, cells[0][0], np.unique(np.concatenate([idx for _, idx in cells])), cells))
    return out


def _fixes(cells, ex: np.ndarray) -> list:
    """``(tasks, interval, ns)`` that bring ``cells`` to their typical time."""
    return [(idx, j, np.maximum(ex[idx, j], 0)) for j, idx in cells]


def _saving(trace, g, plan, base_end: float, fixes) -> float:
    """How much earlier the launch ends with ``fixes`` (``(tasks, interval, ns)``
    subtracted) than in the unchanged replay."""
    add = np.zeros((g.tasks.n, len(trace.phases) - 1))
    for idx, j, ns in fixes:
        add[idx, j] -= ns
    r = W.replay(trace, (), g, task_ns=add, plan_=plan)
    return base_end - float(r.simulated[:, -1].max())


def explain_launch(trace, launch: int, typ: Typical, *, kernel_ns: float | None = None,
                   typical_ns: float | None = None, noise: float | None = None, own: bool = False) -> Explained:
    """``launch`` of ``trace`` against ``typ`` (see the module docstring). ``kernel_ns``,
    ``typical_ns`` and ``noise``: the launch's kernel time, the typical one and the noise
    as the caller's launches table has them (``timeline.analysis.launches``: one
    definition for every command); by default from this trace and ``typ`` (``own``:
    ``typ`` is of this trace's launches, so the noise leaves ``launch`` out)."""
    if launch not in trace.launches:
        raise ExplainError(f"launch {launch} is not in the trace; its launches are {R.brief(trace.launches)}")
    one = trace.filter(launches=[launch])
    kernel = int(kernel_ns if kernel_ns is not None else kernel_times(one)[1][0])
    if noise is None:
        others = typ.kernel_ns
        if own and typ.kernel_launches is not None and (typ.kernel_launches != launch).sum() >= 2:
            others = typ.kernel_ns[typ.kernel_launches != launch]
        noise = LA.noise_ns(others)
    typical = float(typical_ns if typical_ns is not None else np.median(typ.kernel_ns))
    if not trace.spec.wait:
        raise ExplainError(f"spec {trace.spec.kernel!r} declares no wait for producers (Spec(wait=...)): explain "
                           "cannot tell a task's own time from its wait; declare it and re-export")
    if not trace.spec.graph:
        return _heuristic(one, launch, typ, kernel, typical, noise)
    g = E.edges(one)
    plan = W.plan(one, g)
    r = W.replay(one, (), g, plan_=plan)
    m = g.tasks
    rec = r.recorded
    typ_dur = typical_for(typ, m, np.diff(rec, axis=1).astype(np.float64))
    ex = _excess(one, g, rec, typ_dur)
    chain = E.chain(g, launch)
    on_path = np.zeros(m.n, bool)
    on_path[[s.task for s in chain]] = True
    fid = W.Fidelity(float(np.abs(r.simulated[:, -1] - r.recorded[:, -1]).max()),
                     abs(float(r.simulated[:, -1].max()) - float(r.recorded[:, -1].max())))
    base_end = float(r.simulated[:, -1].max())
    floor = max(noise / 4, 3 * 1.4826 * float(np.median(np.abs(ex))), LA.NOISE_FLOOR_NS / 2)
    wait = one.phases.index(one.spec.wait[0])
    cands = _candidates(m, ex, floor, on_path, wait, CANDIDATES)
    dur = np.diff(rec, axis=1).astype(np.float64)
    culprits = []
    for scope, rank, s, task, cta, j, idx, cells in cands:
        fixes = _fixes(cells, ex)
        fix = sum(float(f.sum()) for *_, f in fixes)
        if fix <= noise / 2:  # the replay is 1-Lipschitz: it saves at most what it removes, never significant
            continue
        measured = sum(float(dur[i, k].sum()) for k, i in cells)
        culprits.append(Culprit(scope, rank, s, task, cta, j, idx, measured, measured - fix,
                                _saving(one, g, plan, base_end, fixes), cells,
                                sum(float(f[on_path[i]].sum()) for i, _, f in fixes)))
    big = [c for c in culprits if c.excess_ns > noise / 2]  # those that could matter, fixed together
    together = _saving(one, g, plan, base_end, [f for c in big for f in _fixes(c.cells, ex)]) if len(big) > 1 \
        else max([c.saving_ns for c in culprits], default=0.0)
    culprits = _ranked(culprits, noise, together)
    return Explained(launch, kernel, typical, noise, culprits, together,
                     _path_cells(g, chain, ex, wait), fid, [_gating_edge(g, chain, c) for c in culprits], m, True,
                     g, chain)


def _ranked(culprits: list, noise: float, together: float) -> list:
    """Culprits by saving (the narrower scope first between two within 10 % of each
    other); when none saves beyond the noise alone but those with an excess over half
    the noise do together (equal culprits on parallel paths), by excess."""
    out = sorted(culprits, key=lambda c: (-c.saving_ns, SCOPES.index(c.scope)))
    for k in range(len(out) - 1):
        a, b = out[k], out[k + 1]
        if SCOPES.index(b.scope) < SCOPES.index(a.scope) and b.saving_ns >= 0.9 * a.saving_ns:
            out[k], out[k + 1] = b, a
    if out and out[0].saving_ns <= noise < together:
        out = sorted(culprits, key=lambda c: -c.excess_ns)
    return out


def significant(e: Explained) -> list:
    """The culprits whose saving exceeds the noise: alone, or else together, those
    with an excess over half the noise (parallel culprits, each hiding the other);
    none where the launch itself is within the noise of typical (``Explained.slow``).
    B against A (``e.tests`` set): those whose test across the launches of both sides
    holds (``sides.CellTest``), in order."""
    if e.tests is not None:
        return [c for c, t in zip(e.culprits, e.tests) if t.significant]
    if not e.slow:
        return []
    if e.culprits and e.culprits[0].saving_ns > e.noise_ns:
        return [c for c in e.culprits if c.saving_ns > e.noise_ns]
    if e.together_ns > e.noise_ns:
        return [c for c in e.culprits if c.excess_ns > e.noise_ns / 2]
    return []


def _path_cells(g: E.Graph, chain: list, ex: np.ndarray, wait: int) -> list:
    """The critical path's excess per (rank, stage, CTA, interval) cell: the intervals
    of each path task that lie on the path (after the wait where data gated it, all
    where its CTA did), largest first, as ``(rank, stage, cta, interval, ns)``."""
    m = g.tasks
    cells = {}
    for t, _, kind in chain:
        data = kind is not None and bool(hands_off(kind))
        for j in range(wait if data else 0, ex.shape[1]):  # data-gated: its hand-off and what follows
            key = (int(m.rank[t]), int(m.stage[t]), int(m.cta[t]), j)
            cells[key] = cells.get(key, 0.0) + float(ex[t, j])
    return sorted(((*k, v) for k, v in cells.items() if abs(v) > 0), key=lambda c: -c[4])


def _gating_edge(g: E.Graph, chain: list, c: Culprit):
    """The gating edge that carried culprit ``c``'s delay: the edge out of one of its
    tasks that gated a consumer on the critical path (else any gating edge out of
    one), as ``(producer task, consumer task, kind)`` indices, or None."""
    mine = set(c.tasks.tolist())
    for t, p, kind in chain:
        if p >= 0 and p in mine:
            return p, int(t), kind.label
    hit = E.first_gated_by(g, c.tasks)
    return None if hit is None else (hit[0], hit[1], hit[2].label)


def _heuristic(one, launch: int, typ: Typical, kernel: int, typical: float, noise: float) -> Explained:
    """Without a task graph: the excess cells of every task, those on the heuristic
    critical path (``timeline.critical``, per rank) first; no saving (no replay)."""
    from timeline.analysis import critical

    m = E.merged_tasks(one)
    dur = _durations(one, m)
    ex = dur - typical_for(typ, m, dur)
    on_path = np.zeros(m.n, bool)
    for r in one.ranks:
        p = critical.critical_path(one, rank=r, launch=launch)
        stage = np.array([one.spec.stage_index(s) for s in p.column("stage").to_pylist()], dtype=np.int64)
        task = R.numpy(p.column("task")).astype(np.int64)
        on_path |= (m.rank == r) & np.isin(m.stage * (1 << 32) + m.task, stage * (1 << 32) + task)
    floor = max(noise / 4, LA.NOISE_FLOOR_NS / 2)
    cands = _candidates(m, ex, floor, on_path, one.phases.index(one.spec.wait[0]), CANDIDATES)
    culprits = []
    for sc, r, s, t, c, j, idx, cells in cands:
        measured = sum(float(dur[i, k].sum()) for k, i in cells)
        excess = sum(float(ex[i, k].sum()) for k, i in cells)
        culprits.append(Culprit(sc, r, s, t, c, j, idx, measured, measured - excess, 0.0, cells,
                                sum(float(ex[i[on_path[i]], k].sum()) for k, i in cells)))
    return Explained(launch, kernel, typical, noise, culprits, 0.0, [], None, [None] * len(culprits), m, False)
