"""What ``explain`` compares a launch against: a **side**, the launches of one trace file
or run (a selection of them) reduced to a typical launch, and, for ``explain B
--baseline A``, whether two sides can be compared at all.

A side's typical kernel time and noise are ``timeline.analysis.launches``' (over all its
launches); its per-task typical durations (``explain.Typical``) are the medians over
the ``TYPICAL_LAUNCHES`` launches nearest its median kernel time (the explained ones
left out): a run of thousands of launches is not read whole for a typical one. Two
sides compare only as builds of one kernel on one kind of clock: ``comparability``
names every difference that forbids it, and the launches it pairs. ``stable`` counts
the culprits named over a side's slow launches."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.analysis import explain as X
from timeline.analysis import launches as LA
from timeline.analysis import stats as ST

TYPICAL_LAUNCHES = 9  # launches a side's per-task typical durations are the median of
UNREAD = ("xcc", "se", "sh", "cu", "simd", "wave_slot", "sm", "hw_unit")  # where its tasks ran: a typical
# launch's durations never read it (nullable by the tasks contract), so its launches are read without it
MIN_LAUNCHES = 3  # fewer launches give no typical one


class Side(NamedTuple):
    """One side: its launches' ``keys`` and ``kernel`` times (ns, NaN untimed), their
    typical kernel time and noise (ns), the per-task ``typical`` (None with fewer than
    ``MIN_LAUNCHES`` launches), the keys it was made of (``sample``) and its ``name``."""

    name: str
    keys: list
    kernel: np.ndarray
    typical_ns: float
    noise_ns: float
    typical: X.Typical | None
    sample: list


def nearest(kernel: np.ndarray, n: int, leave_out=()) -> list:
    """The indices of the ``n`` launches whose kernel time is nearest the median (ties
    in their order), those in ``leave_out`` left out."""
    k = np.asarray(kernel, dtype=np.float64)
    med = LA.typical_ns(k)
    gone = set(leave_out)
    idx = [int(i) for i in np.argsort(np.abs(k - med), kind="stable") if not np.isnan(k[i]) and int(i) not in gone]
    return idx[:n]


def load_all(load, keys: list) -> list:
    """``[load(key) for key in keys]``, two at a time on threads where there are cores
    (reading a launch's Parquet parts and retiming them leave the GIL)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    workers = min(len(keys), os.cpu_count() or 1, 4)
    if workers < 2:
        return [load(k) for k in keys]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(load, keys))


def side(name: str, keys: list, kernel, load, *, leave_out=(), least: int = MIN_LAUNCHES) -> Side:
    """The ``Side`` of launches ``keys`` (``kernel`` their kernel times) whose Traces
    ``load(key)`` reads; ``leave_out``: indices never part of the typical launch (the
    ones explained); ``least``: the fewest timed launches that make a typical one (a
    baseline of 1 launch is its own typical: B against A decomposes at any n)."""
    k = np.asarray(kernel, dtype=np.float64)
    timed = int((~np.isnan(k)).sum())
    typ_ns, noise = LA.typical_ns(k), LA.noise_ns(k)
    if timed < max(least, 1):
        return Side(name, list(keys), k, typ_ns, noise, None, [])
    idx = nearest(k, TYPICAL_LAUNCHES, leave_out) or nearest(k, TYPICAL_LAUNCHES)
    traces = load_all(load, [keys[i] for i in idx])
    how = (f"the {len(idx)} launches nearest the median kernel time of {timed} launches of {name}" if timed > len(idx)
           else f"{len(idx)} launches of {name}")
    typ = X.typical_of(traces, k[idx], how)
    return Side(name, list(keys), k, typ_ns, noise, typ, [keys[i] for i in idx])


class Comparability(NamedTuple):
    """Whether sides A and B compare (``reasons``: each difference that forbids it; none:
    they do) and what matched: launches paired ``by`` key or position, how many
    (``paired``), and each side's launches, ranks and steps."""

    reasons: list
    by: str
    paired: int
    a: dict
    b: dict

    @property
    def comparable(self) -> bool:
        return not self.reasons

    def says(self) -> str:
        head = (f"paired {self.paired} launch(es) by {self.by}; A: {self.a['launches']} launches of ranks "
                f"{self.a['ranks']}, B: {self.b['launches']} of ranks {self.b['ranks']}")
        return head if not self.reasons else head + "; not comparable: " + "; ".join(self.reasons)


def comparability(spec_a, spec_b, about_a: dict, about_b: dict) -> Comparability:
    """``Comparability`` of two sides from their specs (``Spec``) and ``about_*``
    (``launches``: count, ``ranks``: list, ``keys``: their launch keys, ``synthetic``)."""
    reasons = []
    if spec_a.stages != spec_b.stages:
        na, nb = dict(spec_a.stages), dict(spec_b.stages)
        if list(na) != list(nb):
            reasons.append(f"different stage lists: A {list(na)}, B {list(nb)}")
        else:
            diff = [f"{s} {na[s]} vs {nb[s]}" for s in na if na[s] != nb[s]]
            reasons.append("different task counts: " + ", ".join(diff[:6]))
    elif _graph(spec_a) != _graph(spec_b):
        reasons.append("different task graphs (timeline set-graph): the same stages wait for other producers")
    if spec_a.phases != spec_b.phases:
        reasons.append(f"different phases: A {list(spec_a.phases)}, B {list(spec_b.phases)}")
    if spec_a.grid and spec_b.grid and spec_a.grid != spec_b.grid:
        reasons.append(f"different grids: A {spec_a.grid} CTAs, B {spec_b.grid}")
    if spec_a.clock.name != spec_b.clock.name:
        reasons.append(f"clocks of different kinds: A {spec_a.clock.name}, B {spec_b.clock.name}")
    if bool(about_a.get("synthetic")) != bool(about_b.get("synthetic")):
        which = "A" if about_a.get("synthetic") else "B"
        reasons.append(f"side {which} is SYNTHETIC (a model), the other measured")
    if sorted(about_a["ranks"]) != sorted(about_b["ranks"]):
        reasons.append(f"different ranks: A {about_a['ranks']}, B {about_b['ranks']}")
    ka, kb = about_a["keys"], about_b["keys"]
    headed = [k for k in kb if k.headed]
    common = set(k for k in ka if k.headed) & set(headed)
    by, paired = ("(step, layer)", len(common)) if common else ("position", min(len(ka), len(kb)))
    return Comparability(reasons, by, paired, about_a, about_b)


