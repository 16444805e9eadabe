"""One device run of the Triton backend on an NVIDIA GPU (written for the H200).

    PYTHONPATH=. python3 bench/gpu_run.py --out DIR

1. correctness of the demo mono kernel (``instrument.demo.triton_mono``) against
   torch in float32, for the normal build and both timeline builds, on fresh
   random inputs with the work buffers poisoned (NaN) first;
2. traces at a realistic size: 16 chained launches (16 "layers") in one buffer
   with lead-thread stamps, 4 launches with per-warp stamps; each collected, checked
   for anomalies and saved (``Trace.save``: zstd Arrow IPC / Parquet);
3. the calibration kernel (``triton_calib``): decoded phase durations against the
   spin lengths (worst error), the timer's step, and the timer's rate against
   CUDA events over launches of 0.75 to 75 ms;
4. the demo kernel with stamps off / lead thread / per warp / off again, timed
   with CUDA events (batches of launches, variants interleaved, median over many
   samples): the overhead ratio, with the off/off ratio as the noise floor; at
   the full size and at M=512 (a 4x shorter launch, so stamps weigh 4x more).

Everything printed also goes to ``DIR/gpu_run_<gpu>.txt``; the numbers to
``DIR/gpu_run_<gpu>.json``; the traces and the raw stamp buffers (``.npz``) to DIR.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch

import triton
from instrument import alloc
from instrument import triton as itl
from instrument.demo import triton_calib as tc
from instrument.demo import triton_mono as tm

LINES: list = []


def say(*parts) -> None:
    """Print a line and keep it for the results file."""
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LINES.append(line)


def environment(command: str | None = None) -> dict:
    """GPU, driver, library versions, the date and ``command`` (this script's, by
    default): what traces/README.md records. bench/stamp_cost_gpu.py uses it too."""
    props = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        driver = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        driver = f"nvidia-smi failed: {e}"
    return {
        "gpu": props.name,
        "arch": itl.arch_of(0),
        "sms": props.multi_processor_count,
        "driver (version, sm clock, max sm clock)": driver,
        "cuda (torch)": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command or "PYTHONPATH=. python3 bench/gpu_run.py " + " ".join(sys.argv[1:]),
    }


def rel_err(out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere gives inf."""
    o = out.double()
    if not torch.isfinite(o).all():
        return math.inf
    r = ref.double()
    return float((o - r).norm() / r.norm())


# -- 1. correctness ---------------------------------------------------------------------
def check_correctness(ffn: tm.MonoFFN, arch: str, tol=5e-3) -> dict:
    """Each build on fresh inputs; every stage checked against torch from the
    kernel's own stage input (so fp16 rounding does not compound)."""
    s = ffn.shape
    builds = {"normal": None,
              "lead": alloc(tm.spec(s, waves=1, arch=arch)),
              "warps": alloc(tm.spec(s, waves=s.num_warps, arch=arch))}
    out = {}
    ys = {}
    for seed, (name, buf) in enumerate(builds.items(), start=11):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(s.M, s.D, device="cuda", generator=g).half()
        y = torch.full((s.M, s.D), float("nan"), device="cuda", dtype=torch.float16)
        ffn.h.fill_(float("nan"))
        ffn.a.fill_(float("nan"))
        ffn.run(x, y, buffer=buf)
        torch.cuda.synchronize()
        href, _, _ = tm.reference(x, ffn.w1, ffn.w2)
        hk = ffn.h.float()
        hn = hk * torch.rsqrt(hk.pow(2).mean(dim=1, keepdim=True) + tm.EPS)
        aref = hn * torch.sigmoid(hn)
        yref = ffn.a.float() @ ffn.w2.float()
        _, _, y_e2e = tm.reference(x, ffn.w1, ffn.w2)
        errs = {"H": rel_err(ffn.h, href), "A": rel_err(ffn.a, aref), "Y": rel_err(y, yref),
                "Y_end_to_end": rel_err(y, y_e2e)}
        ok = all(v < tol for k, v in errs.items() if k != "Y_end_to_end") and errs["Y_end_to_end"] < 4 * tol
        hangs = ffn.hangs()
        out[name] = {"errors": errs, "ok": ok and hangs == 0, "hangs": hangs}
        ys[name] = (x, y)
        say(f"  {name:7s} rel err H {errs['H']:.2e}  A {errs['A']:.2e}  Y {errs['Y']:.2e}  "
            f"Y end-to-end {errs['Y_end_to_end']:.2e}  hangs {hangs}  -> {'OK' if out[name]['ok'] else 'FAIL'}")
    # the same input through all three builds: stamps must not change a bit of the result
    x = ys["normal"][0]
    res = []
    for name, buf in builds.items():
        y = torch.empty(s.M, s.D, device="cuda", dtype=torch.float16)
        ffn.run(x, y, buffer=buf)
        res.append(y)
    torch.cuda.synchronize()
    same = all(torch.equal(res[0], r) for r in res[1:])
    out["bitwise_same_across_builds"] = same
    say(f"  same input through normal / lead / warps builds: outputs bitwise identical = {same}")
    return out


