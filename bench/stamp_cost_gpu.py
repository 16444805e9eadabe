"""What one timeline stamp costs on an NVIDIA GPU (written for the H200), as a slope.

    PYTHONPATH=. python3 bench/stamp_cost_gpu.py --out DIR

A persistent kernel (one CTA per SM) whose CTAs each run ``T`` tasks of a fixed,
small amount of real work: load a 1-element-per-thread fp32 tile (L2-resident),
a dependent FMA chain on it (``--iters`` x 8 FMAs, about 1 us), store the tile to
the task's own slot. Each task is stamped at the 5 phases of the mono kernels
with ``instrument.triton.stamp`` (start, tile load issued, half the chain, the
whole chain, tile stored). Builds of the same kernel: ``TL=False`` (normal build),
lead-thread stamps (``waves=1``) and per-warp stamps (``waves=num_warps``), both
also as hybrid builds (``%clock64`` every stamp, ``%globaltimer`` at the first and
the last; ``hlead``, ``hwarps``); ``lead+4`` / ``hlead+4``: four further stamps a
task (marks right behind four of the stamps), whose difference to the build
without them is what a further stamp costs; the normal build a second time (A/A:
the noise floor); ``dlead`` / ``dwarps``: the library's deferred stamps
(``stamp_deferred``: each stores the reading of the one before, so no store waits
for its own counter read), hybrid, lead thread and per warp, also ``+4`` (as are
``hwarps``). And two experiments, other ways to stamp measured against the
library's (defined here, not in ``instrument``): ``regs`` (the ticks held in
registers, the record written once at the task's end) and ``c32`` (phases 1..4
read the 32-bit ``%clock``; its buffer does not decode), also ``+4``. And the ``BETWEEN`` builds (``lead6``,
``warps6``, ``hlead6``, ``hwarps6``): the chain's two halves run as three loops
each, and their ``+4`` puts the four marks between those loops, so that a further
stamp has work on both sides and is measured against the same six loops without
it (a mark right behind another stamp waits for that stamp's store to read its
register; ``lead+4`` measures that case).

The launches of every (build, T) pair are interleaved round by round (order
rotated), timed with CUDA events around a batch of launches; each round gives a
paired difference ``t_on - t_off``. Per CTA timeline a launch holds ``5 T``
stamps, so ``(t_on - t_off) / (5 T)`` is the cost of one stamp, and the slope of
``t_on - t_off`` against ``5 T`` over T = 64, 256, 1024 is that cost free of any
per-launch constant. Done at 4 and 8 warps. One check: the stamped builds' buffers
(but ``c32``'s) decode with ``timeline.collect``, every row there, no anomaly but
``clock_change`` (a hybrid decode's report that the SM clock moved).

Output: ``DIR/stamp_cost_<gpu>.txt`` (what is printed) and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from instrument import alloc
from instrument import triton as itl

PHASES_PER_TASK = 5
TILES = 64  # distinct input tiles the tasks cycle through (L2-resident)
LINES: list = []


def say(*parts) -> None:
    """Print a line and keep it for the results file."""
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LINES.append(line)


# -- device code ---------------------------------------------------------------------
@triton.jit
def chain(y, x, n):
    """``n`` x 8 dependent FMAs ``y = y * c + x`` (latency-bound: one warp per SM
    sub-partition waits out each FMA)."""
    for _ in range(n):
        for _j in tl.static_range(8):
            y = y * 0.99951171875 + x
    return y


@triton.jit
def _clock32():
    return tl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


# bench_stamp's experiments (0: the library's stamp); see its docstring
EXP_C32 = tl.constexpr(1)
EXP_NO_ANCHOR = tl.constexpr(2)
EXP_NO_BOOK = tl.constexpr(3)
EXP_BARE = tl.constexpr(4)
EXP_NO_DROP = tl.constexpr(5)
EXP_NO_PLACE = tl.constexpr(6)
EXP_RED_DROP = tl.constexpr(7)
EXP_BRANCH_DROP = tl.constexpr(8)
EXP_PLAIN_DROP = tl.constexpr(9)
EXP_DROP_FIRST = tl.constexpr(10)
EXP_FLAG_DROP = tl.constexpr(11)
EXP_DROP_LAST = tl.constexpr(12)


@triton.jit
def _tid():
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _red_add(word, pred):
    """Add 1 to the int64 at ``word`` where ``pred`` holds, by ``red`` (no result)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p red.global.gpu.relaxed.add.u64 [$1], 1; mov.u32 $0, 0; }",
        "=r,l,r", [word, pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def bench_stamp(stamps, LAYOUT: tl.constexpr, launch, task, PHASE: tl.constexpr, TL: tl.constexpr,
                EXP: tl.constexpr):
    """``instrument.triton.stamp`` of stage 0, or an experiment (``EXP``; none a stamp
    this tool decodes whole): ``EXP_C32``, every stamp but the first and the last
    phase's stores the 32-bit ``%clock``; the others a hybrid lead-thread stamp with a
    part left out or done another way: ``EXP_NO_ANCHOR`` without its anchors,
    ``EXP_NO_BOOK`` without the record's bookkeeping (slot check, placement word, drop
    counter), ``EXP_BARE`` neither (a cycle-counter read and its store),
    ``EXP_NO_DROP`` / ``EXP_NO_PLACE`` without the drop counter / placement word;
    the drop counter as a predicated ``red`` (no result) instead of the library's
    ``atomic_add`` (``EXP_RED_DROP``), as that atomic behind a branch
    (``EXP_BRANCH_DROP``), as a predicated plain load, add and store (``EXP_PLAIN_DROP``:
    what a drop word one CTA owns would take; here one shared word, so it only times
    the instructions), or counted before the first phase's counter read rather than
    after its stores (``EXP_DROP_FIRST``), counted at the last phase instead of the
    first (``EXP_DROP_LAST``), or not counted but flagged: a predicated plain store of
    the task's index + 1 (``EXP_FLAG_DROP``)."""
    if EXP == EXP_C32 and PHASE != 0 and PHASE != LAYOUT.phases - 1:
        if TL:
            ok = itl.in_slots(LAYOUT, launch, 0, task)
            tl.store(stamps + itl.stamp_offset(LAYOUT, launch, 0, task, 0, PHASE), _clock32().to(tl.int64), mask=ok)
    elif EXP > EXP_C32:
        if TL:
            tl.static_assert(LAYOUT.anchors != 0 and LAYOUT.waves == 1, "the experiments: a hybrid lead-thread spec")
            no_book = EXP == EXP_NO_BOOK or EXP == EXP_BARE
            ok = (task >= 0) if no_book else itl.in_slots(LAYOUT, launch, 0, task)
            if EXP == EXP_DROP_FIRST and PHASE == 0:
                tl.atomic_add(stamps + itl.drop_counter_word(LAYOUT, 0), 1, mask=ok == 0, sem="relaxed")
            t = itl.clock64()
            if EXP != EXP_NO_ANCHOR and EXP != EXP_BARE:
                itl._anchor(stamps, LAYOUT, launch, 0, task, 0, PHASE, ok)
            tl.store(stamps + itl.stamp_offset(LAYOUT, launch, 0, task, 0, PHASE), t, mask=ok)
            if PHASE == LAYOUT.phases - 1 and EXP == EXP_DROP_LAST:
                tl.atomic_add(stamps + itl.drop_counter_word(LAYOUT, 0), 1, mask=ok == 0, sem="relaxed")
            if PHASE == 0 and not no_book:
                if EXP != EXP_NO_PLACE:
                    place = itl.placement_word(tl.program_id(0), 0, itl.smid())
                    tl.store(stamps + itl.placement_offset(LAYOUT, launch, 0, task, 0), place, mask=ok)
                drop_word = itl.drop_counter_word(LAYOUT, 0)
                if EXP == EXP_RED_DROP:
                    _red_add(stamps + drop_word, (ok == 0) & (_tid() == 0))
                elif EXP == EXP_PLAIN_DROP:
                    tl.store(stamps + drop_word, tl.load(stamps + drop_word, mask=ok == 0, other=0) + 1, mask=ok == 0)
                elif EXP == EXP_FLAG_DROP:
                    tl.store(stamps + drop_word, task.to(tl.int64) + 1, mask=ok == 0)
                elif EXP == EXP_BRANCH_DROP:
                    if ok == 0:
                        tl.atomic_add(stamps + drop_word, 1, sem="relaxed")
                elif EXP != EXP_NO_DROP and EXP != EXP_DROP_FIRST and EXP != EXP_DROP_LAST:
                    tl.atomic_add(stamps + drop_word, 1, mask=ok == 0, sem="relaxed")
    else:
        itl.stamp(stamps, LAYOUT, launch, 0, task, PHASE, TL)


@triton.jit
def chain_marked(y, x, n, stamps, LAYOUT: tl.constexpr, launch, task, TL: tl.constexpr, EXP: tl.constexpr,
                 PIECES: tl.constexpr, MID: tl.constexpr, MARK0: tl.constexpr):
    """``chain(y, x, n)`` in ``PIECES`` (1 or 3) loops of ``n // 3``, ``n // 3`` and the
    rest steps; with ``MID`` a mark stamp (``MARK0``, ``MARK0 + 1``) between them: a
    stamp with work on both sides, against the same loops without it."""
    if PIECES == 1:
        y = chain(y, x, n)
    else:
        k = n // 3
        y = chain(y, x, k)
        if MID:
            bench_stamp(stamps, LAYOUT, launch, task, MARK0, TL, EXP)
        y = chain(y, x, k)
        if MID:
            bench_stamp(stamps, LAYOUT, launch, task, MARK0 + 1, TL, EXP)
        y = chain(y, x, n - 2 * k)
    return y


@triton.jit(do_not_specialize=["launch", "n_tasks", "iters"])
def work_kernel(inp, out, stamps, launch, n_tasks, iters, LAYOUT: tl.constexpr, TL: tl.constexpr,
                BLOCK: tl.constexpr, EXTRA: tl.constexpr = False, EXP: tl.constexpr = 0,
                PIECES: tl.constexpr = 1, MID: tl.constexpr = False):
    """Persistent: CTA ``bid`` runs tasks ``bid + i G`` for ``i < n_tasks``; each task
    loads tile ``task % TILES``, runs the FMA chain in two halves and stores to
    ``out[task]``. Stamps (when ``TL``): 0 start, 1 load issued, 2 first half of the
    chain done, 3 chain done, 4 tile stored; ``EXTRA``: after stamps 1..4 also one of
    the spec's four marks (5 + k), right behind it: four further stamps a task;
    ``EXP``: see ``bench_stamp``; ``PIECES`` / ``MID``: see ``chain_marked`` (the four
    marks between the pieces of the two halves)."""
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = iters // 2
    for i in range(n_tasks):
        task = bid + i * G
        bench_stamp(stamps, LAYOUT, launch, task, 0, TL, EXP)
        x = tl.load(inp + (task % 64) * BLOCK + lanes)  # 64 = TILES
        bench_stamp(stamps, LAYOUT, launch, task, 1, TL, EXP)
        if EXTRA:
            bench_stamp(stamps, LAYOUT, launch, task, 5, TL, EXP)
        y = chain_marked(x, x, half, stamps, LAYOUT, launch, task, TL, EXP, PIECES, MID, 5)
        bench_stamp(stamps, LAYOUT, launch, task, 2, TL, EXP)
        if EXTRA:
            bench_stamp(stamps, LAYOUT, launch, task, 6, TL, EXP)
        y = chain_marked(y, x, iters - half, stamps, LAYOUT, launch, task, TL, EXP, PIECES, MID, 7)
        bench_stamp(stamps, LAYOUT, launch, task, 3, TL, EXP)
        if EXTRA:
            bench_stamp(stamps, LAYOUT, launch, task, 7, TL, EXP)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        bench_stamp(stamps, LAYOUT, launch, task, 4, TL, EXP)
        if EXTRA:
            bench_stamp(stamps, LAYOUT, launch, task, 8, TL, EXP)


# -- experiments: other ways to stamp, measured beside the library's ------------------------------
@triton.jit
def tick(ON: tl.constexpr):
    """A stamp held in a register: ``%clock64`` (int64; 0 when not ``ON``). The
    task's ticks go to the buffer together, with ``task_record``, when it ends."""
    if ON:
        return itl.clock64()
    else:
        return tl.zeros([], dtype=tl.int64)


@triton.jit
def task_begin(ON: tl.constexpr):
    """The first phase's stamp of a register-held record: ``(%clock64, %globaltimer)``
    read back to back (the record's first anchor); zeros when not ``ON``."""
    if ON:
        c = itl.clock64()
        return c, itl.globaltimer()
    else:
        return tl.zeros([], dtype=tl.int64), tl.zeros([], dtype=tl.int64)


@triton.jit
def task_record(stamps, LAYOUT: tl.constexpr, launch, STAGE: tl.constexpr, task, first, ticks,
                ON: tl.constexpr):
    """The last phase's stamp and the whole record: read ``%clock64`` and
    ``%globaltimer`` (the second anchor), then write placement word, one tick per
    phase (``ticks``: the tuple of phases 0 .. P-2, ``tick`` / ``task_begin``
    readings; the last is this read) and both anchors (``first``: ``task_begin``'s
    timer) as one ``LAYOUT.cols``-word row, 16-byte vector stores, from the lanes
    that hold it. Outside the stage's slots nothing is stored and the stage's drop
    counter counts 1. Needs a hybrid lead-thread layout (``waves == 1``)."""
    if ON:
        tl.static_assert(LAYOUT.anchors == LAYOUT.phases + 1 and LAYOUT.waves == 1,
                         "task_record needs a hybrid lead-thread spec without marks: spec(..., hybrid=True)")
        last = itl.clock64()
        g1 = itl.globaltimer()
        ok = itl.in_slots(LAYOUT, launch, STAGE, task)
        col = tl.arange(0, LAYOUT.cols)
        row = tl.where(col == itl._PLACEMENT_COL, itl.placement_word(tl.program_id(0), 0, itl.smid()), 0)
        for j in tl.static_range(LAYOUT.phases - 1):
            row = tl.where(col == itl.phase_col(j), ticks[j], row)
        row = tl.where(col == itl.phase_col(LAYOUT.phases - 1), last, row)
        row = tl.where(col == itl.anchor_col(LAYOUT, 0), first, row)
        row = tl.where(col == itl.anchor_col(LAYOUT, 1), g1, row)
        tl.store(stamps + itl.word_offset(LAYOUT, launch, STAGE, task, 0, 0) + col, row, mask=ok)
        tl.atomic_add(stamps + itl.drop_counter_word(LAYOUT, STAGE), 1, mask=ok == 0, sem="relaxed")


@triton.jit(do_not_specialize=["launch", "n_tasks", "iters"])
def work_kernel_regs(inp, out, stamps, launch, n_tasks, iters, LAYOUT: tl.constexpr, TL: tl.constexpr,
                     BLOCK: tl.constexpr):
    """``work_kernel`` with register-held hybrid stamps: ``task_begin`` / ``tick`` read
    ``%clock64`` into registers, ``task_record`` writes the task's record at its end."""
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = iters // 2
    for i in range(n_tasks):
        task = bid + i * G
        c0, g0 = task_begin(TL)
        x = tl.load(inp + (task % 64) * BLOCK + lanes)  # 64 = TILES
        c1 = tick(TL)
        y = chain(x, x, half)
        c2 = tick(TL)
        y = chain(y, x, iters - half)
        c3 = tick(TL)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        task_record(stamps, LAYOUT, launch, 0, task, g0, (c0, c1, c2, c3), TL)


@triton.jit(do_not_specialize=["launch", "n_tasks", "iters"])
def work_kernel_deferred(inp, out, stamps, launch, n_tasks, iters, LAYOUT: tl.constexpr, TL: tl.constexpr,
                         BLOCK: tl.constexpr, EXTRA: tl.constexpr = False):
    """``work_kernel`` with deferred stamps (``instrument.triton.stamp_deferred``: each
    stores the reading of the stamp before it); ``EXTRA``: the four marks as well."""
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = iters // 2
    for i in range(n_tasks):
        task = bid + i * G
        t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 0, 0, -1, TL)
        x = tl.load(inp + (task % 64) * BLOCK + lanes)  # 64 = TILES
        t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 1, t, 0, TL)
        if EXTRA:
            t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 5, t, 1, TL)
        y = chain(x, x, half)
        t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 2, t, 1 + 4 * EXTRA, TL)  # held: mark 5 or phase 1
        if EXTRA:
            t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 6, t, 2, TL)
        y = chain(y, x, iters - half)
        t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 3, t, 2 + 4 * EXTRA, TL)
        if EXTRA:
            t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 7, t, 3, TL)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        if EXTRA:
            t = itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 8, t, 7, TL)
        itl.stamp_deferred(stamps, LAYOUT, launch, 0, task, 4, t, 3 + 5 * EXTRA, TL)