def _graph(spec) -> dict:
    return {k: [tuple(sorted(r._asdict().items())) if hasattr(r, "_asdict") else r for r in v]
            for k, v in (spec.graph or {}).items()}


def identity(e: X.Explained, c: X.Culprit) -> tuple:
    """A culprit as it is the same culprit in another launch: scope, rank, stage,
    task, CTA and phase."""
    return (c.scope, c.rank, int(c.stage), c.task, c.cta, int(c.phase))


class Stable(NamedTuple):
    """A culprit named first over several slow launches: its ``identity``, one of its
    culprits and launches (``culprit``, ``explained``), how many launches named it, their
    ``share`` of all the launches' excess (``stats.Share``: with its bootstrap interval
    over the launches), and over those launches the excess (kernel - typical) and the
    culprit's savings, summed (ns)."""

    identity: tuple
    culprit: X.Culprit
    explained: X.Explained
    launches: int
    share: ST.Share
    excess_ns: float
    saving_ns: float


def stable(explained: list, level: float = ST.LEVEL) -> list:
    """Over explained slow launches: each culprit named first (significant) in any, the
    most often named first (``Stable``)."""
    excess = np.array([max(e.kernel_ns - e.typical_ns, 0.0) for e in explained])
    first = [identity(e, sig[0]) if (sig := X.significant(e)) else None for e in explained]
    named: dict = {}
    for i, (e, who) in enumerate(zip(explained, first)):
        if who is None:
            continue
        c = X.significant(e)[0]
        hit = named.setdefault(who, [c, e, 0, 0.0])
        hit[2] += 1
        hit[3] += c.saving_ns
    out = []
    for k, (c, e, n, sv) in named.items():
        part = np.where(np.array([w == k for w in first]), excess, 0.0)
        out.append(Stable(k, c, e, n, ST.share(part, excess, level=level), float(part.sum()), sv))
    return sorted(out, key=lambda x: (-x.launches, -x.share.share))


class CellTest(NamedTuple):
    """A culprit of B's launch tested across both sides' launches: ``shift`` (B - A of
    its cells' durations per launch and task, ns: ``cell_sums``), ``q`` (its Benjamini–Hochberg
    adjusted p over the launch's culprits) and ``significant``: B's kernel time is
    significantly slower, this q is below 1 - level, and fixing it saves time."""

    shift: ST.Shift
    q: float
    significant: bool


def cell_sums(parts, m, cells) -> np.ndarray:
    """Per launch of ``parts`` (``Typical.parts``): over ``cells`` ((interval, indices
    into the merged tasks ``m``)) that launch's durations of the same (rank, stage,
    task) and interval, summed and divided by the culprit's task count (per task, as
    its ``excess_us``); NaN where a launch lacks one of them."""
    out = np.full(len(parts), np.nan)
    for k, (rank, stage, task, dur) in enumerate(parts):
        span = int(max(task.max(initial=0), m.task.max(initial=0))) + 1
        stages = int(max(stage.max(initial=0), m.stage.max(initial=0))) + 1
        key = (rank.astype(np.int64) * stages + stage) * span + task
        order = np.argsort(key, kind="stable")
        total = 0.0
        for j, idx in cells:
            want = (m.rank[idx].astype(np.int64) * stages + m.stage[idx]) * span + m.task[idx]
            at = np.searchsorted(key[order], want)
            ok = (at < key.size) & (key[order][np.minimum(at, key.size - 1)] == want)
            if not ok.all():
                total = np.nan
                break
            total += float(dur[order[at], j].sum())
        out[k] = total
    tasks = np.unique(np.concatenate([idx for _, idx in cells])).size if cells else 1
    return out / max(tasks, 1)


def tested(e: X.Explained, a: X.Typical, b: X.Typical, kernel: ST.Shift, level: float) -> X.Explained:
    """``e`` (a launch of B against A's typical) with each culprit's ``CellTest``: its
    cells' per-launch sums over B's launches (``b.parts``) against A's (``a.parts``),
    Benjamini–Hochberg over the culprits."""
    shifts = [ST.shift(cell_sums(a.parts, e.tasks, c.cells), cell_sums(b.parts, e.tasks, c.cells), level=level)
              for c in e.culprits]
    q = ST.adjust([s.p for s in shifts])
    slower = kernel.significant and kernel.estimate > 0
    tests = tuple(CellTest(s, float(qi), bool(slower and not s.reason and qi < 1 - level and s.estimate > 0
                                              and c.saving_ns > 0))
                  for s, qi, c in zip(shifts, q, e.culprits))
    return e._replace(tests=tests)


__all__ = ["CellTest", "Comparability", "MIN_LAUNCHES", "Side", "Stable", "TYPICAL_LAUNCHES", "UNREAD", "cell_sums",
           "comparability", "identity", "load_all", "nearest", "side", "stable", "tested"]
