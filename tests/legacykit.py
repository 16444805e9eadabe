"""A GLM-5 layer kernel timeline tensor written by its rules (REFERENCE.md §1), and
their host reports reimplemented from their documented rules, for the legacy tests.

The tensor: ``(n_tasks, 8)`` int64, ``row = first[stage] + task`` over
``GLM5_STAGES``; CTA ``bid`` runs the tasks ``t`` of each stage with
``(base[stage] + t) % G == bid``, stages in order, one after another; columns 0-4
start, hint, staged, compute, end (100 MHz ticks), except qkv_a's hint and cache's
compute (never written); debug marks: split 5 and 6, uv 5, router 5, 6, 7, and
``route_top8``'s ``("ug", bid, 7)`` stamped by CTA ``bid`` from the ug stage and
again from the down stage (the later stamp stays)."""

from __future__ import annotations

import numpy as np

from timeline.ingest import legacy as L

G = L.GLM5_GRID


def glm5_tensor(seed: int = 0, t0: int = 7_000_000_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    stages = L.GLM5_STAGES
    count = dict(stages)
    first, acc = {}, 0
    for name, c in stages:
        first[name] = acc
        acc += c
    base, acc = {}, 0
    for name in L.GLM5_BASE_ORDER:
        base[name] = acc
        acc += count[name]
    ticks = np.zeros((acc, 8), dtype=np.int64)
    clock = t0 + rng.integers(0, 50, G)  # each CTA's own time
    for name, c in stages:
        for bid in range(G):
            for t in range((bid + G - base[name]) & (G - 1), c, G):
                row = first[name] + t
                d = rng.integers(1, 40, 4)
                marks = np.cumsum(np.concatenate(([clock[bid]], d)))
                ticks[row, :5] = marks
                if name == "qkv_a":
                    ticks[row, 1] = 0
                if name == "cache":
                    ticks[row, 3] = 0
                mid = (marks[2] + marks[3]) // 2
                for col in {"split": (5, 6), "uv": (5,), "router": (5, 6, 7)}.get(name, ()):
                    ticks[row, col] = mid + col
                if name in ("ug", "down") and bid < count["ug"]:
                    ticks[first["ug"] + bid, 7] = mid  # route_top8: the ug row of task index bid
                clock[bid] = marks[-1] + rng.integers(1, 6)
    return ticks


def their_timeline_report(ticks: np.ndarray, stages) -> list:
    """``layer.timeline_report()``'s numbers, by its rule: per stage ``(name, n, first,
    hint median, last end, d0, d1, d2, d3)`` in µs (ticks / 100.0 from the earliest
    column 0; columns 1-3 inherit the previous one where 0; torch medians)."""
    import torch

    tl = torch.from_numpy(ticks)[:, :5].double() / 100.0
    t0 = tl[:, 0].min()
    rows, i = [], 0
    for name, n in stages:
        st = tl[i: i + n].clone()
        i += n
        for c in (1, 2, 3):
            st[:, c] = torch.where(st[:, c] > 0, st[:, c], st[:, c - 1])
        d = (st[:, 1:] - st[:, :-1]).median(0).values
        rows.append((name, n, float(st[:, 0].min() - t0), float(st[:, 1].median() - t0),
                     float(st[:, 4].max() - t0), *(float(v) for v in d)))
    return rows


def their_profile_rows(ticks: np.ndarray, stages) -> list:
    """``tools/profile_summary.py``'s rows by its rule: ``(event, count, first, median, last)``."""
    import torch

    t = torch.from_numpy(ticks).double()
    start = t[:, 0].min()
    out, offset = [], 0
    for name, c in stages:
        stage = t[offset: offset + c]
        offset += c
        for column, event in ((0, "start"), (1, "hint"), (2, "ready"), (3, "computed"), (4, "publish")):
            v = stage[:, column]
            v = (v[v > 0] - start) / 100
            if v.numel():
                out.append((f"{name}_{event}", v.numel(), v.min().item(), v.median().item(), v.max().item()))
    return out
