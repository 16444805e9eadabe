"""What continuous capture costs a decode step, and whether it keeps every step it
samples, on an NVIDIA GPU (written for the H100 / H200 with 16 host cores).

    PYTHONPATH=. python3 bench/capture_gpu.py --out $OUT/capture

The Triton demo mono kernel as a CUDA graph of ``--layers`` launches a step
(``instrument.demo.triton_graph``), every capture with ``instrument.Capture``'s
default settings (a ring the device-memory budget holds, the host staging, worker
processes decoding and appending to a run dataset under ``--runs``) unless named.

1. Device cost: five builds, each its own graph: ``off`` and ``off2`` (a normal build;
   two graphs of it, the A/A pair whose ratio is the noise floor), ``every16``,
   ``every4`` and ``every1`` (timeline builds, one step in 16 / 4 / every step
   captured while the graph replays). Interleaved: each round replays ``--steps``
   steps of every build in a shuffled order, CUDA events around the round's replays;
   a round's time per step is one sample. Printed side by side: µs a step with a 95%
   confidence interval (t over the rounds), the ratio to ``off`` (delta method), the
   A/A pair, and whether every16 / every1 lie within the A/A spread.
2. Keeping every sampled step: continuous replays of ``--keep-steps`` steps,
   ``keep1`` (every step, default settings) and ``keep4w2`` (every 4th step, 2 worker
   processes): steps written whole, ring_overrun, host_behind, incomplete; the
   device's steps/s; how long the drain ran on after the device finished; host CPU
   ms per captured step (the drain's copies and every worker's decode and append),
   each worker's sustained steps/s and peak RSS. Goal (issue 41): every sampled
   step written, 0 ring_overrun, 0 host_behind, the run read back with every
   (step, layer) key.
3. ``throttled`` (every step, ring 2, a drain pass only every ``--throttle-ms``: the
   ring laps the drain and the lapped steps must be ring_overrun, never decoded) and
   ``sample`` (one step in 4 for 12 steps, a ring of exactly its 3 sampled steps: the
   small run ``traces/`` keeps).

Every capture's run is read back (``timeline.open_run``): 0 anomalies, its launches
exactly the written steps' (step, layer) keys. The JSON beside the text has every
sample and every report.

    PYTHONPATH=. python bench/capture_gpu.py --dry-run

No GPU: the same harness in Triton's interpreter (it re-runs itself with
``TRITON_INTERPRET=1``), a tiny shape, one CTA, launches one by one instead of a
graph, host time instead of CUDA events: checks that every build and capture runs,
every sampled step is written whole or counted, and the report prints. Its times
mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BUILDS = {"off": 0, "off2": 0, "every16": 16, "every4": 4, "every1": 1}  # build -> every (0: no capture)
GOALS = {"every16": 1.005, "every1": 1.01}  # the ratio to off each must stay under (issue 33)
# continuous replays: every, workers (None: the default), steps the host loop may queue ahead of the device
# (None: no bound; 2: a serving loop that reads each step's tokens while the next step runs)
KEEPS = {"keep1": (1, None, 2), "keep4w2": (4, 2, 2), "keep1-runahead": (1, None, None)}
GOAL_KEEPS = ("keep1", "keep4w2")
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13,
       20: 2.09, 30: 2.04}


def t95(dof: int) -> float:
    """Student's t for a two-sided 95% interval with ``dof`` degrees of freedom."""
    keys = [k for k in sorted(T95) if k <= max(dof, 1)]
    return T95[keys[-1]] if dof <= 30 else 1.96


def interval(samples) -> tuple:
    """(mean, half-width of its 95% interval) of per-round samples."""
    x = np.asarray(samples, float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), t95(len(x) - 1) * float(x.std(ddof=1)) / np.sqrt(len(x))


def ratio(a, b) -> tuple:
    """mean(a) / mean(b) with the half-width of its 95% interval (delta method)."""
    (ma, ha), (mb, hb) = interval(a), interval(b)
    r = ma / mb
    return r, r * float(np.hypot(ha / ma, hb / mb))


