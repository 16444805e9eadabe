"""``timeline attach`` on a large Kineto JSON: events/s of each stage and its peak RSS,
the framework trace streamed (a 1 GB JSON must not need 10 GB).

    python bench/attach.py --mb 1024        # writes a ~1 GB Kineto JSON to a scratch folder

The framework trace is SYNTHETIC: ``tests/kinetokit.py``'s ``bulk_trace`` (a cpu_op,
its cudaLaunchKernel and ac2g flow, a kernel, a memcpy, repeated, in Kineto's schema)
around the 16 launches of the real H200 demo trace (``traces/h200_mono_demo.arrow``)
placed at a known offset. Stages, each in a fresh process (its peak RSS its own, its
workers' apart):

- ``whole``: every piece only checked to be whole events (msgspec, nothing built):
  the least a reader of this JSON does; ``decode``: every piece decoded into the
  reader's struct and nothing more (one process): what bounds a reader here;
- ``read-1``: ``read_framework`` in one process (``TIMELINE_ATTACH_WORKERS=1``);
  ``read``: the same on every core (the default);
- ``attach``: read + match + fit;
- ``chrome``: read + attach + the merged JSON (every framework byte copied, the CTA
  events added by the timeline export);
- ``perfetto``: read (gathering the tracks' names and flows in its own decode) + attach +
  the merged protobuf (every framework event converted: one more decode pass);
  ``perfetto-2pass``: the same with the read before issue 48 (the output's own two passes).

On the side-by-side file also the code before issue 42's speed work
(``tests/attach_baseline``: ``read-before``, ``perfetto-before``), ``json.load`` and
ijson. "events" = the framework file's events plus the timeline events written; the
rate divides by the stage's wall time. The goal (issue 42): >= 3 M events/s, peak
RSS bounded; issue 48's for ``perfetto``: >= 0.6 M events/s and at most 1.5x the read's
wall time (the last line)."""

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
    """Write the Kineto JSON (module docstring, ``kinetokit.bulk_trace``); returns its
    event count and the offset."""
    import kinetokit as KK
    from timeline import load

    return KK.bulk_trace(path, mb, load(ROOT / "traces" / "h200_mono_demo.arrow"), KERNEL)


