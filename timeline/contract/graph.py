"""The task graph of a mono kernel: which tasks each task waits for.

A spec's ``graph`` maps a consumer stage to its producer ``Rule``s. A rule says:
task ``t`` of the consumer waits for tasks ``[lo(t), lo(t) + count)`` of stage
``stage``, with ``lo(t) = offset + (t % mod if mod else (t // div) * mul)``; the
constructors name the shapes the mono kernels use (``every``, ``same``, ``div``,
``block``, ``mod``, ``tiles``, ``allreduce``). An all-reduce rule waits for those
tasks on every rank of the launch. Besides its rules a task waits for its own CTA's
previous task (the rotation order): that edge is implicit (``timeline.analysis.edges``).

This module only states and checks the graph (plain Python, what a Spec stores in
its JSON); ``timeline.analysis.edges`` reads a trace against it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

from timeline.contract.placement import MAX_INDEX
from timeline.errors import TimelineError


class GraphError(TimelineError):
    """A task graph that names an unknown stage, or producer tasks a stage does not have."""


class EdgeKind(IntEnum):
    """What an edge into a consumer task is (stored as int8 in ``edges.Graph.kind``)."""

    DATA = 0  # a producer task one of its rules names
    ALL_REDUCE = 1  # a producer task of an all-reduce rule (on any rank of the launch)
    CTA_ORDER = 2  # the task its own CTA ran just before (implicit, not in the graph)

    @property
    def label(self) -> str:
        """Its name in tables and exports: ``data``, ``all-reduce``, ``cta-order``."""
        return EDGE_LABELS[self]


EDGE_LABELS = ("data", "all-reduce", "cta-order")  # by EdgeKind value


def hands_off(kind):
    """Does an edge of ``kind`` (an ``EdgeKind``, or an int array of them) hand a
    producer's results to the consumer, ending its wait (data or all-reduce, not the
    CTA's order)?"""
    return kind != EdgeKind.CTA_ORDER


