"""A direct, row-by-row computation of the chip report's figures (``timeline.analysis.chip``)
from a trace's task rows, for the tests to hold the columnar one against: every ns of a
launch's window marked per unit in a boolean array, no sweep, no grouping library."""

from __future__ import annotations

import math

import numpy as np


def unit_name(row: dict, vendor: str) -> str:
    """The finest unit's name by the documented rule (``xcd3.se1.cu7``, ``.sh1`` where
    the SH is 1; ``sm40``; ``cta12`` without hardware placement)."""
    if vendor == "amd":
        sh = ".sh1" if row["sh"] else ""
        return f"xcd{row['xcc']}.se{row['se']}{sh}.cu{row['cu']}"
    if vendor == "nvidia":
        return f"sm{row['sm']}"
    return f"cta{row['cta']}"


def _times(row: dict, phases, wait):
    """A row's (first, wait start, wait end, last) ns, missing phases inherited."""
    vals, prev = [], None
    for p in phases:
        v = row[f"{p}_ns"]
        v = prev if v is None else v
        vals.append(v)
        prev = v
    got = [v for v in vals if v is not None]
    first, last = min(got), max(got)
    if not wait:
        return first, first, first, last
    w0 = vals[phases.index(wait[0])]
    w1 = vals[phases.index(wait[1])]
    w0 = first if w0 is None else w0
    w1 = w0 if w1 is None else w1
    return first, min(max(w0, first), last), min(max(w1, first), last), last


def direct(trace, launch: int, rank: int, vendor: str) -> dict:
    """Per finest unit ``{name: (busy, wait, idle, last end from start)}`` and the tail
    ``(tail_from, tail_ns, units busy in it, units)`` of one launch on one rank."""
    rows = [r for r in trace.tasks.to_pylist() if r["launch"] == launch and r["rank"] == rank
            and r["cta"] is not None]
    times = [_times(r, list(trace.phases), trace.spec.wait) for r in rows]
    lo = min(t[0] for t in times)
    hi = max(t[3] for t in times)
    busy, both, last = {}, {}, {}
    for r, (a0, a1, b0, b1) in zip(rows, times):
        u = unit_name(r, vendor)
        b = busy.setdefault(u, np.zeros(hi - lo, bool))
        x = both.setdefault(u, np.zeros(hi - lo, bool))
        b[a0 - lo:a1 - lo] = True
        b[b0 - lo:b1 - lo] = True
        x[a0 - lo:b1 - lo] = True
        last[u] = max(last.get(u, lo), b1)
    units = {u: (int(busy[u].sum()), int(both[u].sum() - busy[u].sum()), int((hi - lo) - both[u].sum()),
                 last[u] - lo) for u in busy}
    ends = {}
    for r, t in zip(rows, times):
        k = (r["stage"], r["task"])
        ends[k] = max(ends.get(k, t[3]), t[3])
    e = sorted(ends.values())
    t90 = e[int(math.ceil(0.9 * len(e) - 1e-9)) - 1]
    in_tail = sum(1 for u in busy if busy[u][t90 - lo:].any())
    return {"units": units, "tail": (t90 - lo, hi - t90, in_tail, len(busy))}
