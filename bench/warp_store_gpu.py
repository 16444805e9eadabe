"""Why a per-warp stamp right behind another costs more than a lead-thread one (H200).

    PYTHONPATH=. python3 bench/warp_store_gpu.py --out DIR

``bench/stamp_cost_gpu.py`` measured a further deferred hybrid stamp right behind
another at 4.3 / 3.9 ns (lead thread, 4 / 8 warps) and 9.7 / 10.4 ns (per warp), the
same instructions in SASS. This run asks where the difference lies, with the same
FMA-chain kernel and deferred stamps (each stores the reading of the one before)
written here with nothing but a ``%clock64`` read and the held reading's store, into
a raw int64 buffer (none of it decodes), ``+4`` builds adding four further stamps
right behind others, against the same kernel without them:

- ``lead``: one thread of the CTA stores (what ``itl.stamp_lead`` stores);
- ``rec``: lane 0 of every warp stores into its own 12-word record (the library's
  per-warp layout: a warp's records 96 bytes apart);
- ``one``: per-warp readings, only warp 0's lane 0 stores (the other warps' stores gone);
- ``same``: lane 0 of every warp stores into warp 0's record (one address for all);
- ``inter``: lane 0 of every warp stores, the warps' words of a column adjacent
  (``(task * cols + col) * warps + warp``: one 32-byte sector for 4 warps).

And the library's own ``dlead`` / ``dwarps`` (``+4``), as in ``stamp_cost_gpu.py``.
Interleaved round by round, CUDA events around each batch; a further stamp's cost is
(slope of ``+4`` - slope of the build) / 4 per task, slopes over T tasks a CTA.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

import stamp_cost_gpu as SC  # bench/ is this script's sys.path[0]

from instrument import alloc
from instrument import triton as itl

COLS = tl.constexpr(12)  # a per-warp hybrid record with four marks: 5 phases, 4 marks, placement, 2 anchors
HOWS = {"lead": 0, "rec": 1, "one": 2, "same": 3, "inter": 4}
H_LEAD = tl.constexpr(0)
H_ONE = tl.constexpr(2)
H_SAME = tl.constexpr(3)
H_INTER = tl.constexpr(4)


@triton.jit
def _word(task, warp, COL: tl.constexpr, NW: tl.constexpr, HOW: tl.constexpr):
    """The word a warp's column ``COL`` of task ``task`` goes to, by ``HOW``."""
    if HOW == H_INTER:
        w = (task.to(tl.int64) * COLS + COL) * NW + warp
    elif HOW == H_SAME:
        w = task.to(tl.int64) * NW * COLS + COL + 0 * warp
    else:
        w = (task.to(tl.int64) * NW + warp) * COLS + COL
    return w


@triton.jit
def xstamp(buf, task, COL: tl.constexpr, held, HELD: tl.constexpr, HOW: tl.constexpr, NW: tl.constexpr,
           AGAIN: tl.constexpr):
    """Read ``%clock64``; store ``held`` at column ``HELD`` (``HELD < 0``: the reading
    itself at ``COL``, a chain's first stamp, whose reading the next one does not
    store again unless ``AGAIN``; the last, ``COL == 4``, stores both), as
    ``itl.stamp_deferred`` does."""
    if HOW == H_LEAD:
        t = itl.clock64()
        if HELD > 0 or (AGAIN and HELD == 0):
            tl.store(buf + _word(task, 0, HELD, NW, HOW), held)
        if HELD < 0 or COL == 4:
            tl.store(buf + _word(task, 0, COL, NW, HOW), t)
    else:
        lanes = tl.arange(0, NW * 32)
        tid = itl.thread_id_like(lanes)
        warp = tid >> 5
        if HOW == H_ONE:
            lead = tid == 0
        else:
            lead = (tid & 31) == 0
        t = itl.clock64_like(lanes)
        if HELD > 0 or (AGAIN and HELD == 0):
            tl.store(buf + _word(task, warp, HELD, NW, HOW), held, mask=lead)
        if HELD < 0 or COL == 4:
            tl.store(buf + _word(task, warp, COL, NW, HOW), t, mask=lead)
    return t


