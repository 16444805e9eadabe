"""Two GPUs, one run (issue 34, run 2): the tensor-parallel demo
(``instrument.demo.triton_tp``) as a real TP job runs it, one process a GPU, each
rank replaying a CUDA graph of ``--layers`` launches a step and capturing one step
in ``--every`` (``instrument.Capture``) into ONE run directory, concurrently; rank
``--slow-rank`` spins ``--slow-ns`` in every part task of layer ``--slow-layer`` (a
rank slowed on purpose). Each rank calibrates its GPU's clock against the host's
twice before replaying, ``--drift-s`` apart (``Capture.calibrate``: both travel in
every spec the rank appends, so each launch start is placed along the measured
drift), and once after (not appended: printed against what the two predicted for
that moment, the check that the placement held over the replay).
Then ``timeline launches RUN`` (per launch, both ranks' kernel times and the start
skew between the two GPUs on the host clock, ± its bound; its ``--json`` summarized
beside the raw, uncalibrated difference of the two timers) and ``timeline explain
RUN`` (the slowed layer's launch: the slowed rank's part stage must be named, and the
all-reduce skew must show it last). On a 2-GPU machine::

    PYTHONPATH=. python3 bench/tp_run_gpu.py --out $OUT --gpus 2

writes ``$OUT/tp_run_<card>.txt`` (commit as ``bench/results/tp_run_2gpu.txt``) and the
run ``$OUT/run`` (small: commit under ``traces/``). The mailboxes and partial tiles
live on GPU 0, allocated by rank 0's process and opened by rank 1's through CUDA IPC
(``torch.multiprocessing``; the driver enables peer access), at system scope.

On the CPU (``--dry-run``): the same two processes, started together, each running
its rank's kernel with the ring capture in Triton's interpreter (``tools.triton_interp``,
one CTA, a tiny shape) and appending to the one run concurrently; the interpreter
cannot share mailboxes between processes, so there each rank reduces its own part
only (``WORLD`` = 1 in the kernel; the run's specs still say world 2), and there is
no device clock to calibrate (``instrument.calibrate`` needs an NVIDIA GPU: the
output says so and the calibrated skew stays empty, with ``timeline launches``'s
reason). It proves the processes, the capture, the concurrent appends and the
commands, not the cross-GPU waits nor the clocks (``tests/test_tp_run_gpu_script.py``)::

    PYTHONPATH=. python3 bench/tp_run_gpu.py --out "$(mktemp -d)" --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DRY_SHAPE = dict(M=32, N=32, K=64, BM=16, BN=16, BK=16, G=1, world=2, num_warps=4)  # 4 tasks a stage


DRY_MAX_SPIN = 64  # polls a dry-run wait may take (every wait there is on the rank's own post)


def _args(tp, s, r, bufs, cap, layer, world, scope, slow_ns, slow_layer):
    """``tp_kernel``'s arguments for rank ``r``'s launch of ``layer`` (tag and slot from
    the capture's step counter); dry (``world`` 1): computed as rank 0 of a world of one."""
    x, w, parts, mail, out, err = bufs
    dry = world == 1
    return (x, w, parts, mail, out, err, cap.stamps, layer, 0, 0 if dry else r, world, s.M, s.N, s.K, s.BM, s.BN,
            s.BK, s.G, cap.layout, True, DRY_MAX_SPIN if dry else tp.MAX_SPIN, scope, cap.step, cap.layers,
            cap.ring, cap.every, slow_ns, slow_layer)


def rank_main(r: int, a, run: str, shared, barrier, results) -> None:
    """One rank's process: its buffers, capture into ``run``, warm-up, the graph (or,
    dry, eager steps), replay while the capture drains; its report on ``results``."""
    import torch

    from instrument.capture import Capture
    from instrument.demo import triton_tp as tp

    dry = a.dry_run
    if dry:
        from tools import triton_interp
        triton_interp.install(4, seed=r)
    s = tp.TPShape(**DRY_SHAPE) if dry else tp.TPShape()
    dev = torch.device("cpu") if dry else torch.device("cuda", r)
    if not dry:
        torch.cuda.set_device(dev)
        tp.check_tp_shape(s, torch.cuda.get_device_properties(dev).multi_processor_count, 1)
    g = torch.Generator().manual_seed(0)  # the same X and W on every rank
    x = (torch.randn(s.M, s.K, generator=g) / s.K ** 0.25).half().to(dev)
    w = (torch.randn(s.K, s.N, generator=g) / s.K ** 0.25).half().to(dev)
    if dry or r == 0:
        parts = torch.empty(s.world, s.M, s.N, device=dev, dtype=torch.float32)
        mail = torch.zeros(s.world, s.tasks, device=dev, dtype=torch.int64)
        err = torch.zeros(1, device=dev, dtype=torch.int32)
        if not dry:
            for _ in range(s.world - 1):
                shared.put((parts, mail, err))  # CUDA IPC handles: the peers open GPU 0's memory
    else:
        parts, mail, err = shared.get()
        tp.enable_peer_access(dev, torch.device("cuda", 0))  # besides the lazy enable of the IPC open
    bufs = (x, w, parts, mail, torch.empty(s.M, s.N, device=dev, dtype=torch.float32), err)
    world, scope = (1, "gpu") if dry else (s.world, "sys")
    slow = a.slow_ns if r == a.slow_rank else 0
    cap = Capture(tp.spec(s, rank=r), ring=a.ring, every=a.every, layers=a.layers, run=run, device=dev,
                  name=f"tp_rank{r}")

    def one_step():
        for layer in range(a.layers):
            tp.tp_kernel[(s.G,)](*_args(tp, s, r, bufs, cap, layer, world, scope, slow, a.slow_layer),
                                 num_warps=s.num_warps)
        cap.advance()

    def sync():
        if not dry:
            torch.cuda.synchronize(dev)

    if not dry:  # compile before any rank launches: a rank compiling while its peer spins would hang it
        tp.tp_kernel.warmup(*_args(tp, s, r, bufs, cap, 0, world, scope, slow, a.slow_layer), grid=(s.G,),
                            num_warps=s.num_warps)
    barrier.wait()
    one_step()  # eager warm-up step, every rank at once
    sync()
    barrier.wait()
    if dry or r == 0:
        mail.zero_()
        err.zero_()
    sync()
    cap.reset(0)
    barrier.wait()
    if dry:
        step = one_step
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            one_step()
        step = graph.replay
    cals = []
    if not dry:  # before the barrier: the first call compiles a kernel; two for the drift
        cals.append(cap.calibrate())
        time.sleep(a.drift_s)
        cals.append(cap.calibrate())
    barrier.wait()  # the ranks start replaying together (a wait gives up after MAX_SPIN polls)
    cap.start()
    t0 = time.monotonic()
    for _ in range(a.steps):
        step()
    sync()
    seconds = time.monotonic() - t0
    rep = cap.close()
    if not dry:  # not appended (the steps are written): checks the appended ones' placement at the end
        from instrument.clocksync import calibrate

        cals.append(calibrate(dev))
    barrier.wait()
    hangs = int(err.item()) if (dry or r == 0) else 0
    results.put((r, rep.summary(), rep.written, rep.overrun, hangs, seconds, cals))


def spawn_ranks(a, run: Path) -> list:
    """Both ranks' processes (``spawn``: CUDA and the interpreter start fresh in each),
    joined; their reports in rank order. A rank that fails fails the whole."""
    import torch.multiprocessing as mp

    if a.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # inherited by the spawned processes, read at their Triton import
    ctx = mp.get_context("spawn")
    shared, results, barrier = ctx.Queue(), ctx.Queue(), ctx.Barrier(a.gpus)
    procs = [ctx.Process(target=rank_main, args=(r, a, str(run), shared, barrier, results)) for r in range(a.gpus)]
    for p in procs:
        p.start()
    got = [results.get(timeout=a.timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode]
    if bad:
        raise SystemExit(f"error: rank processes exited {bad}")
    return sorted(got)


def raw_start_skew(run: Path) -> str:
    """Per (step, layer), rank 1's first start minus rank 0's on their own timers
    (each append keeps its GPU's ``%globaltimer``; no calibration between them, so an
    offset between the two timers is in it): median, min, max over the launches."""
    import numpy as np

    from timeline.run.read import open_run

    t = open_run(run).launches()
    starts = {}
    for r, st, la, s0 in zip(*(t.column(c).to_pylist() for c in ("rank", "step", "layer", "start_ns"))):
        starts.setdefault((st, la), {})[r] = s0
    d = np.array([v[1] - v[0] for v in starts.values() if 0 in v and 1 in v], dtype=np.float64)
    if not d.size:
        return "raw start skew: no launch has both ranks"
    return (f"raw start skew, rank 1 - rank 0 first start on their own timers (uncalibrated), {d.size} launches: "
            f"median {np.median(d) / 1e3:+.3f} µs, min {d.min() / 1e3:+.3f}, max {d.max() / 1e3:+.3f}")


NO_CLOCK = ("clock calibration: none (the CPU interpreter has no %globaltimer; instrument.calibrate needs an "
            "NVIDIA GPU): the skew between the ranks' appends stays empty")


def clock_lines(r: int, cals: list) -> list:
    """Rank ``r``'s calibrations: the two appended (before the replay: the offset and
    the drift between them) and the one after, against the offset the appended two
    place at its moment (``clocks.placement_at``, what the run's placement uses)."""
    from timeline.contract import clocks as K

    if len(cals) < 3:
        return []
    a, b, after = cals
    d = K.drift(a, b)
    p = K.placement_at([a, b], after.host_ns)
    off, bound = after.offset_ns - p.offset_ns, p.uncertainty_ns + after.uncertainty_ns
    return [f"rank {r}: {a.device} = host {a.offset_ns:+,} ns ± {a.uncertainty_ns:,.0f} ns ({a.rounds} rounds), "
            f"drift {d.ppm:+.3f} ± {d.uncertainty_ppm:.3f} ppm over {d.seconds:.2f} s: both carried by every append "
            "of the rank",
            f"rank {r}: after the replay ({(after.host_ns - b.host_ns) / 1e9:.2f} s later) the offset is "
            f"{off:+,} ns from where those two place it (± {bound:,.0f} ns together): "
            + ("within" if abs(off) <= bound else "BEYOND") + " the bounds"]


def host_start_skew(run: Path) -> str | None:
    """Per (step, layer), rank 1's start minus rank 0's, each placed on the host clock by
    its append's calibration (``Run.launches()``'s ``host_start_ns``): the raw
    difference with the two timers' offset taken out; None where no launch has both."""
    import numpy as np

    from timeline.run.read import open_run

    t = open_run(run).launches()
    starts = {}
    for r, st, la, h in zip(*(t.column(c).to_pylist() for c in ("rank", "step", "layer", "host_start_ns"))):
        if h is not None:
            starts.setdefault((st, la), {})[r] = h
    d = np.array([v[1] - v[0] for v in starts.values() if 0 in v and 1 in v], dtype=np.float64)
    if not d.size:
        return None
    return (f"calibrated start skew, rank 1 - rank 0 first start on the host clock, {d.size} launches: "
            f"median {np.median(d) / 1e3:+.3f} µs, min {d.min() / 1e3:+.3f}, max {d.max() / 1e3:+.3f}")


def launches_skew(doc: dict) -> tuple:
    """``(line, found)``: the calibrated skew of ``timeline launches RUN --json`` (latest
    rank's start minus the earliest on the host clock, ± its bound) over the launches
    of both ranks, or why it is empty (the command's note)."""
    import numpy as np

    rows = [r for r in doc["rows"] if r["ranks"] == 2]
    got = [(r["skew_us"], r["skew_pm_us"]) for r in rows if r["skew_us"] is not None]
    if not got:
        why = doc["notes"][0] if doc.get("notes") else "no launch has both ranks"
        return f"calibrated start skew (timeline launches --json): {why}", False
    s, pm = (np.array(v, dtype=np.float64) for v in zip(*got))
    return (f"calibrated start skew (timeline launches --json), latest - earliest rank start on the host clock, "
            f"{s.size} launches: median {np.median(s):.3f} µs, min {s.min():.3f}, max {s.max():.3f}; "
            f"± median {np.median(pm):.3f} µs, max {pm.max():.3f}"), True


def command(args: list) -> tuple:
    """``timeline ARGS`` in a subprocess: ``(seconds, exit status, output)``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "timeline", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    return time.monotonic() - t0, p.returncode, (p.stdout + p.stderr).rstrip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=2, help="ranks, one process and one GPU each (2)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--ring", type=int, default=2)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow-layer", type=int, default=3)
    ap.add_argument("--slow-ns", type=int, default=8000)
    ap.add_argument("--drift-s", type=float, default=2.0,
                    help="seconds between each GPU's two calibrations before the replay (its drift)")
    ap.add_argument("--timeout", type=float, default=540, help="seconds to wait for the ranks")
    ap.add_argument("--dry-run", action="store_true", help="the interpreter on the CPU, a tiny run")
    a = ap.parse_args(argv)
    if a.gpus != 2:
        ap.error("--gpus 2: the TP demo's world is 2")
    if a.dry_run:
        a.layers, a.steps, a.every, a.slow_layer, a.slow_ns = 4, 4, 2, 1, 2000
        card = "cpu-interp (dry run: no cross-rank waits)"
    else:
        import torch
        if torch.cuda.device_count() < 2:
            print("needs 2 NVIDIA GPUs (or --dry-run on the CPU)", file=sys.stderr)
            return 2
        card = f"2 x {torch.cuda.get_device_name(0)}"
    a.out.mkdir(parents=True, exist_ok=True)
    run = a.out / "run"
    if run.exists():
        print(f"error: {run} exists; give an empty --out (a run is appended to, never rewritten)", file=sys.stderr)
        return 2
    reports = spawn_ranks(a, run)
    lines = [f"tensor-parallel demo, 2 ranks in 2 processes on {card}: {a.layers} layers a step, {a.steps} steps, "
             f"one in {a.every} captured into one run; rank {a.slow_rank} spins {a.slow_ns} ns in every part task "
             f"of layer {a.slow_layer}"]
    for r, summary, written, overrun, hangs, seconds, cals in reports:
        lines.append(f"rank {r}: {summary}; waits given up {hangs}; {seconds:.3f} s replaying")
        lines += clock_lines(r, cals)
    if a.dry_run:
        lines.append(NO_CLOCK)
    lines.append(raw_start_skew(run))
    lines.append(host_start_skew(run) or "calibrated start skew, rank 1 - rank 0: none (no launch has both ranks "
                                         "placed on the host clock)")
    _, rc, out = command(["launches", str(run), "--json"])
    skew_line, calibrated = launches_skew(json.loads(out)) if rc == 0 else (f"timeline launches --json: exit {rc}",
                                                                           False)
    lines.append(skew_line)
    cmds = [["launches", str(run)], ["explain", str(run)]]
    if a.dry_run:  # ranks that never waited on each other: the slowed launch is refused (causality), not another
        cmds.append(["explain", str(run), "--launch", f"0:{(a.slow_layer + 1) % a.layers}"])
    rcs = []
    for args in cmds:
        dt, rc, out = command(args)
        rcs.append(rc)
        lines += [f"\n$ timeline {' '.join(args)}   # {dt:.2f} s, exit {rc}", out]
    text = "\n".join(lines)
    print(text)
    stem = "tp_run_cpu-interp" if a.dry_run else "tp_run_2gpu"
    (a.out / f"{stem}.txt").write_text(text + "\n")
    failed = any(rep[4] for rep in reports) or rcs[0] or (rcs[-1] if a.dry_run else rcs[1] or not calibrated)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
