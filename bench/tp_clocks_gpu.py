"""Ranks on one GPU with an all-reduce stage: the calibrated merge against the truth.

    PYTHONPATH=. python3 bench/tp_clocks_gpu.py --out DIR [--world 2 --grid 32] [--captures 5]
    PYTHONPATH=. python3 bench/tp_clocks_gpu.py --out DIR --gpus 2    # a rank a GPU (not run yet)

``instrument.demo.triton_tp``: ``Y = X @ W`` with K split over ``--world`` ranks, each
rank a persistent launch of ``--grid`` CTAs on its own CUDA stream of one GPU,
``reduce`` waiting for ``part`` on every rank through mailboxes. All ranks read one
``%globaltimer``, so the skew between their traces is known exactly: their raw
ticks are on one axis. Each capture: every rank's buffer calibrated
(``StampBuffer.calibrate``, ``--rounds`` rounds) before and after one launch of all
ranks, each rank's trace collected, then

- ``merge(traces)``: aligned by the calibrations (the default), each rank's stated
  uncertainty; its error = how far a rank lands, against rank 0, from where the
  shared clock puts it, which must be within the two ranks' uncertainties summed
  (the table prints the worst rank);
- ``merge(traces, align="reduce:hint")``: the stage alignment, labelled as such,
  and its worst error the same way;
- the causality check of each merge (``cross_rank_causality`` anomalies: a reduce
  task whose wait ended before a peer's part was published, beyond the ranks'
  uncertainty).

First, after a launch of each build to compile it, the result is checked against
torch (fp32 from the fp16 inputs) on every rank, normal and timeline build, and no
wait may give up. The last capture's rank traces go to
``DIR/h200_tp<world>_rank<r>.arrow``; the printed lines and numbers to
``DIR/tp_clocks_<gpu>.txt`` / ``.json`` (``tp_clocks_w<world>_<gpu>`` for a world
other than 2). With ``--gpus N`` every rank runs on a GPU of its own (``world`` = N,
mailboxes on GPU 0 at system scope) and there is no truth: the table gives each
capture's calibrated skew, the ranks' uncertainties, the causality violations of both
merges and how far the stage alignment moves a rank from the calibrated placement
(``tp_clocks_gpus<N>_<gpu>``). That mode was written for a 2-GPU machine and has not
run: none was lent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import stamp_cost_gpu as SC  # bench/ is this script's sys.path[0]

from instrument import alloc
from instrument.demo import triton_tp as tp
from timeline.contract import clocks as K
from timeline.ingest.merge import merge

STAGE_ALIGN = "reduce:hint"


def violations(m) -> int:
    """Cross-rank causality violations a merge counted."""
    return int(m.anomaly_summary().get("cross_rank_causality", 0))


def judged(traces, truth: bool = True) -> dict:
    """One capture's ranks merged both ways: per rank past 0 the error against the
    shared clock (``truth``: the ranks are on one GPU; else ``None``) and its bound
    (rank 0's and its uncertainty), how far the stage alignment moves it from the
    calibrated placement, the violations."""
    cal, stg = merge(traces), merge(traces, align=STAGE_ALIGN)
    unc = [al.uncertainty_ns for al in K.alignment_of(cal)]
    others = range(1, len(traces))
    drift = [K.drift(*K.calibrations_of(t.spec)[:2]) for t in traces]
    return {"skew_ns": max(cal.origins.values()) - min(cal.origins.values()),
            "clocks_error_ns": [tp.shared_clock_error(cal, r) for r in others] if truth else None,
            "bound_ns": [unc[0] + unc[r] for r in others], "uncertainty_ns": unc,
            "clocks_violations": violations(cal), "stage_moves_ns": [tp.rank_shift(stg, r) - tp.rank_shift(cal, r) for r in others],
            "stage_error_ns": [tp.shared_clock_error(stg, r) for r in others] if truth else None,
            "stage_violations": violations(stg),
            "drift_ppm": [d.ppm for d in drift], "drift_uncertainty_ppm": [d.uncertainty_ppm for d in drift],
            "other_anomalies": {k: v for k, v in cal.anomaly_summary().items() if k != "cross_rank_causality"}}


def capture(model, bufs, rounds: int):
    """One calibrated capture of every rank: ``[trace of rank r]``."""
    for b in bufs:
        b.reset()
        b.calibrations.clear()
        b.calibrate(rounds)
    model.run(bufs)
    model.synchronize()
    for b in bufs:
        b.calibrate(rounds)
    return [b.collect() for b in bufs]


def prepared(s, devices, env: dict) -> tuple:
    """``(model, buffers, line, ok, errors)``: the demo on ``devices`` (``None``: one GPU),
    a stamp buffer a rank on its device, both builds checked against torch after a
    launch of each to compile it, no wait given up."""
    model = tp.TensorParallel(s, devices=devices)
    bufs = [alloc(tp.spec(s, rank=r, arch=env["arch"], extra={"captured": env}), device=model.devices[r])
            for r in range(s.world)]
    model.warm_up(bufs)
    model.run()
    e_off = model.error()
    model.poison()
    model.run(bufs)
    e_on = model.error()
    where = f" on {s.world} GPUs" if devices else ""
    line = (f"shape {tuple(s)}{where}: {s.tasks} tasks a stage a rank, {s.G} CTAs a rank; max relative error "
            f"normal {e_off:.1e}, timeline {e_on:.1e}; waits given up {model.hangs()}")
    return model, bufs, line, e_off < 1e-2 and e_on < 1e-2 and model.hangs() == 0, (e_off, e_on)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--captures", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=500, help="calibration rounds")
    ap.add_argument("--world", type=int, default=2, help="ranks (streams of the one GPU)")
    ap.add_argument("--grid", type=int, default=32, help="CTAs a rank (world x grid <= the SMs)")
    ap.add_argument("--gpus", type=int, default=0, help="a rank a GPU on this many GPUs (world = gpus)")
    a = ap.parse_args(argv)
    from gpu_run import environment

    env = environment("PYTHONPATH=. python3 bench/tp_clocks_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv))
    s = tp.TPShape(world=a.gpus or a.world, G=a.grid)
    devices = [torch.device("cuda", r) for r in range(a.gpus)] if a.gpus else None
    model, bufs, line, ok, (e_off, e_on) = prepared(s, devices, env)
    lines = [f"{k}: {v}" for k, v in env.items()] + [line]
    more, rows, traces, good = table(model, bufs, a.captures, a.rounds, truth=not a.gpus)
    lines += more
    a.out.mkdir(parents=True, exist_ok=True)
    tag = env["gpu"].split()[-1].lower()
    for r, t in enumerate(traces):
        t.save(a.out / (f"{tag}_tp{s.world}gpus_rank{r}.arrow" if a.gpus else f"h200_tp{s.world}_rank{r}.arrow"))
    lines.append(f"{'ALL OK' if ok and good else 'FAILED'}: " + (
        "no causality violation in any calibrated merge, no other anomaly" if a.gpus else
        "every calibrated merge puts every rank within its and rank 0's summed uncertainties of the shared clock, "
        "no causality violation, no other anomaly"))
    stem = (f"tp_clocks_gpus{a.gpus}_{tag}" if a.gpus else f"tp_clocks_{tag}" if s.world == 2
            else f"tp_clocks_w{s.world}_{tag}")
    SC.save(a.out, stem, lines, {"environment": env, "shape": s._asdict(), "captures": rows,
                                 "error_normal": e_off, "error_timeline": e_on})
    return 0 if ok and good else 1


def table(model, bufs, captures: int, rounds: int, truth: bool) -> tuple:
    """``(lines, rows, last traces, ok)`` of ``captures`` calibrated captures: with
    ``truth`` (ranks on one GPU) each capture's worst rank against the shared clock,
    which must lie within the ranks' summed uncertainties; without (a rank a GPU) the
    stage alignment's largest move from the calibrated placement. Both: the skew, the
    ranks' uncertainties, each merge's causality violations (none allowed in the
    calibrated one), no other anomaly."""
    if truth:
        head = f"{'skew ns':>9} {'clocks: worst error ns':>22} {'its bound':>9}"
        tail = f"{'stage: worst error ns':>21}"
    else:
        head, tail = f"{'skew ns':>12}", f"{'stage: largest move ns':>22}"
    lines = [f"{'capture':>7} {head} {'± ns (ranks)':>13} {'violations':>10} {tail} {'violations':>10}"]
    rows, ok = [], True
    for i in range(captures):
        traces = capture(model, bufs, rounds)
        row = judged(traces, truth)
        rows.append(row)
        ok &= row["clocks_violations"] == 0 and not row["other_anomalies"]
        u = row["uncertainty_ns"]
        if truth:
            ok &= all(abs(e) <= b for e, b in zip(row["clocks_error_ns"], row["bound_ns"]))
            w = max(range(len(traces) - 1), key=lambda k: abs(row["clocks_error_ns"][k]))
            first = f"{row['skew_ns']:9d} {row['clocks_error_ns'][w]:22d} {row['bound_ns'][w]:9.0f}"
            last = f"{max(row['stage_error_ns'], key=abs):21d}"
        else:
            first, last = f"{row['skew_ns']:12d}", f"{max(row['stage_moves_ns'], key=abs):22d}"
        lines.append(f"{i:7d} {first} {min(u):6.0f}-{max(u):<6.0f} {row['clocks_violations']:10d} {last} "
                     f"{row['stage_violations']:10d}")
    return lines, rows, traces, ok


if __name__ == "__main__":
    sys.exit(main())