def within_aa(cap: tuple, aa: tuple) -> bool:
    """Whether a build's ratio to ``off`` (``(ratio, half-width)``) is no slower than
    the A/A spread allows: the low end of its 95% interval is not above 1 plus the
    A/A pair's distance from 1 and its half-width (faster is no cost)."""
    (r, h), (a, ah) = cap, aa
    return r - h <= 1.0 + abs(a - 1.0) + ah


def summarize(rep) -> dict:
    """The numbers of a ``CaptureReport`` this bench prints and keeps."""
    rates = rep.steps_per_worker_s()
    return {"written": len(rep.written), "overrun": len(rep.overrun), "host_behind": len(rep.host_behind),
            "incomplete": len(rep.incomplete), "failed": len(rep.failed), "rows": rep.rows, "steps": rep.steps,
            "ring": rep.ring, "ring_note": rep.ring_note, "staging_steps": rep.staging_steps,
            "workers": rep.workers, "pool": rep.pool, "pinned": rep.pinned, "batches": rep.batches,
            "cpu_ms_per_step": None if rep.cpu_per_step() is None else 1e3 * rep.cpu_per_step(),
            "drain_cpu_s": rep.drain_cpu_s, "worker_cpu_s": rep.worker_cpu_s, "worker_steps": rep.worker_steps,
            "steps_per_worker_s": rates, "worker_rss_mib": rep.worker_rss_mib, "wall_s": rep.wall_s,
            "behind": rep.behind, "summary": rep.summary(), "written_steps": list(rep.written),
            "drain_passes": rep.drain_passes, "drain_pass_ms": 1e3 * rep.drain_pass_s / max(rep.drain_passes, 1),
            "drain_pass_max_ms": 1e3 * rep.drain_pass_max_s}


