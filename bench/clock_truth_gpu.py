"""The hybrid clock on an NVIDIA GPU (written for the H200): known spins and the demo.

    PYTHONPATH=. python3 bench/clock_truth_gpu.py --out DIR

1. Known spins, a hybrid build (``%clock64`` every stamp, ``%globaltimer`` anchors):
   ``instrument.demo.triton_calib.hybrid_calib_kernel`` spins each phase N ns on
   ``%globaltimer`` (50 ns .. 100 µs) or K cycles on ``%clock64`` (100 .. 200 000),
   one task per SM, 2 launches. Decoded with ``timeline.collect``. A global-clock
   spin must decode to N plus at most the timer's step (the spin exits on the first
   read at or past N: the reference's own step) and the stamp's own time; a cycle
   spin of K cycles must decode to K / f, f one SM clock for every K (printed as
   K / decoded ns in MHz: constant unless the decode is wrong; the shortest spins
   add the spin loop's last turn).
2. The demo mono kernel (``triton_mono``), 8 chained launches, the plain build and
   the hybrid build of the same inputs: zero-length phases, median ``start→hint``,
   anomalies; the hybrid trace is saved (``h200_mono_hybrid.arrow``).

Output: ``DIR/clock_truth_<gpu>.txt`` (what is printed), ``.json`` and the trace.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch

from instrument import alloc
from instrument.demo import triton_calib as tc
from instrument.demo import triton_mono as tm

LINES: list = []


def say(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LINES.append(line)


def durations(trace) -> dict:
    """stage name -> int64 array of its decoded interval durations (ns)."""
    iv = trace.intervals
    stage = np.asarray(pc.cast(iv.column("stage"), "string").to_pylist())
    dur = np.asarray(iv.column("duration_ns").to_pylist(), dtype=np.int64)
    return {s: dur[stage == s] for s in trace.spec.stage_names}


def spins(unit: str, values, grid: int, arch: str, env: dict) -> dict:
    """One hybrid calibration run (2 launches) and its table."""
    sp = tc.hybrid_spec(grid, values, unit, launches=2, arch=arch, extra={"captured": env})
    buf = alloc(sp)
    tc.run_hybrid(buf, values)  # compile
    buf.reset()
    for launch in range(2):
        tc.run_hybrid(buf, values, launch=launch)
    torch.cuda.synchronize()
    trace = buf.collect()
    d = durations(trace)
    rows = []
    say(f"  spins on {'%globaltimer (N ns)' if unit == 'ns' else '%clock64 (K cycles)'}; anomalies "
        f"{trace.anomaly_summary() or 'none'}")
    if unit == "ns":
        say(f"  {'N ns':>8s} {'intervals':>9s} {'min':>8s} {'median':>8s} {'max':>8s} {'max-N':>6s}")
    else:
        say(f"  {'K cyc':>8s} {'intervals':>9s} {'min ns':>8s} {'median':>8s} {'max':>8s} {'K/median MHz':>12s}")
    for n, name in zip(values, sp.stage_names):
        x = d[name]
        row = {"spin": n, "intervals": int(x.size), "min": int(x.min()), "median": float(np.median(x)),
               "max": int(x.max()), "zero": int((x == 0).sum())}
        if unit == "ns":
            row["max_minus_n"] = int(x.max()) - n
            say(f"  {n:8d} {x.size:9d} {x.min():8d} {np.median(x):8.0f} {x.max():8d} {row['max_minus_n']:6d}")
        else:
            row["mhz"] = n * 1e3 / float(np.median(x)) if np.median(x) > 0 else float("nan")
            say(f"  {n:8d} {x.size:9d} {x.min():8d} {np.median(x):8.1f} {x.max():8d} {row['mhz']:12.1f}")
        rows.append(row)
    if unit == "cycles":  # the reference: K / f + c0, c0 the back-to-back interval, f from the longest spin
        c0 = rows[0]["median"]
        f = values[-1] / (rows[-1]["median"] - c0)  # cycles per ns
        say(f"  reference K / f + c0: c0 = {c0:.1f} ns (K = 0: two stamps back to back), f = {f * 1e3:.1f} MHz "
            f"(from K = {values[-1]})")
        for n, name, row in zip(values, sp.stage_names, rows):
            err = d[name] - (n / f + c0)
            row["ref_err_max_ns"] = float(np.abs(err).max())
            row["ref_err_median_ns"] = float(np.median(err))
            say(f"  K {n:8d}: decoded - reference median {np.median(err):+6.1f} ns, worst |.| {np.abs(err).max():6.1f} ns")
    return {"unit": unit, "anomalies": trace.anomaly_summary(), "rows": rows}


def demo(arch: str, env: dict, out: Path, launches: int = 8) -> dict:
    """The demo kernel's plain and hybrid builds on the same chained inputs."""
    s = tm.Shape()
    ffn = tm.MonoFFN(s)
    g = torch.Generator(device="cuda").manual_seed(7)
    xs = [torch.randn(s.M, s.D, device="cuda", generator=g).half()]
    xs += [torch.empty(s.M, s.D, device="cuda", dtype=torch.float16) for _ in range(launches)]
    res = {}
    for name, hybrid in (("plain", False), ("hybrid", True)):
        buf = alloc(tm.spec(s, launches=launches, arch=arch, hybrid=hybrid, extra={"captured": env}))
        for _ in range(3):
            ffn.run(xs[0], xs[1], buffer=buf, launch=0)
        buf.reset()
        for i in range(launches):
            ffn.run(xs[i], xs[i + 1], buffer=buf, launch=i)
        torch.cuda.synchronize()
        trace = buf.collect()
        iv = trace.intervals
        dur = np.asarray(iv.column("duration_ns").to_pylist(), dtype=np.int64)
        ph = np.asarray(iv.column("phase").to_pylist())
        first = trace.phases[0] + "→" + trace.phases[1]
        res[name] = {"intervals": int(dur.size), "zero_length": int((dur == 0).sum()),
                     "median_start_hint_ns": float(np.median(dur[ph == first])),
                     "min_start_hint_ns": int(dur[ph == first].min()),
                     "anomalies": trace.anomaly_summary(), "hangs": ffn.hangs()}
        say(f"  {name:6s}: {dur.size} intervals, {res[name]['zero_length']} of zero length, {first} median "
            f"{res[name]['median_start_hint_ns']:.0f} ns (min {res[name]['min_start_hint_ns']}), anomalies "
            f"{trace.anomaly_summary() or 'none'}, hangs {ffn.hangs()}")
        if hybrid:
            raw = buf.tensor.cpu().numpy()
            np.savez_compressed(out / "h200_hybrid_buffer.npz", buffer=raw, spec=np.array(buf.spec.to_json()))
            res[name].update(_anchor_check(trace, raw, buf.spec))
            path = out / "h200_mono_hybrid.arrow"
            trace.save(path)
            res[name]["file"] = path.name
            res[name]["bytes"] = path.stat().st_size
    return res


