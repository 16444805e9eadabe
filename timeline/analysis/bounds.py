"""How far a statement across ranks can be trusted: the clock alignment bound of the
ranks it compares, carried into every such statement ``explain`` makes.

Within one GPU's clock (one rank, or ranks on one device) times compare exactly.
Across ranks they compare only as well as the ranks were put on one axis
(``timeline.contract.clocks.alignment_of``): by measured clocks, each rank within
``± u``, so two instants of ranks a and b compare within ``u_a + u_b``
(``clocks.spread_uncertainty``); by an assumption (first stamps, a stage), not at all
(ASSUMED). A statement is **certain** only where no placement of the ranks within
their bounds could reverse it: "rank 3 arrived last" when its lead over every other
rank exceeds their two bounds; a culprit ranking when its margins exceed twice the
launch's spread bound (each of two compared savings may move by that bound). A launch
whose cross-rank waits contradict its clocks (causality violations beyond the bounds)
has no trusted alignment: nothing across its ranks is certain."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.contract import clocks as K
from timeline.core import grouped as GR
from timeline.core import rows as R

ONE_CLOCK = "one clock"
MEASURED = "measured"
ASSUMED = "assumed"
CONTRADICTED = "contradicted"


class Alignment(NamedTuple):
    """How the ranks of one launch compare: ``kind`` (``ONE_CLOCK``, ``MEASURED``,
    ``ASSUMED`` or ``CONTRADICTED``), ``bounds`` ``{rank: ± ns or None}`` and the
    causality violations across ranks that contradict them."""

    kind: str
    bounds: dict
    violations: int = 0

    def pair(self, a: int, b: int) -> float | None:
        """The bound on comparing instants of ranks ``a`` and ``b`` (None: not comparable)."""
        if a == b:
            return 0.0
        if self.kind in (ASSUMED, CONTRADICTED):
            return None
        ua, ub = self.bounds.get(a), self.bounds.get(b)
        return None if ua is None or ub is None else float(ua + ub)

    @property
    def spread(self) -> float | None:
        """The bound on any comparison across the launch's ranks (None: not comparable)."""
        if len(self.bounds) < 2 or self.kind == ONE_CLOCK:
            return 0.0
        if self.kind in (ASSUMED, CONTRADICTED) or any(u is None for u in self.bounds.values()):
            return None
        return K.spread_uncertainty(self.bounds.values())

    def says(self) -> str:
        """The alignment in words, as every cross-rank statement's caveat."""
        if self.kind == ONE_CLOCK:
            return "one clock"
        if self.kind == MEASURED:
            return f"ranks aligned by measured clocks, ± {max(self.bounds.values()):,.0f} ns each"
        if self.kind == CONTRADICTED:
            return (f"ranks' clock alignment contradicted by {self.violations} cross-rank causality violation(s): "
                    "cross-rank order not established")
        return "ranks aligned by an ASSUMPTION (first stamps or a stage): their skew is not measured"


def alignment(trace, violations: int = 0) -> Alignment:
    """The ``Alignment`` of ``trace``'s ranks (``violations``: its cross-rank causality
    violations beyond their bounds, ``edges.Graph.cross_rank``)."""
    al = K.alignment_of(trace)
    ranks = trace.ranks
    if len(ranks) < 2:
        return Alignment(ONE_CLOCK, {r: 0.0 for r in ranks})
    bounds = {a.rank: (a.uncertainty_ns if a.measured else (0.0 if a.by == "own clock" else None)) for a in al}
    bounds = {r: bounds.get(r, 0.0) for r in ranks}
    if violations:
        return Alignment(CONTRADICTED, bounds, int(violations))
    if any(u is None for u in bounds.values()):
        return Alignment(ASSUMED, bounds)
    if all(u == 0 for u in bounds.values()) and all(a.by == "own clock" for a in al):
        return Alignment(ONE_CLOCK, bounds)
    return Alignment(MEASURED, bounds)


class Arrival(NamedTuple):
    """At one all-reduce of one launch: the rank whose producers ended last, its lead
    over the runner-up (ns), the runner-up, and the ranks that could be last within the
    alignment bounds (``tied``; one: ``certain``)."""

    last: int
    lead_ns: float
    second: int | None
    tied: tuple
    certain: bool


