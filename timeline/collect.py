"""The collector: a stamp buffer (torch tensor, numpy array, ``.npy`` / ``.bin`` file)
plus its spec -> a ``Trace`` of Arrow tables and an anomaly report.

Contract: every stamp (nonzero tick word) of the buffer ends up either in a row of
the ``tasks`` table or in the ``stamps`` count of an anomaly; nothing that looks
like a timeline is drawn from a record the collector cannot vouch for. All work is
columnar numpy over the whole buffer; there is no per-row Python loop.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from timeline import schema as S
from timeline.trace import Trace, anomalies_table

DEFAULT_WINDOW_GAP_MS = 100.0


class CollectError(ValueError):
    """A buffer that cannot be decoded against its spec, or (strict) one with anomalies."""


def _to_numpy(buffer) -> np.ndarray:
    """The buffer as a flat int64 numpy array. Accepts a torch tensor (any device;
    copied to host), a numpy array, or a path to a ``.npy`` or raw ``.bin`` file
    of little-endian int64 words."""
    if isinstance(buffer, (str, os.PathLike)):
        path = Path(buffer)
        if not path.exists():
            raise CollectError(f"stamp buffer file {str(path)!r} does not exist")
        if path.suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
        else:
            size = path.stat().st_size
            if size % 8:
                raise CollectError(
                    f"{path}: {size} bytes is not a whole number of int64 words; a raw stamp "
                    "buffer is the kernel's int64 words as written (tensor.cpu().numpy().tofile())"
                )
            arr = np.fromfile(path, dtype="<i8")
    elif hasattr(buffer, "detach") and hasattr(buffer, "cpu"):  # torch, without importing it
        arr = buffer.detach().cpu().numpy()
    else:
        arr = np.asarray(buffer)
    if arr.dtype == np.uint64:
        arr = arr.view(np.int64)
    if arr.dtype != np.int64:
        raise CollectError(
            f"stamp buffer has dtype {arr.dtype}; the kernel writes int64 words. Allocate it "
            "with instrument.alloc(spec) (torch.int64) or pass the words viewed as int64"
        )
    return np.ascontiguousarray(arr).reshape(-1)


def _cluster_window(ticks: np.ndarray, gap: int):
    """The [lo, hi] tick window of the largest cluster of ``ticks`` (all > 0) whose
    consecutive sorted values are at most ``gap`` apart. Only called when a launch's
    span exceeds ``gap``, so the sort is paid only for suspicious buffers."""
    t = np.sort(ticks)
    cuts = np.flatnonzero(np.diff(t) > gap) + 1
    bounds = np.concatenate(([0], cuts, [t.size]))
    sizes = np.diff(bounds)
    k = int(np.argmax(sizes))
    return int(t[bounds[k]]), int(t[bounds[k + 1] - 1])


def collect(
    buffer,
    spec: S.Spec,
    *,
    strict: bool = False,
    window_gap_ms: float = DEFAULT_WINDOW_GAP_MS,
    windows=None,
    synthetic: bool = False,
) -> Trace:
    """Decode one rank's stamp buffer into a ``Trace``.

    ``window_gap_ms``: within one launch, stamps more than this far from the bulk of
    the launch's stamps (no stamp in between) are "outside the launch window" and
    dropped, e.g. stale rows of an earlier run in a buffer not reset. ``windows``:
    optional explicit ``[(lo_tick, hi_tick)]`` per launch instead. ``strict=True``
    raises ``CollectError`` on any anomaly instead of reporting it."""
    if not isinstance(spec, S.Spec):
        raise CollectError(f"collect needs a timeline.schema.Spec, got {type(spec).__name__}")
    flat = _to_numpy(buffer)
    lay = spec.layout
    if flat.size < lay.words:
        raise CollectError(
            f"stamp buffer holds {flat.size} int64 words but spec {spec.kernel!r} needs "
            f"{lay.words} (launches {lay.launches} x rows {lay.rows} x waves {lay.waves} x "
            f"cols {lay.cols}); was it allocated for another spec? Allocate it with "
            "instrument.alloc(spec), or pass the spec the kernel was built with"
        )
    P = len(spec.phases)
    nst = len(spec.stages)
    anomalies = []  # (rank, kind, launch, stage, phase, count, stamps)

    # -- words outside the layout ------------------------------------------------
    extra = flat[lay.words:]
    if extra.size:
        nz = int(np.count_nonzero(extra))
        anomalies.append((spec.rank, "size_mismatch", -1, "", "", int(extra.size), 0))
        if nz:
            anomalies.append((spec.rank, "overflow", -1, "", "past_end", nz, nz))
    recs = flat[: lay.words].reshape(-1, lay.cols)
    if lay.cols > 1 + P:
        pad_nz = int(np.count_nonzero(recs[:, 1 + P:]))
        if pad_nz:
            anomalies.append((spec.rank, "overflow", -1, "", "padding", pad_nz, pad_nz))

    place = recs[:, S.PLACEMENT_COL]
    ticks = recs[:, 1: 1 + P]
    n = recs.shape[0]

    # -- record coordinates (launch, row -> stage/task, wave) --------------------------
    counts = np.array([c for _, c in spec.stages], dtype=np.int64)
    stage_of_row = np.repeat(np.arange(nst, dtype=np.int16), counts)
    task_of_row = np.arange(lay.rows, dtype=np.int64) - np.repeat(np.array(lay.first, dtype=np.int64), counts)
    idx = np.arange(n, dtype=np.int64)
    wave_of = (idx % lay.waves).astype(np.int16)
    row_of = (idx // lay.waves) % lay.rows
    launch_of = (idx // (lay.waves * lay.rows)).astype(np.int32)
    stage_of = stage_of_row[row_of]

    written = ticks != 0
    nw = written.sum(axis=1)
    has = nw > 0
    stage_launch_key = launch_of.astype(np.int64) * nst + stage_of

    def per_stage(kind, mask, stamps=None, phase=""):
        """Append one anomaly line per (launch, stage) where ``mask`` holds."""
        if not mask.any():
            return
        cnt = np.bincount(stage_launch_key[mask], minlength=lay.launches * nst)
        st = (np.bincount(stage_launch_key[mask], weights=stamps[mask], minlength=lay.launches * nst)
              if stamps is not None else np.zeros_like(cnt))
        for key in np.flatnonzero(cnt):
            anomalies.append((spec.rank, kind, int(key // nst), spec.stages[key % nst][0], phase,
                              int(cnt[key]), int(st[key])))

    per_stage("unwritten", ~has)
    keep = has.copy()

    bad_tick = has & (ticks < 0).any(axis=1)
    per_stage("impossible_tick", bad_tick, nw)
    keep &= ~bad_tick

    fields = S.unpack_placement(place, spec.arch)
    bad_place = keep & (place != 0) & (fields["version"] != S.LAYOUT_VERSION)
    per_stage("bad_placement", bad_place, nw)
    keep &= ~bad_place

    # -- launch windows -----------------------------------------------------------
    gap = max(1, int(window_gap_ms * 1e-3 * spec.clock.hz))
    big = np.iinfo(np.int64).max
    row_lo = np.where(written, ticks, big).min(axis=1)
    row_hi = ticks.max(axis=1)
    outside = np.zeros(n, dtype=bool)
    for launch in range(lay.launches):
        sel = keep & (launch_of == launch)
        if not sel.any():
            continue
        if windows is not None:
            lo, hi = (int(v) for v in windows[launch])
        else:
            lo, hi = int(row_lo[sel].min()), int(row_hi[sel].max())
            if hi - lo <= gap:
                continue
            lt = ticks[sel]
            lo, hi = _cluster_window(lt[lt != 0], gap)
        outside |= sel & ((row_lo < lo) | (row_hi > hi))
    per_stage("outside_window", outside, nw)
    keep &= ~outside

    # -- rows kept: flags --------------------------------------------------------------
    flags = np.zeros(n, dtype=np.int32)
    missing = keep[:, None] & ~written
    flags[missing.any(axis=1)] |= S.Flag.MISSING_PHASE
    for j in np.flatnonzero(missing.any(axis=0)):
        per_stage("missing_phase", missing[:, j], phase=spec.phases[j])

    # the mono kernels' rule: a missing mark inherits the previous column's value
    ff = _ffill_zero(ticks)
    back = np.zeros_like(written)
    back[:, 1:] = keep[:, None] & written[:, 1:] & (ff[:, 1:] < ff[:, :-1]) & (ff[:, :-1] != 0)
    flags[back.any(axis=1)] |= S.Flag.BACKWARDS
    for j in np.flatnonzero(back.any(axis=0)):
        per_stage("backwards", back[:, j], phase=spec.phases[j])

    no_place = keep & (place == 0)
    flags[no_place] |= S.Flag.NO_PLACEMENT
    per_stage("no_placement", no_place)

    if lay.waves > 1:
        mis = keep & ~no_place & (fields["wave"] != wave_of)
        flags[mis] |= S.Flag.MISPLACED
        per_stage("misplaced", mis)

    # -- the tasks table ---------------------------------------------------------------
    k = np.flatnonzero(keep)
    kt = ticks[k]
    kw = written[k]
    origin = int(kt[kw].min()) if kw.any() else 0
    ns = S.ticks_to_ns(kt - origin, spec.clock)
    pmiss = no_place[k]

    def placed(name, dtype):
        v = fields[name][k].astype(dtype) if name in fields else None
        if v is None:
            return pa.nulls(k.size, pa.from_numpy_dtype(dtype))
        return pa.array(v, mask=pmiss)

    stage_dict = pa.DictionaryArray.from_arrays(
        pa.array(stage_of[k].astype(np.int32)), pa.array(list(spec.stage_names), pa.string()))
    cols = {
        "rank": pa.array(np.full(k.size, spec.rank, np.int16)),
        "launch": pa.array(launch_of[k]),
        "stage": stage_dict,
        "stage_index": pa.array(stage_of[k]),
        "task": pa.array(task_of_row[row_of[k]].astype(np.int32)),
        "slot_wave": pa.array(wave_of[k]),
        "cta": placed("cta", np.int32),
        "wave": placed("wave", np.int16),
        "xcc": placed("xcc", np.int16),
        "se": placed("se", np.int16),
        "sh": placed("sh", np.int16),
        "cu": placed("cu", np.int16),
        "simd": placed("simd", np.int16),
        "wave_slot": placed("wave_slot", np.int16),
        "sm": placed("sm", np.int16),
        "hw_unit": placed("hw_unit", np.int32),
        "placement": pa.array(place[k]),
        "flags": pa.array(flags[k]),
    }
    for j, p in enumerate(spec.phases):
        cols[f"{p}_ns"] = pa.array(ns[:, j], mask=~kw[:, j])
    for j, p in enumerate(spec.phases):
        cols[f"{p}_tick"] = pa.array(kt[:, j])
    tasks = pa.table(cols, schema=S.tasks_schema(spec.phases))

    report = anomalies_table(anomalies)
    if strict and report.num_rows:
        raise CollectError(_strict_message(spec, report))
    return Trace(tasks, [spec], report, origins={spec.rank: origin}, synthetic=synthetic)


def _ffill_zero(ticks: np.ndarray) -> np.ndarray:
    """Forward-fill zeros along each row (the inherit-previous-phase rule); leading
    zeros stay 0."""
    P = ticks.shape[1]
    colidx = np.where(ticks != 0, np.arange(P), 0)
    np.maximum.accumulate(colidx, axis=1, out=colidx)
    out = np.take_along_axis(ticks, colidx, axis=1)
    out[(ticks == 0) & (colidx == 0)] = 0  # nothing written at or before this column
    return out


def _strict_message(spec, report) -> str:
    lines = [f"stamp buffer of {spec.kernel!r} (rank {spec.rank}) has anomalies:"]
    for r in report.to_pylist():
        where = ", ".join(x for x in (
            f"launch {r['launch']}" if r["launch"] >= 0 else "",
            f"stage {r['stage']}" if r["stage"] else "",
            f"phase {r['phase']}" if r["phase"] else "") if x)
        lines.append(f"  {r['kind']}: {r['count']} ({where}) - {S.ANOMALY_KINDS[r['kind']]}")
    lines.append("re-run with strict=False (CLI: without --strict) to keep the clean rows and "
                 "see the anomalies in the report")
    return "\n".join(lines)
