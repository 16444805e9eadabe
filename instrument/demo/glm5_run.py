"""Host side of the GLM-5-shaped FlyDSL demo (``instrument.demo.flydsl_glm5``): its
reference, its inputs, a run of each build against the reference, and the command
line. NOT RUN HERE (no AMD GPU); on an MI300X / MI355X::

    python -m instrument.demo.glm5_run --check --trace glm5.arrow --legacy rank0/trace.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from instrument.demo.flydsl_glm5 import (COUNT, FIRST, KERNEL, LAYERS, N_TASKS, NORMAL, PRODUCERS, SPEC, THREADS,
                                         TIMELINE, WAVES, launch)
from timeline.contract.kernels import GLM5_GRID, GLM5_STAGES, LEGACY_COLS


def reference(x, w):
    """Every task's value (float64, ``{stage: array}``): ``x[t] * rowsum(w[first + t])``
    for qkv_a, else the sum over its producer stages of the mean of the producer
    tasks' values, times the row sum. ``x``: ``(164,)``, ``w``: ``(N_TASKS, THREADS * 4)``."""
    import numpy as np

    rowsum = np.asarray(w, dtype=np.float64).reshape(N_TASKS, -1).sum(axis=1)
    values = {}
    for name, n in GLM5_STAGES:
        xin = np.empty(n)
        for t in range(n):
            xin[t] = (float(x[t]) if name == "qkv_a" else
                      sum(values[p.stage][p.lo(t):p.lo(t) + p.n(COUNT[p.stage])].mean() for p in PRODUCERS[name]))
        values[name] = xin * rowsum[FIRST[name]:FIRST[name] + n]
    return values


def read_boxes(boxes):
    """``(values, tags)`` of the mailboxes (an int64 ``(N_TASKS * WAVES,)`` array): each
    task's value (the sum of its waves' pairs, float64, in row order) and every pair's tag."""
    import numpy as np

    words = np.asarray(boxes, dtype=np.int64).reshape(N_TASKS, WAVES)
    bits = (words & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
    return bits.sum(axis=1), (words >> 32)


def make_inputs(device, seed=0):
    """The input ``x``, the weights (row sums near 1), zeroed mailboxes and step counter."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    k = THREADS * 4
    return {
        "x": torch.randn(COUNT["qkv_a"], generator=g).to(device),
        "w": ((1.0 + 0.1 * torch.randn(N_TASKS, k, generator=g)) / k).to(device),
        "boxes": torch.zeros(N_TASKS * WAVES, dtype=torch.int64, device=device),
        "step": torch.zeros(1, dtype=torch.int32, device=device),
    }


def run(mode, grid=GLM5_GRID, seed=0, device="cuda"):
    """One step of ``LAYERS`` launches in build ``mode``, each checked against
    ``reference``; return ``(max error relative to the largest value, worst count of
    stale tags, result)``, the
    result a ``Trace`` (TIMELINE), the ``(N_TASKS, 8)`` tick tensor (KERNEL) or None.
    Needs an MI300X / MI355X."""
    import numpy as np
    import torch

    from instrument.buffer import alloc
    from instrument.demo.flydsl_mono import check_grid

    props = torch.cuda.get_device_properties(device)
    check_grid(grid, getattr(props, "multi_processor_count", None))
    arch = getattr(props, "gcnArchName", "gfx942").split(":")[0]
    io = make_inputs(device, seed)
    want = np.concatenate(list(reference(io["x"].cpu().numpy(), io["w"].cpu().numpy()).values()))
    buf = ticks = None
    if mode == TIMELINE:
        buf = alloc(SPEC.replace(grid=grid, arch=arch), device)
        buf.reset()
    elif mode == KERNEL:
        ticks = torch.zeros(N_TASKS, LEGACY_COLS, dtype=torch.int64, device=device)
    worst, bad_tags = 0.0, 0
    for layer in range(LAYERS):
        addr = buf.address(True) if buf is not None else (ticks.data_ptr() if ticks is not None else 0)
        slot = buf.launch_slot(layer) if buf is not None else layer
        launch(io["x"].data_ptr(), io["w"].data_ptr(), io["boxes"].data_ptr(), io["step"].data_ptr(), addr, slot,
               grid, mode)
        torch.cuda.synchronize(device)
        got, tags = read_boxes(io["boxes"].cpu().numpy())
        worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
        bad_tags = max(bad_tags, int(np.count_nonzero(tags != layer + 1)))  # step 0: tag = layer + 1
    if buf is not None:
        return worst, bad_tags, buf.collect()
    return worst, bad_tags, (ticks.cpu() if ticks is not None else None)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m instrument.demo.glm5_run", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="run the normal, timeline and kernel-stamp builds")
    ap.add_argument("--grid", type=int, default=GLM5_GRID, help="CTAs, a power of two <= compute units (256)")
    ap.add_argument("--trace", help="save the timeline build's Trace here (Arrow IPC)")
    ap.add_argument("--legacy", help="save the kernel-stamp build's tensor here as the kernel's trace.pt")
    ap.add_argument("--tol", type=float, default=1e-3, help="max relative error accepted")
    args = ap.parse_args(argv)
    if not args.check:
        ap.print_help()
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no GPU visible to torch: this demo needs an MI300X (gfx942) or MI355X (gfx950)", file=sys.stderr)
        return 2
    status = 0
    for mode, label in ((NORMAL, "normal  "), (TIMELINE, "timeline"), (KERNEL, "kernel  ")):
        err, bad_tags, result = run(mode, args.grid)
        ok = err <= args.tol and bad_tags == 0
        status |= not ok
        print(f"{label} build: max relative error {err:.3g}, {bad_tags} stale tags ({'ok' if ok else 'FAIL'})")
        if mode == TIMELINE and args.trace:
            result.save(args.trace)
            print(f"  {result.tasks.num_rows} task rows, {result.anomalies.num_rows} anomaly rows; saved {args.trace}")
        if mode == KERNEL and args.legacy:
            Path(args.legacy).parent.mkdir(parents=True, exist_ok=True)  # rank0/trace.pt, as benchmark.py lays it out
            torch.save(dict(stages=list(GLM5_STAGES), ticks=result), args.legacy)
            print(f"  saved {args.legacy} (read it with: timeline import-legacy {args.legacy} --grid {args.grid})")
    return status


if __name__ == "__main__":
    sys.exit(main())