# -- host side -------------------------------------------------------------------------
EXTRA_MARKS = ("m1", "m2", "m3", "m4")  # the further stamps of the EXTRA builds


def spec(grid: int, tasks_per_cta: int, *, waves: int, arch: str, extra=None, hybrid=False, marks=()):
    """One stage ``work`` of ``grid x tasks_per_cta`` tasks (the largest T timed; a
    launch with fewer tasks fills a prefix of the task rows); ``hybrid``: stamps on
    ``%clock64``, ``%globaltimer`` anchors at the first and last phase."""
    sp = itl.spec("stamp_cost", [("work", grid * tasks_per_cta)], waves=waves, grid=grid, arch=arch,
                  extra=dict(extra or {}), hybrid=hybrid)
    return sp.replace(marks=list(marks)) if marks else sp


BUILDS = (  # name, waves (0: num_warps), stamped, hybrid
    ("off", 1, False, False), ("lead", 1, True, False), ("warps", 0, True, False),
    ("hlead", 1, True, True), ("hwarps", 0, True, True), ("regs", 1, True, True),
    ("lead+4", 1, True, False), ("hlead+4", 1, True, True), ("hwarps+4", 0, True, True), ("dlead", 1, True, True), ("dlead+4", 1, True, True),
    ("dwarps", 0, True, True), ("dwarps+4", 0, True, True),
    ("c32", 1, True, True), ("c32+4", 1, True, True),
    # the chain's halves in three loops each, without and with a mark between the loops
    ("lead6", 1, True, False), ("lead6+4", 1, True, False), ("warps6", 0, True, False), ("warps6+4", 0, True, False),
    ("hlead6", 1, True, True), ("hlead6+4", 1, True, True), ("hwarps6", 0, True, True), ("hwarps6+4", 0, True, True))