def bench(a) -> dict:
    """Run every part (module docstring); returns the results."""
    import torch

    from instrument.demo import triton_graph as tg

    cpu = a.dry_run
    dev = "cpu" if cpu else "cuda"
    shape = tg.INTERP_SHAPE if cpu else tg.tm.Shape()
    runs = Path(a.runs)
    ring = {} if a.ring == "auto" else {"ring": int(a.ring)}
    runners, steppers = {}, {}
    for name, every in BUILDS.items():
        r = tg.Runner(shape, a.layers, device=dev, every=every, run=str(runs / name) if every else None, **ring)
        if cpu:
            r.one_step()
            r.reset()
            steppers[name] = r.one_step
        else:
            steppers[name] = r.capture_graph().replay
        runners[name] = r
    for r in runners.values():
        if r.cap is not None:
            r.cap.start()
    samples = {name: [] for name in BUILDS}
    rng = random.Random(a.seed)
    for _ in range(a.rounds):
        order = list(BUILDS)
        rng.shuffle(order)
        for name in order:
            samples[name].append(_time_steps(steppers[name], a.steps, cpu) / a.steps)
    captures = {}
    for name, r in runners.items():
        if r.cap is not None:
            captures[name] = summarize(r.cap.close())
        if r.ffn.hangs():
            raise SystemExit(f"error: build {name}: {r.ffn.hangs()} mailbox waits gave up")
    keeps = {}
    for name, (every, workers, ahead) in KEEPS.items():
        r = tg.Runner(shape, a.layers, device=dev, every=every, run=str(runs / name), workers=workers, **ring)
        keeps[name] = _keep(r, a.keep_steps, cpu, ahead) | {"every": every, "ahead": ahead}
        runners[name] = r
    extra = {}
    for name, every, ring_n, steps, poll_s in (
            ("throttled", 1, 2, 6 if cpu else 400, 3600.0 if cpu else a.throttle_ms / 1e3),
            ("sample", 4, 3, 12, 0.002)):  # sample: a ring of exactly its 3 sampled steps
        r = tg.Runner(shape, a.layers, device=dev, every=every, ring=ring_n, run=str(runs / name), poll_s=poll_s)
        extra[name] = summarize(tg.run_steps(r, steps, graph=not cpu))
        runners[name] = r
    for name, r in runners.items():
        if r.ffn.hangs():
            raise SystemExit(f"error: capture {name}: {r.ffn.hangs()} mailbox waits gave up")
    checks = read_back(runs, {**captures, **{k: v["report"] for k, v in keeps.items()}, **extra}, a.layers)
    return {"device": "cpu (interpreter, dry run)" if cpu else torch.cuda.get_device_name(),
            "host_cores": os.cpu_count(), "layers": a.layers, "steps_per_round": a.steps, "rounds": a.rounds,
            "keep_steps": a.keep_steps, "samples_us": {k: [1e6 * v for v in s] for k, s in samples.items()},
            "captures": captures, "keeps": keeps, "extra": extra, "checks": checks,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _keep(r, steps: int, cpu: bool, ahead: int | None) -> dict:
    """A continuous replay of ``steps`` steps of runner ``r`` while its capture drains:
    the report, the device's steps/s and the seconds the drain ran on after it.
    ``ahead``: the host loop waits for step ``i - ahead`` once it queued step ``i`` (an
    event), as a serving loop reading each step's tokens does; None: it queues every
    step at once, as far ahead as the launch queue lets it."""
    torch = r.torch
    if cpu:
        r.one_step()
        r.reset()
        step = r.one_step
    else:
        step = r.capture_graph().replay
    events = [torch.cuda.Event() for _ in range((ahead or 0) + 1)] if ahead and not cpu else None
    r.cap.start()
    t0 = time.perf_counter()
    for i in range(steps):
        step()
        if events is not None:
            events[i % len(events)].record()
            if i >= ahead:
                events[(i - ahead) % len(events)].synchronize()
    if not cpu:
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    rep = r.cap.close()
    t2 = time.perf_counter()
    return {"report": summarize(rep), "device_steps_per_s": steps / (t1 - t0), "drain_tail_s": t2 - t1,
            "replay_s": t1 - t0}


def read_back(runs: Path, reports: dict, layers: int) -> dict:
    """Each capture's run read back with ``timeline.open_run``: its anomalies and
    whether its launches are exactly the written steps' (step, layer) keys. Raises
    SystemExit naming the capture when one is not."""
    from timeline import open_run

    checks = {}
    for name, rep in reports.items():
        written = rep["written_steps"]
        launches = open_run(str(runs / name)).launches()
        keys = sorted(zip(launches.column("step").to_pylist(), launches.column("layer").to_pylist()))
        want = sorted((k, layer) for k in written for layer in range(layers))
        anomalies = sum(launches.column("anomalies").to_pylist())
        checks[name] = (f"{launches.num_rows} launches of {len(written)} steps, (step, layer) keys "
                        f"{'right' if keys == want else 'WRONG'}, {anomalies} anomalies")
        if keys != want or anomalies:
            raise SystemExit(f"error: capture {name}'s run: {checks[name]}")
    return checks


def _time_steps(step, n: int, cpu: bool) -> float:
    """Seconds ``n`` calls of ``step`` take: host time (CPU), or CUDA events around
    them on the current stream (GPU)."""
    if cpu:
        t = time.perf_counter()
        for _ in range(n):
            step()
        return time.perf_counter() - t
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _lost(c: dict) -> str:
    return (f"{c['written']} written, {c['overrun']} ring_overrun, {c['host_behind']} host_behind, "
            f"{c['incomplete']} incomplete of {c['steps']} steps")


def _host(c: dict) -> str:
    rates = c["steps_per_worker_s"]
    per = "-" if c["cpu_ms_per_step"] is None else f"{c['cpu_ms_per_step']:.2f}"
    rate = f"{min(rates.values()):.0f}-{max(rates.values()):.0f}" if rates else "-"
    rss = f"{max(c['worker_rss_mib'].values()):.0f}" if c["worker_rss_mib"] else "-"
    return f"{per:>8} {rate:>10} {rss:>6}"


def report(res: dict) -> str:
    """The side-by-side tables and the goals."""
    s = res["samples_us"]
    lines = [f"capture cost a decode step: {res['device']}, {res['layers']} layers a step, {res['rounds']} rounds x "
             f"{res['steps_per_round']} steps, interleaved; {res['host_cores']} host cores; captures with "
             "Capture's defaults",
             f"{'build':<9} {'us/step':>12} {'+-95%':>9} {'x off':>8} {'+-95%':>7}  capture"]
    for name in BUILDS:
        m, h = interval(s[name])
        r, rh = ratio(s[name], s["off"])
        cap = res["captures"].get(name)
        lines.append(f"{name:<9} {m:>12.2f} {h:>9.2f} {r:>8.4f} {rh:>7.4f}  " + (_lost(cap) if cap else "-"))
    aa = ratio(s["off2"], s["off"])
    lines.append(f"A/A pair: off2 / off = {aa[0]:.4f} +- {aa[1]:.4f}")
    for name in ("every16", "every1"):
        r = ratio(s[name], s["off"])
        lines.append(f"goal {name} within the A/A spread: {r[0]:.4f} +- {r[1]:.4f} against A/A {aa[0]:.4f} +- "
                     f"{aa[1]:.4f}: {'met' if within_aa(r, aa) else 'NOT met'}")
    for name, goal in GOALS.items():
        r, rh = ratio(s[name], s["off"])
        lines.append(f"goal {name} <= {goal:g} x off: {r:.4f} (95% up to {r + rh:.4f}): "
                     f"{'met' if r <= goal else 'NOT met'}")
    lines.append(f"host cost of the cost part's captures ({'CPU ms a step written':>8}, steps/s a worker, worker "
                 "peak RSS MiB):")
    for name, c in res["captures"].items():
        lines.append(f"  {name:<8} {_host(c)}  ring {c['ring']}, staging {c['staging_steps']} steps, {c['workers']} "
                     f"{c['pool']} workers, {c['batches']} batches, pinned {c['pinned']}")
    lines.append(f"keeping every sampled step: continuous replays of {res['keep_steps']} steps")
    lines.append(f"{'capture':<14} {'every':>5} {'ahead':>5} {'workers':>7} {'ring':>5} {'written':>8} {'overrun':>8} "
                 f"{'behind':>7} {'incompl':>7} {'dev st/s':>9} {'tail s':>7} {'pass ms':>7} {'max ms':>7} "
                 f"{'CPU ms/st':>9} {'st/s/wkr':>10} {'RSS MiB':>7}")
    for name, k in res["keeps"].items():
        c = k["report"]
        ahead = "-" if k.get("ahead") is None else k["ahead"]
        lines.append(f"{name:<14} {k['every']:>5} {ahead:>5} {c['workers']:>7} {c['ring']:>5} {c['written']:>8} "
                     f"{c['overrun']:>8} {c['host_behind']:>7} {c['incomplete']:>7} {k['device_steps_per_s']:>9.1f} "
                     f"{k['drain_tail_s']:>7.2f} {c.get('drain_pass_ms', 0):>7.2f} {c.get('drain_pass_max_ms', 0):>7.1f} "
                     f"{_host(c)}")
    for name, k in res["keeps"].items():
        if name not in GOAL_KEEPS:
            c = k["report"]
            lines.append(f"not a goal, {name}: the host loop queues every step without waiting (as far ahead as the "
                         f"launch queue lets it): {c['written']} of {res['keep_steps']} written, {c['overrun']} "
                         "ring_overrun" + (f"; {c['behind']}" if c["behind"] else ""))
            continue
        c, every = k["report"], k["every"]
        sampled = len(range(0, res["keep_steps"], every))
        ok = (c["written"] == sampled and c["overrun"] == c["host_behind"] == c["incomplete"] == c["failed"] == 0
              and "right" in res["checks"].get(name, ""))
        lines.append(f"goal {name}: all {sampled} sampled steps of {res['keep_steps']} written whole and read back "
                     f"with their (step, layer) keys, 0 ring_overrun, 0 host_behind ({c['workers']} workers, the host "
                     f"loop at most {k['ahead']} steps ahead of the device): "
                     f"{'met' if ok else 'NOT met'}")
        if c["behind"]:
            lines.append(f"          {c['behind']}")
    for name, chk in res.get("checks", {}).items():
        lines.append(f"read back {name}: {chk}")
    for name, c in res.get("extra", {}).items():
        lines.append(f"{name}: {c['summary']}" + (f"; {c['behind']}" if c.get("behind") else ""))
    workers = [v for c in [*res["captures"].values(), *(k["report"] for k in res["keeps"].values())]
               for v in c["worker_rss_mib"].values()]
    lines.append(f"peak RSS: this process {res['peak_rss_mib']:.0f} MiB (the staging it touched included; "
                 f"page-locked on a GPU), a worker process up to {max(workers, default=0):.0f} MiB")
    return "\n".join(lines)


def check_dry_run(res: dict) -> None:
    """A dry run's promises: every build ran every round, every capture's sampled
    steps were written whole or counted (none incomplete), rows written."""
    for name, every in BUILDS.items():
        assert len(res["samples_us"][name]) == res["rounds"], name
        if every:
            cap = res["captures"][name]
            sampled = len(range(0, cap["steps"], every))
            assert cap["written"] + cap["overrun"] + cap["host_behind"] == sampled and cap["incomplete"] == 0, cap
            assert cap["written"] and cap["rows"] > 0, (name, cap)
    for name, k in res["keeps"].items():
        c = k["report"]
        assert c["written"] == len(range(0, res["keep_steps"], k["every"])) and c["overrun"] == 0, (name, c)
    thr = res["extra"]["throttled"]
    assert thr["overrun"] > 0 and thr["incomplete"] == 0 and thr["written"] + thr["overrun"] == thr["steps"], thr
    assert res["extra"]["sample"]["written"] == 3, res["extra"]["sample"]


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the JSON and the text report")
    ap.add_argument("--runs", help="folder for the captures' run datasets (default: a temporary one, removed)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--ring", default="auto", help="the captures' ring (default auto: Capture's default)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=40, help="steps of each build a round")
    ap.add_argument("--keep-steps", type=int, default=2400, help="steps of each continuous replay (part 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--throttle-ms", type=float, default=20.0, help="the throttled capture's drain period (ms)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: Triton's interpreter, a tiny run (see above)")
    a = ap.parse_args(argv)
    if a.ring != "auto" and not a.ring.isdigit():
        ap.error(f"--ring {a.ring}: auto or a whole number")
    for name in ("layers", "rounds", "steps", "keep_steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)}: a whole number >= 1")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        args = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(args, env=env).returncode
    if a.dry_run:
        from tools import triton_interp

        triton_interp.install(4)
        given = [x.split("=")[0] for x in (argv if argv is not None else sys.argv[1:])]
        for name, small in (("layers", 2), ("rounds", 2), ("steps", 2), ("keep_steps", 8)):
            if f"--{name.replace('_', '-')}" not in given:
                setattr(a, name, small)
    made = a.runs is None
    a.runs = a.runs or tempfile.mkdtemp(prefix="capture_gpu_runs_")
    try:
        res = bench(a)
    finally:
        if made:
            shutil.rmtree(a.runs, ignore_errors=True)
    text = report(res)
    print(text)
    if a.dry_run:
        check_dry_run(res)
        print("dry run: every build ran, every sampled step written whole or counted")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "capture.json").write_text(json.dumps(res, indent=1))
        (out / "capture.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
