"""What keeping a run's captures apart costs (issue 48, docs/RUN.md "Captures"): a capture's
fingerprint, and the checks of an append (the same capture again, a launch key another
capture holds), in the in-memory ``append`` (what a capture loop calls) and the streamed
``run add`` of a trace file, each with the checks and with them switched off, taking
turns; and the read side's rule for repeated keys in ``Run.launches()``.

    PYTHONPATH=. python bench/run_appends.py [--ranks 8] [--launches 32] [--steps 6] [--repeats 7]

SYNTHETIC data (``timeline.ingest.synth``'s GLM-5 layer model). Prints each figure beside
its goal and a verdict, and the process's peak RSS."""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

GOAL_SHARE = 0.05  # the checks may add at most 5 % to an append's time


def step_trace(ranks: int, launches: int, step: int):
    """One step of ``launches`` layers on ``ranks`` ranks, slot headers (step, layer)."""
    from timeline.ingest import synth as SY

    spec = SY.glm5_spec(launches=launches, world=ranks)
    return SY.synth_trace(spec, grid=64, seed=step, slots=[(step, layer) for layer in range(launches)])


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _NoDigest:
    """A fingerprint that digests nothing (the checks switched off)."""

    def __init__(self, *a):
        pass

    def update(self, tasks):
        return self

    def hexdigest(self) -> str:
        return "fp:off"


def unchecked():
    """The checks switched off: no fingerprint digest, no refusal (the code before)."""
    from timeline.run import captures as RC

    return mock.patch.multiple(RC, fingerprint=lambda trace: "fp:off", Fingerprint=_NoDigest,
                               refusal=lambda *a, **k: None)


def side_by_side(traces, files, repeats: int, tmp: Path) -> dict:
    """Seconds of each way (checked / unchecked x memory / stream), taking turns; each
    repeat appends every step into a fresh run (the last steps' checks read a run of the
    earlier ones)."""
    from timeline.run import append
    from timeline.run.stream import append_file

    out = {k: [] for k in ("memory on", "memory off", "stream on", "stream off")}
    for i in range(repeats):
        for way in ("on", "off"):
            ctx = unchecked() if way == "off" else contextlib.nullcontext()
            with ctx:
                run = tmp / f"m{way}{i}"
                out[f"memory {way}"].append(sum(timed(lambda t=t: append(run, t, capture=f"s{k}"))
                                                for k, t in enumerate(traces)))
                run = tmp / f"s{way}{i}"
                out[f"stream {way}"].append(sum(timed(lambda f=f: append_file(run, f)) for f in files))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--launches", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    from timeline.run import captures as RC
    from timeline.run import open_run

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        traces = [step_trace(args.ranks, args.launches, s) for s in range(args.steps)]
        files = [t.save(tmp / f"step{s}.arrow") for s, t in enumerate(traces)]
        iv = sum(t.interval_count for t in traces)
        fp = statistics.median(timed(lambda: RC.fingerprint(traces[0])) for _ in range(args.repeats))
        print(f"SYNTHETIC GLM-5: {args.steps} steps x {args.launches} layers x {args.ranks} ranks, {iv:,} intervals, "
              f"{sum(t.tasks.num_rows for t in traces):,} task rows; {args.repeats} repeats, ways taking turns")
        print(f"fingerprint of one step ({traces[0].interval_count:,} intervals): {fp * 1e3:.1f} ms "
              f"({traces[0].interval_count / fp / 1e6:.0f} M intervals/s)")
        got = side_by_side(traces, files, args.repeats, tmp)
        verdicts = []
        for way in ("memory", "stream"):
            on, off = statistics.median(got[f"{way} on"]), statistics.median(got[f"{way} off"])
            share = on / off - 1
            ok = share <= GOAL_SHARE
            verdicts.append(ok)
            print(f"{way:6} append of {args.steps} steps: checked {on:.3f} s ({iv / on / 1e6:.1f} M intervals/s), "
                  f"unchecked {off:.3f} s ({iv / off / 1e6:.1f} M/s): {share:+.1%}; goal <= +{GOAL_SHARE:.0%}: "
                  f"{'met' if ok else 'NOT met'}  (runs: on {', '.join(f'{x:.3f}' for x in got[f'{way} on'])}; "
                  f"off {', '.join(f'{x:.3f}' for x in got[f'{way} off'])})")
        run = open_run(tmp / "mon0")
        t_read = statistics.median(timed(lambda: open_run(tmp / "mon0").launches()) for _ in range(args.repeats))
        raw = run._read_raw("launches")
        t_rule = statistics.median(timed(lambda: RC.repeats(raw, run.records)) for _ in range(args.repeats))
        print(f"read: Run.launches() of the {args.steps}-append run {t_read * 1e3:.1f} ms, of which the rule for "
              f"repeated keys {t_rule * 1e3:.2f} ms ({raw.num_rows:,} launches rows, none repeated)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {rss:.2f} GiB; verdict: {'met' if all(verdicts) else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
