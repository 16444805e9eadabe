"""Two ranks on one GPU with an all-reduce stage: the calibrated merge against the truth.

    PYTHONPATH=. python3 bench/tp_clocks_gpu.py --out DIR [--captures 5] [--rounds 500]

``instrument.demo.triton_tp``: ``Y = X @ W`` with K split over two ranks, each rank a
persistent launch on its own CUDA stream of one GPU, ``reduce`` waiting for ``part``
on every rank through mailboxes. Both ranks read one ``%globaltimer``, so the skew
between their traces is known exactly: their raw ticks are on one axis. Each
capture: every rank's buffer calibrated (``StampBuffer.calibrate``, ``--rounds``
rounds) before and after one launch of both ranks, each rank's trace collected, then

- ``merge(traces)``: aligned by the calibrations (the default), each rank's stated
  uncertainty; its error = how far rank 1 lands from where the shared clock puts it,
  which must be within the two ranks' uncertainties summed;
- ``merge(traces, align="reduce:hint")``: the stage alignment, labelled as such,
  and its error the same way;
- the causality check of each merge (``cross_rank_causality`` anomalies: a reduce
  task whose wait ended before a peer's part was published, beyond the ranks'
  uncertainty).

First, after a launch of each build to compile it, the result is checked against
torch (fp32 from the fp16 inputs) on every rank, normal and timeline build, and no
wait may give up. The last capture's rank traces
go to ``DIR/h200_tp2_rank{0,1}.arrow``; the printed lines and numbers to
``DIR/tp_clocks_<gpu>.txt`` / ``.json``. A 2-GPU run would give the same table
without the truth column.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import stamp_cost_gpu as SC  # bench/ is this script's sys.path[0]

from instrument import alloc
from instrument import triton as itl
from instrument.demo import triton_tp as tp
from timeline import clocks as K
from timeline.merge import merge

STAGE_ALIGN = "reduce:hint"


def max_error(model: tp.TensorParallel) -> float:
    """Largest |out[r] - X @ W| over ranks and elements, relative to max |X @ W|."""
    ref = model.x.float() @ model.w.float()
    return float((model.out - ref).abs().max() / ref.abs().max())


def violations(m) -> int:
    """Cross-rank causality violations a merge counted."""
    return int(m.anomaly_summary().get("cross_rank_causality", 0))


def capture(model, bufs, rounds: int):
    """One calibrated capture of every rank: ``[trace of rank r]``."""
    for b in bufs:
        b.reset()
        b.calibrations.clear()
        b.calibrate(rounds)
    model.run(bufs)
    torch.cuda.synchronize()
    for b in bufs:
        b.calibrate(rounds)
    return [b.collect() for b in bufs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--captures", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=500, help="calibration rounds")
    a = ap.parse_args(argv)
    from gpu_run import environment

    env = environment("PYTHONPATH=. python3 bench/tp_clocks_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv))
    lines = [f"{k}: {v}" for k, v in env.items()]
    s = tp.TPShape()
    model = tp.TensorParallel(s)
    bufs = [alloc(tp.spec(s, rank=r, arch=env["arch"], extra={"captured": env})) for r in range(s.world)]
    model.run()  # compile both builds first: one kernel serves every rank
    model.run(bufs)
    torch.cuda.synchronize()
    model.err.zero_()
    model.out.fill_(float("nan"))
    model.run()
    torch.cuda.synchronize()
    e_off = max_error(model)
    model.out.fill_(float("nan"))
    model.run(bufs)
    torch.cuda.synchronize()
    e_on = max_error(model)
    ok = e_off < 1e-2 and e_on < 1e-2 and model.hangs() == 0
    lines.append(f"shape {tuple(s)}: {s.tasks} tasks a stage a rank, {s.G} CTAs a rank; max relative error "
                 f"normal {e_off:.1e}, timeline {e_on:.1e}; waits given up {model.hangs()}")
    lines.append(f"{'capture':>7} {'skew ns':>9} {'clocks: error ns':>17} {'± ns r0/r1':>13} {'violations':>10}"
                 f" {'stage: error ns':>16} {'violations':>10} {'drift ppm r0/r1':>16}")
    rows = []
    for i in range(a.captures):
        traces = capture(model, bufs, a.rounds)
        cal, stg = merge(traces), merge(traces, align=STAGE_ALIGN)
        unc = [al.uncertainty_ns for al in K.alignment_of(cal)]
        drift = [K.drift(*K.calibrations_of(t.spec)[:2]) for t in traces]
        row = {"skew_ns": cal.origins[1] - cal.origins[0], "clocks_error_ns": tp.shared_clock_error(cal),
               "uncertainty_ns": unc, "clocks_violations": violations(cal),
               "stage_error_ns": tp.shared_clock_error(stg), "stage_violations": violations(stg),
               "drift_ppm": [d.ppm for d in drift], "drift_uncertainty_ppm": [d.uncertainty_ppm for d in drift],
               "other_anomalies": {k: v for k, v in cal.anomaly_summary().items() if k != "cross_rank_causality"}}
        rows.append(row)
        ok &= row["clocks_violations"] == 0 and not row["other_anomalies"] and abs(row["clocks_error_ns"]) <= sum(unc)
        lines.append(f"{i:7d} {row['skew_ns']:9d} {row['clocks_error_ns']:17d} {unc[0]:6.0f}/{unc[1]:<6.0f} "
                     f"{row['clocks_violations']:10d} {row['stage_error_ns']:16d} {row['stage_violations']:10d} "
                     f"{drift[0].ppm:+.1f}±{drift[0].uncertainty_ppm:.1f}/{drift[1].ppm:+.1f}±{drift[1].uncertainty_ppm:.1f}")
    a.out.mkdir(parents=True, exist_ok=True)
    for r, t in enumerate(traces):
        t.save(a.out / f"h200_tp2_rank{r}.arrow")
    lines.append(f"{'ALL OK' if ok else 'FAILED'}: every calibrated merge puts rank 1 within the ranks' summed "
                 "uncertainties of the shared clock, no causality violation, no other anomaly")
    tag = env["gpu"].split()[-1].lower()
    SC.save(a.out, f"tp_clocks_{tag}", lines, {"environment": env, "shape": s._asdict(), "captures": rows,
                                              "error_normal": e_off, "error_timeline": e_on})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
