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


def no_hugepage_madvise() -> bool:
    """Stop numpy from asking the kernel for transparent huge pages on large arrays.

    Where THP defrag is ``madvise`` (Debian's default), numpy's madvise can make a
    process's first large allocations stall in page compaction. bench/collect.py,
    10 M stamps, four runs on the 2-core VM: the first decode in a fresh process took
    0.49-1.04 s without it against 0.68-1.28 s with it (faster in three runs of four),
    while later decodes in the same process were slower without it (20-36 against
    36-58 M stamps/s). So only the ``timeline`` command calls it: it decodes once per
    process. Process-wide, so the library never calls it. Returns whether it could."""
    try:
        np._core.multiarray._set_madvise_hugepage(False)
    except AttributeError:  # pragma: no cover - numpy < 2 keeps it in np.core
        try:
            np.core.multiarray._set_madvise_hugepage(False)
        except AttributeError:
            return False
    return True


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

    # one transposing copy: every column contiguous (column-wise ops beat axis=1
    # reductions over P ~ 5, and Arrow takes contiguous columns without a copy)
    cols_t = np.ascontiguousarray(recs[:, : 1 + P].T)
    place = cols_t[S.PLACEMENT_COL]
    tcol = [cols_t[1 + j] for j in range(P)]
    n = recs.shape[0]

    # -- record coordinates (launch, row -> stage/task, wave), built by broadcasting --
    counts = np.array([c for _, c in spec.stages], dtype=np.int64)
    stage_of_row = np.repeat(np.arange(nst, dtype=np.int16), counts)
    task_of_row = (np.arange(lay.rows, dtype=np.int32)
                   - np.repeat(np.array(lay.first, dtype=np.int32), counts))
    shape3 = (lay.launches, lay.rows, lay.waves)

    def coord(values, axis, dtype):
        view = [1, 1, 1]
        view[axis] = -1
        return np.broadcast_to(np.asarray(values, dtype).reshape(view), shape3).reshape(-1)

    launch_of = coord(np.arange(lay.launches), 0, np.int32)
    stage_of = coord(stage_of_row, 1, np.int16)
    wave_of = coord(np.arange(lay.waves), 2, np.int16)

    written = [t != 0 for t in tcol]
    nw = np.zeros(n, dtype=np.int8)
    for w in written:
        nw += w
    has = nw > 0
    row_hi = tcol[0].copy()
    row_min = tcol[0].copy()
    for t in tcol[1:]:
        np.maximum(row_hi, t, out=row_hi)
        np.minimum(row_min, t, out=row_min)

    stage_launch_key = None

    def per_stage(kind, mask, stamps=None, phase=""):
        """Append one anomaly line per (launch, stage) where ``mask`` holds."""
        nonlocal stage_launch_key
        if not mask.any():
            return
        if stage_launch_key is None:
            stage_launch_key = launch_of.astype(np.int64) * nst + stage_of
        cnt = np.bincount(stage_launch_key[mask], minlength=lay.launches * nst)
        st = (np.bincount(stage_launch_key[mask], weights=stamps[mask], minlength=lay.launches * nst)
              if stamps is not None else np.zeros_like(cnt))
        for key in np.flatnonzero(cnt):
            anomalies.append((spec.rank, kind, int(key // nst), spec.stages[key % nst][0], phase,
                              int(cnt[key]), int(st[key])))

    per_stage("unwritten", ~has)
    keep = has.copy()

    bad_tick = has & (row_min < 0)
    per_stage("impossible_tick", bad_tick, nw)
    keep &= ~bad_tick

    version_field = S.PLACEMENT_HI_FIELDS[-1]
    version = (place >> (32 + version_field.lo)) & ((1 << version_field.width) - 1)
    bad_place = keep & (place != 0) & (version != S.LAYOUT_VERSION)
    per_stage("bad_placement", bad_place, nw)
    keep &= ~bad_place

    # -- launch windows -----------------------------------------------------------
    gap = max(1, int(window_gap_ms * 1e-3 * spec.clock.hz))
    full = nw == P
    if full.all():
        row_lo = row_min  # every tick written: the smallest is the smallest nonzero
    else:
        big = np.iinfo(np.int64).max
        row_lo = np.where(written[0], tcol[0], big)
        for w, t in zip(written[1:], tcol[1:]):
            np.minimum(row_lo, np.where(w, t, big), out=row_lo)
    outside = None
    per_launch = lay.rows * lay.waves
    for launch in range(lay.launches):
        sl = slice(launch * per_launch, (launch + 1) * per_launch)
        sel = keep[sl]
        if not sel.any():
            continue
        if windows is not None:
            lo, hi = (int(v) for v in windows[launch])
        else:
            lo, hi = int(row_lo[sl][sel].min()), int(row_hi[sl][sel].max())
            if hi - lo <= gap:
                continue
            lt = np.concatenate([t[sl][sel] for t in tcol])
            lo, hi = _cluster_window(lt[lt != 0], gap)
        out = sel & ((row_lo[sl] < lo) | (row_hi[sl] > hi))
        if out.any():
            if outside is None:
                outside = np.zeros(n, dtype=bool)
            outside[sl] |= out
    if outside is not None:
        per_stage("outside_window", outside, nw)
        keep &= ~outside

    # -- rows kept: flags --------------------------------------------------------------
    flags = np.zeros(n, dtype=np.int32)
    if not full[keep].all():
        for j, w in enumerate(written):
            miss = keep & ~w
            if miss.any():
                flags[miss] |= S.Flag.MISSING_PHASE
                per_stage("missing_phase", miss, phase=spec.phases[j])

    # the mono kernels' rule: a missing mark inherits the previous column's value
    ff = tcol if full.all() else S.inherit_missing(tcol, 0)
    for j in range(1, P):
        back = keep & written[j] & (ff[j] < ff[j - 1]) & (ff[j - 1] != 0)
        if back.any():
            flags[back] |= S.Flag.BACKWARDS
            per_stage("backwards", back, phase=spec.phases[j])

    no_place = keep & (place == 0)
    if no_place.any():
        flags[no_place] |= S.Flag.NO_PLACEMENT
        per_stage("no_placement", no_place)

    all_kept = bool(keep.all())
    k = slice(None) if all_kept else np.flatnonzero(keep)
    kplace = place[k]
    types = S.tasks_schema(spec.phases)
    fields = S.unpack_placement(kplace, spec.arch, {
        name: types.field(name).type.to_pandas_dtype() for name in S.PLACEMENT_COLUMNS})
    pmiss = no_place[k]
    if lay.waves > 1:
        mis = ~pmiss & (fields["wave"] != wave_of[k])
        if mis.any():
            kflags = flags[k]
            kflags[mis] |= S.Flag.MISPLACED
            flags[k] = kflags
            mis_full = np.zeros(n, dtype=bool)
            mis_full[np.arange(n)[k][mis]] = True
            per_stage("misplaced", mis_full)

    # -- the tasks table ---------------------------------------------------------------
    kt = [t[k] for t in tcol]
    kw = [w[k] for w in written]
    origin = int(row_lo[k].min()) if kplace.size else 0  # row_lo: each row's earliest tick
    any_pmiss = bool(pmiss.any())
    nkeep = len(kplace)

    def placed(name, dtype):
        if name not in fields:
            return pa.nulls(nkeep, pa.from_numpy_dtype(dtype))
        v = fields[name].astype(dtype, copy=False)
        return pa.array(v, mask=pmiss) if any_pmiss else pa.array(v)

    stage_dict = pa.DictionaryArray.from_arrays(
        pa.array(stage_of[k].astype(np.int32)), pa.array(list(spec.stage_names), pa.string()))
    cols = {
        "rank": pa.array(np.full(nkeep, spec.rank, np.int16)),
        "launch": pa.array(launch_of[k]),
        "stage": stage_dict,
        "stage_index": pa.array(stage_of[k]),
        "task": pa.array(coord(task_of_row, 1, np.int32)[k]),
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
        "placement": pa.array(kplace),
        "flags": pa.array(flags[k]),
    }
    for j, p in enumerate(spec.phases):
        ns = kt[j] - origin
        ns = S.ticks_to_ns(ns, spec.clock, inplace=True)
        cols[f"{p}_ns"] = pa.array(ns) if kw[j].all() else pa.array(ns, mask=~kw[j])
    for j, p in enumerate(spec.phases):
        cols[f"{p}_tick"] = pa.array(kt[j])
    tasks = pa.table(cols, schema=S.tasks_schema(spec.phases))

    report = anomalies_table(anomalies)
    if strict and report.num_rows:
        raise CollectError(_strict_message(spec, report))
    return Trace(tasks, [spec], report, origins={spec.rank: origin}, synthetic=synthetic)


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
