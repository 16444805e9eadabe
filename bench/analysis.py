"""Analysis time at 1 M and 10 M intervals, side by side in one run, against the goal
of issue 10 (every analysis <= 0.5 s at 10 M intervals, and linear: 10x the data in
about 10x the time).

    python bench/analysis.py                 # 1 M and 10 M intervals
    python bench/analysis.py --sizes 1e6

Traces are SYNTHETIC (``timeline.ingest.synth``: the GLM-5 stage list, 8 waves, grid 256,
ranks x launches to reach the size), built once per size; each analysis is timed
as the median of 3 runs on the same trace (its intervals table already derived, as
in the dashboard), in a process tuned as the commands run (``timeline.core.process.tune_process``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_S = 0.5


def make_trace(intervals: int):
    from timeline.ingest import synth

    per_launch_rank = sum(c for _, c in synth.GLM5_STAGES) * 8 * 4  # tasks x waves x intervals
    pairs = max(1, round(intervals / per_launch_rank))
    ranks = min(8, pairs)
    launches = max(1, round(pairs / ranks))
    trace = synth.synth_trace(synth.glm5_spec(waves=8, world=ranks, launches=launches), grid=256, seed=1)
    trace.intervals  # derived once, as the dashboard holds it
    return trace


def analyses():
    """``name -> f(trace)``: every analysis the CLI and the dashboard run."""
    from timeline.analysis import stages as A
    from timeline.analysis import compare as C

    return {
        "stage_report": lambda t: A.stage_report(t),
        "stage_report by launch": lambda t: A.stage_report(t, by_launch=True),
        "typical_launch": lambda t: C.typical_launch(t),
        "concurrency (4096 bins)": lambda t: A.concurrency(t, bins=4096),
        "idle_per_cta": lambda t: A.idle_per_cta(t),
        "idle_gaps": lambda t: A.idle_gaps(t),
        "critical_path (one launch)": lambda t: A.critical_path(t, rank=t.ranks[0], launch=t.launches[0]),
    }


def timed(fn, trace, repeat=3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(trace)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7])
    a = ap.parse_args(argv)
    from timeline.core.process import tune_process

    tune_process()  # as the timeline and timeline-view commands run
    results, sizes = {}, []
    for size in a.sizes:
        trace = make_trace(int(size))
        n = trace.intervals.num_rows
        sizes.append(n)
        for name, fn in analyses().items():
            results[(name, n)] = timed(fn, trace)
        del trace
    head = "".join(f" {f'{n / 1e6:.2f} M s':>11}" for n in sizes)
    print(f"analyses of SYNTHETIC traces (median of 3), intervals: {', '.join(f'{n:,}' for n in sizes)}")
    print(f"{'analysis':<28}{head}" + (f" {'ratio':>7} {'data':>6}" if len(sizes) > 1 else "") + "  goal")
    for name in analyses():
        ts = [results[(name, n)] for n in sizes]
        cells = "".join(f" {t:>11.3f}" for t in ts)
        ratio = f" {ts[-1] / ts[0]:>6.1f}x {sizes[-1] / sizes[0]:>5.1f}x" if len(sizes) > 1 else ""
        verdict = "met" if ts[-1] <= GOAL_S else "NOT met"
        print(f"{name:<28}{cells}{ratio}  <= {GOAL_S} s at {sizes[-1] / 1e6:.1f} M: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
