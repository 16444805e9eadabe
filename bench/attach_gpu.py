"""``timeline attach`` on a GPU: torch.profiler (CPU + CUDA activity) around the
Triton demo mono kernel, then attach; the goals of issue 42 checked and printed.

    PYTHONPATH=. python bench/attach_gpu.py --out $OUT

Two runs, each its own profiler session:

- ``plain``: ``--launches`` launches of the demo kernel (``instrument/demo/triton_mono.py``),
  one stamp-buffer slot each, the clock calibrated (``instrument.calibrate``) before and after;
- ``graph``: the graph demo (``instrument/demo/triton_graph.py``): a CUDA graph of
  ``--layers`` launches a step, replayed ``--steps`` times with ``prof.step()`` after each
  replay, continuous capture on (one step in ``--every``, a ring of 2), calibrated before.

For each: the Kineto JSON (``prof.export_chrome_trace``), the trace (both kept in
``$OUT``; where msgspec is missing on the device, the attach is left to
``--from $OUT`` on any machine), ``attach`` with the
host clock relation measured here (``CLOCK_REALTIME - CLOCK_MONOTONIC``, read between two
monotonic reads; Kineto's axis is ``CLOCK_REALTIME - baseTimeNanoseconds``), so that the
fitted offset is compared with the calibration's. Printed and written to
``$OUT/attach_gpu.txt`` / ``.json``: launches, matched, unmatched (must be 0), every stamp
inside its kernel event within the fitted bound, the bound (goal <= 1 µs), the offset
against the calibration's. The plain run's files (trace, Kineto JSON, merged .pftrace and
.json.gz) are the small sample for ``traces/``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

KERNEL = "mono_ffn_kernel"


def realtime_minus_monotonic(rounds: int = 200):
    """``(CLOCK_REALTIME - CLOCK_MONOTONIC ns, ± ns)``: the tightest of ``rounds``
    realtime reads bracketed by two monotonic reads."""
    best = None
    for _ in range(rounds):
        a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or b - a < best[1]:
            best = (r - (a + b) // 2, b - a)
    return best[0], best[1] / 2 + 1


def profiler(steps: int | None = None):
    """``torch.profiler.profile`` of the CPU and CUDA; with ``steps``, a schedule of that
    many active steps (without a schedule ``prof.step()`` writes no ``ProfilerStep#N``
    markers, and the graph run's launches pair with its kernels by those steps)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    if steps is None:
        return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=0, warmup=0, active=steps, repeat=1))


def run_plain(out: Path, launches: int):
    import torch

    import instrument
    from instrument.demo import triton_mono as tm

    shape = tm.Shape()
    ffn = tm.MonoFFN(shape)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(shape.M, shape.D, device="cuda", generator=g).half()
    y = torch.empty(shape.M, shape.D, device="cuda", dtype=torch.float16)
    buf = instrument.alloc(tm.spec(shape, launches=launches), "cuda")
    for la in range(launches):  # compile and warm up, then start clean
        ffn.run(x, y, buffer=buf, launch=la)
    torch.cuda.synchronize()
    buf.reset()
    buf.calibrate()
    with profiler() as prof:
        for la in range(launches):
            ffn.run(x, y, buffer=buf, launch=la)
        torch.cuda.synchronize()
    buf.calibrate()
    if ffn.hangs():
        raise SystemExit(f"plain: {ffn.hangs()} mailbox waits gave up")
    trace = buf.collect()
    path = out / "plain.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return trace, path


def run_graph(out: Path, layers: int, steps: int, every: int):
    import torch

    from instrument.demo import triton_graph as tg
    from instrument.demo import triton_mono as tm
    from timeline import merge

    traces = []
    runner = tg.Runner(tm.Shape(), layers, every=every, ring=2, sink=traces.append, pool="thread")  # a list of this process
    graph = runner.capture_graph()
    runner.cap.calibrate()
    runner.cap.start()
    with profiler(steps) as prof:
        for i in range(steps):
            graph.replay()
            if i == steps - 1:  # the schedule's window closes at this step(): every kernel done before it
                torch.cuda.synchronize()
            prof.step()
        torch.cuda.synchronize()
    rep = runner.cap.close()
    if runner.ffn.hangs():
        raise SystemExit(f"graph: {runner.ffn.hangs()} mailbox waits gave up")
    path = out / "graph.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return merge(traces), path, rep.summary()


