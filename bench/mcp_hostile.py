"""``timeline mcp``'s ``sql`` tool against the hostile-query suite (tests/mcpkit.py's
``HOSTILE``: wide lists, huge strings, cross joins, recursive CTEs, range(10^9),
nested aggregates, the escape attempts, DuckDB's own settings) at the server's default
limits, through the SDK's stdio client, the server under ``/usr/bin/time -v``: per
query the time the client waited (goal: its time limit + 1 s), the largest resident
size of any process of the server's tree while it ran (the server, its sandbox
workers; sampled every 5 ms from /proc), the answer, and its verdict; then time's peak
resident size of the whole run (goal: 1.5 GB). Before the sandbox (issue 48):
``SELECT list(range) FROM range(100000000)`` took the server to 5.85 GB and answered
after 14.8 s.

    PYTHONPATH=. python bench/mcp_hostile.py                 # default limits (10 s)
    PYTHONPATH=. python bench/mcp_hostile.py --seconds 2     # the test's limit
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ off the path (bench/mcp.py would shadow the SDK's ``mcp``), tests/ on it (mcpkit)
sys.path[:] = [str(ROOT), str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import mcpkit  # noqa: E402

RSS_GOAL = 1.5e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="the server's --sql-seconds (default 10, its default)")
    a = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    print(f"# PYTHONPATH=. python bench/mcp_hostile.py {' '.join(argv if argv is not None else sys.argv[1:])}   "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; load average {load0:.2f})")
    with tempfile.TemporaryDirectory() as d:
        root = mcpkit.make_root(Path(d))
        rows, report = mcpkit.run_suite(root, a.seconds, Path(d) / "time.txt")
    goal_s = a.seconds + 1.0
    print(f"timeline mcp --root . --sql-seconds {a.seconds:g} (the bundled H100 run as `run`); each sql call as the "
          f"client waited for it; peak: the largest resident size of any process of the server's tree meanwhile")
    print(f"{'query':<32} {'time s':>7} {'goal s':>7} {'peak MB':>8}  {'verdict':<8} answer")
    bad = 0
    for label, _, took, peak, summary, fault in rows:
        ok = not fault and took <= goal_s
        bad += not ok
        print(f"{label:<32} {took:7.2f} {goal_s:7.2f} {peak / 1e6:8.0f}  {'met' if ok else 'NOT met':<8} "
              f"{(fault or summary)[:150]}")
    peak = mcpkit.peak_kb(report) * 1024
    tool = "/usr/bin/time -v" if Path("/usr/bin/time").is_file() else "wait4 (no /usr/bin/time here)"
    print(f"peak resident size of the server and its workers ({tool}): {peak / 1e9:.2f} GB; goal <= "
          f"{RSS_GOAL / 1e9:g} GB: {'met' if peak <= RSS_GOAL else 'NOT met'}")
    print(f"queries: {len(rows)}; every answer within its limit + 1 s and bounded: "
          f"{'met' if not bad else f'NOT met ({bad})'}; load average at the end {os.getloadavg()[0]:.2f}")
    return 0 if not bad and peak <= RSS_GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
