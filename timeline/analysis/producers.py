"""Every task's data producers under a task graph, compact: O(tasks), not O(edges).

A rule whose producer range is the same for every consumer task (``every``,
``allreduce``, a ``tiles`` rule with ``mul=0``) makes every consumer of a stage wait
for the same tasks: the GLM-5 graph's barriers and all-reduces name millions of
(consumer, producer) pairs in one launch. Here such a rule is one **group**
reference per consumer (per producer rank for an all-reduce): the group is the
producer tasks of that range on one (rank, launch), and what a consumer needs of
its producers (the latest end, the first producer in task order at it, the latest
``ready``) is a grouped maximum over the group's members, computed once per group.
Other rules (a few producers per consumer: ``same``, ``div``, ``block``, ...; listed
edges) stay **task** references, one per edge.

``maximum`` is the one reduction: per consumer, the maximum of a per-task value over
its producers, the producer that attains it (ties: the first in task-index order,
i.e. (rank, stage, task) within a launch) and the rule that named it (ties: the
first rule in the graph, as the edges table lists them). ``timeline.analysis.edges``
gates, flags causality and lists edges with it; ``timeline.analysis.whatif`` replays
with the same references.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from timeline.contract.graph import EdgeKind


class Producers(NamedTuple):
    """The data producers of a trace's tasks (indices into ``edges.Tasks``): one entry
    per reference, ``producer`` a task (``group`` -1) or ``group`` a group (``producer``
    -1), with the rule's ordinal in the graph and the producer's rank; the groups'
    members as (task, group) pairs; per rule its ``EdgeKind`` and whether it is an
    all-reduce (its edges are listed per producer rank); and how many producer tasks
    the rules name that have no row (``missing``). Every reference names a present
    producer: a group with no member is left out (its tasks counted missing)."""

    consumer: np.ndarray
    producer: np.ndarray
    group: np.ndarray
    rule: np.ndarray
    rank: np.ndarray
    member: np.ndarray
    member_group: np.ndarray
    groups: int
    rule_kind: np.ndarray
    rule_ranked: np.ndarray
    missing: int


def stage_rows(spec):
    """Per stage index the first row of a dense (stage, task) numbering, and the rows."""
    counts = [c for _, c in spec.stages]
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64), int(sum(counts))


def task_lookup(m, first: np.ndarray, rows: int):
    """``lookup(rank, launch, row) -> task index`` (-1 where absent), ``row`` =
    ``first[stage] + task``, over a dense (rank, launch, row) array; and the ranks."""
    ranks, launches = int(m.rank.max()) + 1, int(m.launch.max()) + 1
    table = np.full((ranks, launches, rows), -1, dtype=np.int64)
    table[m.rank, m.launch, first[m.stage] + m.task] = np.arange(m.n)

    def lookup(rank, launch, row):
        ok = (rank >= 0) & (rank < ranks)
        out = np.full(len(row), -1, dtype=np.int64)
        out[ok] = table[rank[ok], launch[ok], row[ok]]
        return out

    return lookup, ranks


def rule_pairs(rule, m, c: np.ndarray, producer_count: int):
    """``(consumer, producer task)`` of every edge a shaped rule gives consumers ``c``
    (consumer-major, producers in task order)."""
    n = rule.n(producer_count)
    return np.repeat(c, n), np.repeat(np.asarray(rule.lo(m.task[c])), n) + np.tile(np.arange(n), c.size)


def listed_pairs(rule, m, c: np.ndarray):
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


def shared_range(rule, producer_count: int, consumer_count: int):
    """``(lo, n)`` when every consumer task of a shaped rule waits for the same producer
    tasks ``lo .. lo + n - 1`` (a barrier, an all-reduce, a ``tiles`` row with
    ``mul=0``), else None."""
    if rule.listed:
        return None
    lo = np.unique(np.asarray(rule.lo(np.arange(max(consumer_count, 1), dtype=np.int64))))
    return (int(lo[0]), rule.n(producer_count)) if lo.size == 1 else None


def producers(spec, m) -> Producers:
    """The ``Producers`` of tasks ``m`` under ``spec.graph``: group references for the
    rules with a shared range, task references for the rest."""
    first, rows = stage_rows(spec)
    lookup, ranks = task_lookup(m, first, rows)
    launches = int(m.launch.max()) + 1
    counts = [c for _, c in spec.stages]
    refs, members, ranges, kinds, ranked, missing = [], [], {}, [], [], 0
    for consumer, rules in spec.graph.items():
        ci = spec.stage_index(consumer)
        c = np.flatnonzero(m.stage == ci)
        for rule in rules:
            ordinal = len(kinds)
            kinds.append(EdgeKind.ALL_REDUCE if rule.allreduce else EdgeKind.DATA)
            ranked.append(rule.allreduce)
            ps = spec.stage_index(rule.stage)
            span = shared_range(rule, counts[ps], counts[ci])
            if span is None:
                missing += _task_refs(rule, m, c, counts[ps], first[ps], lookup, ranks, ordinal, refs)
                continue
            key = (ps, *span)
            if key not in ranges:
                ranges[key] = len(ranges)
                lo, n = span
                mine = np.flatnonzero((m.stage == ps) & (m.task >= lo) & (m.task < lo + n))
                members.append((mine, (ranges[key] * ranks + m.rank[mine]) * launches + m.launch[mine]))
            base = ranges[key] * ranks
            for r in (range(ranks) if rule.allreduce else [None]):
                rank = m.rank[c] if r is None else np.full(c.size, r, dtype=np.int64)
                refs.append((c, np.full(c.size, -1, np.int64), (base + rank) * launches + m.launch[c],
                             np.full(c.size, ordinal, np.int64), rank))
    groups = len(ranges) * ranks * launches
    member = np.concatenate([t for t, _ in members]) if members else np.zeros(0, np.int64)
    member_group = np.concatenate([g for _, g in members]) if members else np.zeros(0, np.int64)
    size = np.bincount(member_group, minlength=groups)
    cat = [np.concatenate([r[k] for r in refs]) if refs else np.zeros(0, np.int64) for k in range(5)]
    on_group = cat[2] >= 0
    span_n = {v: n for (_, _, n), v in ranges.items()}
    if on_group.any():
        need = np.array([span_n[k] for k in range(len(ranges))], dtype=np.int64)[cat[2][on_group] // (ranks * launches)]
        missing += int((need - size[cat[2][on_group]]).sum())
    keep = ~on_group.copy()
    keep[on_group] = size[cat[2][on_group]] > 0
    cat = [a[keep] for a in cat]
    return Producers(*cat, member, member_group, groups, np.array(kinds, dtype=np.int8), np.array(ranked, bool),
                     missing)


def _task_refs(rule, m, c, producer_count, first_row, lookup, ranks, ordinal, refs) -> int:
    """Append rule ``ordinal``'s task references for consumers ``c`` to ``refs`` in
    the edges table's order; return how many producers it names have no row."""
    rep, ptask = listed_pairs(rule, m, c) if rule.listed else rule_pairs(rule, m, c, producer_count)
    missing = 0
    for r in (range(ranks) if rule.allreduce else [None]):
        rank = m.rank[rep] if r is None else np.full(rep.size, r, dtype=np.int64)
        p = lookup(rank, m.launch[rep], first_row + ptask)
        ok = p >= 0
        missing += int((~ok).sum())
        refs.append((rep[ok], p[ok], np.full(int(ok.sum()), -1, np.int64), np.full(int(ok.sum()), ordinal, np.int64),
                     rank[ok]))
    return missing