# -- 2. traces ------------------------------------------------------------------------------
def capture(ffn: tm.MonoFFN, arch: str, *, waves: int, launches: int, seed: int, env: dict):
    """``launches`` chained launches (x_l -> x_{l+1}) into one buffer; returns the
    trace, the raw buffer and the worst end-to-end error of a launch."""
    s = ffn.shape
    sp = tm.spec(s, waves=waves, launches=launches, arch=arch, extra={"captured": env})
    buf = alloc(sp)
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs = [torch.randn(s.M, s.D, device="cuda", generator=g).half()]
    xs += [torch.empty(s.M, s.D, device="cuda", dtype=torch.float16) for _ in range(launches)]
    for _ in range(3):  # warm-up: compiled, caches and clocks up
        ffn.run(xs[0], xs[1], buffer=buf, launch=0)
    buf.reset()
    for i in range(launches):
        ffn.run(xs[i], xs[i + 1], buffer=buf, launch=i)
    trace = buf.collect()
    worst = max(rel_err(xs[i + 1], tm.reference(xs[i], ffn.w1, ffn.w2)[2]) for i in range(launches))
    return trace, buf.tensor.cpu().numpy(), worst


def describe(name: str, trace, path: Path) -> dict:
    """One line about a saved trace; the numbers for the JSON."""
    size = path.stat().st_size
    info = {"file": path.name, "rows": trace.tasks.num_rows, "launches": len(trace.launches),
            "anomalies": trace.anomaly_summary(), "bytes": size}
    last = pc.max(trace.tasks.column(f"{trace.phases[-1]}_ns")).as_py()
    say(f"  {name}: {info['rows']} task rows, {info['launches']} launches, anomalies "
        f"{info['anomalies'] or 'none'}, last end at {last / 1e3:.1f} us, {path.name} {size / 1e3:.0f} kB")
    return info


# -- 3. calibration ---------------------------------------------------------------------------
def calibrate(arch: str, sms: int, env: dict, out: Path) -> dict:
    """Phases of known length; the timer's step; its rate against CUDA events."""
    sp = tc.spec(sms, launches=2, arch=arch, extra={"captured": env})
    buf = alloc(sp)
    tc.run(buf, tc.SPIN_NS)  # warm-up (compile)
    buf.reset()
    for launch in range(2):
        tc.run(buf, tc.SPIN_NS, launch=launch)
    trace = buf.collect()
    trace.save(out / "h200_calibration.arrow")
    rows = tc.interval_errors(trace)
    say(f"  {'N (ns)':>8s} {'intervals':>9s} {'min':>8s} {'median':>8s} {'max':>8s} {'worst |d-N|':>11s}")
    for n, cnt, lo, med, hi, worst in rows:
        say(f"  {n:8d} {cnt:9d} {lo:8d} {med:8d} {hi:8d} {worst:11d}")
    worst_all = max(r[5] for r in rows)
    ticks = np.concatenate([np.asarray(trace.tasks.column(f"{p}_tick").to_pylist(), dtype=np.int64)
                            for p in trace.phases])
    step = int(np.gcd.reduce(ticks - ticks.min()))
    say(f"  worst calibration error {worst_all} ns; timer step (gcd of tick differences) {step} ns; "
        f"bound 2 steps = {2 * max(step, 32)} ns -> {'OK' if worst_all <= 2 * max(step, 32) else 'FAIL'}")
    describe("calibration", trace, out / "h200_calibration.arrow")

    # rate: decoded span of launches of 0.75, 7.5 and 75 ms against CUDA events around
    # each (kernel compiled and loaded, spin lengths on the device before the first
    # event). A line through (span, event time): its slope is the event clock's ns
    # per timer ns, its intercept the launch's own start and end.
    rbuf = alloc(tc.spec(sms, arch=arch))
    tc.run(rbuf, tc.spins_tensor(tc.SPIN_NS, device=rbuf.tensor.device))
    torch.cuda.synchronize()
    pairs = []
    for scale in (1, 10, 100):
        spins = tc.spins_tensor(tc.SPIN_NS, scale=scale, device=rbuf.tensor.device)
        rbuf.reset()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        tc.run(rbuf, spins)
        end.record()
        torch.cuda.synchronize()
        event_ns = start.elapsed_time(end) * 1e6
        t = rbuf.collect().tasks
        span = float(pc.max(t.column("end_ns")).as_py() - pc.min(t.column("start_ns")).as_py())
        pairs.append((span, event_ns))
        say(f"  rate check x{scale:<3d}: decoded span {span / 1e6:9.4f} ms, CUDA events {event_ns / 1e6:9.4f} ms, "
            f"ratio {span / event_ns:.5f}")
    spans, evs = np.array(pairs).T
    slope, intercept = np.polyfit(spans, evs, 1)
    say(f"  event time = {intercept / 1e3:.1f} us + {slope:.6f} x decoded span (slope 1 = the timer counts "
        f"the event clock's ns; the intercept is the launch's own start and end)")
    return {"rows": [dict(zip(("N", "count", "min", "median", "max", "worst"), r)) for r in rows],
            "worst_ns": worst_all, "timer_step_ns": step, "rate_pairs_ns": pairs,
            "rate_slope": float(slope), "rate_intercept_ns": float(intercept)}, trace, buf.tensor.cpu().numpy()


