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


# -- every generation of REFERENCE §1b, written by its kernel's rules (not read from timeline.contract.kernels) --------

def _running(order, count) -> dict:
    base, acc = {}, 0
    for name in order:
        base[name] = acc
        acc += count[name]
    return base


def write_pattern(stages, cta_of, never, marks, *, cols=8, seed=0, t0=7_000_000_000, grid=G) -> np.ndarray:
    """A tensor as the kernel writes it: every CTA walks the stages in order and runs
    its tasks (``cta_of[stage][t] == bid``) one after another; each task stamps
    columns 0-4 at rising synthetic times except ``never(stage, t)`` (columns it never
    writes); ``marks(stage, t, bid, row_of)`` gives ``[(row, column)]`` debug marks it
    stamps (mid-task). Row ``first[stage] + t``; a later stamp overwrites."""
    rng = np.random.default_rng(seed)
    first, acc = {}, 0
    for name, c in stages:
        first[name] = acc
        acc += c
    ticks = np.zeros((acc, cols), dtype=np.int64)
    clock = t0 + rng.integers(0, 50, grid)

    def row_of(name, t):
        return first[name] + t

    for name, c in stages:
        for bid in range(grid):
            for t in np.flatnonzero(cta_of[name] == bid):
                d = rng.integers(1, 40, 4)
                stamp = np.cumsum(np.concatenate(([clock[bid]], d)))
                row = first[name] + int(t)
                skip = never(name, int(t))
                for col in range(5):
                    if col not in skip:
                        ticks[row, col] = stamp[col]
                mid = (stamp[2] + stamp[3]) // 2
                for r, col in marks(name, int(t), bid, row_of):
                    ticks[r, col] = mid + col
                clock[bid] = stamp[-1] + rng.integers(1, 6)
    return ticks


def rotation(stages, order, grid=G, fixed=None, inline=None) -> dict:
    """``{stage: CTA per task}``: ``(base[s] + t) % grid``, base the running sum over
    ``order``; ``fixed`` stages from their own base; ``inline`` ones on their host's."""
    count = dict(stages)
    base = _running(order, count)
    base.update(fixed or {})
    for name, host in (inline or {}).items():
        base[name] = base[host]
    return {n: (base[n] + np.arange(c)) % grid for n, c in stages}