class Maximum(NamedTuple):
    """``maximum``'s answer, per task: the largest value over its producers (``fill``
    where it has none), the producer attaining it (-1: none) and the ordinal of the
    first rule naming that producer (-1: none)."""

    value: np.ndarray
    producer: np.ndarray
    rule: np.ndarray


def group_maximum(p: Producers, value: np.ndarray, fill):
    """Per group: the largest ``value`` of its members and the first member (task
    order) attaining it."""
    n = len(value)
    gmax = np.full(p.groups, fill, dtype=value.dtype)
    v = value[p.member]
    np.maximum.at(gmax, p.member_group, v)
    top = v == gmax[p.member_group]
    gwho = np.full(p.groups, n, dtype=np.int64)
    np.minimum.at(gwho, p.member_group[top], p.member[top])
    return gmax, gwho


def reference_values(p: Producers, value: np.ndarray, fill):
    """Per reference: the value (a group's maximum) and the task attaining it."""
    gmax, gwho = group_maximum(p, value, fill)
    on_group = p.group >= 0
    v, who = value[np.maximum(p.producer, 0)], p.producer.copy()
    v[on_group], who[on_group] = gmax[p.group[on_group]], gwho[p.group[on_group]]
    return v, who


def maximum(p: Producers, value: np.ndarray, fill) -> Maximum:
    """Per task, the maximum of ``value`` over its producers (see ``Maximum``)."""
    n = len(value)
    v, who = reference_values(p, value, fill)
    best = np.full(n, fill, dtype=value.dtype)
    np.maximum.at(best, p.consumer, v)
    top = v == best[p.consumer]
    first = np.full(n, n, dtype=np.int64)
    np.minimum.at(first, p.consumer[top], who[top])
    top &= who == first[p.consumer]
    rule = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(rule, p.consumer[top], p.rule[top])
    none = first == n
    first[none], rule[none] = -1, -1
    return Maximum(best, first, rule)


def has_producer(p: Producers, n: int) -> np.ndarray:
    """Per task: does any present producer feed it."""
    out = np.zeros(n, dtype=bool)
    out[p.consumer] = True
    return out
