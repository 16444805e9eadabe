"""Stamps held until the task's end, against the library's deferred stamps (H200).

    PYTHONPATH=. python3 bench/held_stamps_gpu.py --out DIR
    PYTHONPATH=. python bench/held_stamps_gpu.py --out DIR --sass   # no GPU: the builds' SASS
    TRITON_INTERPRET=1 PYTHONPATH=. python bench/held_stamps_gpu.py --out DIR --interp   # no GPU: run, check

``bench/stamp_cost_gpu.py`` measured a further deferred hybrid stamp right behind
another at about 4 ns (lead thread) and 10 ns (per warp), each stamp a ``CS2R`` and
one store. Two ways to take the store out of a further stamp, both hybrid, lead
thread and per warp, written here (experiments, not in ``instrument``):

- ``row``: the record held across a warp's lanes (lane ``c`` keeps column ``c``),
  a stamp a counter read and a select; the last phase stores the row, one
  coalesced store a warp (``stamp_row``);
- ``p``: every reading in a register of its own, a further stamp nothing but the
  ``CS2R``; the last phase stores the record as int64 pairs, ``st.global.v2.b64``
  from one thread (``pair_record``).

Builds, in the style of ``stamp_cost_gpu.py`` (same FMA-chain kernel, slopes over T
tasks a CTA, interleaved round by round, CUDA events around each batch): the library's
``dlead`` / ``dwarps`` and the experiments' ``rowlead`` / ``rowwarps`` / ``plead`` /
``pwarps``, each also ``+4`` (four marks right behind four stamps); ``rowlead6`` /
``rowwarps6`` (``+4``: the marks between pieces of work); ``rowlaglead`` /
``rowlagwarps``: lane-held, each task's row (and its drop count) written one task
later, right after the next task's tile load is issued (``row_write_behind``), so that
no record store stands between a task's last stamp and the next load; ``off`` and
``off2`` (A/A). ``--builds`` times some of them (each with its ``+4``), ``--stem``
names the results file. Every stamped build's buffer is decoded once (rows whole; its
anomalies printed). ``--sass`` (no GPU) reports from each build's sm_90 SASS its clock
reads and record stores and how many of those stand between the tile load and the
FMA chain (``record_stores``); ``--interp`` (no GPU, ``TRITON_INTERPRET=1``) runs each
build in Triton's interpreter, the clocks emulated, and checks every reading stored as
taken (``interp_report``).
``bench/record_cost_gpu.py`` times ``stamp_row``'s write in parts (``bench_row``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

import stamp_cost_gpu as SC  # bench/ is this script's sys.path[0]

from instrument import alloc
from instrument import triton as itl


# -- lane-held records -------------------------------------------------------------------
@triton.jit
def _row_view(LAYOUT: tl.constexpr):
    """``(lanes, wave, col, writer)``, one element a thread: the thread's record (its
    warp, or 0 for a lead-thread layout), the column its lane holds (``%tid.x & 31``)
    and whether it writes it (lead thread: warp 0's lanes; never past the columns)."""
    NW: tl.constexpr = itl._num_warps()
    tl.static_assert(LAYOUT.cols <= 32, "a lane-held record has at most 32 columns")
    lanes = tl.arange(0, NW * 32)
    tid = itl.thread_id_like(lanes)
    col = tid & 31
    if LAYOUT.waves == 1:
        return lanes, tid * 0, col, (tid < 32) & (col < LAYOUT.cols)
    else:
        return lanes, tid >> 5, col, col < LAYOUT.cols


@triton.jit
def _row_hold(LAYOUT: tl.constexpr, PHASE: tl.constexpr, row, lanes, wave, col):
    """Read ``%clock64``; lane ``phase_col(PHASE)`` of ``row`` keeps it (phase 0 starts
    the row: placement word, zeros; the first and last phase also hold an anchor)."""
    t = itl.clock64_like(lanes)
    if PHASE == 0:
        g = itl.globaltimer_like(lanes)
        row = tl.where(col == itl._PLACEMENT_COL, itl.placement_word(tl.program_id(0), wave, itl.smid()),
                       tl.zeros_like(t))
        row = tl.where(col == itl.anchor_col(LAYOUT, 0), g, row)
    if PHASE == LAYOUT.phases - 1:
        g = itl.globaltimer_like(lanes)
        row = tl.where(col == itl.anchor_col(LAYOUT, 1), g, row)
    return tl.where(col == itl.phase_col(PHASE), t, row)


@triton.jit
def _row_write(stamps, LAYOUT: tl.constexpr, launch, task, row, lanes, wave, col, writer):
    """Each writer lane stores its column of record (launch, stage 0, task, wave);
    outside the stage's slots lane 0 of each writing warp counts a drop instead."""
    ok = itl.in_slots(LAYOUT, launch, 0, task)
    tl.store(stamps + itl.word_offset(LAYOUT, launch, 0, tl.cast(task, tl.int64), wave, col), row,
             mask=writer & ok)
    tl.atomic_add(stamps + itl.drop_counter_word(LAYOUT, 0) + 0 * lanes, 1,
                  mask=writer & (col == 0) & (ok == 0), sem="relaxed")


@triton.jit
def stamp_row(stamps, LAYOUT: tl.constexpr, launch, task, PHASE: tl.constexpr, row, ON: tl.constexpr):
    """A hybrid stamp of stage 0 held in the warp's lanes (``_row_hold``); the last
    phase writes the row (``_row_write``). Returns the row (0 when not ``ON``)."""
    if ON:
        lanes, wave, col, writer = _row_view(LAYOUT)
        row = _row_hold(LAYOUT, PHASE, row, lanes, wave, col)
        if PHASE == LAYOUT.phases - 1:
            _row_write(stamps, LAYOUT, launch, task, row, lanes, wave, col, writer)
        return row
    else:
        return tl.zeros([], dtype=tl.int64)


# bench_row's experiments (0: stamp_row)
ROW_RED = tl.constexpr(1)
ROW_NO_DROP = tl.constexpr(2)
ROW_NO_WRITE = tl.constexpr(3)
ROW_LAG = tl.constexpr(4)


@triton.jit
def bench_row(stamps, LAYOUT: tl.constexpr, launch, task, PHASE: tl.constexpr, r, TL: tl.constexpr,
              EXP: tl.constexpr):
    """``stamp_row``, or its last phase's write done another way: ``ROW_RED`` the drop
    counted by a predicated ``red`` (no branch), ``ROW_NO_DROP`` not counted,
    ``ROW_NO_WRITE`` neither row nor drop (the store predicated off by ``task < 0``):
    what holding alone costs; ``ROW_LAG`` no write here at all: the kernel writes the
    row one task later (``work_kernel_row``)."""
    if EXP == 0 or PHASE != LAYOUT.phases - 1:
        r = stamp_row(stamps, LAYOUT, launch, task, PHASE, r, TL)
    elif TL:
        lanes, wave, col, writer = _row_view(LAYOUT)
        r = _row_hold(LAYOUT, PHASE, r, lanes, wave, col)
        if EXP != ROW_LAG:
            ok = itl.in_slots(LAYOUT, launch, 0, task)
            if EXP == ROW_NO_WRITE:
                ok = task < 0
            tl.store(stamps + itl.word_offset(LAYOUT, launch, 0, tl.cast(task, tl.int64), wave, col), r,
                     mask=writer & ok)
            if EXP == ROW_RED:
                SC._red_add(stamps + itl.drop_counter_word(LAYOUT, 0) + 0 * lanes,
                            writer & (col == 0) & (ok == 0))
    return r


@triton.jit
def row_write_behind(stamps, LAYOUT: tl.constexpr, launch, task, row, have):
    """Write the lane-held row of ``task``, an earlier task's, where ``have`` (there is
    one): placed after the next task's tile load has been issued, the row's store and
    drop count no longer stand between the task's last stamp and that load."""
    lanes, wave, col, writer = _row_view(LAYOUT)
    _row_write(stamps, LAYOUT, launch, task, row, lanes, wave, col, writer & have)


@triton.jit
def chain_row(y, x, n, stamps, LAYOUT: tl.constexpr, launch, task, r, TL: tl.constexpr,
              PIECES: tl.constexpr, MID: tl.constexpr, MARK0: tl.constexpr, EXP: tl.constexpr):
    """``stamp_cost_gpu.chain_marked`` for lane-held stamps: returns ``(y, row)``."""
    if PIECES == 1:
        y = SC.chain(y, x, n)
    else:
        k = n // 3
        y = SC.chain(y, x, k)
        if MID:
            r = bench_row(stamps, LAYOUT, launch, task, MARK0, r, TL, EXP)
        y = SC.chain(y, x, k)
        if MID:
            r = bench_row(stamps, LAYOUT, launch, task, MARK0 + 1, r, TL, EXP)
        y = SC.chain(y, x, n - 2 * k)
    return y, r


@triton.jit(do_not_specialize=["launch", "n_tasks", "iters"])
def work_kernel_row(inp, out, stamps, launch, n_tasks, iters, LAYOUT: tl.constexpr, TL: tl.constexpr,
                    BLOCK: tl.constexpr, EXTRA: tl.constexpr = False, PIECES: tl.constexpr = 1,
                    MID: tl.constexpr = False, EXP: tl.constexpr = 0):
    """``stamp_cost_gpu.work_kernel`` with lane-held stamps (``bench_row``); with
    ``EXP=ROW_LAG`` each task's row written by the next task, right after its tile
    load and first stamps (``row_write_behind``), the last one after the loop."""
    LAG: tl.constexpr = TL and EXP == ROW_LAG
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = iters // 2
    if LAG:
        held = tl.zeros([BLOCK], dtype=tl.int64)
        held_task = bid - G
    for i in range(n_tasks):
        task = bid + i * G
        r = bench_row(stamps, LAYOUT, launch, task, 0, 0, TL, EXP)
        x = tl.load(inp + (task % 64) * BLOCK + lanes)  # 64 = TILES
        r = bench_row(stamps, LAYOUT, launch, task, 1, r, TL, EXP)
        if EXTRA:
            r = bench_row(stamps, LAYOUT, launch, task, 5, r, TL, EXP)
        if LAG:
            row_write_behind(stamps, LAYOUT, launch, held_task, held, i > 0)
        y, r = chain_row(x, x, half, stamps, LAYOUT, launch, task, r, TL, PIECES, MID, 5, EXP)
        r = bench_row(stamps, LAYOUT, launch, task, 2, r, TL, EXP)
        if EXTRA:
            r = bench_row(stamps, LAYOUT, launch, task, 6, r, TL, EXP)
        y, r = chain_row(y, x, iters - half, stamps, LAYOUT, launch, task, r, TL, PIECES, MID, 7, EXP)
        r = bench_row(stamps, LAYOUT, launch, task, 3, r, TL, EXP)
        if EXTRA:
            r = bench_row(stamps, LAYOUT, launch, task, 7, r, TL, EXP)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        if EXTRA:
            r = bench_row(stamps, LAYOUT, launch, task, 8, r, TL, EXP)
        r = bench_row(stamps, LAYOUT, launch, task, 4, r, TL, EXP)
        if LAG:
            held = r
            held_task = task
    if LAG:
        row_write_behind(stamps, LAYOUT, launch, held_task, held, n_tasks > 0)


# -- register-held records, written as pairs ---------------------------------------------
@triton.jit
def _st_pair(ptr, a, b, pred):
    """Store the int64 pair ``(a, b)`` at ``ptr`` (16-byte aligned), one
    ``st.global.v2.b64``, where ``pred``."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $4, 0; @p st.global.v2.b64 [$1], {$2, $3}; mov.u32 $0, 0; }",
        "=r,l,l,l,r", [ptr, a, b, pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pair_view(LAYOUT: tl.constexpr, BLOCK: tl.constexpr):
    """``(lanes, wave, writer)``: lead thread (``waves == 1``: thread 0 writes record 0)
    or per warp (one element a thread; lane 0 writes its warp's record)."""
    if LAYOUT.waves == 1:
        lanes = tl.arange(0, BLOCK)
        tid = itl.thread_id_like(lanes)
        return lanes, tid * 0, tid == 0
    else:
        return itl._warps(LAYOUT)


@triton.jit
def pair_tick(lanes, TL: tl.constexpr, ANCHOR: tl.constexpr = False):
    """A register-held stamp in every thread: ``%clock64``, or with ``ANCHOR`` the
    record's ``%globaltimer`` anchor; 0 when not ``TL``."""
    if TL:
        if ANCHOR:
            return itl.globaltimer_like(lanes)
        else:
            return itl.clock64_like(lanes)
    else:
        return 0


@triton.jit
def pair_record(stamps, LAYOUT: tl.constexpr, launch, task, lanes, wave, writer, c, m, g0, TL: tl.constexpr):
    """The last phase's stamp and the task's record from registers: ``c`` the readings
    of phases 0-3, ``m`` the marks' (or ``()``), ``g0`` the first anchor; reads the
    last phase and the second anchor, then stores the record as int64 pairs (placement
    and phase 0, phases 1-2, 3-4, the marks, the anchors) from the writer thread;
    outside the stage's slots the drop counter counts 1 instead."""
    if TL:
        last = pair_tick(lanes, TL)
        g1 = pair_tick(lanes, TL, True)
        ok = itl.in_slots(LAYOUT, launch, 0, task)
        pred = writer & ok
        base = stamps + itl.word_offset(LAYOUT, launch, 0, tl.cast(task, tl.int64), wave, 0)
        _st_pair(base, itl.placement_word(tl.program_id(0), wave, itl.smid()), c[0], pred)
        _st_pair(base + 2, c[1], c[2], pred)
        _st_pair(base + 4, c[3], last, pred)
        if len(m) == 4:
            _st_pair(base + 6, m[0], m[1], pred)
            _st_pair(base + 8, m[2], m[3], pred)
        _st_pair(base + itl.anchor_col(LAYOUT, 0), g0, g1, pred)
        tl.atomic_add(stamps + itl.drop_counter_word(LAYOUT, 0) + 0 * lanes, 1, mask=writer & (ok == 0),
                      sem="relaxed")


@triton.jit(do_not_specialize=["launch", "n_tasks", "iters"])
def work_kernel_pairs(inp, out, stamps, launch, n_tasks, iters, LAYOUT: tl.constexpr, TL: tl.constexpr,
                      BLOCK: tl.constexpr, EXTRA: tl.constexpr = False):
    """``stamp_cost_gpu.work_kernel`` with register-held stamps (``pair_record``)."""
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes, wave, writer = _pair_view(LAYOUT, BLOCK)
    half = iters // 2
    for i in range(n_tasks):
        task = bid + i * G
        c0 = pair_tick(lanes, TL)
        g0 = pair_tick(lanes, TL, True)
        x = tl.load(inp + (task % 64) * BLOCK + lanes)  # 64 = TILES
        c1 = pair_tick(lanes, TL)
        if EXTRA:
            m1 = pair_tick(lanes, TL)
        y = SC.chain(x, x, half)
        c2 = pair_tick(lanes, TL)
        if EXTRA:
            m2 = pair_tick(lanes, TL)
        y = SC.chain(y, x, iters - half)
        c3 = pair_tick(lanes, TL)
        if EXTRA:
            m3 = pair_tick(lanes, TL)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        if EXTRA:
            m4 = pair_tick(lanes, TL)
            pair_record(stamps, LAYOUT, launch, task, lanes, wave, writer, (c0, c1, c2, c3), (m1, m2, m3, m4), g0,
                        TL)
        else:
            pair_record(stamps, LAYOUT, launch, task, lanes, wave, writer, (c0, c1, c2, c3), (), g0, TL)


# -- host side -------------------------------------------------------------------------------
BUILDS = {"dlead": 1, "dwarps": 0, "rowlead": 1, "rowwarps": 0, "rowlead6": 1, "rowwarps6": 0,
          "rowlaglead": 1, "rowlagwarps": 0, "plead": 1, "pwarps": 0}  # each also "+4"; waves (0: num_warps)
BETWEEN = ("rowlead6", "rowwarps6")


def kernel_of(build: str) -> tuple:
    """``(kernel, constexpr switches)`` of ``build`` (``off``, ``off2``: the normal build)."""
    base, _, four = build.partition("+")
    if base.startswith(("off", "dlead", "dwarps")):
        return SC.work_kernel_deferred, {"EXTRA": bool(four)}
    if base.startswith("rowlag"):
        return work_kernel_row, {"EXTRA": bool(four), "EXP": ROW_LAG.value}
    if base.startswith("row"):
        return work_kernel_row, ({"PIECES": 3, "MID": bool(four)} if base in BETWEEN else {"EXTRA": bool(four)})
    return work_kernel_pairs, {"EXTRA": bool(four)}


def launch(build: str, inp, out, buf, t: int, iters: int, nw: int, grid: int) -> None:
    """One launch of ``build`` with ``t`` tasks a CTA."""
    kernel, switches = kernel_of(build)
    args = SC.launch_args(inp, out, buf, buf.layout, t, iters, not build.startswith("off"), nw)
    kernel[(grid,)](*args, num_warps=nw, **switches)


def build_spec(build: str, nw: int, grid: int, tmax: int, arch: str):
    """The spec ``build`` stamps into: hybrid, lead thread or ``nw`` warps, with the four
    marks for a ``+4`` build."""
    base = build.partition("+")[0]
    return SC.spec(grid, tmax, waves=BUILDS[base] or nw, arch=arch, hybrid=True, marks=SC.marks_of(build))


def measure(nw: int, grid: int, tasks: list, iters: int, arch: str, rounds: int, batch: int, chosen) -> tuple:
    """``(lines, results)``: each build's decode, ns a stamp against ``off`` (slope over
    T, / 5 stamps a task), and a further stamp's cost (``+4`` against its build), for
    the builds in ``chosen`` (each with its ``+4``)."""
    tmax = max(tasks)
    block = nw * 32
    inp = torch.rand(SC.TILES * block, device="cuda") * 0.01
    out = torch.empty(grid * tmax * block, device="cuda")
    bufs = {b + s: alloc(build_spec(b + s, nw, grid, tmax, arch)) for b in chosen for s in ("", "+4")}
    lines = [f"== {nw} warps"]
    decode = {}
    for b, buf in bufs.items():
        launch(b, inp, out, buf, tmax, iters, nw, grid)
        buf.reset()
        launch(b, inp, out, buf, tmax, iters, nw, grid)
        tr = buf.collect()
        decode[b] = {"rows": tr.tasks.num_rows, "expected": grid * tmax * buf.spec.waves,
                     "anomalies": tr.anomaly_summary()}
        lines.append(f"  decode {b}: {decode[b]['rows']} rows (expected {decode[b]['expected']}), anomalies "
                     f"{decode[b]['anomalies'] or 'none'}")
    bufs["off"] = bufs["off2"] = next(iter(bufs.values()))  # a normal build: its buffer argument is None
    builds = ["off", *[b for b in bufs if not b.startswith("off")], "off2"]
    configs = [(b, t) for t in tasks for b in builds]
    us = SC.interleaved(configs, lambda c: SC.events_around(
        lambda: launch(c[0], inp, out, bufs[c[0]], c[1], iters, nw, grid), batch), rounds, batch)
    fits = {b: SC.diff_slope(us, b, "off", tasks) for b in builds[1:]}
    per_stamp = {b: slope / SC.PHASES_PER_TASK for b, (_, slope) in fits.items()}
    further = {b: SC.further_ns(per_stamp, b) for b in chosen}
    lines.append("  ns a stamp (slope against off over T = " + str(tasks) + ", / 5 stamps a task): "
                 + ", ".join(f"{b} {v:.2f}" for b, v in per_stamp.items()))
    lines.append("  a further stamp, ns (right behind another; " + ", ".join(BETWEEN) + ": between pieces of "
                 "work): " + ", ".join(f"{b} {v:.2f}" for b, v in further.items()))
    lines.append("  build - off at each T, ns a launch: " + "; ".join(
        f"{b} " + "/".join(f"{d:.0f}" for d in diffs) for b, (diffs, _) in fits.items()))
    return lines, {"num_warps": nw, "decode": decode, "diff_ns": {b: d for b, (d, _) in fits.items()},
                   "ns_per_stamp": per_stamp, "further_stamp_ns": further}


def record_stores(sass: list) -> dict:
    """Where a build's record stores (``STG.E.64`` / ``.128``) sit in its SASS against the
    task's tile load (the first ``LDG``) and its FMA chain (the first ``FFMA``): how many
    come between the two (they overlap the load's latency) and how many elsewhere (at a
    stamp, or at the task's end, in front of the next task's load)."""
    load = next(i for i, ins in enumerate(sass) if ins.startswith("LDG"))
    chain = next(i for i, ins in enumerate(sass) if ins.startswith("FFMA") and i > load)
    stores = [i for i, ins in enumerate(sass) if "STG.E.64" in ins or "STG.E.128" in ins]
    inside = sum(load < i < chain for i in stores)
    reads = sum("SR_CLOCKLO" in ins or "SR_GLOBALTIMERLO" in ins for ins in sass)
    return {"clock_reads": reads, "record_stores": len(stores),
            "between_load_and_chain": inside}


def stamp_order(build: str) -> tuple:
    """The phase and mark indices a task of ``build`` stamps, in program order."""
    base, _, four = build.partition("+")
    if not four:
        return (0, 1, 2, 3, 4)
    return (0, 1, 5, 6, 2, 7, 8, 3, 4) if base in BETWEEN else (0, 1, 5, 2, 6, 3, 7, 8, 4)


def stored_as_read(words, spec, reads, order: tuple, grid: int, per_cta: int) -> bool:
    """Whether task ``k`` of every CTA ``p`` holds, in every warp's record, the ``k``-th
    run of ``len(order)`` cycle-counter readings CTA ``p`` took, in ``order``'s columns,
    and as anchors its ``k``-th pair of timer readings (``tools.triton_interp.READS``)."""
    from timeline.contract import schema as S
    from tools.triton_interp import readings

    lay = spec.layout
    cols = np.array([S.phase_col(i) for i in order] + [S.anchor_col(lay, 0), S.anchor_col(lay, 1)])
    waves = np.arange(spec.waves)[:, None]
    for cta in range(grid):
        want = np.concatenate([readings(reads, cta, "clock64").reshape(per_cta, len(order)),
                               readings(reads, cta, "globaltimer").reshape(per_cta, 2)], axis=1)
        tasks = cta + grid * np.arange(per_cta)
        at = S.word_offset(lay, 0, 0, tasks[:, None, None], waves[None], cols[None, None])  # (task, wave, col)
        if not (words[at] == want[:, None, :]).all():
            return False
    return True


def interp_report(out: Path, chosen, grid: int = 3, per_cta: int = 4, iters: int = 2) -> int:
    """No GPU, under ``TRITON_INTERPRET=1``: run each build (but the register-held ones,
    whose paired store is inline asm) in Triton's interpreter, the clocks emulated
    (``tools.triton_interp``), at 4 and 8 warps, and check that it decodes whole, with no
    anomaly, every reading stored as taken (``stored_as_read``). 1 if one does not."""
    from tools import triton_interp

    lines, res = ["held_stamps_gpu.py --interp: each build in Triton's interpreter, clocks emulated, no GPU; "
                  f"{grid} CTAs x {per_cta} tasks"], {}
    for nw in (4, 8):
        for b in [x + s for x in chosen if not x.startswith("p") for s in ("", "+4")]:
            triton_interp.install(nw)
            sp = build_spec(b, nw, grid, per_cta, "sm_90")
            buf = alloc(sp, device="cpu")
            launch(b, torch.rand(SC.TILES * nw * 32) * 0.01, torch.empty(grid * per_cta * nw * 32), buf, per_cta,
                   iters, nw, grid)
            trace = buf.collect()
            r = {"rows": trace.tasks.num_rows, "expected": grid * per_cta * sp.waves,
                 "anomalies": trace.anomaly_summary(),
                 "stored_as_read": stored_as_read(buf.tensor.numpy(), sp, triton_interp.READS, stamp_order(b),
                                                  grid, per_cta)}
            res[f"{nw}w {b}"] = r
            lines.append(f"  {nw} warps {b}: {r['rows']} rows (expected {r['expected']}), anomalies "
                         f"{r['anomalies'] or 'none'}, every reading stored as taken: {r['stored_as_read']}")
    SC.save(out, "held_stamps_interp", lines, res)
    ok = all(r["rows"] == r["expected"] and not r["anomalies"] and r["stored_as_read"] for r in res.values())
    return 0 if ok else 1


def sass_report(out: Path, chosen, grid: int, tmax: int, iters: int) -> None:
    """No GPU: compile each build for sm_90 at 4 and 8 warps and report ``record_stores``."""
    from tools.sass import instructions

    lines, res = ["held_stamps_gpu.py --sass: sm_90 SASS of each build, no GPU; per build: cycle-counter and "
                  "timer reads, record stores, of them between the tile load and the FMA chain"], {}
    for nw in (4, 8):
        for b in [x + s for x in chosen for s in ("", "+4")]:
            kernel, switches = kernel_of(b)
            lay = build_spec(b, nw, grid, tmax, "sm_90").layout
            k = itl.compile_launch(kernel, torch.float32, torch.float32, torch.int64, 0, tmax, iters, lay, True,
                                   nw * 32, grid=(grid,), num_warps=nw, **switches)
            res[f"{nw}w {b}"] = r = record_stores(instructions(k.asm["cubin"]))
            lines.append(f"  {nw} warps {b}: clock reads {r['clock_reads']}, record stores {r['record_stores']}, "
                         f"{r['between_load_and_chain']} of them between the tile load and the chain")
    SC.save(out, "held_stamps_sass", lines, res)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    SC.slope_args(ap, rounds=200)
    ap.add_argument("--builds", nargs="+", choices=list(BUILDS), default=list(BUILDS),
                    help="the builds to time (each with its +4); default all")
    ap.add_argument("--stem", default="held_stamps_h200", help="results file name (without .txt / .json)")
    ap.add_argument("--sass", action="store_true", help="no GPU: each build's SASS report into --out, nothing run")
    ap.add_argument("--interp", action="store_true",
                    help="no GPU, with TRITON_INTERPRET=1: each build run in Triton's interpreter and checked")
    a = ap.parse_args(argv)
    if a.interp:
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--interp runs the kernels in Triton's interpreter: run with TRITON_INTERPRET=1 set")
        return interp_report(a.out, a.builds)
    if a.sass:
        sass_report(a.out, a.builds, 132, max(a.tasks), a.iters)
        return 0
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    from gpu_run import environment  # bench/ is this script's sys.path[0]

    env = environment("PYTHONPATH=. python3 bench/held_stamps_gpu.py " + " ".join(sys.argv[1:] if argv is None
                                                                                 else argv))
    lines = [f"{k}: {v}" for k, v in env.items()]
    lines.append(f"grid {grid}, {a.iters * 8} dependent FMAs a task, {a.rounds} rounds x {a.batch} launches, "
                 "interleaved; all builds hybrid")
    res = {"environment": env, "tasks": a.tasks, "by_warps": []}
    bad = []
    for nw in (4, 8):
        more, r = measure(nw, grid, a.tasks, a.iters, env["arch"], a.rounds, a.batch, a.builds)
        lines += more
        res["by_warps"].append(r)
        bad += [f"{nw} warps {b}" for b, d in r["decode"].items() if d["rows"] != d["expected"]]
    lines.append("decode: every build's rows whole" if not bad else "decode: rows missing in " + ", ".join(bad))
    SC.save(a.out, a.stem, lines, res)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
