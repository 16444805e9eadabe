"""``timeline attach`` on a large Kineto JSON: events/s of each stage and its peak RSS,
the framework trace streamed (a 1 GB JSON must not need 10 GB).

    python bench/attach.py --mb 1024        # writes a ~1 GB Kineto JSON to a scratch folder

The framework trace is SYNTHETIC: ``tests/kinetokit.py``'s events in Kineto's schema
(a cpu_op, its cudaLaunchKernel and ac2g flow, a kernel, a memcpy, repeated) around
the 16 launches of the real H200 demo trace (``traces/h200_mono_demo.arrow``) placed
at a known offset. Stages, each in a fresh process (its peak RSS its own):

- ``read``: ``read_framework`` (the structural scan of every byte, the kept events parsed);
- ``attach``: read + match + fit;
- ``chrome``: read + attach + the merged JSON (every framework byte copied, the CTA
  events added by the timeline export);
- ``perfetto``: read + attach + the merged protobuf (every framework event converted).

"events" = the framework file's events plus the timeline events written; the rate
divides by the stage's wall time. The goal (issue 42): >= 3 M events/s, peak RSS bounded."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

KERNEL = "mono_ffn_kernel"


def generate(path: Path, mb: int) -> dict:
    """Write the Kineto JSON (module docstring); returns its event count and the offset."""
    import kinetokit as KK
    from timeline import load
    from timeline.attach import match as MA
    from timeline.core import rows as R

    trace = load(ROOT / "traces" / "h200_mono_demo.arrow")
    ls = MA.launches(trace)
    first, last = R.column(ls, "device_first_ns"), R.column(ls, "device_last_ns")
    t0 = 5_000_000_000_000
    offset = t0 - int(first.min())
    host = KK.Host(4242, 4242, t0, t0)
    head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1790000000000000000,\n  "traceEvents": [\n  ')
    events, corr = 0, 1
    with open(path, "w") as f:
        f.write(head)
        lines = KK.gpu_metadata(0, [7])
        for i in range(len(first)):
            s, e = int(first[i]) + offset - 900, int(last[i]) + offset + 700
            lines.append(KK.kernel_event(KERNEL, 0, 7, s, e, corr, (trace.spec.grid, 1, 1)))
            lines += KK.launch_events(host, s - 10_000, s, 0, 7, corr)
            corr += 1
        f.write(",\n  ".join(lines))
        events += len(lines)
        t = int(last.max()) + offset + 1_000_000
        block, target = [], mb << 20
        while f.tell() < target:
            block.clear()
            for _ in range(2000):
                block.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, '
                             f'"ts": {KK.us(t)}, "dur": {KK.us(9000)}, "args": {{"External id": {corr}, '
                             f'"Record function id": 0, "Ev Idx": {corr}}}}}')
                block += KK.launch_events(host, t + 1000, t + 20_000, 0, 7, corr, "cudaLaunchKernel", "cuda_runtime", 211)
                block.append(KK.kernel_event("void at::native::vectorized_elementwise_kernel<4>", 0, 7, t + 20_000,
                                             t + 25_000, corr, (66, 1, 1), (128, 1, 1)))
                block.append(KK.copy_event("memcpy", 0, 7, t + 26_000, t + 27_000, corr + 1))
                corr, t = corr + 2, t + 30_000
            f.write(",\n  " + ",\n  ".join(block))
            events += len(block)
        f.write('\n  ],\n  "traceName": "bench"\n}\n')
    return {"events": events, "offset": offset, "bytes": path.stat().st_size}


def naive(name: str, path: Path) -> dict:
    """The straightforward readers of the same file, for the side-by-side figures:
    ``json.load`` of the whole document, or ijson's ``items`` (an incremental parser),
    each keeping the kernel events' fields."""
    t = time.perf_counter()
    kept = 0
    if name == "json.load":
        with open(path) as f:
            doc = json.load(f)
        evs = doc["traceEvents"]
    else:
        import ijson

        f = open(path, "rb")
        evs = ijson.items(f, "traceEvents.item")
    n = 0
    for e in evs:
        n += 1
        if e.get("cat") == "kernel":
            a = e.get("args", {})
            kept += bool((e["ts"], e.get("dur"), a.get("device"), a.get("stream"), a.get("correlation")))
    return {"framework_events": n, "timeline_events": 0, "wall_s": time.perf_counter() - t,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def stage(name: str, path: Path, out: Path) -> dict:
    from timeline import load

    if name in ("json.load", "ijson"):
        return naive(name, path)
    from timeline.attach import attach, read_framework
    from timeline.attach import write as AW

    t = time.perf_counter()
    fw = read_framework(path)
    res = {"framework_events": fw.events, "timeline_events": 0}
    if name != "read":
        att = attach(load(ROOT / "traces" / "h200_mono_demo.arrow"), fw, kernel=KERNEL)
        res["offset"], res["bound_ns"] = att.fits[0].offset_ns, att.fits[0].bound_ns
        if name == "chrome":
            res["timeline_events"] = AW.write_chrome(att, out / "m.json").timeline_events
        elif name == "perfetto":
            w = AW.write_perfetto(att, out / "m.pftrace")
            res["timeline_events"] = w.timeline_events
    res["wall_s"] = time.perf_counter() - t
    res["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the Kineto JSON (MB, default 1024)")
    ap.add_argument("--dir", help="scratch folder (default: a temporary one)")
    ap.add_argument("--stages", default="read,attach,chrome,perfetto")
    ap.add_argument("--naive-mb", type=int, default=64, help="the side-by-side readers' file (MB, default 64; 0: none)")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.stage:
        print(json.dumps(stage(a.stage, Path(a.dir) / "kineto.json", Path(a.dir))))
        return 0
    print(f"# python bench/attach.py --mb {a.mb} --naive-mb {a.naive_mb}")
    if a.naive_mb:
        with tempfile.TemporaryDirectory(dir=a.dir) as d:
            d = Path(d)
            g = generate(d / "kineto.json", a.naive_mb)
            print(f"side by side on a {g['bytes'] / 2**20:,.0f} MB file ({g['events']:,} events): the kernel events' fields read")
            print(f"{'reader':10s} {'fw events':>11s} {'wall s':>7s} {'Mev/s':>6s} {'peak MB':>8s}")
            for s in ("read", "json.load", "ijson"):
                r = subprocess.run([sys.executable, __file__, "--stage", s, "--dir", str(d)], capture_output=True,
                                   text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
                if r.returncode:
                    print(f"{s:10s} failed: {r.stderr.strip().splitlines()[-1][:100]}")
                    continue
                res = json.loads(r.stdout.strip().splitlines()[-1])
                print(f"{s:10s} {res['framework_events']:>11,} {res['wall_s']:>7.2f} "
                      f"{res['framework_events'] / res['wall_s'] / 1e6:>6.2f} {res['peak_mb']:>8,.0f}", flush=True)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        d = Path(d)
        t = time.perf_counter()
        g = generate(d / "kineto.json", a.mb)
        print(f"SYNTHETIC Kineto JSON: {g['bytes'] / 2**20:,.0f} MB, {g['events']:,} events "
              f"(written in {time.perf_counter() - t:.1f} s); 16 instrumented launches of traces/h200_mono_demo.arrow")
        print(f"{'stage':10s} {'fw events':>11s} {'tl events':>10s} {'wall s':>7s} {'Mev/s':>6s} {'peak MB':>8s}  check")
        for s in a.stages.split(","):
            r = subprocess.run([sys.executable, __file__, "--stage", s, "--dir", str(d)], capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if r.returncode:
                print(f"{s}: failed\n{r.stderr[-2000:]}")
                return 1
            res = json.loads(r.stdout.strip().splitlines()[-1])
            n = res["framework_events"] + res["timeline_events"]
            check = ""
            if "offset" in res:
                err = abs(res["offset"] - g["offset"])
                check = f"offset error {err} ns <= bound {res['bound_ns']:.0f} ns: {err <= res['bound_ns']}"
            print(f"{s:10s} {res['framework_events']:>11,} {res['timeline_events']:>10,} {res['wall_s']:>7.2f} "
                  f"{n / res['wall_s'] / 1e6:>6.2f} {res['peak_mb']:>8,.0f}  {check}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
