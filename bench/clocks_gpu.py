"""Rank clocks measured, not assumed (issue 12, item 3), on one GPU: ``instrument.
calibrate`` (a ping-pong through pinned host memory) run

- twice in one process ``--gap`` seconds apart (default 60): the drift in ppm;
- in between, by two processes at once, each as its own "rank": they share one
  device clock, so their offsets, compared at one host time along that drift, must
  agree within their stated uncertainties (goal: each <= 1 µs).

    PYTHONPATH=. python3 bench/clocks_gpu.py --out DIR

Writes ``clocks_h200.txt`` / ``.json`` to DIR. Needs an NVIDIA GPU (Triton, torch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one(rounds: int) -> dict:
    from instrument.clocksync import calibrate

    calibrate(rounds=20)  # compile and warm the path
    return calibrate(rounds=rounds).to_dict()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--gap", type=float, default=60.0, help="seconds between the drift calibrations")
    ap.add_argument("--pairs", type=int, default=5, help="two-process comparisons")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.rounds)))
        return 0
    from timeline import clocks as K

    from instrument.clocksync import calibrate

    calibrate(rounds=20)
    before = calibrate(rounds=a.rounds)
    t0 = time.monotonic()
    pairs = []
    for _ in range(a.pairs):  # while the drift interval runs
        procs = [subprocess.Popen([sys.executable, __file__, "--one", "--rounds", str(a.rounds)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        cal = [K.Calibration.from_dict(json.loads(p.communicate()[0].strip().splitlines()[-1])) for p in procs]
        pairs.append(cal)
    time.sleep(max(0.0, a.gap - (time.monotonic() - t0)))  # the interval the drift is measured over
    after = calibrate(rounds=a.rounds)
    d = K.drift(before, after)
    lines = [f"instrument.calibrate on one GPU: {a.rounds} ping-pong rounds each, the intersection of their "
             "intervals (offset = device %globaltimer - host CLOCK_MONOTONIC)",
             "two processes at once, each its own 'rank' (one device clock: the offsets must agree), compared at one "
             "host time along the drift measured below",
             f"{'pair':>4} {'offset A ns':>20} {'± ns':>7} {'offset B ns':>20} {'± ns':>7} {'B-A at A ns':>11} "
             f"{'agree':>6} {'goal <= 1 µs':>12}"]
    for i, (x, y) in enumerate(pairs):
        ok = K.agree(x, y, d.ppm)
        lines.append(f"{i:>4} {x.offset_ns:>20d} {x.uncertainty_ns:>7.1f} {y.offset_ns:>20d} "
                     f"{y.uncertainty_ns:>7.1f} {K.apart(x, y, d.ppm):>11.1f} {str(ok):>6} "
                     f"{'met' if ok and max(x.uncertainty_ns, y.uncertainty_ns) <= 1000 else 'NOT met':>12}")
    lines.append(f"drift over {d.seconds:.1f} s: {d.ppm:+.3f} ppm ± {d.uncertainty_ppm:.4f} "
                 f"(offsets {before.offset_ns} ± {before.uncertainty_ns:.1f} -> "
                 f"{after.offset_ns} ± {after.uncertainty_ns:.1f} ns)")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "clocks_h200.txt").write_text(text + "\n")
        (a.out / "clocks_h200.json").write_text(json.dumps(
            {"pairs": [[x.to_dict(), y.to_dict()] for x, y in pairs], "before": before.to_dict(),
             "after": after.to_dict(), "drift": d._asdict()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
