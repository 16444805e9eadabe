"""Where a task's timeline record costs, on an NVIDIA GPU (written for the H200).

    PYTHONPATH=. python3 bench/record_cost_gpu.py --out DIR

``bench/stamp_cost_gpu.py``'s FMA-chain kernel, its chain in three loops a half
(the ``hlead6`` build: a hybrid lead-thread record of five stamps, two anchors, the
placement word), against the same kernel without a record (``off6``) and against
experiments (``stamp_cost_gpu.bench_stamp``): ``reddrop`` (the drop counter a
predicated ``red``, no result, instead of the library's ``atomic_add`` predicated
off), ``branchdrop`` (the atomic behind a branch), ``plaindrop`` (a predicated plain
load, add and store), ``dropfirst`` (the atomic before the first phase's counter read,
not after its stores), ``droplast`` (the atomic at the last phase), ``flagdrop`` (no
count: a predicated plain store of the task's index + 1) and those that leave parts of the
record out (none decodes whole): ``noanchor`` (no ``%globaltimer`` anchors), ``nodrop`` (no drop
counter), ``noplace`` (no placement word), ``nobook`` (no slot check, placement word or
drop counter) and ``bare`` (neither: five cycle-counter
reads and their stores); and ``bench/held_stamps_gpu.py``'s lane-held record
(``row6``: ``stamp_row``, the record held across a warp's lanes and written whole at
the last phase) with its write done another way: ``rowred`` (the drop counted by a
predicated ``red``), ``rownodrop`` (not counted), ``rownowrite`` (neither row nor drop
stored: what holding alone costs). Interleaved round by round, CUDA events around each
launch; what a part costs a task is the slope over T = 64 / 256 / 512 tasks a CTA of
the difference to ``off6``.

    PYTHONPATH=. python bench/record_cost_gpu.py --sass DIR   # no GPU: where each build's first load sits

``--sass`` compiles every build for sm_90 (no GPU needed) and prints, from its SASS,
what lies between the first stamp's counter read and the task's tile load (``LDG``):
how many instructions and how many branches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import held_stamps_gpu as HS  # bench/ is this script's sys.path[0]
import stamp_cost_gpu as SC

from instrument import alloc

BUILDS = {"off6": None, "hlead6": 0, **{name: e.value for name, e in (
    ("reddrop", SC.EXP_RED_DROP), ("branchdrop", SC.EXP_BRANCH_DROP), ("plaindrop", SC.EXP_PLAIN_DROP),
    ("dropfirst", SC.EXP_DROP_FIRST), ("droplast", SC.EXP_DROP_LAST), ("flagdrop", SC.EXP_FLAG_DROP), ("noanchor", SC.EXP_NO_ANCHOR), ("nodrop", SC.EXP_NO_DROP),
    ("noplace", SC.EXP_NO_PLACE), ("nobook", SC.EXP_NO_BOOK), ("bare", SC.EXP_BARE))}}
ROW_BUILDS = {"row6": 0, "rowred": HS.ROW_RED.value, "rownodrop": HS.ROW_NO_DROP.value,
              "rownowrite": HS.ROW_NO_WRITE.value}  # lane-held records (held_stamps_gpu.stamp_row), their write
BUILDS.update(ROW_BUILDS)


def kernel_of(name: str):
    """A build's kernel: ``held_stamps_gpu``'s lane-held one for ``ROW_BUILDS``."""
    return HS.work_kernel_row if name in ROW_BUILDS else SC.work_kernel


def sass_report(out: Path, warps: int = 4) -> str:
    """``--sass``: per build, the instructions and branches from the first
    ``CS2R ... SR_CLOCKLO`` to the first ``LDG`` of its SASS (compiled, not run)."""
    from tools.sass import instructions

    grid = 132
    layout = SC.spec(grid, 512, waves=1, arch="sm_90", hybrid=True).layout
    lines = ["each build's SASS (sm_90, compiled here, not run): from the first stamp's counter read to the task's "
             "tile load", f"{'build':>12} {'instructions':>12} {'branches':>9}"]
    res = {}
    for name, exp in BUILDS.items():
        k = SC.itl.compile_launch(kernel_of(name), torch.float32, torch.float32, torch.int64, 0, 64, 64, layout,
                                  exp is not None, warps * 32, grid=(grid,), num_warps=warps, PIECES=3, EXP=exp or 0)
        sass = instructions(k.asm["cubin"])
        load = next(i for i, ins in enumerate(sass) if ins.startswith("LDG"))
        read = next((i for i, ins in enumerate(sass) if "SR_CLOCKLO" in ins), load)
        between = sass[read:load]
        res[name] = {"instructions": len(between), "branches": sum(" BRA " in f" {ins} " for ins in between)}
        lines.append(f"{name:>12} {res[name]['instructions']:>12} {res[name]['branches']:>9}")
    return SC.save(out, "record_cost_sass", lines, res)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sass", type=Path, metavar="DIR", help="no GPU: the SASS report into DIR, nothing run")
    ap.add_argument("--tasks", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--iters", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--warps", type=int, default=4)
    a = ap.parse_args(argv)
    if a.sass:
        sass_report(a.sass, a.warps)
        return 0
    if a.out is None:
        ap.error("--out DIR (or --sass DIR)")
    nw, tmax = a.warps, max(a.tasks)
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    block = nw * 32
    inp = torch.rand(SC.TILES * block, device="cuda") * 0.01
    out = torch.empty(grid * tmax * block, device="cuda")
    buf = alloc(SC.spec(grid, tmax, waves=1, arch=SC.itl.arch_of(), hybrid=True))

    def go(name, t):
        exp = BUILDS[name]
        kernel_of(name)[(grid,)](*SC.launch_args(inp, out, buf, buf.layout, t, a.iters, exp is not None, nw),
                                num_warps=nw, PIECES=3, EXP=exp or 0)

    configs = [(b, t) for t in a.tasks for b in BUILDS]
    us = SC.interleaved(configs, lambda c: SC.events_around(lambda: go(*c), 1), a.rounds, 1, sync_every=1)
    lines = [f"a task's hybrid lead-thread record and its parts, against the kernel without one: {grid} CTAs x "
             f"{nw} warps, {a.iters * 8} dependent FMAs a task in three loops a half, {a.rounds} rounds, "
             "interleaved, CUDA events around each launch",
             f"{'build - off6':>18} " + " ".join(f"{'T=' + str(t):>10}" for t in a.tasks) + "   ns a task (slope)"]
    res = {}
    for name in list(BUILDS)[1:]:
        diffs, slope = SC.diff_slope(us, name, "off6", a.tasks)
        res[name] = {"diff_ns": diffs, "ns_per_task": slope}
        lines.append(f"{name:>18} " + " ".join(f"{d:10.0f}" for d in diffs) + f"   {slope:8.2f}")
    lines.append("kernel time, median µs: " + ", ".join(f"{b} T={t} {np.median(us[(b, t)]):.1f}" for b, t in configs))
    SC.save(a.out, "record_cost_h200" if nw == 4 else f"record_cost_w{nw}_h200", lines, {"tasks": a.tasks, "results": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