# -- 4. overhead ---------------------------------------------------------------------------------
def overhead(ffn: tm.MonoFFN, arch: str, *, samples: int, batch: int) -> dict:
    """Median time per launch of each build; variants interleaved, order rotated."""
    say(f"  shape M={ffn.shape.M} D={ffn.shape.D} F={ffn.shape.F}: tasks {tm.task_counts(ffn.shape)}, "
        f"{5 * sum(tm.task_counts(ffn.shape))} stamps a launch (lead thread)")
    s = ffn.shape
    variants = {"off": None,
                "lead (5 stamps/task)": alloc(tm.spec(s, waves=1, arch=arch)),
                f"per warp ({s.num_warps} warps x 5)": alloc(tm.spec(s, waves=s.num_warps, arch=arch)),
                "off again (A/A)": None}
    names = list(variants)
    g = torch.Generator(device="cuda").manual_seed(99)
    x = torch.randn(s.M, s.D, device="cuda", generator=g).half()
    y = torch.empty_like(x)
    for name in names:  # warm-up
        for _ in range(20):
            ffn.run(x, y, buffer=variants[name])
    torch.cuda.synchronize()
    events = {n: [] for n in names}
    for r in range(samples):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(batch):
                ffn.run(x, y, buffer=variants[name])
            e1.record()
            events[name].append((e0, e1))
        if r % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    hangs = ffn.hangs()
    us = {n: np.array([a.elapsed_time(b) * 1e3 / batch for a, b in events[n]]) for n in names}
    base = float(np.median(us["off"]))
    flops = 2.0 * s.M * s.D * s.F * 2
    say(f"  {samples} samples x {batch} launches per variant, interleaved; us per launch:")
    say(f"  {'variant':28s} {'median':>9s} {'p10':>9s} {'p90':>9s} {'ratio':>8s}")
    res = {}
    for n in names:
        med = float(np.median(us[n]))
        res[n] = {"median_us": med, "p10_us": float(np.percentile(us[n], 10)),
                  "p90_us": float(np.percentile(us[n], 90)), "ratio_to_off": med / base}
        say(f"  {n:28s} {med:9.2f} {res[n]['p10_us']:9.2f} {res[n]['p90_us']:9.2f} {med / base:8.4f}")
    say(f"  off build: {flops / (base * 1e-6) / 1e12:.0f} TFLOP/s over the two GEMMs; hangs {hangs}")
    res["hangs"] = hangs
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the results, traces and raw buffers")
    ap.add_argument("--samples", type=int, default=300, help="timing samples per variant")
    ap.add_argument("--batch", type=int, default=10, help="launches per timing sample")
    ap.add_argument("--launches", type=int, default=16, help="chained launches in the lead-thread trace")
    ap.add_argument("--warp-launches", type=int, default=4, help="chained launches in the per-warp trace")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_run needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    env = environment()
    say("== environment")
    for k, v in env.items():
        say(f"  {k}: {v}")
    arch, sms = env["arch"], env["sms"]
    shape = tm.Shape()
    say(f"  demo shape {shape._asdict()}; tasks (up, norm, down) = {tm.task_counts(shape)}")
    ffn = tm.MonoFFN(shape, seed=0)
    results = {"environment": env, "shape": shape._asdict()}

    failed = []

    def section(title, fn):
        """Run one part; a failure is printed and recorded, and the next part runs."""
        say(title)
        try:
            return fn()
        except Exception:  # noqa: BLE001 - one device call must report every part it can
            for line in traceback.format_exc().rstrip().splitlines():
                say("  ! " + line)
            failed.append(title)
            return None

    results["correctness"] = section("== 1. correctness (torch float32 reference, buffers poisoned with NaN)",
                                     lambda: check_correctness(ffn, arch))

    def traces():
        lead, lead_raw, lead_err = capture(ffn, arch, waves=1, launches=args.launches, seed=21, env=env)
        lead.save(out / "h200_mono_demo.arrow")
        results["trace_lead"] = describe(f"lead thread, {args.launches} chained launches", lead,
                                         out / "h200_mono_demo.arrow")
        say(f"  worst end-to-end error of a launch: {lead_err:.2e}")
        raws["lead"], raws["lead_spec"] = lead_raw, lead.spec.to_json()
        warps, warps_raw, warps_err = capture(ffn, arch, waves=shape.num_warps, launches=args.warp_launches,
                                              seed=22, env=env)
        warps.save(out / "h200_mono_warps.parquet")
        results["trace_warps"] = describe(f"per warp, {args.warp_launches} chained launches", warps,
                                          out / "h200_mono_warps.parquet")
        say(f"  worst end-to-end error of a launch: {warps_err:.2e}")
        raws["warps"], raws["warps_spec"] = warps_raw, warps.spec.to_json()
        return (lead.anomaly_count == 0 and warps.anomaly_count == 0
                and max(lead_err, warps_err) < 2e-2)

    raws = {}
    results["traces_ok"] = section("== 2. traces", traces)

    def calibration():
        res, trace, raw = calibrate(arch, sms, env, out)
        raws["calibration"], raws["calibration_spec"] = raw, trace.spec.to_json()
        return res

    results["calibration"] = section("== 3. calibration (spin N ns inside each phase)", calibration)
    results["overhead"] = section("== 4. overhead: stamps on vs off",
                                  lambda: overhead(ffn, arch, samples=args.samples, batch=args.batch))
    small = tm.Shape(M=512)
    results["overhead_small"] = section(
        "== 4b. overhead at M=512 (4x shorter launch, same stamps per task)",
        lambda: overhead(tm.MonoFFN(small, seed=0), arch, samples=args.samples, batch=args.batch))
    np.savez_compressed(out / "h200_raw_buffers.npz", **raws)
    cal, ovh, cor = results["calibration"], results["overhead"], results["correctness"]
    ok = (not failed and bool(results["traces_ok"]) and results["overhead_small"]["hangs"] == 0
          and all(v["ok"] for v in cor.values() if isinstance(v, dict))
          and cal["worst_ns"] <= 2 * max(cal["timer_step_ns"], 32) and ovh["hangs"] == 0)
    say("== summary")
    if cal and ovh:
        lr = ovh["lead (5 stamps/task)"]["ratio_to_off"]
        say(f"  calibration worst error {cal['worst_ns']} ns; event ns per timer ns {cal['rate_slope']:.6f} "
            f"(+{cal['rate_intercept_ns'] / 1e3:.1f} us a launch); "
            f"overhead lead/off {lr:.4f} ({(lr - 1) * 100:+.2f} %), A/A "
            f"{ovh['off again (A/A)']['ratio_to_off']:.4f}")
    small_ovh = results.get("overhead_small")
    if small_ovh:
        say(f"  at M=512: lead/off {small_ovh['lead (5 stamps/task)']['ratio_to_off']:.4f}, A/A "
            f"{small_ovh['off again (A/A)']['ratio_to_off']:.4f}")
    say(f"  {'ALL OK' if ok else 'FAILED: ' + ', '.join(failed or ['a check above'])}; "
        f"{time.time() - t_start:.0f} s")
    tag = env["gpu"].split()[-1].lower()
    (out / f"gpu_run_{tag}.txt").write_text("\n".join(LINES) + "\n")
    (out / f"gpu_run_{tag}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
