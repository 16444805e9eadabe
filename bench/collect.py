"""Collector throughput: stamps/s and peak memory of ``timeline.collect`` against a
straightforward per-record Python decoder of the same buffer and FlyDSL KTRACE's own
decoder (``flydsl.runtime.device_runtime.rocm_ktrace_buffer.decode_records``) on a
KTRACE buffer of as many events, side by side in one run (the machine is noisy: the
ratio is the figure); then the goals of issue 10.

    python bench/collect.py            # 1 M and 10 M stamps
    python bench/collect.py --sizes 1e6 --naive-max 2e6

Buffers are SYNTHETIC (``timeline.ingest.synth``: GLM-5 stage list, 8 waves, grid 256).
Each measurement runs in a fresh process so peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np


def make_buffer(stamps: int):
    from timeline.ingest import synth

    per_launch = sum(c for _, c in synth.GLM5_STAGES) * 8 * 5
    launches = max(1, -(-stamps // per_launch))
    spec = synth.glm5_spec(waves=8, launches=launches)
    (sp, buf), = synth.synth_buffers(spec, grid=256, seed=1)
    return sp, buf


def naive_decode(buf, spec):
    """The obvious decoder: a Python loop over records, a dict per row."""
    import pyarrow as pa

    from timeline.contract import schema as S

    lay = spec.layout
    P = len(spec.phases)
    rows = []
    words = buf.tolist()
    origin = None
    for rec in range(lay.launches * lay.rows * lay.waves):
        base = rec * lay.cols
        ticks = words[base + 1: base + 1 + P]
        if not any(ticks):
            continue
        place = words[base]
        launch, rest = divmod(rec, lay.rows * lay.waves)
        row, wave = divmod(rest, lay.waves)
        stage = max(i for i, f in enumerate(lay.first) if f <= row)
        hi = place >> 32
        d = {"launch": launch, "stage": spec.stages[stage][0], "task": row - lay.first[stage],
             "slot_wave": wave, "cta": (hi >> 10) & 0x3FFFF, "wave": (hi >> 4) & 0x3F,
             "xcc": hi & 0xF, "placement": place}
        for p, t in zip(spec.phases, ticks):
            d[f"{p}_tick"] = t
            if t and (origin is None or t < origin):
                origin = t
        rows.append(d)
    for d in rows:
        for p in spec.phases:
            t = d[f"{p}_tick"]
            d[f"{p}_ns"] = S.ticks_to_ns(t - origin, spec.clock) if t else None
    return pa.Table.from_pylist(rows)


def ktrace_buffer(events: int) -> bytes:
    """A FlyDSL KTRACE buffer holding ``events`` events (its own 32-byte records, wave
    regions of ``EVENTS_PER_WAVE`` slots: a header, then events), as its decoder reads
    it: ``rocm_ktrace_buffer.decode_records(raw)``."""
    from flydsl.expr.rocdl import ktrace_format

    per = ktrace_format.EVENTS_PER_WAVE - 1
    waves = -(-events // per)
    head = np.dtype([("attempted", "<u4"), ("wave", "<u4"), ("dispatch", "<u8"), ("queue", "<u8"),
                     ("bx", "<u4"), ("by", "<u4")])
    ev = np.dtype([("ts", "<u8"), ("payload", "<u8"), ("hw_id", "<u4"), ("xcc_id", "<u4"), ("packed", "<u4"),
                   ("start", "<u4")])
    assert head.itemsize == ev.itemsize == ktrace_format.RECORD_BYTES
    raw = np.zeros((waves, ktrace_format.EVENTS_PER_WAVE), dtype=np.dtype((np.void, ktrace_format.RECORD_BYTES)))
    h = raw[:, 0].copy().view(head)
    h["attempted"], h["wave"], h["bx"] = per, np.arange(waves) & 0xFF, np.arange(waves) // 8
    raw[:, 0] = h.view(raw.dtype)
    e = raw[:, 1:].copy().view(ev).reshape(waves, per)
    e["ts"] = 1_000_000 + np.arange(waves * per).reshape(waves, per)
    e["packed"] = (np.arange(per) % 2).astype(np.uint32) << 24  # push / pop
    raw[:, 1:] = e.view(raw.dtype).reshape(waves, per)
    return raw.tobytes()[: (events + waves) * ktrace_format.RECORD_BYTES]


def ktrace_one(events: int) -> dict:
    from flydsl.runtime.device_runtime.rocm_ktrace_buffer import decode_records

    raw = ktrace_buffer(events)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out, _ = decode_records(raw)
    dt = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": "ktrace", "stamps": len(out), "rows": len(out), "seconds": dt, "stamps_per_s": len(out) / dt,
            "warm_seconds": None, "buffer_mb": len(raw) / 2**20, "peak_extra_mb": (rss1 - rss0) / 1024}


def one(mode: str, stamps: int) -> dict:
    if mode == "ktrace":
        return ktrace_one(stamps)
    if mode == "collect-tuned":
        from timeline.core.process import tune_process

        tune_process()
    sp, buf = make_buffer(stamps)
    n = int(np.count_nonzero(buf[: sp.layout.record_words].reshape(-1, sp.layout.cols)[:, 1:]))

    from timeline import collect

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if mode.startswith("collect"):
        rows = collect(buf, sp).tasks.num_rows
    else:
        rows = naive_decode(buf, sp).num_rows
    dt = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    warm = []
    if mode.startswith("collect"):  # steady state: the allocator has its pages, as in a long-lived viewer
        for _ in range(4):
            t0 = time.perf_counter()
            collect(buf, sp)
            warm.append(time.perf_counter() - t0)
    return {"mode": mode, "stamps": n, "rows": rows, "seconds": dt, "stamps_per_s": n / dt,
            "warm_seconds": float(np.median(warm)) if warm else None,
            "buffer_mb": buf.nbytes / 2**20, "peak_extra_mb": (rss1 - rss0) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="*", type=float, default=[1e6, 1e7])
    ap.add_argument("--naive-max", type=float, default=1e7, help="skip the naive decoder above this many stamps")
    ap.add_argument("--ktrace-max", type=float, default=2e6, help="skip KTRACE's decoder above this many events")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "STAMPS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(float(a.one[1])))))
        return
    print("timeline.collect vs a per-record Python decoder (SYNTHETIC buffers, one process each)")
    print("cold = the first decode in a fresh process (page faults included); warm = median of 4 more;")
    print("collect-tuned = as the timeline / timeline-view commands run (timeline.core.process.tune_process: numpy's")
    print("    huge-page madvise off, glibc keeps freed pages); collect = the library in a default process")
    print(f"{'stamps':>10} {'decoder':>12} {'cold s':>8} {'Mstamps/s':>10} {'warm s':>8} {'Mstamps/s':>10}"
          f" {'peak+MB':>8} {'buffer MB':>9} {'speedup cold':>12} {'warm':>6}")
    goals = []
    for size in a.sizes:
        res = {}
        for mode in ("collect", "collect-tuned", "naive", "ktrace"):
            if (mode == "naive" and size > a.naive_max) or (mode == "ktrace" and size > a.ktrace_max):
                continue
            out = subprocess.run([sys.executable, __file__, "--one", mode, str(int(size))],
                                 capture_output=True, text=True, check=True)
            res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        for mode, r in res.items():
            base = res["naive"]["seconds"] if "naive" in res else float("nan")
            warm = r["warm_seconds"] or r["seconds"]
            print(f"{r['stamps']:>10} {mode:>12} {r['seconds']:>8.3f} {r['stamps_per_s'] / 1e6:>10.1f} "
                  f"{warm:>8.3f} {r['stamps'] / warm / 1e6:>10.1f} {r['peak_extra_mb']:>8.0f} "
                  f"{r['buffer_mb']:>9.1f} {base / r['seconds']:>11.1f}x {base / warm:>5.0f}x")
        c = res["collect-tuned"]
        warm_rate = c["stamps"] / c["warm_seconds"] / 1e6
        goals.append(f"{c['stamps']:>10} stamps: warm {warm_rate:.1f} M/s (goal >= 60: {_met(warm_rate >= 60)}), "
                     f"first decode {c['stamps_per_s'] / 1e6:.1f} M/s (goal >= 30: {_met(c['stamps_per_s'] >= 30e6)})")
        if "ktrace" in res:
            k = res["ktrace"]["stamps_per_s"]
            ratio = c["stamps"] / c["warm_seconds"] / k
            goals.append(f"{'':>10}         KTRACE's decoder {k / 1e6:.2f} M events/s: collect warm {ratio:.0f}x "
                         f"(goal >= 300x: {_met(ratio >= 300)})")
    print("\ngoals (issue 10), the collect-tuned rows (as the commands run):")
    print("\n".join(goals))


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    main()
