"""A run part's Parquet row-group size, side by side in one run: one rank-step task part
of ``--layers`` launches of the SYNTHETIC GLM-5 layer (``timeline synth``), written by
``timeline.run.append`` with each ``--sizes`` row-group size (``write.ROW_GROUP_ROWS``),
then for each: bytes on disk, the append's wall time (best of ``--repeats``), one
launch's rows read back (``layout.read_parquet(where=("launch", L))``, what every
per-launch command does once per rank-step part) and the whole part read, best of
``--repeats``. Sizes take turns so that the machine's noise falls on all alike.

    PYTHONPATH=. python bench/row_groups.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=128)
    p.add_argument("--grid", type=int, default=256)
    p.add_argument("--sizes", default="131072,32768,16384")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    from timeline.cli import main as cli
    from timeline.core.trace import load
    from timeline.run import layout as RL
    from timeline.run import write as RW

    sizes = [int(s) for s in a.sizes.split(",")]
    d = Path(tempfile.mkdtemp(prefix="rowgroups-"))
    try:
        src = d / "t.arrow"
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["synth", "-o", str(src), "--launches", str(a.layers), "--ranks", "1", "--grid", str(a.grid),
                        "-q"]) == 0
        trace = load(src)
        got = {n: {"write": [], "launch": [], "whole": []} for n in sizes}
        for rep in range(a.repeats):
            for n in sizes:
                RW.ROW_GROUP_ROWS = n
                run = d / f"run{n}"
                shutil.rmtree(run, ignore_errors=True)
                t0 = time.perf_counter()
                RW.append(run, trace, capture="c")
                got[n]["write"].append(time.perf_counter() - t0)
                part = next((run / "tasks").rglob("*.parquet"))
                got[n]["bytes"] = part.stat().st_size
                t0 = time.perf_counter()
                RL.read_parquet(part, where=("launch", a.layers // 2))
                got[n]["launch"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                RL.read_parquet(part)
                got[n]["whole"].append(time.perf_counter() - t0)
        print(f"# PYTHONPATH=. python bench/row_groups.py {' '.join(argv if argv is not None else sys.argv[1:])}   "
              f"(load average {os.getloadavg()[0]:.2f})")
        print(f"one task part: {trace.tasks.num_rows:,} rows ({a.layers} launches of one rank, grid {a.grid}); "
              f"best of {a.repeats}, sizes taking turns")
        base = sizes[0]
        print(f"{'row group':>10} {'bytes':>10} {'x':>6} {'append ms':>10} {'x':>6} {'1 launch ms':>12} {'x':>6} "
              f"{'whole ms':>9} {'x':>6}")
        for n in sizes:
            g, b = got[n], got[base]
            w, la, wh = min(g["write"]), min(g["launch"]), min(g["whole"])
            print(f"{n:>10} {g['bytes']:>10,} {g['bytes'] / b['bytes']:>6.3f} {1e3 * w:>10.1f} "
                  f"{w / min(b['write']):>6.2f} {1e3 * la:>12.2f} {la / min(b['launch']):>6.2f} {1e3 * wh:>9.1f} "
                  f"{wh / min(b['whole']):>6.2f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
