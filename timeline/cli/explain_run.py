"""``timeline explain RUN``: the p99 launch of a run dataset (``timeline.run``,
/work RUN_API: ``open_run(path).launches()`` / ``.launch(step, layer)``) explained
against the launches nearest the run's median kernel time."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc

from timeline.analysis import explain as X
from timeline.core import grouped as GR
from timeline.core import rows as R

NEAREST = 5  # baseline: this many launches nearest the run's median kernel time
PERCENTILE = 99


def open_run(path: str):
    """``timeline.run.open_run(path)``; an ``ExplainError`` where this build has no run datasets."""
    try:
        from timeline.run import open_run as opener
    except ImportError:
        raise X.ExplainError(f"{path!r} is a folder, read as a run dataset, but this build has no timeline.run; "
                             "give a trace file") from None
    return opener(path)


def run_kernel_times(launches) -> tuple:
    """A run's ``launches()`` table as ``(keys, kernel ns)``: per (step, layer) (rows
    whose step is null: per (capture, launch)) its last end minus its first start
    over the ranks where they share one append's time axis, else (ranks appended
    separately, e.g. one process a GPU) its slowest rank's kernel time: times of two
    axes are not comparable; ``keys`` are ``(step, layer)`` pairs (``(capture, launch)``)."""
    step = launches.column("step")
    has = np.asarray(pc.is_valid(step))
    start, end = R.numpy(launches.column("start_ns")), R.numpy(launches.column("end_ns"))
    a = np.where(has, R.numpy(pc.fill_null(step, 0)), -1).astype(np.int64)
    b = R.numpy(pc.fill_null(launches.column("layer"), -1)).astype(np.int64)
    cap = np.unique(launches.column("capture").to_pylist(), return_inverse=True)[1].reshape(-1)
    la = R.numpy(launches.column("launch")).astype(np.int64)
    gid, n, (ka, kb, kc, kl) = GR.group_ids(a, np.where(has, b, -1), np.where(has, 0, cap), np.where(has, 0, la))
    lo, hi = GR.group_min_max(gid, n, start, end)
    appends = launches.column("append").to_pylist() if "append" in launches.column_names else [0] * gid.size
    app = np.unique(appends, return_inverse=True)[1].reshape(-1).astype(np.int64)
    a_lo, a_hi = GR.group_min_max(gid, n, app, app)
    worst = np.full(n, -1, dtype=np.int64)
    np.maximum.at(worst, gid, (end - start).astype(np.int64))
    caps = launches.column("capture").to_pylist()
    first = np.zeros(n, dtype=np.int64)
    first[gid[::-1]] = np.arange(gid.size)[::-1]
    keys = [(int(x), None if y < 0 else int(y)) if x >= 0 else (caps[int(first[k])], int(lk))
            for k, (x, y, lk) in enumerate(zip(ka, kb, kl))]
    return keys, np.where(a_lo == a_hi, hi - lo, worst).astype(np.int64)


def percentile_index(kernel_ns, q: float = PERCENTILE) -> int:
    """The index of the launch at the ``q``-th percentile of kernel time (nearest rank)."""
    order = np.argsort(kernel_ns, kind="stable")
    return int(order[max(math.ceil(q / 100 * order.size) - 1, 0)])


def explain_run(run, *, step=None, layer=None, capture=None, slot=None, nearest: int = NEAREST):
    """``(trace of the chosen launch, Typical, its launch number, its key)``: the launch
    ``step``/``layer`` (or ``capture``/``slot``, for launches without slot headers), or
    else the p99 launch, against the ``nearest`` launches nearest the median kernel
    time (the chosen one left out)."""
    keys, kernel = run_kernel_times(run.launches())
    if not keys:
        raise X.ExplainError("the run holds no launches")
    if step is not None or capture is not None:
        want, said = ((step, layer), f"--step {step} --layer {layer}") if step is not None else \
            ((capture, slot), f"--capture {capture} --slot {slot}")
        pick = [k for k, key in enumerate(keys) if key == want]
        if not pick:
            raise X.ExplainError(f"{said}: no such launch in the run; it has {R.brief(keys)}")
        at = pick[0]
    else:
        at = percentile_index(kernel)
    med = np.median(kernel)
    near = [int(k) for k in np.argsort(np.abs(kernel - med), kind="stable") if int(k) != at][:nearest]
    if not near:
        raise X.ExplainError("the run holds one launch: too few for a typical one")
    base = [open_launch(run, keys[k]) for k in near]
    typ = X.typical_of(base, np.delete(kernel, at), f"the {len(base)} launches nearest the run's median kernel "
                                                    f"time (noise over its other {kernel.size - 1} launches)")
    trace = open_launch(run, keys[at])
    return trace, typ, int(trace.launches[0]), keys[at]


def open_launch(run, key):
    """The ``Trace`` of the launch ``key``: ``(step, layer)``, or ``(capture, launch)``
    for a launch without slot headers (``Run.launch(capture=, slot=)``)."""
    if isinstance(key[0], str):
        return run.launch(capture=key[0], slot=key[1])
    return run.launch(key[0], key[1])


def explain_run_trace(args):
    """``cmd_explain``'s reading of a run folder: ``(trace, typical, [launch], the
    options that pick the launch again)``."""
    run = open_run(args.trace)
    trace, typ, launch, key = explain_run(run, step=args.step, layer=args.layer, capture=args.capture,
                                          slot=args.slot)
    if isinstance(key[0], str):
        pick = f"--capture {key[0]} --slot {key[1]}"
    else:
        pick = f"--step {key[0]}" + (f" --layer {key[1]}" if key[1] is not None else "")
    return trace, typ, [launch], pick
