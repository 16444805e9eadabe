"""Rank clocks measured, not assumed (issue 12, item 3), on one GPU: ``instrument.
calibrate`` by both methods (``listen``: many pollers bracket the host's post;
``pingpong``: a round trip), side by side, run

- twice in one process ``--gap`` seconds apart (default 60): the drift in ppm;
- in between, by two processes at once, each as its own "rank": they share one
  device clock, so their offsets, compared at one host time along that drift, must
  agree within their stated uncertainties (goal: each <= 1 µs);
- and each process's two methods against each other (both bound the same offset:
  they must agree too, a check of each method's bound).

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

METHODS = ("listen", "pingpong")


def both(rounds: int) -> dict:
    """``{method: Calibration}``, one after the other."""
    from instrument.clocksync import calibrate

    return {m: calibrate(rounds=rounds, method=m) for m in METHODS}


def one(rounds: int) -> dict:
    both(20)  # compile and warm the paths
    return {m: c.to_dict() for m, c in both(rounds).items()}


SWEEP = (("pingpong", 1, 0), ("pingpong", 1, 4_000), ("listen", 1, 0), ("listen", 1, 4_000), ("listen", 2, 4_000),
         ("listen", 4, 4_000), ("listen", 64, 4_000))  # (method, pollers, random pause up to ns)


def sweep(rounds: int) -> list:
    """One calibration per ``SWEEP`` setting, the rounds' shape beside it: the host's
    side (``received - sent``) and, for listen, the device's bracket (earliest hit -
    latest miss), ns."""
    import numpy as np

    from instrument import clocksync as CS
    from timeline.contract import clocks as K

    dev, name = CS._device_of(None)
    out = [f"one {rounds}-round calibration per setting, back to back:",
           f"{'method':>9} {'pollers':>7} {'pause ns':>8} {'± ns':>7} {'host side min/median ns':>24} "
           f"{'device bracket min/median ns':>29}"]
    for method, ctas, pause in SWEEP:
        if method == "listen":
            sent, lo, received, hi = CS._listened(dev, rounds, ctas, 10.0, pause)
            cal, bracket = K.estimate(sent, lo, received, device_hi=hi, name=name), hi - lo
            dev_text = f"{bracket.min()}/{np.median(bracket):.0f}"
        else:
            sent, seen, received = CS._pingpong(dev, rounds, 10.0, pause)
            cal, dev_text = K.estimate(sent, seen, received, name=name), "-"
        host = received - sent
        out.append(f"{method:>9} {ctas:>7} {pause:>8} {cal.uncertainty_ns:>7.1f} "
                   f"{f'{host.min()}/{np.median(host):.0f}':>24} {dev_text:>29}")
    return out


def _pair_line(i, x, y, ppm, K) -> str:
    ok = K.agree(x, y, ppm)
    return (f"{i:>4} {x.offset_ns:>20d} {x.uncertainty_ns:>7.1f} {y.offset_ns:>20d} {y.uncertainty_ns:>7.1f} "
            f"{K.apart(x, y, ppm):>11.1f} {str(ok):>6} "
            f"{'met' if ok and max(x.uncertainty_ns, y.uncertainty_ns) <= 1000 else 'NOT met':>12}")


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
    from timeline.contract import clocks as K

    both(20)
    swept = sweep(a.rounds)
    before = both(a.rounds)
    t0 = time.monotonic()
    pairs = []
    for _ in range(a.pairs):  # while the drift interval runs
        procs = [subprocess.Popen([sys.executable, __file__, "--one", "--rounds", str(a.rounds)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        got = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        pairs.append([{m: K.Calibration.from_dict(g[m]) for m in METHODS} for g in got])
    time.sleep(max(0.0, a.gap - (time.monotonic() - t0)))  # the interval the drift is measured over
    after = both(a.rounds)
    drift = {m: K.drift(before[m], after[m]) for m in METHODS}
    lines = [f"instrument.calibrate on one GPU: {a.rounds} rounds each, the intersection of their intervals "
             "(offset = device %globaltimer - host CLOCK_MONOTONIC); listen: one CTA polls the host's post; "
             "pingpong: one thread answers it; both with random pauses of up to 4 µs between rounds", *swept]
    head = (f"{'pair':>4} {'offset A ns':>20} {'± ns':>7} {'offset B ns':>20} {'± ns':>7} {'B-A at A ns':>11} "
            f"{'agree':>6} {'goal <= 1 µs':>12}")
    for m in METHODS:
        lines += [f"\n{m}: two processes at once, each its own 'rank' (one device clock: the offsets must agree), "
                  "compared at one host time along the drift measured below", head]
        lines += [_pair_line(i, x[m], y[m], drift[m].ppm, K) for i, (x, y) in enumerate(pairs)]
        d = drift[m]
        lines.append(f"{m} drift over {d.seconds:.1f} s: {d.ppm:+.3f} ppm ± {d.uncertainty_ppm:.4f} "
                     f"(offsets {before[m].offset_ns} ± {before[m].uncertainty_ns:.1f} -> "
                     f"{after[m].offset_ns} ± {after[m].uncertainty_ns:.1f} ns)")
    lines += ["\nthe two methods in one process (A: listen, B: pingpong, a few ms apart): they bound one offset",
              head.replace("goal <= 1 µs", "")]
    cross = [(p[0]["listen"], p[0]["pingpong"]) for p in pairs] + [(before["listen"], before["pingpong"]),
                                                                   (after["listen"], after["pingpong"])]
    for i, (x, y) in enumerate(cross):
        lines.append(_pair_line(i, x, y, drift["listen"].ppm, K)[:-13])
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "clocks_h200.txt").write_text(text + "\n")
        (a.out / "clocks_h200.json").write_text(json.dumps(
            {"pairs": [[{m: c.to_dict() for m, c in x.items()} for x in p] for p in pairs],
             "before": {m: c.to_dict() for m, c in before.items()},
             "after": {m: c.to_dict() for m, c in after.items()},
             "drift": {m: d._asdict() for m, d in drift.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