def peak_mb() -> tuple:
    """(this process's peak RSS, the largest worker's), MB."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def decode_only(name: str, path: Path) -> dict:
    """The bound on a reader here: every piece of the file decoded by msgspec into
    the reader's struct and nothing more (``decode``), or only checked to be whole
    events (``whole``: the cut's check, the least any reader must do), one process."""
    import msgspec

    from timeline.attach import jsonscan as J

    class Whole(msgspec.Struct, gc=False):
        pass

    kind = J.Lean if name == "decode" else Whole
    t = time.perf_counter()
    n = sum(len(p.events) for p in J.pieces(path, decoder=msgspec.json.Decoder(list[kind])))
    return {"framework_events": n, "timeline_events": 0, "wall_s": time.perf_counter() - t}


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
    return {"framework_events": n, "timeline_events": 0, "wall_s": time.perf_counter() - t}


def stage(name: str, path: Path, out: Path) -> dict:
    """One stage in this (fresh) process: its counts, wall seconds and peak RSS."""
    if name in ("json.load", "ijson"):
        res = naive(name, path)
    elif name in ("decode", "whole"):
        res = decode_only(name, path)
    elif name.endswith("-before"):
        res = before(name, path, out)
    else:
        res = current(name, path, out)
    res["peak_mb"], res["worker_peak_mb"] = peak_mb()
    return res


def current(name: str, path: Path, out: Path) -> dict:
    from timeline import load
    from timeline.attach import attach, read_framework
    from timeline.attach import write as AW

    t = time.perf_counter()
    fw = read_framework(path, tracks_for=0 if name == "perfetto" else None)  # perfetto-2pass: the read before issue 48
    res = {"framework_events": fw.events, "timeline_events": 0}
    if name not in ("read", "read-1"):
        att = attach(load(ROOT / "traces" / "h200_mono_demo.arrow"), fw, kernel=KERNEL)
        res["offset"], res["bound_ns"] = att.fits[0].offset_ns, att.fits[0].bound_ns
        if name == "chrome":
            res["timeline_events"] = AW.write_chrome(att, out / "m.json").timeline_events
        elif name in ("perfetto", "perfetto-2pass"):
            res["timeline_events"] = AW.write_perfetto(att, out / "m.pftrace").timeline_events
    res["wall_s"] = time.perf_counter() - t
    return res


def before(name: str, path: Path, out: Path) -> dict:
    """The code before issue 42's speed work (tests/attach_baseline), for the side by side."""
    import attach_baseline
    from timeline import load
    from timeline.attach import attach

    t = time.perf_counter()
    fw = attach_baseline.kineto.read_kineto(path)
    res = {"framework_events": fw.events, "timeline_events": 0}
    if name == "perfetto-before":
        att = attach(load(ROOT / "traces" / "h200_mono_demo.arrow"), fw, kernel=KERNEL)
        res["timeline_events"] = attach_baseline.write_perfetto(att, out / "m.pftrace")
    res["wall_s"] = time.perf_counter() - t
    return res


def run_stage(s: str, d: Path, root: Path = ROOT) -> dict:
    """Stage ``s`` in a fresh process, with the code of the tree ``root`` (``--before``)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    if s == "read-1":
        env["TIMELINE_ATTACH_WORKERS"] = "1"
    r = subprocess.run([sys.executable, str(root / "bench" / "attach.py"), "--stage", s, "--dir", str(d)],
                       capture_output=True, text=True, env=env)
    for out in ("m.json", "m.pftrace"):  # each stage writes a new file, not over the stage before's (a rename over
        (d / out).unlink(missing_ok=True)  # an 800 MB file costs its removal: 0.5 s of a stage's wall on ext4)
    if r.returncode:
        raise RuntimeError(f"{s}: failed\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def row(s: str, res: dict, g: dict) -> str:
    n = res["framework_events"] + res["timeline_events"]
    check = ""
    if "offset" in res:
        err = abs(res["offset"] - g["offset"])
        check = f"offset error {err} ns <= bound {res['bound_ns']:.0f} ns: {err <= res['bound_ns']}"
    rate = n / res["wall_s"] / 1e6
    return (f"{s:23s} {res['framework_events']:>11,} {res['timeline_events']:>10,} {res['wall_s']:>7.2f} {rate:>6.2f} "
            f"{g['bytes'] / res['wall_s'] / 1e6:>6.0f} {res['peak_mb']:>8,.0f} {res['worker_peak_mb']:>9,.0f}  "
            f"{'yes' if rate >= GOAL else 'no ':3s}  {check}")


GOAL = 3.0  # M events/s (issue 42)
HEADER = (f"{'stage':23s} {'fw events':>11s} {'tl events':>10s} {'wall s':>7s} {'Mev/s':>6s} {'MB/s':>6s} "
          f"{'peak MB':>8s} {'worker MB':>9s}  3M?")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the Kineto JSON (MB, default 1024)")
    ap.add_argument("--dir", help="scratch folder (default: a temporary one)")
    ap.add_argument("--stages", default="whole,decode,read-1,read,attach,chrome,perfetto")
    ap.add_argument("--naive-mb", type=int, default=64, help="the side-by-side readers' file (MB, default 64; 0: none)")
    ap.add_argument("--reuse", metavar="DIR", help="keep the --mb file in DIR (kineto-<MB>mb.json) and use it again on "
                    "later runs, instead of writing it each run (the stages' outputs still go to a temporary folder)")
    ap.add_argument("--before", metavar="REV", help="run each stage also with the code of git revision REV, just "
                    "before its own run (an A/B under one machine load: rows 'STAGE before')")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.stage:
        print(json.dumps(stage(a.stage, Path(a.dir) / "kineto.json", Path(a.dir))))
        return 0
    print(f"# python bench/attach.py --mb {a.mb} --naive-mb {a.naive_mb} --stages {a.stages}"
          f"{' --before ' + a.before if a.before else ''}   "
          f"({os.cpu_count()} cores; workers: TIMELINE_ATTACH_WORKERS or the cores)")
    print("# MB/s: the JSON file's bytes per wall second; peak MB: the stage's process; worker MB: its largest worker")
    if a.naive_mb:
        with tempfile.TemporaryDirectory(dir=a.dir) as d:
            d = Path(d)
            g = generate(d / "kineto.json", a.naive_mb)
            print(f"side by side on a {g['bytes'] / 2**20:,.0f} MB file ({g['events']:,} events): readers, their "
                  "bound (decode: msgspec into the reader's struct, nothing else; whole: only the cut's check), "
                  "and the code before (tests/attach_baseline)")
            print(HEADER)
            for s in ("read", "read-1", "read-before", "decode", "whole", "json.load", "ijson", "perfetto",
                      "perfetto-before"):
                print(row(s, run_stage(s, d), g), flush=True)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        d = Path(d)
        t = time.perf_counter()
        g, how = reused(d / "kineto.json", a.mb, a.reuse)
        print(f"SYNTHETIC Kineto JSON: {g['bytes'] / 2**20:,.0f} MB, {g['events']:,} events "
              f"({how} in {time.perf_counter() - t:.1f} s); 16 instrumented launches of traces/h200_mono_demo.arrow")
        print(HEADER)
        got = {}
        before = checkout(a.before, d) if a.before else None
        for s in a.stages.split(","):
            if before is not None:  # the same stage with the code of --before, just before it: one machine load
                print(row(f"{s} before", run_stage(s, d, before), g), flush=True)
            got[s] = run_stage(s, d)
            print(row(s, got[s], g), flush=True)
        if "perfetto" in got and "read" in got:
            print(verdict(got["perfetto"], got["read"]))
    return 0


def checkout(rev: str, d: Path) -> Path:
    """The project's files at git revision ``rev`` (``--before``), in ``d/before``."""
    out = d / "before"
    out.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out


def reused(path: Path, mb: int, folder) -> tuple:
    """The bench's Kineto JSON at ``path``: written there, or (``folder``: ``--reuse``)
    linked from ``folder/kineto-<mb>mb.json``, written there first where it is not
    yet (its counts beside it, ``.meta.json``); (``generate``'s counts, how it came)."""
    if folder is None:
        return generate(path, mb), "written"
    keep = Path(folder) / f"kineto-{mb}mb.json"
    meta = keep.with_name(keep.name + ".meta.json")
    how = "reused"
    if not (keep.exists() and meta.exists()):
        Path(folder).mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(generate(keep, mb)))
        how = "written"
    path.symlink_to(keep.resolve())
    return json.loads(meta.read_text()), how


PERFETTO_GOAL, RATIO_GOAL = 0.6, 1.5  # issue 48: M events/s of attach -o, and its wall time over the read's


def verdict(p: dict, r: dict) -> str:
    """Issue 48's goal for the Perfetto output beside its figures."""
    rate = (p["framework_events"] + p["timeline_events"]) / p["wall_s"] / 1e6
    ratio = p["wall_s"] / r["wall_s"]
    met = rate >= PERFETTO_GOAL and ratio <= RATIO_GOAL
    return (f"issue 48: perfetto {rate:.2f} M events/s (goal >= {PERFETTO_GOAL}), {ratio:.2f}x the read's wall time "
            f"(goal <= {RATIO_GOAL}x): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
