"""Continuous capture's host pipeline against a simulated device, on the CPU: how many
sampled steps a second the drain and its workers keep, and what beyond it.

    PYTHONPATH=. python bench/capture_cpu.py --out bench/results/capture_cpu.txt

The device is a thread (``tests/capturekit.RingDevice.run_paced``) writing the ring
exactly as the Triton demo's 16-layer step does (its spec: 11,264 task rows, 540 kB
of raw rows a step; ticks, placement words, slot headers and write counts), one
step every ``1 / pace`` seconds, every step sampled, into a CPU ``Capture`` appending
to a run dataset in a temporary folder. Side by side, each configuration in a fresh
process (its peak RSS its own):

- ``per-step``: the design before issue 41, by the new code's ``pool="inline",
  batch=1``: the drain thread decodes and appends each step before it copies the next;
- ``thread x2``: two worker threads of the capturing process;
- ``process x1``, ``process x2``: one or two worker processes (the default pool).

Each at every pace of ``--paces`` for ``--steps`` steps, the ring ``"auto"`` from the
step time, the staging ``--staging-mib``, the other settings Capture's defaults.
Printed: steps written, ring_overrun, host_behind; steps written a second from the
device's first step to the end of ``close()`` (``wrote/s``) and how long the
capture ran on after the device's last step (``tail``: the backlog decoded at
``close()``); host CPU ms per step written (the process's CPU less the device
thread's, plus the worker processes' batches), each worker's CPU ms per step and
steps per busy second; peak RSS of the capturing process and of a worker process.
On this VM the device thread itself takes CPU from the pipeline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MODES = {"per-step": {"pool": "inline", "batch": 1}, "thread x2": {"pool": "thread", "workers": 2},
         "process x1": {"pool": "process", "workers": 1}, "process x2": {"pool": "process", "workers": 2}}
CAPACITY = {"per-step": {"pool": "inline", "batch": 1}, "inline": {"pool": "inline"},
            "thread x1": {"pool": "thread", "workers": 1}, "thread x2": {"pool": "thread", "workers": 2},
            "process x1": {"pool": "process", "workers": 1}, "process x2": {"pool": "process", "workers": 2}}
LAYERS = 16


def one(mode: str, pace: float, steps: int, staging_mib: int) -> dict:
    """One configuration in this process: the device thread at ``pace`` steps/s for
    ``steps`` steps, the capture ``MODES[mode]``; its numbers."""
    import capturekit as CK
    from instrument import capture as CAP
    from instrument.capture_pool import peak_rss_kib
    from instrument.demo import triton_mono as tm

    run = tempfile.mkdtemp(prefix="capture_cpu_")
    try:
        cap = CAP.Capture(tm.spec(tm.Shape()), ring="auto", step_s=1.0 / pace, every=1, layers=LAYERS, run=run,
                          device="cpu", staging=staging_mib << 20, name="bench", **MODES[mode])
        dev = CK.RingDevice(cap)
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", CAP.CaptureBehind)
            cap.start()
            t0 = time.perf_counter()
            dev.run_paced(steps, pace).join()
            t1 = time.perf_counter()
            rep = cap.close()
            t2 = time.perf_counter()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        own = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
        procs = sum(rep.worker_cpu_s.values()) if rep.pool == "process" else 0.0
        cpu = own - dev.steps_s + procs
        rates = rep.steps_per_worker_s()
        return {"mode": mode, "pace": pace, "steps": steps, "ring": rep.ring, "staging_steps": rep.staging_steps,
                "written": len(rep.written), "overrun": len(rep.overrun), "host_behind": len(rep.host_behind),
                "incomplete": len(rep.incomplete), "device_s": t1 - t0, "tail_s": t2 - t1,
                "device_pace": steps / (t1 - t0), "cpu_s": cpu, "device_cpu_s": dev.steps_s,
                "cpu_ms_per_step": 1e3 * cpu / max(len(rep.written), 1),
                "worker_ms_per_step": {w: 1e3 * rep.worker_cpu_s[w] / n for w, n in rep.worker_steps.items()},
                "steps_per_worker_s": rates, "batches": rep.batches, "rss_mib": peak_rss_kib() / 1024,
                "worker_rss_mib": max(rep.worker_rss_mib.values(), default=0.0) if rep.pool == "process" else 0.0,
                "said": [str(w.message) for w in said]}
    finally:
        shutil.rmtree(run, ignore_errors=True)


def capacity(mode: str, steps: int) -> dict:
    """The pipeline's capacity in this process: ``steps`` steps already in a ring that
    holds them all, the workers started, then ``close()`` timed (copies, decodes,
    appends at full speed, no device in the way)."""
    import capturekit as CK
    from instrument import capture as CAP
    from instrument.capture_pool import peak_rss_kib
    from instrument.demo import triton_mono as tm

    run = tempfile.mkdtemp(prefix="capture_cpu_")
    try:
        cap = CAP.Capture(tm.spec(tm.Shape()), ring=steps, every=1, layers=LAYERS, run=run, device="cpu",
                          name="bench", **CAPACITY[mode])
        CK.RingDevice(cap).run(steps)
        with cap._lock:
            cap._ensure_host()  # the workers ready, as start() leaves them
        usage0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        rep = cap.close()
        wall = time.perf_counter() - t0
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        own = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
        cpu = own + (sum(rep.worker_cpu_s.values()) if rep.pool == "process" else 0.0)
        assert len(rep.written) == steps, rep.summary()
        return {"mode": mode, "steps": steps, "wall_s": wall, "steps_per_s": steps / wall,
                "cpu_ms_per_step": 1e3 * cpu / steps, "batches": rep.batches, "rss_mib": peak_rss_kib() / 1024,
                "worker_rss_mib": max(rep.worker_rss_mib.values(), default=0.0) if rep.pool == "process" else 0.0}
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _child(args: list) -> dict:
    cmd = [sys.executable, __file__, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"error: {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_capacity(a) -> list:
    """Every capacity mode ``--repeats`` times, interleaved, each in a fresh process."""
    out = []
    for _ in range(a.repeats):
        for mode in CAPACITY:
            out.append(_child(["--capacity", mode, "--capacity-steps", str(a.capacity_steps)]))
    return out


def capacity_table(rows: list) -> list:
    """Per mode: the median steps/s and CPU ms a step over the repeats, and the ratio
    to its single-worker (or single-thread) mode."""
    med = {}
    for mode in CAPACITY:
        mine = [r for r in rows if r["mode"] == mode]
        med[mode] = (float(np.median([r["steps_per_s"] for r in mine])),
                     float(np.median([r["cpu_ms_per_step"] for r in mine])),
                     float(np.median([r["batches"] for r in mine])), max(r["rss_mib"] for r in mine),
                     max(r["worker_rss_mib"] for r in mine), [round(r["steps_per_s"], 1) for r in mine])
    base = {"thread x2": "thread x1", "process x2": "process x1", "inline": "per-step"}
    lines = [f"{'mode':<11} {'steps/s':>8} {'x':>6} {'CPU ms/st':>9} {'batches':>7} {'RSS MiB':>7} {'wkr MiB':>7}  "
             "each repeat (steps/s)"]
    for mode, (rate, cpu, batches, rss, wrss, each) in med.items():
        x = f"{rate / med[base[mode]][0]:.2f}" if mode in base else "1"
        lines.append(f"{mode:<11} {rate:>8.1f} {x:>6} {cpu:>9.2f} {batches:>7.0f} {rss:>7.0f} {wrss:>7.0f}  {each}")
    return lines


def run_all(a) -> list:
    """Every (mode, pace), each in a fresh process (``--one``)."""
    out = []
    for mode in a.modes:
        for pace in a.paces:
            out.append(_child(["--one", mode, str(pace), "--steps", str(a.steps),
                               "--staging-mib", str(a.staging_mib)]))
            print(line(out[-1]), flush=True)
    return out


HEADER = (f"{'mode':<11} {'pace':>5} {'ring':>4} {'written':>7} {'overrun':>7} {'behind':>6} {'wrote/s':>7} "
          f"{'tail s':>6} {'CPU ms/st':>9} {'wkr ms/st':>11} {'st/s/wkr':>9} {'RSS MiB':>7} {'wkr MiB':>7}")


def line(r: dict) -> str:
    """One configuration's row (``HEADER``)."""
    wk = r["worker_ms_per_step"]
    rates = r["steps_per_worker_s"]
    wms = f"{min(wk.values()):.2f}-{max(wk.values()):.2f}" if len(wk) > 1 else (
        f"{next(iter(wk.values())):.2f}" if wk else "-")
    rate = f"{min(rates.values()):.0f}-{max(rates.values()):.0f}" if len(rates) > 1 else (
        f"{next(iter(rates.values())):.0f}" if rates else "-")
    return (f"{r['mode']:<11} {r['pace']:>5.0f} {r['ring']:>4} {r['written']:>7} {r['overrun']:>7} "
            f"{r['host_behind']:>6} {r['written'] / (r['device_s'] + r['tail_s']):>7.1f} {r['tail_s']:>6.2f} "
            f"{r['cpu_ms_per_step']:>9.2f} {wms:>11} {rate:>9} {r['rss_mib']:>7.0f} {r['worker_rss_mib']:>7.0f}")