BETWEEN = ("lead6", "warps6", "hlead6", "hwarps6")  # builds whose +4 puts its marks between work


def kernel_of(build: str):
    """The kernel a build runs: register-held stamps (``regs``) or a store a stamp."""
    if build.startswith(("dlead", "dwarps")):
        return work_kernel_deferred
    return work_kernel_regs if build == "regs" else work_kernel


def marks_of(build: str) -> tuple:
    return EXTRA_MARKS if build.endswith("+4") else ()


def extra_of(build: str) -> dict:
    """The constexpr switches a build passes: its further stamps (right behind others,
    or for the ``BETWEEN`` builds between pieces of work), the 32-bit counter."""
    between = build.split("+")[0] in BETWEEN
    further = build.endswith("+4")
    return {**({"PIECES": 3} if between else {}), **({"MID": True} if between and further else {}),
            **({"EXTRA": True} if further and not between else {}),
            **({"EXP": EXP_C32.value} if build.startswith("c32") else {})}


def launch_args(inp, out, buf, layout, n_tasks, iters, on, num_warps):
    """The kernel's arguments (after the grid) for one build."""
    return (inp, out, buf.tensor if on else None, 0, n_tasks, iters, layout, on, num_warps * 32)


def compile_check(grid: int, tmax: int, iters: int) -> dict:
    """Compile the builds for sm_90 without a GPU; the facts a broken build
    would change: timer reads per build (0 off, 5 on), the chain's FMAs present
    in loops of 8 in every build."""
    res = {}
    for nw in (4, 8):
        for name, waves, on, hybrid in BUILDS:
            lay = spec(grid, tmax, waves=waves or nw, arch="sm_90", hybrid=hybrid, marks=marks_of(name)).layout
            k = itl.compile_launch(kernel_of(name), torch.float32, torch.float32,
                                   torch.int64 if on else None, 0, tmax, iters, lay, on, nw * 32,
                                   grid=(grid,), num_warps=nw, **extra_of(name))
            ptx = k.asm["ptx"]
            res[(nw, name)] = {"globaltimer": ptx.count("%globaltimer"), "clock64": ptx.count("%clock64"),
                               "fma": ptx.count("fma.rn.f32"), "st_global": ptx.count("st.global")}
    return res


