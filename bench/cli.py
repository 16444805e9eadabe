"""Short commands as a user waits for them: ``timeline --help`` and ``timeline info``
on the bundled trace, each a fresh process (interpreter start and imports included),
the median of ``--repeat`` runs, against issue 10's goals (<= 0.1 s, <= 0.3 s);
and whether the process imported pandas (a fifth of a second when it does). The
processes run as an installed command does: with Python's bytecode cache (an
inherited ``PYTHONDONTWRITEBYTECODE`` is dropped, and a first run writes the cache
before any is timed).

    python bench/cli.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "h200_mono_demo.arrow"
CASES = (("timeline --help", ["--help"], 0.1), ("timeline info (bundled trace)", ["info", str(TRACE)], 0.3))
PANDAS = "import sys, runpy; sys.argv = ['timeline'] + sys.argv[1:]\ntry:\n    runpy.run_module('timeline', " \
         "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('pandas' in sys.modules, file=sys.stderr)"


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(args) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "timeline", *args], capture_output=True, check=True, env=ENV)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    print(f"fresh processes, median of {a.repeat} (python -m timeline ...)")
    for label, args, goal in CASES:
        timed(args)  # writes the bytecode cache
        times = [timed(args) for _ in range(a.repeat)]
        pandas = subprocess.run([sys.executable, "-c", PANDAS, *args], capture_output=True, text=True)
        med = statistics.median(times)
        print(f"  {label:<32} {med:6.3f} s (min {min(times):.3f})  pandas imported: "
              f"{pandas.stderr.strip().splitlines()[-1]:<5}  goal <= {goal} s: {'met' if med <= goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
