"""A further timeline record between pieces of work, this tool's against Triton
Proton's, side by side in one run on an NVIDIA GPU (written for the H200).

    PYTHONPATH=. python3 bench/proton_side_gpu.py --out DIR

The kernel is ``bench/stamp_cost_gpu.py``'s persistent FMA-chain task, its chain in
three loops. Ours: the ``hwarps6`` / ``hwarps6+4`` and ``hlead6`` / ``hlead6+4``
builds there (hybrid stamps; ``+4``: four marks between the loops). Proton's: the
same task with ``triton.profiler.language`` scopes, a ``task`` scope around it and,
with ``MID``, a ``mid`` scope around the middle loop of each half (four more records
a task, between the loops), compiled and run inside one Proton instrumentation
session (warp granularity; a global-memory buffer large enough that no record is
overwritten: Proton's parser died with SIGFPE once its circular buffer wrapped). Each
launch is timed on the device: its kernel's duration as CUPTI records it (through
``torch.profiler``), so Proton's host work after each of its launches (hundreds of ms
at 256 tasks a CTA, growing with its records) stays outside, as it does not with CUDA
events around the launch (printed beside, for that reason). The builds are interleaved
round by round at 64 / 256 / 512 tasks per CTA; a further record costs
``slope(t_with - t_without) / 4`` per task. Baselines without any record, ``off6``
(our kernel, timeline off) and ``proton0`` (Proton's kernel without scopes, in the
session), give what a task's whole record costs: ours five stamps, two anchors and the
placement word; Proton's two records of its ``task`` scope.

Our builds run with the Proton session deactivated: launching a kernel without
Proton records inside an active session killed the process with SIGFPE (Triton
3.6 on the H200).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
import triton.profiler.language as pl
from triton.profiler.mode import Default, buffer_types

import stamp_cost_gpu as SC  # bench/ is this script's sys.path[0]

from instrument import alloc


@triton.jit
def _third_marked(y, x, n, MID: tl.constexpr):
    """``chain(y, x, n)`` in three loops, with ``MID`` a ``mid`` scope around the middle one."""
    k = n // 3
    y = SC.chain(y, x, k)
    if MID:
        pl.enter_scope("mid")
    y = SC.chain(y, x, k)
    if MID:
        pl.exit_scope("mid")
    return SC.chain(y, x, n - 2 * k)


@triton.jit(do_not_specialize=["n_tasks", "iters"])
def proton_kernel(inp, out, n_tasks, iters, BLOCK: tl.constexpr, MID: tl.constexpr, TASK: tl.constexpr):
    """``stamp_cost_gpu.work_kernel``'s task with Proton scopes: with ``TASK`` a
    ``task`` scope around it, with ``MID`` a ``mid`` scope around the middle loop of
    each half."""
    bid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = iters // 2
    for i in range(n_tasks):
        task = bid + i * G
        if TASK:
            pl.enter_scope("task")
        x = tl.load(inp + (task % 64) * BLOCK + lanes)
        y = _third_marked(x, x, half, MID)
        y = _third_marked(y, x, iters - half, MID)
        tl.store(out + task.to(tl.int64) * BLOCK + lanes, y)
        if TASK:
            pl.exit_scope("task")


def device_us(prof, launched: list, batch: int, names) -> dict:
    """``{config: µs per launch}`` from the profiler's kernel records: the kernels
    named ``names`` in start order are ``launched`` (``batch`` each), one for one."""
    kernels = sorted((e for e in prof.profiler.kineto_results.events()
                      if e.device_type() == torch.autograd.DeviceType.CUDA and e.name().startswith(names)),
                     key=lambda e: e.start_ns())
    if len(kernels) != len(launched) * batch:
        raise RuntimeError(f"{len(kernels)} kernel records for {len(launched) * batch} launches")
    out = {}
    for i, c in enumerate(launched):
        out.setdefault(c, []).append(sum(k.duration_ns() for k in kernels[i * batch:(i + 1) * batch]) / 1e3 / batch)
    return {c: np.array(v[SC.WARMUP:]) for c, v in out.items()}  # the warm-up launches left out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", type=int, nargs="+", default=[64, 256, 512])  # 512: Proton's records fit in shared
    ap.add_argument("--iters", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1, help="launches a timed sample (1: Proton's host work after "
                    "each launch stays outside the events)")
    ap.add_argument("--warps", type=int, default=4)
    a = ap.parse_args(argv)
    import triton.profiler as proton
    import triton.profiler.language as pl

    pl.enable_semantic("triton")
    nw, tmax = a.warps, max(a.tasks)
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    arch = SC.itl.arch_of()
    block = nw * 32
    inp = torch.rand(SC.TILES * block, device="cuda") * 0.01
    out = torch.empty(grid * tmax * block, device="cuda")
    ours = {}
    for name in ("hlead6", "hlead6+4", "hwarps6", "hwarps6+4"):
        waves, hybrid = next((w, h) for n, w, _, h in SC.BUILDS if n == name)
        buf = alloc(SC.spec(grid, tmax, waves=waves or nw, arch=arch, hybrid=hybrid, marks=SC.marks_of(name)))
        ours[name] = buf

    def go(name, t):
        if name.startswith("proton"):
            proton_kernel[(grid,)](inp, out, t, a.iters, block, name.endswith("+4"), name != "proton0", num_warps=nw)
        elif name == "off6":  # our kernel, the chain in the same three loops, no timeline
            buf = ours["hlead6"]
            SC.work_kernel[(grid,)](*SC.launch_args(inp, out, buf, buf.layout, t, a.iters, False, nw), num_warps=nw,
                                    PIECES=3)
        else:
            buf = ours[name]
            SC.kernel_of(name)[(grid,)](*SC.launch_args(inp, out, buf, buf.layout, t, a.iters, True, nw),
                                        num_warps=nw, **SC.extra_of(name))

    builds = ("off6", "hlead6", "hlead6+4", "hwarps6", "hwarps6+4", "proton0", "proton", "proton+4")
    per_warp = 1 << (tmax * 6 * 8 - 1).bit_length()  # a power of two holding a warp's records (6 a task, 8 bytes)
    session = proton.start(str(Path(tempfile.gettempdir()) / "proton_side"), backend="instrumentation",
                           data="trace", mode=Default(buffer_type=buffer_types["global"], buffer_size=nw * per_warp))

    def timed(config):  # our builds run (and compile) with the session off: Proton's hook is for its own kernels
        ours_ = not config[0].startswith("proton")
        if ours_:
            proton.deactivate(session)
        pair = SC.events_around(lambda: go(*config), a.batch)
        if ours_:
            proton.activate(session)
        return pair

    configs = [(b, t) for t in a.tasks for b in builds]
    launched = []

    def logged(config):
        launched.append(config)
        return timed(config)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        events_us = SC.interleaved(configs, logged, a.rounds, a.batch, sync_every=1)
    proton.finalize()
    us = device_us(prof, launched, a.batch, ("work_kernel", "proton_kernel"))
    lines = [f"a further record between pieces of work, ours (hybrid stamps) and Proton's (scopes), one run: "
             f"{grid} CTAs x {nw} warps, {a.iters * 8} dependent FMAs a task in three loops a half, "
             f"{a.rounds} rounds x {a.batch} launches, interleaved; each launch's duration on the device (CUPTI, "
             "through torch.profiler): Proton's host work after its launches stays outside",
             f"{'pair':>22} " + " ".join(f"{'T=' + str(t):>12}" for t in a.tasks) + "   ns per further record (slope / 4)"]
    res = {}
    for base in ("hlead6", "hwarps6", "proton"):
        diffs, slope = SC.diff_slope(us, base + "+4", base, a.tasks)
        ev, _ = SC.diff_slope(events_us, base + "+4", base, a.tasks)
        res[base] = {"diff_ns": diffs, "ns_per_record": slope / 4, "event_diff_ns": ev}
        lines.append(f"{base + '+4 - ' + base:>22} " + " ".join(f"{d:12.0f}" for d in diffs) + f"   {slope / 4:8.2f}"
                     + "   (CUDA events around the launch: " + ", ".join(f"{d:.0f}" for d in ev) + " ns)")
    stamps = len(ours["hlead6"].spec.phases)  # a task's stamps (its phases), anchors aside
    for base, zero, records in (("hlead6", "off6", stamps), ("hwarps6", "off6", stamps), ("proton", "proton0", 2)):
        diffs, slope = SC.diff_slope(us, base, zero, a.tasks)
        res[base]["ns_per_task_record"] = slope
        lines.append(f"{base + ' - ' + zero:>22} " + " ".join(f"{d:12.0f}" for d in diffs)
                     + f"   {slope:8.2f} ns a task's whole record, {slope / records:.2f} per record ({records} a task)")
    lines.append("kernel time, median µs: " + ", ".join(f"{b} T={t} {np.median(us[(b, t)]):.1f}" for b, t in configs))
    SC.save(a.out, "proton_side_h200", lines, {"tasks": a.tasks, "results": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