def arrival(ends: dict, al: Alignment) -> Arrival:
    """The ``Arrival`` of per-rank last producer ends ``{rank: ns}``."""
    order = sorted(ends, key=lambda r: (-ends[r], r))
    last = order[0]
    second = order[1] if len(order) > 1 else None
    lead = float(ends[last] - ends[second]) if second is not None else 0.0
    tied = [last]
    for r in order[1:]:
        b = al.pair(last, r)
        if b is None or ends[last] - ends[r] <= b:
            tied.append(r)
    return Arrival(last, lead, second, tuple(tied), len(tied) == 1)


def rule_ends(trace, producer: str) -> tuple:
    """Per launch and rank, the last end of ``producer``'s tasks: ``(launches, ranks,
    ends)`` numpy arrays, one entry per (launch, rank) pair."""
    t = trace.tasks
    _, end = R.extent(R.phase_matrix(t, trace.phases))
    rank, launch, stage = (R.column(t, c).astype(np.int64) for c in ("rank", "launch", "stage_index"))
    sel = stage == trace.spec.stage_index(producer)
    gid, ng, (la, rk) = GR.group_ids(launch[sel], rank[sel])
    _, last = GR.group_min_max(gid, ng, end[sel], end[sel])
    return la, rk, last


def arrivals(trace, al: Alignment) -> list:
    """Per all-reduce rule of the graph: ``(consumer, producer, {launch: Arrival})``."""
    out = []
    if trace.tasks.num_rows == 0:
        return out
    for consumer, rules in trace.spec.graph.items():
        for rule in rules:
            if not rule.allreduce:
                continue
            la, rk, last = rule_ends(trace, rule.stage)
            per: dict = {}
            for launch, rank, end in zip(la.tolist(), rk.tolist(), last.tolist()):
                per.setdefault(launch, {})[rank] = end
            out.append((consumer, rule.stage, {k: arrival(v, al) for k, v in per.items() if len(v) > 1}))
    return out


def allreduce_skew(trace) -> list:
    """Per all-reduce rule of the graph (consumer, producer stage): per launch, the
    rank whose producer tasks ended last and by how much after the first rank's, as
    ``(consumer, producer, launches, ranks, last ranks, skew ns)`` arrays."""
    out = []
    spec = trace.spec
    t = trace.tasks
    if t.num_rows == 0:
        return out
    _, end = R.extent(R.phase_matrix(t, trace.phases))
    rank, launch, stage = (R.column(t, c).astype(np.int64) for c in ("rank", "launch", "stage_index"))
    for consumer, rules in spec.graph.items():
        for rule in rules:
            if not rule.allreduce:
                continue
            sel = stage == spec.stage_index(rule.stage)
            gid, ng, (la, rk) = GR.group_ids(launch[sel], rank[sel])
            _, last = GR.group_min_max(gid, ng, end[sel], end[sel])
            lid, nl, (launches,) = GR.group_ids(la)
            worst = np.full(nl, -1, dtype=np.int64)
            hi = np.full(nl, np.iinfo(np.int64).min)
            lo = np.full(nl, np.iinfo(np.int64).max)
            np.maximum.at(hi, lid, last)
            np.minimum.at(lo, lid, last)
            for k in range(ng):
                if last[k] == hi[lid[k]] and worst[lid[k]] < 0:
                    worst[lid[k]] = rk[k]
            out.append((consumer, rule.stage, launches, np.unique(rk), worst, hi - lo))
    return out


def culprits_certain(savings: list, noise: float, al: Alignment) -> bool:
    """Whether a culprit ranking (``savings``, the first the named one) holds for any
    placement of the ranks within their bounds: its lead over the next and its margin
    over the noise both exceed twice the launch's spread bound. Always on one clock."""
    spread = al.spread
    if spread is None:
        return False
    if spread == 0:
        return True
    first = savings[0]
    runner = savings[1] if len(savings) > 1 else -np.inf
    return first - runner > 2 * spread and first - noise > 2 * spread


__all__ = ["ASSUMED", "Alignment", "Arrival", "CONTRADICTED", "MEASURED", "ONE_CLOCK", "alignment", "allreduce_skew",
           "arrival", "arrivals", "culprits_certain", "rule_ends"]
