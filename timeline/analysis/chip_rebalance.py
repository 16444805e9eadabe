"""Which unit is slow, and what rebalancing would give back (``timeline chip``).

**Speed.** Each own interval of a task row (its phases but the wait,
``timeline.analysis.chip``: staging, compute, epilogue) is one sample: the log of its
length over the median of that interval among its stage's rows in its launch on its
rank: 0 for a typical one, +0.1 for one 10.5 % slower. A slow unit slows every one.

**The culprit.** At every level coarse to fine (XCD, SE, CU; or SM) the unit whose
rows' median speed is the highest is tested against the rows of every other unit of
the level (their samples) by the one statistical rule (``timeline.analysis.stats``: Mann–Whitney,
Hodges–Lehmann shift and its interval; the p-value adjusted by Benjamini–Hochberg over
the level's units, since the slowest of N was picked; at most ``SAMPLE`` rows a side,
drawn with a fixed seed). A coarse unit is the culprit where it is significantly
slower **and** still is without its slowest child (the slowness is spread over its
CUs: "XCD 3's CUs ran every stage 9 % slower"); else the search goes one level finer;
at the finest level a significantly slower unit is the culprit. No level significant:
no culprit. Its slowdown is ``exp(shift)`` with the interval's ends likewise.

**Rebalancing**, each by the what-if replay over the task graph
(``timeline.analysis.whatif.replay``, its ``task_ns``), its saving (the launch's
measured kernel time less the replay's) beside the unchanged replay's fidelity:

- *the slowest unit at the typical unit's speed*: every own interval of every task
  that ran on the culprit (else the unit level's slowest unit) divided by its
  slowdown;
- *the stage spread evenly*: the tail's stage (``chip.tail_table``) dealt out evenly
  over the units that ran it: each unit's tasks of the stage scaled so that its busy
  time in the stage is the stage's mean over those units (the work conserved, each
  CTA's task order kept: the replay cannot move a task to another CTA).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from timeline.analysis import AnalysisError
from timeline.analysis import chip as CHP
from timeline.analysis import stats as ST
from timeline.core import grouped as GR

SAMPLE = 4096  # the most rows a side of a unit's test (drawn with a fixed seed)


def speeds(rows: CHP.Rows) -> tuple:
    """``(row, x)``: one sample per own interval of a row (staging, compute, epilogue are
    three): the row, and log(ns / the median of that interval over its (rank, launch,
    stage)'s rows); intervals of no time left out. A slow unit slows each."""
    own = CHP.own_of(rows)
    r, j = np.nonzero(own > 0)
    d = own[r, j]
    gid, n, _ = GR.group_ids(rows.rank[r], rows.launch[r], rows.stage[r], j)
    med = GR.group_quantiles(gid, n, d, [0.5])[0][gid]  # whole ns: the integer sort's speed, the same medians
    return r, np.log(d.astype(np.float64) / med)


def _sample(values: np.ndarray, seed: int) -> np.ndarray:
    """At most ``SAMPLE`` of ``values`` (NaN dropped), drawn with ``seed``."""
    v = values[~np.isnan(values)]
    if v.size <= SAMPLE:
        return v
    return np.random.default_rng(seed).choice(v, SAMPLE, replace=False)


class Suspect(NamedTuple):
    """A level's slowest unit: its level and name, its number, its samples' median
    speed and count, the Mann–Whitney p of its samples against the other units', that p
    adjusted by Benjamini–Hochberg over the level's ``units``, and (``measured``) the
    shift of its speeds (``ST.Shift``, log units) with its interval."""

    level: str
    unit: str
    number: int
    median: float
    samples: int
    p: float
    q: float
    units: int
    level_of_test: float
    shift: ST.Shift | None = None

    @property
    def significant(self) -> bool:
        """Slower (median speed above 0), with the adjusted p below 1 - level."""
        return self.median > 0 and self.q < 1 - self.level_of_test

    def slowdown(self) -> tuple:
        """``(factor, low, high)``: exp of the shift and of its interval's ends."""
        s = self.shift
        return tuple(math.exp(x) if math.isfinite(x) else (math.inf if x > 0 else 0.0 if x < 0 else math.nan)
                     for x in (s.estimate, s.lo, s.hi))


def _q(x: np.ndarray, mine: np.ndarray, others: np.ndarray, n_units: int) -> tuple:
    """``(p, q)``: the test of the samples ``mine`` against ``others`` (masks), and its
    p adjusted over ``n_units`` units (the slowest of which was picked)."""
    p = ST.pvalue(_sample(x[others], 1), _sample(x[mine], 2))
    return p, float(ST.adjust([p] + [1.0] * (n_units - 1))[0]) if n_units > 1 else p


def measured(s: Suspect, rows: CHP.Rows, sp: tuple) -> Suspect:
    """``s`` with its ``shift``: its samples against every other unit's of its level."""
    r, x = sp
    u = rows.unit[s.level][r]
    ok = ~np.isnan(x)
    sh = ST.shift(_sample(x[ok & (u != s.number)], 1), _sample(x[ok & (u == s.number)], 2), level=s.level_of_test)
    return s._replace(shift=sh)


def suspects(rows: CHP.Rows, levels: list, sp: tuple, level: float = ST.LEVEL) -> list:
    """Per level (coarse to fine, wave slots left out): its slowest unit as a ``Suspect``
    (``sp``: ``speeds(rows)``)."""
    r, x = sp
    out = []
    ok = ~np.isnan(x)
    by_x = np.flatnonzero(ok)[np.argsort(x[ok], kind="stable")]  # one sort of the samples for every level
    for lv in levels:
        if lv.name == "slot":
            continue
        u = rows.unit[lv.name][r]
        med = _unit_medians(u[by_x], x[by_x], len(lv.names))
        if np.isnan(med).all():
            continue
        top = int(np.nanargmax(med))
        mine = (u == top) & ok
        n_units = int((~np.isnan(med)).sum())
        p, q = _q(x, mine, ok & (u != top), n_units)
        out.append(Suspect(lv.name, lv.names[top], top, float(med[top]), int(mine.sum()), p, q, n_units, level))
    return out


def _unit_medians(unit: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """Per unit of ``n`` the median of its samples ``x`` (NaN: none), ``x`` in ascending
    order: a stable sort by unit keeps each unit's samples sorted (a radix sort of
    16-bit unit numbers), so the medians need no sort of their own."""
    o = np.argsort(unit.astype(np.int16) if n < 1 << 15 else unit, kind="stable")
    return GR.grouped_quantiles(np.bincount(unit, minlength=n), x[o], [0.5], presorted=True)[0]


def culprit(rows: CHP.Rows, levels: list, sp: tuple, found: list, measure: bool = True):
    """The culprit unit (a ``Suspect``, ``measured`` unless ``measure`` is false: who,
    not by how much, spares the interval's bisection) by the module's rule, or None."""
    r, x = sp
    by = {s.level: s for s in found}
    names = [lv.name for lv in levels if lv.name != "slot"]
    ok = ~np.isnan(x)
    for k, name in enumerate(names):
        s = by.get(name)
        if s is None or not s.significant:
            continue
        if k == len(names) - 1:
            return measured(s, rows, sp) if measure else s
        inside = rows.unit[name][r] == s.number
        child = rows.unit[names[k + 1]][r]
        cmed = GR.group_quantiles(child[inside & ok], int(child.max()) + 1, x[inside & ok], [0.5])[0]
        rest = inside & ok & (child != int(np.nanargmax(cmed)))
        if rest.sum() < 2:
            continue
        p, q = _q(x, rest, ok & ~inside, s.units)
        if q < 1 - s.level_of_test and np.median(x[rest]) > 0:
            return measured(s, rows, sp) if measure else s
    return None


def task_rows(rows: CHP.Rows, m) -> np.ndarray:
    """Per placed row, its task's index in the replay's merged tasks ``m``
    (``timeline.analysis.edges.Tasks``): the same (rank, launch, stage, task)."""
    keys = [np.concatenate((np.asarray(a, np.int64), b)) for a, b in
            ((m.rank, rows.rank), (m.launch, rows.launch), (m.stage, rows.stage), (m.task, rows.task))]
    gid, n, _ = GR.group_ids(*keys)
    at = np.full(n, -1, np.int64)
    at[gid[:m.n]] = np.arange(m.n)
    return at[gid[m.n:]]


class Saving(NamedTuple):
    """A rebalancing's replay: what it changes and how, the launch's measured and
    predicted kernel time and the saving (µs), and the unchanged replay's fidelity (the
    largest error of a launch's end, µs): a saving is worth no more than that."""

    what: str
    how: str
    measured_us: float
    predicted_us: float
    saving_us: float
    fidelity_us: float


def _replayed(trace, g, plan, task_ns: np.ndarray) -> tuple:
    """``(measured, predicted)`` kernel time (ns, first start to last end over every rank)."""
    from timeline.analysis import whatif as W

    r = W.replay(trace, (), g, task_ns=task_ns, plan_=plan)
    t0 = float(r.recorded[:, 0].min())
    return float(r.recorded[:, -1].max()) - t0, float(r.simulated[:, -1].max()) - t0


def _own(rec: np.ndarray, trace) -> np.ndarray:
    """``(tasks, intervals)`` of the merged tasks' own intervals (the wait's column 0)."""
    d = np.diff(rec, axis=1).astype(np.float64)
    if trace.spec.wait:
        d[:, trace.spec.wait_index] = 0.0
    return np.maximum(d, 0.0)


def place_of(s: Suspect, levels: list) -> tuple:
    """``(unit's name without its rank, rank)`` of a level's unit (``xcd3``, 1 for
    ``r1.xcd3``): its place on the chip."""
    lv = next(lv for lv in levels if lv.name == s.level)
    rank = int(lv.rank[s.number])
    return s.unit.removeprefix(f"r{rank}."), rank


def peers(s: Suspect, rows: CHP.Rows, levels: list, sp: tuple) -> list:
    """The culprit's place on the launch's other ranks (``xcd3`` of rank 4 beside
    ``r1.xcd3``) where that unit is significantly slower too, each tested as a suspect
    is (against its level's other units; adjusted over them) and ``measured``: a unit
    slow on every rank is rebalanced on every rank, else the others still hold the
    kernel's end."""
    r, x = sp
    lv = next(lv for lv in levels if lv.name == s.level)
    place, rank = place_of(s, levels)
    ok = ~np.isnan(x)
    u = rows.unit[lv.name][r]
    out = []
    for k, name in enumerate(lv.names):
        if k == s.number or name.removeprefix(f"r{int(lv.rank[k])}.") != place:
            continue
        mine = (u == k) & ok
        if mine.sum() < 2:
            continue
        p, q = _q(x, mine, ok & (u != k), s.units)
        t = Suspect(lv.name, name, k, float(np.median(x[mine])), int(mine.sum()), p, q, s.units, s.level_of_test)
        if t.significant:
            out.append(estimated(t, rows, sp))
    return out


def estimated(s: Suspect, rows: CHP.Rows, sp: tuple) -> Suspect:
    """``s`` with its shift's estimate alone (Hodges–Lehmann, ``ST.hodges_lehmann``, of
    the samples ``measured`` would test; no interval: its ends NaN): what a rebalancing
    divides by, without the interval's bisection (a tenth of a second a unit)."""
    r, x = sp
    u = rows.unit[s.level][r]
    ok = ~np.isnan(x)
    a, b = _sample(x[ok & (u != s.number)], 1), _sample(x[ok & (u == s.number)], 2)
    est = ST.hodges_lehmann(a, b)
    return s._replace(shift=ST.Shift(est, math.nan, math.nan, s.level_of_test, s.p, a.size, b.size, a.size, b.size,
                                     "samples"))


def rebalance(trace, rows: CHP.Rows, levels: list, unit: Suspect, stage: str | None, also: tuple = ()) -> list:
    """The module's two rebalancings of ``trace`` (one launch; ``rows`` its placed
    rows): ``unit`` (with its slow ``peers``, ``also``) at the typical speed, ``stage``
    spread evenly; ``Saving``s (an ``AnalysisError`` where the trace has no task graph)."""
    from timeline.analysis import edges as E
    from timeline.analysis import whatif as W

    if not trace.spec.graph:
        raise AnalysisError("chip: the trace has no task graph (`timeline set-graph`), so no replay can say what "
                            "rebalancing would give back")
    g = E.edges(trace)
    plan = W.plan(trace, g)
    fid = W.fidelity(trace, g, plan).kernel_end_ns / 1e3
    own = _own(plan.rec, trace)
    at = task_rows(rows, g.tasks)
    out = []
    if unit is not None and unit.shift is not None:
        out.append(_unit_saving(trace, g, plan, fid, own, [unit, *also], rows, at, levels))
    if stage is not None:
        s = trace.spec.stage_names.index(stage)
        fine = CHP.unit_level(levels).name
        sel = (rows.stage == s) & (at >= 0)
        t_idx, first = np.unique(at[sel], return_index=True)
        u = rows.unit[fine][sel][first]  # each task's unit (its first wave's)
        busy = own[t_idx].sum(axis=1)
        gid, n, (rank, _) = GR.group_ids(np.asarray(g.tasks.rank)[t_idx], u)
        per = np.bincount(gid, weights=busy, minlength=n)
        mean = np.bincount(rank_id := GR.group_ids(rank)[0], weights=per) / np.bincount(rank_id)
        factor = np.where(per > 0, mean[rank_id] / np.where(per > 0, per, 1), 1.0)[gid]
        add = np.zeros_like(own)
        add[t_idx] = own[t_idx] * (factor - 1.0)[:, None]
        meas, pred = _replayed(trace, g, plan, add)
        out.append(Saving(f"stage {stage} spread evenly",
                          f"each of its {n} units' tasks scaled to the stage's mean busy time per unit "
                          "(work conserved, each CTA's task order kept)", meas / 1e3, pred / 1e3,
                          (meas - pred) / 1e3, fid))
    return out


def _unit_saving(trace, g, plan, fid: float, own: np.ndarray, units: list, rows: CHP.Rows, at: np.ndarray,
                 levels: list) -> Saving:
    """The replay with each of ``units``' tasks' own phases divided by its measured
    slowdown (the first: the culprit; the rest: its slow peers on other ranks)."""
    add = np.zeros_like(own)
    n, fs = 0, []
    for unit in units:
        f = unit.slowdown()[0]
        on = np.unique(at[(rows.unit[unit.level] == unit.number) & (at >= 0)])
        add[on] = own[on] * (1.0 / f - 1.0)
        n, fs = n + on.size, fs + [f]
    meas, pred = _replayed(trace, g, plan, add)
    if len(units) == 1:
        what = f"{units[0].unit} at the typical speed"
        how = f"its {n} tasks' own phases / {fs[0]:.3f} (its measured slowdown)"
    else:
        ranks = sorted(place_of(u, levels)[1] for u in units)
        what = f"{place_of(units[0], levels)[0]} at the typical speed on ranks {', '.join(map(str, ranks))}"
        how = (f"each rank's unit's tasks' own phases / its measured slowdown ({min(fs):.3f} to {max(fs):.3f}), "
               f"{n} tasks")
    return Saving(what, how, meas / 1e3, pred / 1e3, (meas - pred) / 1e3, fid)


def unit_culprit(trace, level: float = ST.LEVEL) -> dict | None:
    """The culprit unit of ``trace`` (one launch) as explain's record: level, unit,
    slowdown with its interval and a sentence; None where none is named, or the trace
    has no hardware placement (a derived CTA is no unit)."""
    try:
        rows, levels = CHP.rows_of(trace)
    except AnalysisError:
        return None
    if CHP.vendor_levels(trace.tasks, trace.spec.arch) == "cta":
        return None
    sp = speeds(rows)
    c = culprit(rows, levels, sp, suspects(rows, levels, sp, level))
    if c is None:
        return None
    f, lo, hi = c.slowdown()
    return {"level": c.level, "unit": c.unit, "slowdown": round(f, 5), "low": round(lo, 5), "high": round(hi, 5),
            "says": f"{c.unit} ran its tasks {(f - 1) * 100:.1f} % slower [{(lo - 1) * 100:.1f}, {(hi - 1) * 100:.1f}] "
                    f"than the other {c.level.upper() if c.level != 'cu' else 'CU'}s' (`timeline chip`): the unit, "
                    "not a task, is the culprit"}


__all__ = ["unit_culprit", "Saving", "estimated", "peers", "place_of", "rebalance", "task_rows", "SAMPLE", "Suspect", "culprit", "measured", "speeds", "suspects"]