def environment(argv) -> dict:
    """GPU, driver, library versions and the date (``gpu_run.environment``)."""
    from gpu_run import environment as env  # bench/ is this script's sys.path[0]

    return env("PYTHONPATH=. python3 bench/stamp_cost_gpu.py " + " ".join(argv))


def events_around(launch, batch: int) -> tuple:
    """CUDA events recorded around ``batch`` calls of ``launch``."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(batch):
        launch()
    e1.record()
    return e0, e1


WARMUP = 3  # timed calls of each config before the rounds (``interleaved``)


def interleaved(configs: list, timed, rounds: int, batch: int, sync_every: int = 20) -> dict:
    """``{config: µs per launch of every round}``: ``timed(config)`` (an event pair
    around ``batch`` launches) ``WARMUP`` times each to warm up, then ``rounds`` rounds of
    every config, the order rotated a step each round so that drift hits all alike."""
    for c in configs:  # warm-up: clocks up, caches warm
        for _ in range(WARMUP):
            timed(c)
    torch.cuda.synchronize()
    ev = {c: [] for c in configs}
    for r in range(rounds):
        k = r % len(configs)
        for c in configs[k:] + configs[:k]:
            ev[c].append(timed(c))
        if r % sync_every == sync_every - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return {c: np.array([a.elapsed_time(b) * 1e3 / batch for a, b in ev[c]]) for c in configs}


def diff_slope(us: dict, build: str, base: str, tasks: list) -> tuple:
    """``(median ns of build - base at each T, slope in ns a task)``: ``us`` as
    ``interleaved`` returns it, keyed ``(build, T)``."""
    diffs = [float(np.median((us[(build, t)] - us[(base, t)]) * 1e3)) for t in tasks]
    return diffs, float(np.polyfit(np.array(tasks, float), np.array(diffs), 1)[0])


def further_ns(per_stamp: dict, base: str) -> float:
    """What one further stamp costs, ns: the build with four more a task (``base +
    "+4"``) against ``base``, from their ns a stamp averaged over a task's five."""
    return (per_stamp[base + "+4"] - per_stamp[base]) * PHASES_PER_TASK / 4


