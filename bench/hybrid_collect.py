"""The hybrid clock's decode cost: ``timeline.collect`` of one buffer's worth of tasks
as a plain build, a hybrid build whose SM clocks hold steady, and a hybrid build
whose SM clocks move from task to task (as the H200's did under the demo kernel),
side by side in one process (warm medians; the machine is noisy: the ratios are
the figure).

    python bench/hybrid_collect.py                  # 16 launches x 132 SMs x 64 tasks
    python bench/hybrid_collect.py --tasks-per-sm 16

The buffers are SYNTHETIC: tasks of 5 phases 0..300 ns apart, back to back on each
SM, cycles at 1.7 GHz (+1 MHz per SM) or, moving, a rate drawn per task from
1.6..2.0 GHz; the global clock in 32 ns steps.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from timeline import collect
from timeline.contract import schema as S

EPOCH = 1_700_000_000_000_000_000


def buffers(launches: int, sms: int, per: int, moving: bool, seed: int = 0):
    """``(plain spec, buffer, hybrid spec, buffer)`` of the same task times."""
    tasks = sms * per
    hy = S.Spec("hy", [("a", tasks)], clock="globaltimer", cycles="clock64", arch="sm_90", grid=sms,
                launches=launches)
    plain = hy.replace(cycles="")
    rng = np.random.default_rng(seed)
    rec = np.zeros((launches, tasks, hy.layout.cols), np.int64)
    prec = np.zeros((launches, tasks, plain.layout.cols), np.int64)
    t, sm = np.arange(tasks), np.arange(tasks) % sms
    for la in range(launches):
        ph = (la * 10**6 + (t // sms) * 1600)[:, None] + np.cumsum(rng.integers(0, 300, (tasks, 5)), axis=1)
        if moving:  # a rate a task: cycles accumulate task after task on each SM
            hz = rng.uniform(1.6e9, 2.0e9, tasks)
            dur = (ph[:, 4] - ph[:, 0]) + 400
            base = np.zeros(tasks)
            for s in range(sms):
                k = np.flatnonzero(sm == s)
                base[k] = np.r_[0, np.cumsum((dur[k] * hz[k] / 1e9)[:-1])]
            cyc = 10**9 + base[:, None] + (ph - ph[:, :1]) * hz[:, None] / 1e9
        else:
            cyc = 10**9 * (sm[:, None] + 1) + ph * (1.7e9 + sm * 1e6)[:, None] / 1e9
        rec[la, :, 0] = prec[la, :, 0] = S.pack_placement(t % sms, 0, sm)
        rec[la, :, 1:6] = cyc.astype(np.int64)
        rec[la, :, 6], rec[la, :, 7] = EPOCH + (ph[:, 0] // 32) * 32, EPOCH + (ph[:, 4] // 32) * 32
        prec[la, :, 1:6] = EPOCH + (ph // 32) * 32
    flat = np.concatenate([rec.reshape(-1), np.zeros(hy.layout.trailer, np.int64)])
    pflat = np.concatenate([prec.reshape(-1), np.zeros(plain.layout.trailer, np.int64)])
    return plain, pflat, hy, flat


def warm(buf, spec, reps: int = 5):
    collect(buf, spec)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        tr = collect(buf, spec)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), tr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=16)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--tasks-per-sm", type=int, default=64)
    a = ap.parse_args()
    plain, pbuf, hy, hbuf = buffers(a.launches, a.sms, a.tasks_per_sm, moving=False)
    _, _, hym, mbuf = buffers(a.launches, a.sms, a.tasks_per_sm, moving=True)
    stamps = a.launches * a.sms * a.tasks_per_sm * 5
    print(f"timeline.collect, {a.launches} launches x {a.sms} SMs x {a.tasks_per_sm} tasks x 5 phases = {stamps} "
          "stamps (SYNTHETIC), warm medians of 5")
    base = None
    for label, spec, buf in (("plain (global clock only)", plain, pbuf), ("hybrid, SM clocks steady", hy, hbuf),
                             ("hybrid, SM clocks moving", hym, mbuf)):
        dt, tr = warm(buf, spec)
        base = base or dt
        print(f"  {label:28s} {dt:7.3f} s  {stamps / dt / 1e6:7.2f} M stamps/s  {dt / base:6.1f}x the plain decode  "
              f"anomalies {tr.anomaly_summary() or 'none'}")


if __name__ == "__main__":
    main()
