"""Export throughput: events/s of ``timeline.export`` (Chrome JSON, both event forms,
and Perfetto protobuf) side by side with the straightforward versions of the same
files, in one run (the machine is noisy: the ratio is the figure).

    python bench/export.py                      # 8 ranks x 2 launches x 256 CTAs x 8 waves
    python bench/export.py --launches 1 --naive-max 3e5

The trace is SYNTHETIC (``timeline.ingest.synth``: GLM-5 stage list, 8 waves, grid 256),
written to a scratch directory. Each measurement runs in a fresh process, so its
peak RSS is its own; "cpu s" is that process's CPU time (all its threads: the
export writes the file from a thread of its own), the "Mev/s" column divides by
it, "wall Mev/s" by the wall time, what the user waits for. Our exporters run
``--repeat`` times, alternating, and the median-wall run is shown (this machine's
kernel time for a page-cache write varies several-fold from run to run). A run
makes the B/E text and throws it away (no file): the exporter's cost without the
disk's; and a plain write of as many bytes, for the disk alone. The naive
baselines:

- ``json.dump``: a list of dicts, one per event (ts/dur as float µs), dumped at once;
- ``pb2 objects``: one ``perfetto_trace_pb2.TracePacket`` per slice begin/end, set
  field by field and serialized one by one (the perfetto package's own classes).

They run on the first ``--naive-max`` events' worth of task rows; rates compare.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict


def make_trace(launches: int, world: int, grid: int, waves: int):
    from timeline.ingest import synth

    return synth.synth_trace(synth.glm5_spec(waves=waves, world=world, launches=launches), grid=grid, seed=2)


def head(trace, events: int):
    """A Trace of the first task rows, about ``events`` Chrome events' worth."""
    from timeline import Trace

    rows = max(1, int(events) // len(trace.phases))
    return Trace(trace.tasks.slice(0, rows), trace.specs, synthetic=trace.synthetic)


def naive_chrome(trace, path) -> int:
    """The obvious exporter: a dict per event, one json.dump."""
    waves = max(sp.waves for sp in trace.specs)
    launches = max(sp.launches for sp in trace.specs)
    by_task = defaultdict(list)
    for r in trace.intervals.to_pylist():
        by_task[(r["rank"], r["launch"], r["stage"], r["task"], r["wave"])].append(r)
    events, threads = [], set()
    for (rank, launch, stage, task, wave), ivs in by_task.items():
        r0 = ivs[0]
        pid, tid = rank * launches + launch + 1, r0["cta"] * waves + wave + 1
        threads.add((pid, tid, rank, launch, r0["cta"], wave))
        first, last = min(i["start_ns"] for i in ivs), max(i["end_ns"] for i in ivs)
        events.append({"ph": "X", "pid": pid, "tid": tid, "ts": first / 1000, "dur": (last - first) / 1000,
                       "name": stage, "cat": stage,
                       "args": {"stage": stage, "task": task, "cta": r0["cta"], "wave": wave, "xcc": r0["xcc"],
                                "se": r0["se"], "cu": r0["cu"], "hw_unit": r0["hw_unit"],
                                "phase_us": {i["phase"]: i["duration_ns"] / 1000 for i in ivs}}})
        for i in ivs:
            events.append({"ph": "X", "pid": pid, "tid": tid, "ts": i["start_ns"] / 1000,
                           "dur": i["duration_ns"] / 1000, "name": i["phase"], "cat": "phase",
                           "args": {"stage": stage, "task": task, "inherited": i["inherited"]}})
    for pid, tid, rank, launch, cta, wave in sorted(threads):
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                       "args": {"name": f"CTA {cta} · wave {wave}"}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    return len(events)


def naive_perfetto(trace, path) -> int:
    """The obvious protobuf exporter: a TracePacket object per slice begin and end."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    from timeline.export.perfetto import field_bytes

    waves = max(sp.waves for sp in trace.specs)
    launches = max(sp.launches for sp in trace.specs)
    n = 0
    by_task = defaultdict(list)
    for r in trace.intervals.to_pylist():
        by_task[(r["rank"], r["launch"], r["stage"], r["task"], r["wave"])].append(r)
    with open(path, "wb") as f:
        for (rank, launch, stage, task, wave), ivs in by_task.items():
            track = ((rank * launches + launch + 1) << 24) | (ivs[0]["cta"] * waves + wave + 1)
            marks = [(min(i["start_ns"] for i in ivs), 1, stage, {"task": task, "cta": ivs[0]["cta"]})]
            for i in ivs:
                marks += [(i["start_ns"], 1, i["phase"], {"inherited": int(i["inherited"])}), (i["end_ns"], 2, None, None)]
            marks.append((max(i["end_ns"] for i in ivs), 2, None, None))
            for ts, kind, name, args in marks:
                p = pb.TracePacket()
                p.timestamp = ts
                p.trusted_packet_sequence_id = 1
                p.track_event.type = kind
                p.track_event.track_uuid = track
                if name is not None:
                    p.track_event.name = name
                    for k, v in args.items():
                        a = p.track_event.debug_annotations.add()
                        a.name = k
                        a.int_value = v
                f.write(field_bytes(1, p.SerializeToString()))
            n += len(ivs) + 1
    return n


class _Discard(io.RawIOBase):
    """A binary sink that keeps nothing: the exporter's own cost, without the disk's."""

    def write(self, b):
        return len(b)


def plain_write(path: str, mb: float) -> dict:
    """Write ``mb`` MB of one 1 MB buffer to ``path``: what the disk alone costs this
    machine for a file the size of the export's (its kernel time is the ``sys`` s)."""
    piece = memoryview(b" " * (1 << 20))
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(int(mb * 1e6) >> 20):
            f.write(piece)
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - w0
    os.remove(path)
    return {"mode": "plain_write", "wall": wall, "sys": r1.ru_stime - r0.ru_stime, "mb": mb}


def one(mode: str, a) -> dict:
    from timeline.core.process import tune_process

    if mode == "plain_write":
        return plain_write(os.path.join(a.dir, "out.plain"), a.plain_mb)
    tune_process()  # as the timeline command runs
    trace = make_trace(a.launches, a.world, a.grid, a.waves)
    if mode.startswith("naive"):
        trace = head(trace, a.naive_max)
    _ = trace.intervals  # derived on first use; not part of the export's cost
    path = os.path.join(a.dir, f"out.{mode}")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    w0, c0 = time.perf_counter(), time.process_time()
    if mode == "chrome_X":
        from timeline.export import write_chrome

        n = write_chrome(trace, path, complete=True)
    elif mode == "chrome_BE":
        from timeline.export import write_chrome

        n = write_chrome(trace, path, complete=False)
    elif mode == "chrome_BE_nofile":
        from timeline.export import write_chrome

        n = write_chrome(trace, _Discard(), complete=False)
        path = None
    elif mode == "perfetto":
        from timeline.export import write_perfetto

        n = write_perfetto(trace, path)
    elif mode == "naive_json":
        n = naive_chrome(trace, path)
    else:
        n = naive_perfetto(trace, path)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size = os.path.getsize(path) if path else 0
    if path:
        os.remove(path)
    return {"mode": mode, "events": n, "tasks": trace.tasks.num_rows, "wall": wall, "cpu": cpu,
            "rate": n / cpu, "mb": size / 1e6, "peak_extra_mb": (rss1 - rss0) / 1024}


ROWS = (("chrome_X", "naive_json", "Chrome JSON, X events", "json.dump"),
        ("chrome_BE", "naive_json", "Chrome JSON, B/E pairs", "json.dump"),
        ("perfetto", "naive_pb2", "Perfetto protobuf (slices)", "pb2 objects"))


def _median_run(runs: list) -> dict:
    """The run of median wall time (its cpu, rate and peak with it); ``wall_rate`` = events / wall s."""
    r = sorted(runs, key=lambda x: x["wall"])[len(runs) // 2]
    return {**r, "wall_rate": r["events"] / r["wall"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--waves", type=int, default=8)
    ap.add_argument("--naive-max", type=float, default=1.4e6, help="events the naive exporters run on")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each of our exporters (median)")
    ap.add_argument("--one", metavar="MODE", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--plain-mb", type=float, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a)))
        return
    with tempfile.TemporaryDirectory() as d:
        runs = {}
        fast = ("chrome_X", "chrome_BE", "plain_write", "chrome_BE_nofile", "perfetto")
        for mode in fast * a.repeat + ("naive_json", "naive_pb2"):  # the fast ones alternate, a.repeat times
            cmd = [sys.executable, __file__, "--one", mode, "--dir", d, "--launches", str(a.launches),
                   "--world", str(a.world), "--grid", str(a.grid), "--waves", str(a.waves),
                   "--naive-max", str(a.naive_max), "--plain-mb", str(runs.get("chrome_BE", [{"mb": 0}])[-1]["mb"])]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.setdefault(mode, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
        plain = runs.pop("plain_write")
        res = {mode: _median_run(r) for mode, r in runs.items()}
    print(f"timeline.export vs straightforward exporters (SYNTHETIC: {a.world} ranks x {a.launches} launches x "
          f"{a.grid} CTAs x {a.waves} waves; one process each)")
    print(f"{'export':<28} {'events':>9} {'cpu s':>7} {'wall s':>7} {'Mev/s':>7} {'wall Mev/s':>10} {'MB':>7} {'peak+MB':>8}   "
          f"{'naive':<12} {'events':>9} {'Mev/s':>7} {'MB':>7} {'peak+MB':>8} {'speedup':>8}")
    for fast, slow, label, slow_label in ROWS:
        f, s = res[fast], res[slow]
        print(f"{label:<28} {f['events']:>9} {f['cpu']:>7.2f} {f['wall']:>7.2f} {f['rate'] / 1e6:>7.2f} "
              f"{f['wall_rate'] / 1e6:>10.2f} "
              f"{f['mb']:>7.0f} {f['peak_extra_mb']:>8.0f}   {slow_label:<12} {s['events']:>9} "
              f"{s['rate'] / 1e6:>7.2f} {s['mb']:>7.0f} {s['peak_extra_mb']:>8.0f} {f['rate'] / s['rate']:>7.1f}x")
    nf = res["chrome_BE_nofile"]
    print(f"Chrome JSON, B/E pairs, the text made and thrown away (no file): {nf['events']} events, {nf['cpu']:.2f} cpu s, "
          f"{nf['rate'] / 1e6:.2f} Mev/s: the file's write is the rest of the row above")
    ks, ws = sorted(p["sys"] for p in plain), sorted(p["wall"] for p in plain)
    print(f"a plain write of the B/E file's {plain[0]['mb']:.0f} MB (1 MB pieces of one buffer, a fresh process, in the "
          f"same rotation), {len(plain)} runs: kernel time {ks[0]:.2f} .. {ks[-1]:.2f} s, wall {ws[0]:.2f} .. "
          f"{ws[-1]:.2f} s: what this machine's disk alone costs, run to run")
    print("events: Chrome = trace events written (B/E counts each half); Perfetto = slices (a begin and an end each)")
    print(f"Mev/s = events / cpu s (both threads: the export writes a file it opens from a thread of its own while it "
          f"makes the next chunk); wall Mev/s = events / wall s, what the user waits for; ours: the median-wall run "
          f"of {a.repeat}, alternating")


if __name__ == "__main__":
    main()