def check(name, trace, path, host, out: Path, lines: list, step_offset=None) -> dict:
    """Attach, write the merged files, check the goals. ``step_offset``: the graph run's
    steps are paired at offset 0 by construction (the device step counter is 0 at the
    first profiled replay, ``prof.step()`` follows each replay); what attach infers on
    its own (the calibration choosing among alike steps) is reported beside."""
    from timeline.attach import AttachError, attach, read_framework
    from timeline.attach import report as AR
    from timeline.attach import write as AW

    fw = read_framework(path)
    if fw.base_ns is None:
        raise SystemExit(f"{name}: the Kineto trace has no baseTimeNanoseconds")
    host_clock = (host[0] - fw.base_ns, host[1])
    att = attach(trace, fw, kernel=KERNEL, host_clock=host_clock, step_offset=step_offset)
    inferred = att.how[0]
    if step_offset is not None:
        try:
            inferred = attach(trace, fw, kernel=KERNEL, host_clock=host_clock).how[0]
        except AttachError as e:
            inferred = f"refused: {e}"
    w1 = AW.write_perfetto(att, out / f"{name}_attached.pftrace")
    w2 = AW.write_chrome(att, out / f"{name}_attached.json.gz")
    rep = AR.report_dict(att)
    r = rep["ranks"][0]
    f = att.fits[0]
    m = att.matches
    inside = all(o <= f.bound_ns for o in m.column("outside_ns").to_pylist())
    c = r["calibration"] or {}
    goals = {"launches": len(set(trace.launches)), "matched": r["matched"], "unmatched": len(set(trace.launches)) - m.num_rows,
             "anomalies": len(r["anomalies"]), "every_stamp_inside": inside, "bound_ns": f.bound_ns,
             "bound_le_1us": f.bound_ns <= 1000, "offset_ns": f.offset_ns,
             "calibration_predicted_ns": c.get("predicted_ns"), "calibration_difference_ns": c.get("difference_ns"),
             "calibration_tolerance_ns": c.get("tolerance_ns"), "calibration_agrees": c.get("agrees"),
             "paired_by": att.how[0], "inferred_pairing": inferred, "written": [w1._asdict(), w2._asdict()]}
    lines += [f"== {name}: {path.name}", *AR.report_lines(att), f"  without --step-offset: {inferred}",
              f"  goals: unmatched {goals['unmatched']} (want 0), every stamp inside within the bound: {inside}, "
              f"bound {f.bound_ns:,.0f} ns (want <= 1000): {goals['bound_le_1us']}"]
    return {"report": rep, "goals": goals}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--launches", type=int, default=4, help="plain run: launches (4)")
    ap.add_argument("--layers", type=int, default=8, help="graph run: launches a step (8)")
    ap.add_argument("--steps", type=int, default=12, help="graph run: steps replayed (12)")
    ap.add_argument("--every", type=int, default=4, help="graph run: capture one step in N (4)")
    ap.add_argument("--from", dest="src", help="attach again the files of an earlier --out (no GPU)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.src:
        return again(Path(a.src), out)
    import torch
    import triton

    host = realtime_minus_monotonic()
    (out / "host_clock.json").write_text(json.dumps(list(host)))
    lines = [f"# PYTHONPATH=. python bench/attach_gpu.py --out $OUT --launches {a.launches} --layers {a.layers} "
             f"--steps {a.steps} --every {a.every}",
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}",
             f"CLOCK_REALTIME - CLOCK_MONOTONIC = {host[0]:,} ns ± {host[1]:.0f}"]
    result = {"host_clock": host}
    trace, path = run_plain(out, a.launches)
    trace.save(out / "plain.arrow")
    gtrace, gpath, summary = run_graph(out, a.layers, a.steps, a.every)
    gtrace.save(out / "graph.arrow")
    lines.append(f"graph capture: {summary}")
    with open(path, "rb") as src, gzip.open(out / "plain.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    try:
        import msgspec  # noqa: F401  (timeline.attach's reader; a device machine may lack it)
    except ImportError:
        lines.append("captured; msgspec is not installed here: attach on any machine with "
                     "`PYTHONPATH=. python bench/attach_gpu.py --from $OUT --out DIR`")
        (out / "attach_gpu.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    result["plain"] = check("plain", trace, path, host, out, lines)
    result["graph"] = check("graph", gtrace, gpath, host, out, lines, step_offset=0)
    return finish(result, lines, out)


def again(src: Path, out: Path) -> int:
    """Attach the saved traces and profiler files of an earlier run again."""
    from timeline import load

    host = tuple(json.loads((src / "host_clock.json").read_text()))
    lines = [f"# PYTHONPATH=. python bench/attach_gpu.py --from {src} --out $OUT",
             f"CLOCK_REALTIME - CLOCK_MONOTONIC = {host[0]:,} ns ± {host[1]:.0f} (as measured then)"]
    result = {"host_clock": host}
    for name in ("plain", "graph"):
        result[name] = check(name, load(src / f"{name}.arrow"), src / f"{name}.pt.trace.json", host, out, lines,
                             step_offset=0 if name == "graph" else None)
    return finish(result, lines, out)


def finish(result: dict, lines: list, out: Path) -> int:
    ok = all(result[k]["goals"]["unmatched"] == 0 and result[k]["goals"]["every_stamp_inside"]
             and result[k]["goals"]["bound_le_1us"] for k in ("plain", "graph"))
    lines.append(f"all goals met: {ok}")
    (out / "attach_gpu.txt").write_text("\n".join(lines) + "\n")
    (out / "attach_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
