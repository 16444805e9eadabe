"""What if a stage were faster: the recorded schedule replayed as a discrete-event
simulation over the task graph (``Spec.graph``), with some phases scaled.

The replay keeps everything the trace says but the scaled durations: every CTA runs
its recorded task sequence, the idle time between two of its tasks stays what it
was, every phase keeps its recorded duration (times the factor of a ``Change`` that
names it). Only the wait for producers (``Spec.wait``) is predicted: it ends at its
latest producer's simulated end plus the hand-off latency recorded for it, or, for a
task its producers did not hold, after its own recorded wait (the polling). In
detail, per task: ``handoff`` = recorded wait end - latest producer's recorded end;
``own`` = recorded wait length; a task its data held waits ``max(latest + handoff,
wait start + min(own, its stage's shortest unheld wait, 0 where none))``, any other ``max(wait
start + own, latest + min(its stage's shortest held hand-off (where none, its shortest
hand-off), handoff))``. With no change
the replay reproduces the recorded times exactly (``fidelity`` measures it; a
prediction is only worth its fidelity).

Tasks are simulated in recorded wait-end order, a topological order of the graph
when the trace has no causality violation (``timeline.analysis.edges``); a trace with
violations is refused.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.analysis import edges as E
from timeline.analysis import producers as PD
from timeline.analysis import whatif_levels as WL
from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.analysis import AnalysisError


class Change(NamedTuple):
    """Make the durations of ``stage``'s interval ending at ``phase`` (None: every
    interval of the stage but its wait) ``duration * factor + add_ns``, at least 0."""

    stage: str
    phase: str | None
    factor: float = 1.0
    add_ns: float = 0.0


MAX_FACTOR = 1e6  # a --scale past this is a typo, not a question (a task a million times slower)
MAX_ADD_NS = 1e12  # a --add past this (1000 s a task) likewise; ns past 2**53 would not even add exactly


def parse_change(text: str, *, add: bool = False) -> Change:
    """``"ug.compute=0.8"`` / ``"down=1.1"`` (a factor), or with ``add`` ``"norm.compute=1000"``
    (ns added to every task's interval), as a ``Change``; an ``AnalysisError`` naming the form,
    or the bound a huge value is past (``MAX_FACTOR``, ``MAX_ADD_NS``)."""
    what, eq, value = text.partition("=")
    stage, _, phase = what.partition(".")
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    flag = "--add" if add else "--scale"
    if not eq or not stage or not np.isfinite(x) or (x < 0 and not add):
        raise AnalysisError(f"{flag} {text!r}: give STAGE=X or STAGE.PHASE=X, e.g. ug.compute=0.8 (the interval "
                            "ending at compute) or down=1.1; --add takes ns (norm.compute=1000)")
    if abs(x) > (MAX_ADD_NS if add else MAX_FACTOR):
        raise AnalysisError(f"{flag} {text!r}: {x:g} is past the {MAX_ADD_NS:g} ns a task --add takes" if add else
                            f"{flag} {text!r}: {x:g} is past the factor {MAX_FACTOR:g} --scale takes")
    return Change(stage, phase or None, 1.0, x) if add else Change(stage, phase or None, x)


class Replay(NamedTuple):
    """Recorded and simulated phase times of every task (``(tasks, phases)`` ns, waves
    merged: the first phase the earliest wave's, the others the latest's), the tasks'
    ``Tasks`` and the graph they were read with."""

    tasks: E.Tasks
    recorded: np.ndarray
    simulated: np.ndarray
    graph: E.Graph


def _merged_phases(trace, m: E.Tasks) -> np.ndarray:
    """``(tasks, phases)`` ns: per task, the first phase's earliest wave, every later
    phase's latest (missing phases inherit)."""
    t = trace.tasks
    ff = R.inherited(R.phase_matrix(t, trace.phases))
    # the same numbering as ``edges.merged_tasks``: dense ids of (rank, launch, stage, task) in order
    idx, _, _ = GR.group_ids(*(R.column(t, c).astype(np.int64) for c in ("rank", "launch", "stage_index", "task")))
    out = np.full((m.n, ff.shape[1]), np.iinfo(np.int64).min, dtype=np.int64)
    first = np.full(m.n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, idx, np.where(ff[:, 0] == R.MISSING, np.iinfo(np.int64).max, ff[:, 0]))
    for j in range(1, ff.shape[1]):
        np.maximum.at(out[:, j], idx, ff[:, j])
    out[:, 0] = np.where(first == np.iinfo(np.int64).max, m.start, first)
    for j in range(1, ff.shape[1]):  # a wave without the phase: inherit the merged previous one
        out[:, j] = np.maximum(out[:, j], out[:, j - 1])
    return out


def _factors(trace, m: E.Tasks, changes):
    """``(tasks, intervals)`` scale factors and added ns of the changes (1 and 0
    elsewhere); the wait interval is never changed (it is what the replay predicts)."""
    spec = trace.spec
    names = spec.stage_names
    f = np.ones((m.n, len(trace.phases) - 1))
    add = np.zeros_like(f)
    wait = spec.phases.index(spec.wait[1]) - 1
    for c in changes:
        if c.stage not in names:
            raise AnalysisError(f"--scale {c.stage!r}: unknown stage; this trace's stages are {list(names)}")
        rows = m.stage == names.index(c.stage)
        if c.phase is None:
            cols = [j for j in range(f.shape[1]) if j != wait]
        else:
            if c.phase not in trace.phases[1:]:
                raise AnalysisError(f"--scale {c.stage}.{c.phase}: name a phase after the first, one of "
                                    f"{list(trace.phases[1:])} (the interval that ends there)")
            cols = [trace.phases.index(c.phase) - 1]
            if cols[0] == wait:
                raise AnalysisError(f"--scale {c.stage}.{c.phase}: that interval is the wait for producers, "
                                    "which the replay predicts; scale the producers' phases instead")
        f[np.ix_(rows, cols)] *= c.factor
        add[np.ix_(rows, cols)] += c.add_ns
    return f, add


class Plan(NamedTuple):
    """What every replay of one trace and graph shares (``plan``): the merged tasks'
    recorded phases, the wait's phase indices, the task references by consumer
    (``dp[lo[i]:hi[i]]`` are task i's producer tasks), the group references by
    consumer (``gref[glo[i]:ghi[i]]``, ``timeline.analysis.producers``), each task's
    groups as a member (``mgroup[mlo[i]:mhi[i]]``), per group the offset ``goff`` into
    ``suffix`` (its members in simulation order, the largest recorded end from each
    on: those not yet simulated), each task's CTA predecessor, whether data held its
    wait, its hand-off and own wait, its stage's shortest unheld wait and hand-off,
    the simulation order, and its levels (``whatif_levels.Schedule``; None: one task
    at a time)."""

    rec: np.ndarray
    w0: int
    w1: int
    dp: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    gref: np.ndarray
    glo: np.ndarray
    ghi: np.ndarray
    mgroup: np.ndarray
    mlo: np.ndarray
    mhi: np.ndarray
    goff: np.ndarray
    suffix: np.ndarray
    prev: np.ndarray
    held: np.ndarray
    handoff: np.ndarray
    own: np.ndarray
    floor: np.ndarray
    hmin: np.ndarray
    order: list
    schedule: WL.Schedule | None = None


def _by_key(key: np.ndarray, values: np.ndarray, n: int):
    """``values`` sorted by ``key`` (stable) and per key ``0..n-1`` its ``[lo, hi)`` slice."""
    at = np.argsort(key, kind="stable")
    key = key[at]
    return values[at], np.searchsorted(key, np.arange(n)), np.searchsorted(key, np.arange(n), side="right")


def _suffix_max(pr, end: np.ndarray, order: list):
    """Per group, its members' recorded ends in simulation order, each position the
    largest from there on, one ``-inf`` after each group (all simulated): ``(goff,
    suffix)``, group ``k``'s position ``j`` at ``suffix[goff[k] + j]``."""
    pos = np.empty(end.size, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(end.size)
    at = np.lexsort((pos[pr.member], pr.member_group))
    grp, val = pr.member_group[at], end[pr.member[at]].astype(np.float64)
    size = np.bincount(grp, minlength=pr.groups)
    goff = np.concatenate(([0], np.cumsum(size + 1)[:-1])).astype(np.int64)
    suffix = np.full(int((size + 1).sum()), -np.inf)
    src = np.concatenate(([0], np.cumsum(size)[:-1]))
    for k in np.flatnonzero(size):
        seg = val[src[k]:src[k] + size[k]]
        suffix[goff[k]:goff[k] + size[k]] = np.maximum.accumulate(seg[::-1])[::-1]
    return goff, suffix


def plan(trace, g: E.Graph) -> Plan:
    """The ``Plan`` of replays of ``trace`` read with ``g`` (refused with causality violations)."""
    if g.violations.size:
        raise AnalysisError(f"{g.violations.size} tasks saw their data before it was ready (causality "
                            "violations, `timeline edges`): the graph or the declared wait does not fit this "
                            "trace, so a replay of it would predict nothing")
    m = g.tasks
    rec = _merged_phases(trace, m)
    w0, w1 = (trace.phases.index(p) for p in trace.spec.wait)
    pr = g.producers
    on_task = pr.group < 0
    dp, lo, hi = _by_key(pr.consumer[on_task], pr.producer[on_task], m.n)
    gref, glo, ghi = _by_key(pr.consumer[~on_task], pr.group[~on_task], m.n)
    mgroup, mlo, mhi = _by_key(pr.member, pr.member_group, m.n)
    prev = g.previous
    latest_rec = PD.maximum(pr, rec[:, -1], R.MISSING).value
    fed = PD.has_producer(pr, m.n)
    held = fed & (latest_rec > rec[:, w0])
    handoff = rec[:, w1] - latest_rec
    own = rec[:, w1] - rec[:, w0]
    floor = _per_stage_min(m.stage, own, ~held & fed)  # shortest unheld wait of the stage
    floor[~np.isfinite(floor)] = 0.0  # a stage its data always held: no poll floor seen, the hand-off alone
    hmin = _per_stage_min(m.stage, handoff, held)  # shortest hand-off of the stage
    # a stage its data never held (one CTA running every task in order): its shortest hand-off seen
    # bounds the latency, else every task would keep its recorded wait end and nothing could move it
    hmin = np.where(np.isfinite(hmin), hmin, _per_stage_min(m.stage, handoff, ~held & fed))
    order = np.lexsort((np.arange(m.n), rec[:, 0], rec[:, w1])).tolist()
    goff, suffix = _suffix_max(pr, rec[:, -1], order)
    p = Plan(rec, w0, w1, dp, lo, hi, gref, glo, ghi, mgroup, mlo, mhi, goff, suffix, prev, held, handoff, own,
             floor, hmin, order)
    return p._replace(schedule=WL.schedule(p, pr.groups))


def replay(trace, changes=(), g: E.Graph | None = None, task_ns: np.ndarray | None = None,
           plan_: Plan | None = None) -> Replay:
    """The trace's schedule re-run with ``changes`` (``Change`` or their text forms);
    ``task_ns``: ``(tasks, intervals)`` ns added to single tasks' intervals besides
    (tasks in ``g.tasks`` order; on the wait interval: to its hand-off and own poll);
    ``plan_``: ``plan(trace, g)``, to share between replays of one trace. A group of
    producers (``timeline.analysis.producers``) counts as the largest of its simulated
    members' ends and its members' recorded ends not yet simulated (``Plan.suffix``):
    the same maximum as over its members one by one, in O(1)."""
    changes = [parse_change(c) if isinstance(c, str) else c for c in changes]
    g = g or E.edges(trace)
    m = g.tasks
    p = plan_ or plan(trace, g)
    rec, w0, w1, prev, held = p.rec, p.w0, p.w1, p.prev, p.held
    handoff, own, floor, hmin = p.handoff, p.own, p.floor, p.hmin
    scale, add = _factors(trace, m, changes)
    end = rec[:, -1]
    if task_ns is not None:
        add = add + task_ns
        handoff = handoff + task_ns[:, w1 - 1]
        own = np.maximum(own + task_ns[:, w1 - 1], 0)
    dur = np.maximum(np.diff(rec, axis=1) * scale + add, 0)  # no phase takes less than no time
    before = np.concatenate((np.zeros((m.n, 1)), np.cumsum(dur[:, :w0], axis=1)), axis=1)  # start .. wait start
    after = np.concatenate((np.zeros((m.n, 1)), np.cumsum(dur[:, w1:], axis=1)), axis=1)  # wait end .. end
    if p.schedule is not None:  # level by level (whatif_levels): the same values, many tasks a step
        start, wait_end = WL.simulate(p.schedule, end.astype(np.float64), rec[:, 0].astype(np.float64),
                                      (rec[:, 0] - end[np.maximum(prev, 0)]).astype(np.float64), before[:, -1],
                                      after[:, -1], own, handoff, held, floor[m.stage], hmin[m.stage])
    else:
        start, wait_end = _loop(p, m.n, end, before, after, own, handoff, floor[m.stage], hmin[m.stage])
    sim = np.zeros_like(rec, dtype=np.float64)
    sim[:, :w0 + 1] = start[:, None] + before
    sim[:, w1:] = wait_end[:, None] + after
    return Replay(m, rec, sim, g)


def _loop(p: Plan, n: int, end, before, after, own, handoff, floor, hmin) -> tuple:
    """``replay``'s tasks one at a time in ``p.order``: ``(start, wait end)`` of each
    (``floor``, ``hmin``: per task its stage's)."""
    rec, dp, lo, hi, prev, held = p.rec, p.dp, p.lo, p.hi, p.prev, p.held
    start, wait_end = np.zeros(n), np.zeros(n)
    sim_np = end.astype(np.float64)  # a producer not yet simulated counts with its recorded end
    sim_end = sim_np.tolist()  # the same, read one at a time (a list is faster there), numpy for many
    first_rec = rec[:, 0].astype(np.float64).tolist()
    gap = (rec[:, 0] - end[np.maximum(prev, 0)]).astype(np.float64).tolist()  # after the CTA's previous task
    lead, tail, own_l, hand_l = before[:, -1].tolist(), after[:, -1].tolist(), own.tolist(), handoff.tolist()
    prev_l, lo_l, hi_l, held_l = prev.tolist(), lo.tolist(), hi.tolist(), held.tolist()
    gref, glo, ghi = p.gref.tolist(), p.glo.tolist(), p.ghi.tolist()
    mgroup, mlo, mhi = p.mgroup.tolist(), p.mlo.tolist(), p.mhi.tolist()
    goff, suffix = p.goff.tolist(), p.suffix.tolist()
    gpos = [0] * len(goff)  # per group: its members simulated so far
    gsim = [-np.inf] * len(goff)  # per group: the largest simulated end of those
    floor_l, hmin_l = floor.tolist(), hmin.tolist()
    dp_l = dp.tolist()
    for i in p.order:
        q = prev_l[i]
        t0 = first_rec[i] if q < 0 else sim_end[q] + gap[i]
        ws = t0 + lead[i]
        a, b, c0, c1 = lo_l[i], hi_l[i], glo[i], ghi[i]
        if b > a or c1 > c0:
            latest = -np.inf
            if b - a >= 64:
                latest = float(sim_np[dp[a:b]].max())
            elif b > a:
                latest = max(map(sim_end.__getitem__, dp_l[a:b]))
            for k in gref[c0:c1]:
                latest = max(latest, gsim[k], suffix[goff[k] + gpos[k]])
            if held_l[i]:
                we = max(latest + hand_l[i], ws + min(own_l[i], floor_l[i]))
            else:
                we = max(ws + own_l[i], latest + min(hmin_l[i], hand_l[i]))
        else:
            we = ws + own_l[i]
        start[i], wait_end[i] = t0, we
        sim_end[i] = sim_np[i] = e = we + tail[i]
        for k in mgroup[mlo[i]:mhi[i]]:
            gpos[k] += 1
            if e > gsim[k]:
                gsim[k] = e
    return start, wait_end


def _per_stage_min(stage, values, mask) -> np.ndarray:
    """Per stage index, the minimum of ``values`` where ``mask`` (inf where none)."""
    out = np.full(int(stage.max()) + 1 if stage.size else 0, np.inf)
    np.minimum.at(out, stage[mask], values[mask].astype(np.float64))
    return out


class Prediction(NamedTuple):
    """Per launch (``launches``): the measured and predicted kernel time (first start
    to last end, µs); per launch and stage (``stages``): measured and predicted first
    start, last end (µs from the launch's measured first start) and span."""

    launches: pa.Table
    stages: pa.Table
    fidelity: "Fidelity"


class Fidelity(NamedTuple):
    """How well the unchanged replay reproduces the trace: the largest error of any
    task's end and of any launch's end (ns)."""

    task_end_ns: float
    kernel_end_ns: float


def fidelity(trace, g: E.Graph | None = None, plan_: Plan | None = None) -> Fidelity:
    """The unchanged replay against the recorded times (``plan_``: as ``replay`` takes it)."""
    r = replay(trace, (), g, plan_=plan_)
    err = np.abs(r.simulated[:, -1] - r.recorded[:, -1])
    gid, n, _ = GR.group_ids(r.tasks.launch)
    _, sim_end = _extent(gid, n, r.simulated[:, -1], r.simulated[:, -1])
    _, rec_end = _extent(gid, n, r.recorded[:, -1], r.recorded[:, -1])
    kernel = np.abs(sim_end - rec_end)
    return Fidelity(float(err.max()) if err.size else 0.0, float(kernel.max()) if kernel.size else 0.0)


def _extent(gid: np.ndarray, n: int, lo_vals, hi_vals):
    """Per group of ``n``: the minimum of ``lo_vals`` and the maximum of ``hi_vals`` (float ns)."""
    lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(lo, gid, np.asarray(lo_vals, dtype=np.float64))
    np.maximum.at(hi, gid, np.asarray(hi_vals, dtype=np.float64))
    return lo, hi


def predict(trace, changes) -> Prediction:
    """``replay`` with ``changes`` reduced to what a user asks: per launch the kernel
    time measured and predicted and the saving; per stage its span; beside it the
    unchanged replay's fidelity."""
    g = E.edges(trace)
    r = replay(trace, changes, g)
    m = r.tasks
    lid, nl, (launch,) = GR.group_ids(m.launch)
    t0, meas_end = _extent(lid, nl, r.recorded[:, 0], r.recorded[:, -1])
    _, pred_end = _extent(lid, nl, r.simulated[:, -1], r.simulated[:, -1])
    meas, pred = (meas_end - t0) / 1e3, (pred_end - t0) / 1e3
    launches = pa.table({"launch": pa.array(launch.tolist(), pa.int64()), "measured_us": meas,
                         "predicted_us": pred, "saving_us": meas - pred})
    sid, ns, (s_launch, s_stage) = GR.group_ids(m.launch, m.stage)  # (launch, stage) in order
    base = t0[np.searchsorted(launch, s_launch)]
    stages = {"launch": pa.array(s_launch.tolist(), pa.int64()),
              "stage": [trace.spec.stage_names[i] for i in s_stage.tolist()]}
    for kind, times in (("measured", r.recorded), ("predicted", r.simulated)):
        first, last = _extent(sid, ns, times.min(axis=1), times.max(axis=1))
        stages.update({f"{kind}_first_us": (first - base) / 1e3, f"{kind}_last_us": (last - base) / 1e3,
                       f"{kind}_span_us": (last - first) / 1e3})
    return Prediction(launches, pa.table(stages), fidelity(trace, g))
