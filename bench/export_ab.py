"""The exporters of two checkouts side by side, in one run, on one machine: the
figure a before/after claim needs where the machine's own speed wanders (the
development VM's did, by 2-4x between sessions).

    python bench/export_ab.py BEFORE_DIR [AFTER_DIR=.]
    b=$(mktemp -d) && git archive 7d26bfd timeline | tar -x -C "$b" && python bench/export_ab.py "$b"

Each checkout's ``timeline`` (its own synth, its own exporters) runs in a fresh
process per export, the checkouts alternating ``--repeats`` times; the SYNTHETIC
trace is the one ``bench/export.py`` uses (8 ranks x 2 launches x 256 CTAs x 8
waves). Rates are events per CPU second (all threads) and per wall second (what
the user waits for), each the median over repeats; the file goes to a scratch
directory and is removed after each export.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ONE = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["TREE"])
from timeline.ingest import synth
from timeline.export import write_chrome, write_perfetto
t = synth.synth_trace(synth.glm5_spec(waves=8, world=8, launches=2), grid=256, seed=2)
_ = t.intervals
path, mode = os.environ["OUT"], os.environ["MODE"]
c0, w0 = time.process_time(), time.perf_counter()
if mode == "perfetto":
    n = write_perfetto(t, path)
else:
    n = write_chrome(t, path, complete=mode == "chrome_X")
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
print(json.dumps({"events": n, "cpu": cpu, "wall": wall, "mb": os.path.getsize(path) / 1e6}))
os.remove(path)
"""

MODES = (("chrome_BE", "Chrome JSON, B/E pairs"), ("chrome_X", "Chrome JSON, X events"),
         ("perfetto", "Perfetto protobuf (slices)"))


def run(tree: str, mode: str, out: str) -> dict:
    env = {**os.environ, "TREE": os.path.abspath(tree), "OUT": out, "MODE": mode}
    p = subprocess.run([sys.executable, "-c", ONE], env=env, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default=".")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    trees = {"before": a.before, "after": a.after}
    res = {(k, m): [] for k in trees for m, _ in MODES}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.repeats):
            for mode, _ in MODES:
                for k, tree in trees.items():
                    res[(k, mode)].append(run(tree, mode, os.path.join(d, "out")))
    print(f"exporters of two checkouts, one machine, one run ({a.repeats} alternating repeats, median): before = "
          f"{a.before}, after = {a.after}; SYNTHETIC 8 ranks x 2 launches x 256 CTAs x 8 waves")
    print(f"{'export':<28} {'events':>9} {'MB':>5}   {'before Mev/s':>12} {'after':>6} {'after/before':>12}   "
          f"{'before wall Mev/s':>17} {'after':>6} {'after/before':>12}")
    for mode, label in MODES:
        rate = {(k, kind): statistics.median(r["events"] / r[kind] for r in res[(k, mode)]) / 1e6
                for k in trees for kind in ("cpu", "wall")}
        r0 = res[("after", mode)][0]
        print(f"{label:<28} {r0['events']:>9} {r0['mb']:>5.0f}   {rate['before', 'cpu']:>12.2f} {rate['after', 'cpu']:>6.2f} "
              f"{rate['after', 'cpu'] / rate['before', 'cpu']:>11.2f}x   {rate['before', 'wall']:>17.2f} "
              f"{rate['after', 'wall']:>6.2f} {rate['after', 'wall'] / rate['before', 'wall']:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
