"""The task graph's edges on one 8-rank GLM-5 launch (SYNTHETIC): what the critical
path, explain and the replay need (``edges.edges``: per task its gating producer,
grouped over barriers and all-reduces) beside the full edge list that only the edges
table asks for (``Graph.consumer`` .., built on first use).

    PYTHONPATH=. python3 bench/edges.py                 # grid 256 (the GLM-5 kernel's)
    PYTHONPATH=. python3 bench/edges.py --grid 64

Prints the median of 3 runs of each part and the peak RSS after each.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timeline.analysis import edges as E  # noqa: E402
from timeline.analysis import whatif as W  # noqa: E402
from timeline.ingest import synth_graph as SG  # noqa: E402


def _median_s(fn, runs: int = 3) -> tuple:
    """``(median seconds, last result)`` of ``runs`` calls of ``fn``."""
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    tr = SG.graph_trace(SG.glm5_spec(world=8, launches=1), grid=a.grid, seed=a.seed)
    edges_s, g = _median_s(lambda: E.edges(tr))
    path_s, path = _median_s(lambda: E.exact_path(tr, launch=0, g=g))
    replay_s, _ = _median_s(lambda: W.replay(tr, ["o=1.1"], g))
    rss = _rss_mib()
    print(f"GLM-5, 8 ranks, one launch, grid {a.grid} (SYNTHETIC): {tr.intervals.num_rows:,} intervals, "
          f"{g.tasks.n:,} tasks, {g.edge_count:,} edges, {g.producers.consumer.size:,} producer references")
    print(f"edges(trace) {edges_s:.3f} s + exact_path {path_s:.3f} s ({path.num_rows} rows) = "
          f"{edges_s + path_s:.3f} s; replay {replay_s:.3f} s; peak RSS {rss:.0f} MiB")
    t0 = time.perf_counter()
    listed = g.consumer.size
    list_s = time.perf_counter() - t0
    print(f"the full edge list (edges table only): {listed:,} rows in {list_s:.3f} s; peak RSS {_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