@triton.jit(do_not_specialize=["n_tasks", "iters"])
def xkernel(inp, out, buf, n_tasks, iters, BLOCK: tl.constexpr, HOW: tl.constexpr, NW: tl.constexpr,
            EXTRA: tl.constexpr, AGAIN: tl.constexpr):
    """``stamp_cost_gpu.work_kernel_deferred``'s tasks and stamps, by ``xstamp``."""
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = iters // 2
    for i in range(n_tasks):
        task = bid + i * G
        t = xstamp(buf, task, 0, 0, -1, HOW, NW, AGAIN)
        x = tl.load(inp + (task % 64) * BLOCK + lanes)  # 64 = TILES
        t = xstamp(buf, task, 1, t, 0, HOW, NW, AGAIN)
        if EXTRA:
            t = xstamp(buf, task, 5, t, 1, HOW, NW, AGAIN)
        y = SC.chain(x, x, half)
        t = xstamp(buf, task, 2, t, 1 + 4 * EXTRA, HOW, NW, AGAIN)
        if EXTRA:
            t = xstamp(buf, task, 6, t, 2, HOW, NW, AGAIN)
        y = SC.chain(y, x, iters - half)
        t = xstamp(buf, task, 3, t, 2 + 4 * EXTRA, HOW, NW, AGAIN)
        if EXTRA:
            t = xstamp(buf, task, 7, t, 3, HOW, NW, AGAIN)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        if EXTRA:
            t = xstamp(buf, task, 8, t, 7, HOW, NW, AGAIN)
        xstamp(buf, task, 4, t, 3 + 5 * EXTRA, HOW, NW, AGAIN)


def measure(nw: int, grid: int, tasks: list, iters: int, arch: str, rounds: int, batch: int,
            again: bool) -> tuple:
    """``(lines, results)``: each build's ns a stamp against ``off`` at each T and as a
    slope, and a further stamp's cost."""
    tmax = max(tasks)
    block = nw * 32
    inp = torch.rand(SC.TILES * block, device="cuda") * 0.01
    out = torch.empty(grid * tmax * block, device="cuda")
    raw = torch.zeros(grid * tmax * nw * COLS.value + 64, dtype=torch.int64, device="cuda")
    lib = {name: alloc(SC.spec(grid, tmax, waves=waves or nw, arch=arch, hybrid=True, marks=SC.marks_of(name)))
           for name, waves in (("dlead", 1), ("dlead+4", 1), ("dwarps", 0), ("dwarps+4", 0))}

    def go(build, t):
        if build in lib:
            b = lib[build]
            SC.work_kernel_deferred[(grid,)](*SC.launch_args(inp, out, b, b.layout, t, iters, True, nw),
                                            num_warps=nw, **SC.extra_of(build))
        elif build in ("off", "off2"):
            b = lib["dlead"]
            SC.work_kernel_deferred[(grid,)](*SC.launch_args(inp, out, b, b.layout, t, iters, False, nw),
                                            num_warps=nw)
        else:
            how, _, four = build.partition("+")
            xkernel[(grid,)](inp, out, raw, t, iters, block, HOWS[how], nw, bool(four), again, num_warps=nw)

    builds = ["off", *lib, *(h + s for h in HOWS for s in ("", "+4")), "off2"]
    configs = [(b, t) for t in tasks for b in builds]
    us = SC.interleaved(configs, lambda c: SC.events_around(lambda: go(*c), batch), rounds, batch)
    fits = {b: SC.diff_slope(us, b, "off", tasks) for b in builds[1:]}
    slopes = {b: slope / SC.PHASES_PER_TASK for b, (_, slope) in fits.items()}
    lines = [f"== {nw} warps: ns a stamp (slope against off over T = {tasks}, / 5 stamps a task)",
             "  " + ", ".join(f"{b} {s:.2f}" for b, s in slopes.items())]
    further = {b: SC.further_ns(slopes, b) for b in ("dlead", "dwarps", *HOWS)}
    lines.append("  a further stamp right behind another, ns: " + ", ".join(f"{b} {v:.2f}" for b, v in further.items()))
    lines.append("  build - off at each T, ns a launch: " + "; ".join(
        f"{b} " + "/".join(f"{d:.0f}" for d in diffs) for b, (diffs, _) in fits.items()))
    return lines, {"num_warps": nw, "diff_ns": {b: d for b, (d, _) in fits.items()}, "ns_per_stamp": slopes,
                   "further_stamp_ns": further}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    SC.slope_args(ap, rounds=100)
    ap.add_argument("--again", action="store_true",
                    help="the experiments' second stamp stores the first's reading again (one more store a task)")
    a = ap.parse_args(argv)
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    from gpu_run import environment  # bench/ is this script's sys.path[0]

    env = environment("PYTHONPATH=. python3 bench/warp_store_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv))
    lines = [f"{k}: {v}" for k, v in env.items()]
    lines.append(f"grid {grid}, {a.iters * 8} dependent FMAs a task, {a.rounds} rounds x {a.batch} launches, "
                 "interleaved")
    res = {"environment": env, "tasks": a.tasks, "by_warps": []}
    for nw in (4, 8):
        more, r = measure(nw, grid, a.tasks, a.iters, env["arch"], a.rounds, a.batch, a.again)
        lines += more
        res["by_warps"].append(r)
    SC.save(a.out, "warp_store_again_h200" if a.again else "warp_store_h200", lines, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