class Rule(NamedTuple):
    """Task ``t`` of a consumer stage waits for tasks ``[lo(t), lo(t) + n)`` of
    ``stage``, ``n`` = ``count`` (0: every task of ``stage``, from 0); ``lo(t) =
    offset + (t % mod if mod else (t // div) * mul)``; ``allreduce``: on every rank.
    A rule with ``pairs`` lists its edges instead (``listed``): ``(launch, consumer
    task, producer task)`` triples, launch -1 for every launch."""

    stage: str
    count: int = 1
    div: int = 1
    mul: int = 1
    mod: int = 0
    offset: int = 0
    allreduce: bool = False
    pairs: tuple = ()

    @property
    def listed(self) -> bool:
        return bool(self.pairs)

    def lo(self, t):
        """The first producer task of consumer task(s) ``t`` (an int or an int array)."""
        if self.count == 0:
            return t * 0
        return self.offset + (t % self.mod if self.mod else (t // self.div) * self.mul)

    def n(self, producer_count: int) -> int:
        """How many producer tasks a consumer task waits for."""
        return producer_count if self.count == 0 else self.count

    def to_dict(self) -> dict:
        """The rule as JSON: its stage and the fields that differ from the defaults."""
        d = {"stage": self.stage}
        d.update({k: v for k, v in self._asdict().items() if k != "stage" and v != Rule._field_defaults[k]})
        if self.pairs:
            d["pairs"] = [list(p) for p in self.pairs]
        return d

    @classmethod
    def from_dict(cls, d) -> "Rule":
        if not isinstance(d, dict) or "stage" not in d or set(d) - set(cls._fields):
            raise GraphError(f"a producer rule is a dict of {list(cls._fields)} with at least 'stage'; got {d!r}")
        pairs = _triples(d.get("pairs", ()))
        try:
            r = cls(str(d["stage"]), **{k: (bool(v) if k == "allreduce" else int(v)) for k, v in d.items()
                                        if k not in ("stage", "pairs")}, pairs=pairs)
        except (TypeError, ValueError, OverflowError):
            raise GraphError(f"a producer rule's numbers must be integers; got {d!r}") from None
        if max(r.count, r.div, r.mul, r.mod, r.offset) > MAX_INDEX:
            raise GraphError(f"a producer rule's numbers are task counts and indices, at most {MAX_INDEX}; got {d!r}")
        if r.count < 0 or r.div < 1 or r.mul < 0 or r.mod < 0 or r.offset < 0:
            raise GraphError(f"a producer rule needs count >= 0, div >= 1, mul, mod, offset >= 0; got {d!r}")
        return r


# -- the shapes the mono kernels use -------------------------------------------------------------
def every(stage: str) -> Rule:
    """Every task of ``stage`` (a barrier on it)."""
    return Rule(stage, count=0)


def same(stage: str) -> Rule:
    """Task ``t`` of ``stage``."""
    return Rule(stage)


def div(stage: str, k: int) -> Rule:
    """Task ``t // k`` of ``stage``."""
    return Rule(stage, div=k)


def block(stage: str, k: int) -> Rule:
    """Tasks ``t * k .. t * k + k - 1`` of ``stage``."""
    return Rule(stage, count=k, mul=k)


def mod(stage: str, k: int) -> Rule:
    """Task ``t % k`` of ``stage``."""
    return Rule(stage, mod=k)


def tiles(stage: str, count: int, *, div: int = 1, mul: int = 1, offset: int = 0) -> Rule:
    """Tasks ``offset + (t // div) * mul`` onwards, ``count`` of them (``count=0``:
    every task): a consumer that reads a tile row of its producer."""
    return Rule(stage, count=count, div=div, mul=mul, offset=offset)


def allreduce(stage: str) -> Rule:
    """Every task of ``stage`` on every rank of the launch (a tensor-parallel reduce)."""
    return Rule(stage, count=0, allreduce=True)


def listed(stage: str, pairs, *, allreduce: bool = False) -> Rule:
    """The tasks of ``stage`` named per consumer task: ``pairs`` of ``(launch,
    consumer task, producer task)`` (launch -1: every launch), for waits the data
    decides (MoE routing: which expert tiles a token block feeds), supplied when the
    buffer is collected (``timeline.collect(..., edges=...)``)."""
    return Rule(stage, count=0, allreduce=allreduce, pairs=_triples(pairs))


def _triples(pairs) -> tuple:
    """A listed rule's ``pairs`` as int triples; a ``GraphError`` for anything else."""
    try:
        out = tuple(tuple(int(v) for v in p) for p in pairs)
    except (TypeError, ValueError, OverflowError):
        out = ((),)
    if any(len(p) != 3 or not all(-MAX_INDEX <= v <= MAX_INDEX for v in p) for p in out):
        raise GraphError("a listed rule's pairs are (launch, consumer task, producer task) triples of "
                         f"integers of at most {MAX_INDEX}; got {repr(pairs)[:80]}")
    return out


class Edge(NamedTuple):
    """One listed edge, as ``collect(..., edges=)`` takes them: consumer ``stage``'s
    task ``task`` waits, in launch ``launch`` (-1: every launch), for task
    ``producer_task`` of ``producer_stage``."""

    stage: str
    task: int
    producer_stage: str
    producer_task: int
    launch: int = -1


def with_listed(graph: dict, edges) -> dict:
    """``graph`` plus the ``Edge``s (or 5-tuples in ``Edge`` order) as one listed rule
    per (consumer stage, producer stage), after the rules it has."""
    out = {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in dict(graph or {}).items()}
    grouped = {}
    for e in edges:
        e = Edge(*e)
        grouped.setdefault((e.stage, e.producer_stage), []).append((e.launch, e.task, e.producer_task))
    for (consumer, producer), pairs in grouped.items():
        out.setdefault(consumer, []).append(listed(producer, pairs))
    return out


# -- checking a graph against its stages ----------------------------------------------------------
def check_graph(graph, stages) -> dict:
    """``graph`` (``{stage: [Rule or its dict, ...]}``) as ``{stage: (Rule, ...)}`` in
    stage order, every rule checked against ``stages`` (``((name, count), ...)``):
    known stages, and for every consumer task a producer range inside its stage."""
    count = dict(stages)
    out = {}
    if not isinstance(graph or {}, dict):
        raise GraphError(f"a task graph is {{consumer stage: [rule, ...]}}; got {graph!r}")
    for consumer, rules in (graph or {}).items():
        if consumer not in count:
            raise GraphError(f"the task graph names consumer stage {consumer!r}; the stages are {list(count)}")
        if isinstance(rules, (Rule, dict)):
            rules = [rules]
        if not isinstance(rules, (list, tuple)):
            raise GraphError(f"stage {consumer!r}'s producers are a rule or a list of rules; got {rules!r}")
        checked = []
        for r in rules:
            r = r if isinstance(r, Rule) else Rule.from_dict(r)
            if r.stage not in count:
                raise GraphError(f"stage {consumer!r} waits for unknown stage {r.stage!r}; the stages are "
                                 f"{list(count)}")
            if r.listed:
                _check_pairs(consumer, r, count)
                checked.append(r)
                continue
            t = np.arange(count[consumer], dtype=np.int64)
            lo = np.asarray(r.lo(t))
            hi = lo + r.n(count[r.stage])
            if lo.min() < 0 or hi.max() > count[r.stage]:
                bad = int(t[(lo < 0) | (hi > count[r.stage])][0])
                raise GraphError(f"stage {consumer!r} task {bad} waits for {r.stage!r} tasks "
                                 f"{int(lo[bad])}..{int(hi[bad]) - 1}, but {r.stage!r} has {count[r.stage]} tasks; "
                                 f"fix the rule {r.to_dict()}")
            checked.append(r)
        out[consumer] = tuple(checked)
    return {name: out[name] for name, _ in stages if name in out}


def _check_pairs(consumer: str, r: Rule, count: dict) -> None:
    p = np.array(r.pairs, dtype=np.int64).reshape(-1, 3)
    for col, what, n in ((1, f"{consumer!r} task", count[consumer]), (2, f"{r.stage!r} task", count[r.stage])):
        bad = (p[:, col] < 0) | (p[:, col] >= n)
        if bad.any():
            raise GraphError(f"stage {consumer!r}'s listed edge {tuple(int(v) for v in p[bad][0])} names {what} "
                             f"{int(p[bad][0, col])}, but it has {n} tasks (0..{n - 1}); fix the edge list")
    if (p[:, 0] < -1).any():
        raise GraphError(f"stage {consumer!r}'s listed edges name launch {int(p[p[:, 0] < -1][0, 0])}; a launch "
                         "is >= 0, or -1 for every launch")


def graph_to_dict(graph: dict) -> dict:
    """A checked graph as JSON: ``{stage: [rule dict, ...]}``."""
    return {stage: [r.to_dict() for r in rules] for stage, rules in graph.items()}