def slope_args(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The options of the benches timed as this one is (``warp_store_gpu.py``,
    ``held_stamps_gpu.py``): results folder, tasks a CTA, FMA steps, rounds, batch."""
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--iters", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--batch", type=int, default=5)


def save(out: Path, stem: str, lines: list, results: dict) -> str:
    """Print ``lines`` and write them and ``results`` to ``out/stem.txt`` / ``.json``."""
    text = "\n".join(lines)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.txt").write_text(text + "\n")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return text


def measure(nw: int, grid: int, tasks: list, iters: int, arch: str, rounds: int, batch: int) -> dict:
    """Interleaved timing of off / lead / per warp / off again at each T; paired
    differences per round; the decode check at the largest T."""
    tmax = max(tasks)
    block = nw * 32
    g = torch.Generator(device="cuda").manual_seed(nw)
    inp = torch.rand(TILES * block, device="cuda", generator=g) * 0.01
    out = torch.empty(grid * tmax * block, device="cuda")
    bufs = {name: alloc(spec(grid, tmax, waves=waves or nw, arch=arch, hybrid=hybrid, marks=marks_of(name)))
            for name, waves, on, hybrid in BUILDS if on}
    builds = {"off": (bufs["lead"], False), **{name: (b, True) for name, b in bufs.items()},
              "off2": (bufs["lead"], False)}

    def go(build, t):
        buf, on = builds[build]
        kernel_of(build)[(grid,)](*launch_args(inp, out, buf, buf.layout, t, iters, on, nw), num_warps=nw,
                                  **extra_of(build))

    # the decode check first: one launch of each stamped build at T = tmax into a clean buffer
    check = {}
    for name in bufs:
        if name.startswith("c32"):  # an experiment: its 32-bit readings do not decode
            continue
        buf = bufs[name]
        go(name, tmax)  # compile
        buf.reset()
        go(name, tmax)
        tr = buf.collect()
        iv = tr.intervals
        dur = np.asarray(iv.column("duration_ns"))
        ph = np.asarray(iv.column("phase_index"))
        per_phase = {tr.phases[p] + "→" + tr.phases[p + 1]: float(np.median(dur[ph == p]))
                     for p in range(len(tr.phases) - 1)}
        check[name] = {"rows": tr.tasks.num_rows, "expected_rows": grid * tmax * buf.spec.waves,
                       "anomalies": tr.anomaly_summary(), "median_phase_ns": per_phase}
        say(f"  decode {name:9s}: {tr.tasks.num_rows} rows (expected {grid * tmax * buf.spec.waves}), anomalies "
            f"{tr.anomaly_summary() or 'none'}; median phase ns "
            + ", ".join(f"{k} {v:.0f}" for k, v in per_phase.items()))
    go("off", tmax)
    torch.cuda.synchronize()

    configs = [(b, t) for t in tasks for b in builds]
    us = interleaved(configs, lambda c: events_around(lambda: go(*c), batch), rounds, batch)

    rows = []
    fits = {}
    for name in (*bufs, "off2"):
        xs, ys = [], []
        for t in tasks:
            off, on = us[("off", t)], us[(name, t)]
            diff_ns = (on - off) * 1e3  # paired by round
            stamps_per_cta = PHASES_PER_TASK * t
            med_diff = float(np.median(diff_ns))
            row = {"variant": name, "tasks_per_cta": t, "t_off_us": float(np.median(off)),
                   "t_on_us": float(np.median(on)), "ratio": float(np.median(on) / np.median(off)),
                   "diff_ns_median": med_diff, "diff_ns_p25": float(np.percentile(diff_ns, 25)),
                   "diff_ns_p75": float(np.percentile(diff_ns, 75)), "stamps_per_cta": stamps_per_cta,
                   "ns_per_stamp": med_diff / stamps_per_cta,
                   "task_us_off": float(np.median(off)) / t}
            rows.append(row)
            xs.append(stamps_per_cta)
            ys.append(med_diff)
        slope, icpt = np.polyfit(np.array(xs, float), np.array(ys, float), 1)
        fits[name] = {"ns_per_stamp": float(slope), "intercept_ns": float(icpt)}
    return {"num_warps": nw, "rows": rows, "fits": fits, "check": check}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the results")
    ap.add_argument("--tasks", type=int, nargs="+", default=[64, 256, 1024], help="tasks per CTA")
    ap.add_argument("--iters", type=int, default=64, help="8-FMA steps per task (64: about 1 us)")
    ap.add_argument("--rounds", type=int, default=300, help="interleaved rounds (samples per config)")
    ap.add_argument("--batch", type=int, default=5, help="launches per timed sample")
    ap.add_argument("--grid", type=int, default=0, help="CTAs (default: the SM count)")
    ap.add_argument("--compile-only", action="store_true", help="only the sm_90 compile check (no GPU)")
    args = ap.parse_args(argv)
    grid = args.grid or (torch.cuda.get_device_properties(0).multi_processor_count
                         if torch.cuda.is_available() else 132)
    tmax = max(args.tasks)

    say("== compile check (sm_90 PTX): %globaltimer / %clock64 reads, fma.rn.f32, st.global per build "
        "(want 0 / 5 timer reads, hybrid 5 counter reads and 2 timer reads, FMAs in loops of 8)")
    cc = compile_check(grid, tmax, args.iters)
    ok = True
    for (nw, name), v in cc.items():
        want = {"off": (0, 0), "lead": (PHASES_PER_TASK, 0), "warps": (PHASES_PER_TASK, 0),
                "hlead": (2, PHASES_PER_TASK), "hwarps": (2, PHASES_PER_TASK), "regs": (2, PHASES_PER_TASK),
                "lead+4": (PHASES_PER_TASK + 4, 0), "hlead+4": (2, PHASES_PER_TASK + 4),
                "hwarps+4": (2, PHASES_PER_TASK + 4),
                "dlead": (2, PHASES_PER_TASK), "dlead+4": (2, PHASES_PER_TASK + 4),
                "dwarps": (2, PHASES_PER_TASK), "dwarps+4": (2, PHASES_PER_TASK + 4),
                "c32": (2, 2), "c32+4": (2, 2),
                "lead6": (PHASES_PER_TASK, 0), "lead6+4": (PHASES_PER_TASK + 4, 0),
                "warps6": (PHASES_PER_TASK, 0), "warps6+4": (PHASES_PER_TASK + 4, 0),
                "hlead6": (2, PHASES_PER_TASK), "hlead6+4": (2, PHASES_PER_TASK + 4),
                "hwarps6": (2, PHASES_PER_TASK), "hwarps6+4": (2, PHASES_PER_TASK + 4)}[name]
        # the chain is two loops of 8 FMAs in every build; the normal build's loops may
        # be unswitched (versioned on half > 0) into more copies of the same loops
        good = (v["globaltimer"], v["clock64"]) == want and v["fma"] % 8 == 0 and v["fma"] >= 16
        ok &= good
        say(f"  {nw} warps {name:9s}: {v}  -> {'OK' if good else 'FAIL'}")
    if args.compile_only:
        return 0 if ok else 1
    if not torch.cuda.is_available():
        print("stamp_cost_gpu needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    t0 = time.time()
    env = environment(argv)
    say("== environment")
    for k, v in env.items():
        say(f"  {k}: {v}")
    say(f"  grid {grid} CTAs, tasks per CTA {args.tasks}, {args.iters * 8} dependent FMAs a task, "
        f"{args.rounds} rounds x {args.batch} launches per config, interleaved")
    results = {"environment": env, "grid": grid, "tasks": args.tasks, "iters": args.iters,
               "rounds": args.rounds, "batch": args.batch,
               "compile_check": {f"{nw}w_{n}": v for (nw, n), v in cc.items()}, "by_warps": []}
    for nw in (4, 8):
        say(f"== {nw} warps")
        m = measure(nw, grid, args.tasks, args.iters, env["arch"], args.rounds, args.batch)
        results["by_warps"].append(m)
        for c in m["check"].values():  # a clock change is what the hybrid decode reports, not a fault
            ok &= not (set(c["anomalies"]) - {"clock_change"}) and c["rows"] == c["expected_rows"]
        say(f"  {'variant':9s} {'T/CTA':>6s} {'t_off us':>10s} {'t_on us':>10s} {'ratio':>7s} "
            f"{'on-off ns (p25..p75)':>26s} {'ns/stamp':>9s}")
        for r in m["rows"]:
            label = "off A/A" if r["variant"] == "off2" else r["variant"]
            say(f"  {label:9s} {r['tasks_per_cta']:6d} {r['t_off_us']:10.2f} {r['t_on_us']:10.2f} "
                f"{r['ratio']:7.4f} {r['diff_ns_median']:9.0f} ({r['diff_ns_p25']:7.0f}..{r['diff_ns_p75']:7.0f}) "
                f"{r['ns_per_stamp']:9.2f}")
        t_task = m["rows"][0]["task_us_off"]
        say(f"  task (off build): {t_task * 1e3:.0f} ns; slope fit of on-off against 5 T (stamps per CTA):")
        for name, f in m["fits"].items():
            label = "off A/A" if name == "off2" else name
            say(f"    {label:9s} {f['ns_per_stamp']:7.2f} ns per stamp  (intercept {f['intercept_ns'] / 1e3:+.2f} us "
                "a launch)")
    say("== summary")
    for m in results["by_warps"]:
        f = m["fits"]
        say(f"  {m['num_warps']} warps: lead {f['lead']['ns_per_stamp']:.2f} ns/stamp, per warp "
            f"{f['warps']['ns_per_stamp']:.2f} ns/stamp; hybrid lead {f['hlead']['ns_per_stamp']:.2f}, hybrid per "
            f"warp {f['hwarps']['ns_per_stamp']:.2f}, hybrid in registers {f['regs']['ns_per_stamp']:.2f}, hybrid "
            f"deferred {f['dlead']['ns_per_stamp']:.2f}, hybrid deferred per warp {f['dwarps']['ns_per_stamp']:.2f} "
            "ns/stamp; "
            f"A/A {f['off2']['ns_per_stamp']:+.2f} ns/stamp")
        for base in ("lead", "hlead", "dlead", "hwarps", "dwarps", "c32") + BETWEEN:  # (slope a task with four more - without) / 4
            further = further_ns({b: v["ns_per_stamp"] for b, v in f.items()}, base)
            m.setdefault("further_stamp_ns", {})[base] = further
            where = ("between two pieces of work, against the same loops without it" if base in BETWEEN
                     else "right behind another")
            say(f"    a further stamp ({base}, {where}): {further:.2f} ns")
    say(f"  {'ALL OK' if ok else 'FAILED (see above)'}; {time.time() - t0:.0f} s")
    tag = env["gpu"].split()[-1].lower()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"stamp_cost_{tag}.txt").write_text("\n".join(LINES) + "\n")
    (args.out / f"stamp_cost_{tag}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