def _anchor_check(trace, raw, spec) -> dict:
    """A hybrid trace against its own anchors: each task's first and last stamp as
    placed minus the global clock read there (within two steps by construction), and
    the SM clock each task ran at (cycles over global ns of its two anchors, tasks
    of at least 2 µs), its spread being what the clock_change count reports."""
    from timeline.contract import schema as S

    lay = spec.layout
    rec = raw[: lay.record_words].reshape(-1, lay.cols)
    rec = rec[rec[:, 0] != 0]
    t = trace.tasks
    first, last = (np.asarray(t.column(f"{p}_tick")) for p in (spec.phases[0], spec.phases[-1]))
    g0, g1 = rec[:, S.anchor_col(lay, 0)], rec[:, S.anchor_col(lay, 1)]
    dc = (rec[:, S.phase_col(len(spec.phases) - 1)] - rec[:, S.phase_col(0)]).astype(np.float64)
    dg = (g1 - g0).astype(np.float64)
    mhz = dc[dg >= 2000] / dg[dg >= 2000] * 1e3
    out = {"first_minus_anchor_ns": [int((first - g0).min()), int((first - g0).max())],
           "last_minus_anchor_ns": [int((last - g1).min()), int((last - g1).max())],
           "task_mhz_p1_p50_p99": [float(np.percentile(mhz, q)) for q in (1, 50, 99)]}
    say(f"  hybrid against its anchors: first stamp - anchor {out['first_minus_anchor_ns']} ns, last stamp - anchor "
        f"{out['last_minus_anchor_ns']} ns; SM clock a task ran at (>= 2 µs tasks) p1/p50/p99 "
        + "/".join(f"{v:.0f}" for v in out["task_mhz_p1_p50_p99"]) + " MHz")
    return out


def main(argv=None) -> int:
    from gpu_run import environment  # bench/ is this script's sys.path[0]

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("clock_truth_gpu needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    env = environment("PYTHONPATH=. python3 bench/clock_truth_gpu.py " + " ".join(argv))
    say("== environment")
    for k, v in env.items():
        say(f"  {k}: {v}")
    grid = env["sms"]
    res = {"environment": env}
    say("== 1. known spins, hybrid build (one task per SM, 2 launches, 4 intervals a task)")
    res["spins_ns"] = spins("ns", tc.HYBRID_SPIN_NS, grid, env["arch"], env)
    res["spins_cycles"] = spins("cycles", tc.HYBRID_SPIN_CYCLES, grid, env["arch"], env)
    say("== 2. demo mono kernel, plain vs hybrid build, 8 chained launches")
    res["demo"] = demo(env["arch"], env, args.out)
    say(f"== done in {time.time() - t0:.0f} s")
    tag = env["gpu"].split()[-1].lower()
    (args.out / f"clock_truth_{tag}.txt").write_text("\n".join(LINES) + "\n")
    (args.out / f"clock_truth_{tag}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