def indexed_stages(S: int, heads: int = 8, topk: int = 2048) -> tuple:
    """indexed_mla_moe_kernel.py's stage list for GLM-5 (REFERENCE §1b's general counts)."""
    hg = -(-heads // 8)
    return (("qkv_a", 164), ("cache", 1), ("q_b", 128), ("uk", 32), ("split", S * (topk // 64) * (hg if S == 1 else 1)),
            ("uv", S * 32), ("o", 192), ("router", S * 32), ("ug", 256 if S == 1 else S * 256),
            ("down", 6144 // (32 if S == 1 else 24)))


def _glm_marks(S, count, ug_from_down=True):
    def marks(name, t, bid, row_of):
        out = [(row_of(name, t), c) for c in {"split": (5, 6), "uv": (5,), "router": (5, 6, 7)}.get(name, ())]
        if name == "ug" or (name == "down" and ug_from_down):
            if bid < count["ug"]:
                out.append((row_of("ug", bid), 7))  # route_top8 / dn_route: the ug row of task index bid
        return out
    return marks


def indexed_tensor(S: int, seed=0, t0=7_000_000_000) -> tuple:
    """``(stages, ticks, ctas)`` of the indexed kernel at ``S`` (heads 8, topk 2048)."""
    stages = indexed_stages(S)
    cta = rotation(stages, GLM5_ORDER)

    def never(name, t):
        return {"qkv_a": {1}, "cache": {3}}.get(name, set()) | ({1, 2, 3} if name == "ug" and S > 1 else set())

    return stages, write_pattern(stages, cta, never, _glm_marks(S, dict(stages), ug_from_down=S == 1),
                                 seed=seed, t0=t0), cta


GLM5_ORDER = ("qkv_a", "cache", "q_b", "split", "uk", "uv", "o", "router", "ug", "down")
KIMI_STAGES = (("qkv_a", 228), ("cache", 1), ("q_b", 144), ("uk", 48), ("split", 64), ("uv", 24), ("o", 224))


def kimi_tensor(seed=0) -> tuple:
    """Kimi-K3 attention through the indexed kernel at S = 1: 733 rows, marks split 5, 6 and uv 5."""
    cta = rotation(KIMI_STAGES, ("qkv_a", "cache", "q_b", "split", "uk", "uv", "o"))

    def marks(name, t, bid, row_of):
        return [(row_of(name, t), c) for c in {"split": (5, 6), "uv": (5,)}.get(name, ())]

    return KIMI_STAGES, write_pattern(KIMI_STAGES, cta, lambda n, t: {"qkv_a": {1}, "cache": {3}}.get(n, set()),
                                      marks, seed=seed), cta


def mono_stages(indexer: bool, S: int = 1) -> tuple:
    """monokernel/glm/kernel.py's stage list at GLM-5 S (heads 8, topk 2048, index_max_seq 4096)."""
    keys = 32 if S > 4 else 64
    idx = (("index_q", 256),) if indexer else ()
    score = (("index_score", S * 64), ("index_select", S)) if indexer else ()
    return (("qkv_a", 164), ("q_norm", S), ("cache", 1), ("q_b", 128), *idx, ("uk", 32), *score,
            ("split", S * 1 * (2048 // keys)), ("uv", S * 32), ("o", 192), ("router", S * 32),
            ("ug", 256 if S == 1 else S * 256), ("down", 6144 // (32 if S == 1 else 24)))


def mono_tensor(indexer: bool, seed=0) -> tuple:
    """``(stages, ticks, ctas)`` of Glm5MonoKernel at S = 1: index_q on q_b's CTAs (its
    tasks < 128 right after q_b's task t), index_score / index_select on bases 101 / 100."""
    stages = mono_stages(indexer)
    order = ("qkv_a", "q_norm", "cache", "q_b", "split", "uk", "uv", "o", "router", "ug", "down")
    cta = rotation(stages, order, fixed={"index_score": 101, "index_select": 100} if indexer else None,
                   inline={"index_q": "q_b"} if indexer else None)

    def never(name, t):
        if name == "index_q":
            return {1, 2} if t < 128 else set()
        return {"qkv_a": {1}, "q_norm": {3}, "cache": {3}, "index_score": {1, 2, 3},
                "index_select": {1, 2, 3}}.get(name, set())

    return stages, write_pattern(stages, cta, never, _glm_marks(1, dict(stages)), seed=seed), cta


DSV4_S1 = (("hcd_a", 0), ("hcc_a", 0), ("qkv_a", 128), ("qkv_c", 0), ("cache", 1), ("cmp", 0), ("i_cmp", 0),
           ("q_b", 256), ("q_norm", 16), ("i_q_b", 0), ("i_q", 0), ("i_wp", 0), ("i_score", 0), ("i_topk", 0),
           ("split", 2), ("uv", 128), ("o_a", 512), ("o_b", 224), ("hcd_f", 0), ("hcc_f", 0), ("router", 48),
           ("ug", 2304), ("down", 224))  # plan.py's stage_tasks(1, 16) with V4-Pro dims, by hand
DSV4_ORDER = ("hcd_a", "hcc_a", "qkv_a", "qkv_c", "cache", "cmp", "i_cmp", "split", "q_b", "q_norm", "i_q_b", "i_q",
              "i_wp", "i_score", "i_topk", "uv", "o_a", "o_b", "hcd_f", "hcc_f", "router", "ug", "down")


def dsv4_tensor(seed=0) -> tuple:
    """DeepSeek-V4 at S = 1, 16 heads: TL_COLS = 5, no marks, split placed before q_b;
    qkv_a stamps 0, 2, 3, 4 (qkv_stage has no hint_wait), cache and q_norm 0, 1, 2, 4."""
    cta = rotation(DSV4_S1, DSV4_ORDER)

    def never(name, t):
        return {"qkv_a": {1}, "cache": {3}, "q_norm": {3}}.get(name, set())

    return DSV4_S1, write_pattern(DSV4_S1, cta, never, lambda *a: [], cols=5, seed=seed), cta


def their_report_text(ticks: np.ndarray, stages, S: int = 1) -> str:
    """``timeline_report()`` as the GLM MonoKernel's op.py writes it (the indexed
    kernel's is the same without the index lines), stages of 0 tasks skipped."""
    import torch

    tl = torch.from_numpy(ticks)[:, :5].double() / 100.0
    t0 = tl[:, 0].min()
    rows, i = [], 0
    for name, n in stages:
        if n == 0:
            continue
        st = tl[i: i + n].clone()
        i += n
        for c in (1, 2, 3):
            st[:, c] = torch.where(st[:, c] > 0, st[:, c], st[:, c - 1])
        d = (st[:, 1:] - st[:, :-1]).median(0).values
        rows.append(
            f"{name:7s} x{n:4d}  [{(st[:, 0].min() - t0):6.1f} | hint {(st[:, 1].median() - t0):6.1f} | "
            f"end {(st[:, 4].max() - t0):6.1f}]  hint {d[0]:5.1f}  stage {d[1]:5.1f}  "
            f"compute {d[2]:5.1f}  epi {d[3]:5.1f}")
        if name == "index_score":
            per_sample = n // S
            ready = [(st[s * per_sample: (s + 1) * per_sample, 4].max() - t0).item() for s in range(S)]
            rows.append(" " * 10 + "score-ready/sample " + " ".join(f"{v:.1f}" for v in ready))
        elif name == "index_select":
            done = [(st[s, 4] - t0).item() for s in range(S)]
            rows.append(" " * 10 + "select-done/sample " + " ".join(f"{v:.1f}" for v in done))
    return "\n".join(rows)


TILERT_POINTS = ("entry", "q_a_publish", "cache_wait", "cache_ready", "cache_publish", "q_b_wait", "q_b_ready",
                 "q_b_publish", "uk_wait", "uk_ready", "uk_publish", "split_wait", "split_ready", "split_publish",
                 "uv_wait", "uv_ready", "uv_publish", "o_wait", "o_ready", "o_publish", "router_wait",
                 "router_ready", "router_publish", "ug_wait", "ug_ready", "ug_computed", "ug_publish", "down_wait",
                 "down_ready", "down_computed")  # 30 at S = 1, slot order


def points_tensor(seed=0, t0=9_000_000_000, idle_cta=None) -> np.ndarray:
    """A TileRT program-point tensor as asm_bridge's trace.py has thread 0 write it:
    ``(256, 30)``, each CTA's points in slot order at rising times, a group of points
    skipped where that CTA has no such work (0 = never passed); ``idle_cta`` never
    passes any point (its row stays 0)."""
    rng = np.random.default_rng(seed)
    ticks = np.zeros((G, len(TILERT_POINTS)), np.int64)
    for cta in range(G):
        if cta == idle_cta:
            continue
        now = t0 + int(rng.integers(0, 40))
        for slot, name in enumerate(TILERT_POINTS):
            group = name.rpartition("_")[0]
            if group in ("cache", "router") and cta % 8:  # these stages run on a few CTAs only
                continue
            now += int(rng.integers(1, 60))
            ticks[cta, slot] = now
    return ticks


def their_points_rows(ticks: np.ndarray, points) -> list:
    """tools/profile_summary.py @47b000f5's points branch, as it computes it."""
    import torch

    t = torch.from_numpy(ticks).double()
    start = t[:, 0].min()
    out = []
    for column, name in enumerate(points):
        values = t[:, column]
        values = (values[values > 0] - start) / 100
        if values.numel():
            out.append((name, values.numel(), values.min().item(), values.median().item(), values.max().item()))
    return out
