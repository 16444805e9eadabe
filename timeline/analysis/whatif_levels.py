"""The what-if replay (``timeline.analysis.whatif.replay``) level by level: the same
simulation, each step over many tasks at once.

``replay`` simulates tasks one at a time in its order (recorded wait end), each task
reading what the tasks simulated before it left: its CTA predecessor's simulated end,
each producer's simulated end (or recorded end where the producer comes later in the
order), each producer group's largest simulated end so far and the largest recorded end
of its members still to come (``whatif.Plan.suffix``). A task's **level** is one more
than the highest level of the tasks before it in the order that it reads (0: none),
so every task of a level reads only finished tasks: the levels run in turn, a level's
tasks at once, each with the very values (and the same float operations, in the same
order) the one-at-a-time loop gives it, so the two agree to the bit. The levels are
found by relaxation (each round a task's level from its sources' levels), at most
``MAX_LEVELS`` rounds (and ``MIN_WIDTH`` tasks a level on average); a trace with longer
chains (a CTA running many tasks in order: its chain's length, found first by pointer
jumping, bounds the levels from below) has no ``Schedule`` and ``replay`` keeps its
loop.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

MAX_LEVELS = 128  # past this many levels the loop is as fast (each level costs a few numpy calls)
MIN_WIDTH = 16  # tasks per level on average, at least, for the levels to pay


class Level(NamedTuple):
    """One level's tasks and what they read: the CTA predecessor (``q``, ``q_has``, and
    ``q_sim``: simulated before, else its recorded end counts); task references (``t_ref``
    read by the level's task ``t_at``, ``t_sim`` as for ``q``); group references
    (``g_ref`` read by ``g_at``: ``g_all`` every member simulated before (their running
    maximum), else the largest of the first ``g_n`` members in order from ``g_from`` in
    ``Schedule.slots``' order; ``g_rest``: the recorded ends still to come, ``Plan.suffix``);
    ``fed``: the task reads any producer; the groups the tasks are members of (``m_task``,
    ``m_group``, ``m_slot``)."""

    task: np.ndarray
    q: np.ndarray
    q_has: np.ndarray
    q_sim: np.ndarray
    t_ref: np.ndarray
    t_at: np.ndarray
    t_sim: np.ndarray
    g_ref: np.ndarray
    g_at: np.ndarray
    g_all: np.ndarray
    g_from: np.ndarray
    g_n: np.ndarray
    g_rest: np.ndarray
    fed: np.ndarray
    m_task: np.ndarray
    m_group: np.ndarray
    m_slot: np.ndarray


class Schedule(NamedTuple):
    """The levels in turn; ``groups``, ``slots``: the group count and member slots
    (every group's members in simulation order); ``partial``: some group reference
    reads part of its group (then the members' ends are kept by slot)."""

    levels: list
    groups: int
    slots: int
    partial: bool


def _refs(n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Each reference's reader: ``i`` repeated ``hi[i] - lo[i]`` times (``_by_key``'s slices)."""
    return np.repeat(np.arange(n), (hi - lo).astype(np.int64))


def _depths(n: int, rounds: int, q: np.ndarray, q_sim: np.ndarray, t_at, t_ref, g_at, g_last, s_task, s_group):
    """Each task's level by relaxation: ``rounds`` levels at most (None past them)."""
    depth = np.zeros(n, np.int64)
    off = s_group.astype(np.int64) * (n + 1)  # one group's running maximum never reaches the next's offset
    has_g = g_last >= 0
    for _ in range(rounds + 1):
        d = np.zeros(n, np.int64)
        d[q_sim] = depth[q[q_sim]] + 1
        np.maximum.at(d, t_at, depth[t_ref] + 1)
        if has_g.any():
            run = np.maximum.accumulate(depth[s_task] + off) - off  # per group: the members' running maximum
            np.maximum.at(d, g_at[has_g], run[g_last[has_g]] + 1)
        if np.array_equal(d, depth):
            return depth
        depth = d
    return None


def _longest_chain(q: np.ndarray, q_sim: np.ndarray) -> int:
    """The most tasks of one CTA chain (each reading its predecessor ``q`` where
    ``q_sim``), by pointer jumping: each task's chain head in log2(length) rounds."""
    head = np.where(q_sim, q, np.arange(q.size))
    while True:
        up = head[head]
        if np.array_equal(up, head):
            return int(np.bincount(head).max())
        head = up


def schedule(p, groups: int, rounds: int | None = None) -> Schedule | None:
    """The ``Schedule`` of the plan ``p`` (``whatif.Plan``; ``groups``: its producer
    groups), or None where it has more levels than ``rounds`` (default: ``MAX_LEVELS``,
    and at least ``MIN_WIDTH`` tasks a level on average: else the loop pays as well)."""
    n = len(p.order)
    if n == 0:
        return None
    pos = np.empty(n, np.int64)
    pos[np.asarray(p.order, np.int64)] = np.arange(n)
    q = np.maximum(p.prev, 0)
    q_has = p.prev >= 0
    q_sim = q_has & (pos[q] < pos)
    t_at = _refs(n, p.lo, p.hi)
    t_ref = np.asarray(p.dp, np.int64)
    t_sim = pos[t_ref] < pos[t_at]
    g_at = _refs(n, p.glo, p.ghi)
    g_ref = np.asarray(p.gref, np.int64)
    m_task = _refs(n, p.mlo, p.mhi)
    m_group = np.asarray(p.mgroup, np.int64)
    at = np.lexsort((pos[m_task], m_group))  # every group's members in simulation order (Plan.suffix's)
    s_task, s_group = m_task[at], m_group[at]
    size = np.bincount(s_group, minlength=groups)
    first = np.concatenate(([0], np.cumsum(size)[:-1])).astype(np.int64)
    key = s_group * (n + 1) + pos[s_task]
    done = np.searchsorted(key, g_ref * (n + 1) + pos[g_at]) - first[g_ref]  # members simulated before
    rounds = min(MAX_LEVELS, max(n // MIN_WIDTH, 1)) if rounds is None else rounds
    if _longest_chain(q, q_sim) > rounds:  # a CTA's tasks read each other in turn: that many levels at least
        return None
    last = np.where(done > 0, first[g_ref] + done - 1, -1)  # the last member read, in member order
    depth = _depths(n, rounds, q, q_sim, t_at[t_sim], t_ref[t_sim], g_at, last, s_task, s_group)
    if depth is None:
        return None
    slot = np.empty(at.size, np.int64)
    slot[at] = np.arange(at.size)
    parts = dict(t=_split(depth, t_at, t_ref, t_sim), g=_split(depth, g_at, g_ref, done == size[g_ref],
                                                              first[g_ref], done, p.suffix[p.goff[g_ref] + done]),
                 m=_split(depth, m_task, m_group, slot))
    fed = (p.hi > p.lo) | (p.ghi > p.glo)
    tasks = [x[0] for x in _split(depth, np.arange(n))]
    where = np.empty(n, np.int64)  # a task's place in its level
    for tk in tasks:
        where[tk] = np.arange(tk.size)
    levels = [Level(tk, q[tk], q_has[tk], q_sim[tk], t[1], where[t[0]], t[2], g[1], where[g[0]], g[2], g[3], g[4],
                    g[5], fed[tk], m[0], m[1], m[2]) for tk, t, g, m in zip(tasks, parts["t"], parts["g"], parts["m"])]
    return Schedule(levels, groups, at.size, bool((done < size[g_ref]).any()))


def _split(depth: np.ndarray, reader: np.ndarray, *cols) -> list:
    """Per level (of ``depth``, 0 up): ``[reader, *cols]`` of the entries whose reader
    is at that level (by reader within it: a level's tasks read nothing of each other)."""
    order = np.lexsort((reader, depth[reader]))
    d = depth[reader][order]
    cut = np.searchsorted(d, np.arange(int(depth.max()) + 2))
    arrays = [reader[order]] + [np.asarray(c)[order] for c in cols]
    return [[a[cut[k]:cut[k + 1]] for a in arrays] for k in range(cut.size - 1)]


def simulate(s: Schedule, rec_end: np.ndarray, first_rec, gap, lead, tail, own, handoff, held, floor, hmin):
    """``(start, wait end)`` of every task by ``whatif.replay``'s rule, level by level
    (per task: ``rec_end`` its recorded end (float), ``first_rec`` its recorded start,
    ``gap`` after its CTA predecessor, ``lead`` / ``tail`` from start to the wait and
    from the wait to the end, ``own`` wait, ``handoff``, ``held``, its stage's ``floor``
    and ``hmin``)."""
    n = rec_end.size
    sim, start, wait_end = rec_end.copy(), np.zeros(n), np.zeros(n)
    gsim = np.full(s.groups, -np.inf)
    slots = np.full(s.slots + 1, -np.inf) if s.partial else None
    for lv in s.levels:
        i = lv.task
        t0 = np.where(lv.q_has, np.where(lv.q_sim, sim[lv.q], rec_end[lv.q]) + gap[i], first_rec[i])
        ws = t0 + lead[i]
        latest = np.full(i.size, -np.inf)
        np.maximum.at(latest, lv.t_at, np.where(lv.t_sim, sim[lv.t_ref], rec_end[lv.t_ref]))
        if lv.g_ref.size:
            got = np.where(lv.g_all, gsim[lv.g_ref], -np.inf)
            part = np.flatnonzero(~lv.g_all & (lv.g_n > 0))
            if part.size:
                a = lv.g_from[part]
                got[part] = np.maximum.reduceat(slots, np.ravel(np.c_[a, a + lv.g_n[part]]))[::2]
            np.maximum.at(latest, lv.g_at, np.maximum(got, lv.g_rest))
        with np.errstate(invalid="ignore"):  # a task reading nothing: its other branches are not taken
            waited = np.where(held[i], np.maximum(latest + handoff[i], ws + np.minimum(own[i], floor[i])),
                              np.maximum(ws + own[i], latest + np.minimum(hmin[i], handoff[i])))
        we = np.where(lv.fed, waited, ws + own[i])
        start[i], wait_end[i] = t0, we
        sim[i] = we + tail[i]
        if lv.m_task.size:
            np.maximum.at(gsim, lv.m_group, sim[lv.m_task])
            if slots is not None:
                slots[lv.m_slot] = sim[lv.m_task]
    return start, wait_end


__all__ = ["Level", "MAX_LEVELS", "MIN_WIDTH", "Schedule", "schedule", "simulate"]