def kept(rows: list) -> str:
    """Per mode: the highest pace with every step written and a tail under a second,
    and the lowest with a step lost (and to what)."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["pace"])
        ok = [r["pace"] for r in mine if r["written"] == r["steps"] and r["tail_s"] < 1.0]
        lost = [r for r in mine if r["written"] < r["steps"]]
        what = (f"first loss at {lost[0]['pace']:.0f} steps/s ({lost[0]['overrun']} ring_overrun, "
                f"{lost[0]['host_behind']} host_behind)" if lost else "no step lost at any pace")
        out.append(f"  {mode:<11} every step kept, tail < 1 s, up to {max(ok) if ok else 0:.0f} steps/s; {what}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the text report (and a .json beside it)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--paces", nargs="+", type=float, default=[25, 50, 100, 200, 400],
                    help="device steps per second")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--staging-mib", type=int, default=32, help="host staging (MiB): small, so a short run fills it")
    ap.add_argument("--capacity-steps", type=int, default=480, help="steps of the capacity runs")
    ap.add_argument("--repeats", type=int, default=3, help="capacity runs of each mode, interleaved")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "PACE"), help=argparse.SUPPRESS)
    ap.add_argument("--capacity", choices=list(CAPACITY), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.steps < 1 or a.staging_mib < 1 or any(p <= 0 for p in a.paces):
        ap.error("--steps, --staging-mib and every --paces value must be > 0")
    if a.one:
        print(json.dumps(one(a.one[0], float(a.one[1]), a.steps, a.staging_mib)))
        return 0
    if a.capacity:
        print(json.dumps(capacity(a.capacity, a.capacity_steps)))
        return 0
    cmd = "PYTHONPATH=. python bench/capture_cpu.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    head = [f"$ {cmd}   # {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at start",
            "",
            f"simulated device (a thread): the Triton demo's {LAYERS}-layer step (11,264 task rows, 540 kB), every "
            f"step sampled, {a.steps} steps a run; staging {a.staging_mib} MiB; ring auto from the pace",
            HEADER]
    print("\n".join(head), flush=True)
    rows = run_all(a)
    cap_head = ["", f"capacity: {a.capacity_steps} steps already in the ring, close() timed (no device), median of "
                f"{a.repeats} interleaved repeats; x: against the one-worker (one-thread) mode",
                "  per-step: one collect and one append a step on the drain thread; inline: batches of up to 32 on "
                "the drain thread"]
    print("\n".join(cap_head), flush=True)
    cap_rows = run_capacity(a)
    table = capacity_table(cap_rows)
    print("\n".join(table), flush=True)
    text = "\n".join(head + [line(r) for r in rows] + ["", kept(rows)] + cap_head + table
                     + [f"load average at end {os.getloadavg()[0]:.1f}"])
    if a.out:
        Path(a.out).write_text(text + "\n")
        Path(a.out).with_suffix(".json").write_text(json.dumps({"paced": rows, "capacity": cap_rows}, indent=1))
    print("", kept(rows), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
