"""Each instrumented launch of a trace matched to its kernel event in a framework
trace: by the kernel's name and grid, the launch's step where both sides carry
steps (the launch-slot header's step, the framework's ``ProfilerStep#N``), and the
order of time. Nothing is guessed: a count that does not add up, or two ways to
pair the steps, is an ``AttachError`` listing the candidates.

A launch's stamps are read on its rank's device clock: ``device ns = the rank's
origin tick on that clock + (ns - the rank's merge offset)`` (``launches``)."""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.contract import clocks as K
from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.errors import TimelineError

__all__ = ["AmbiguousSteps", "AttachError", "LAUNCH_SCHEMA", "Pairing", "candidates", "device_step_ns", "launches", "pair", "symbol"]


class AttachError(TimelineError):
    """Launches and a framework trace that cannot be matched or put on one clock as
    asked: no such kernel, a count mismatch, ambiguous steps, no common offset."""


class AmbiguousSteps(AttachError):
    """Several offsets between the trace's and the profiler's step counters pair every
    step's counts (``offsets``): a sampled capture of a workload whose steps all look
    alike. A calibration can choose among them (``timeline.attach.attach``)."""

    def __init__(self, message: str, offsets):
        super().__init__(message)
        self.offsets = list(offsets)


LAUNCH_SCHEMA = pa.schema([
    ("rank", pa.int16()), ("launch", pa.int32()), ("step", pa.int64()), ("layer", pa.int32()),
    ("first_ns", pa.int64()), ("last_ns", pa.int64()),  # the trace's own axis: first and last stamp
    ("device_first_ns", pa.int64()), ("device_last_ns", pa.int64()),  # the same on the device clock
])


def _stamp_columns(trace) -> list:
    return [f"{p}_ns" for p in trace.phases + trace.marks]


def launches(trace) -> pa.Table:
    """One row per (rank, launch) of ``trace``: its step and layer (null where its slot
    had no header), its first and last stamp on the trace's axis and on the device clock."""
    t = trace.tasks
    if not t.num_rows:
        return R.empty(LAUNCH_SCHEMA)
    lo, hi = R.extent(np.stack([R.column(t, c) for c in _stamp_columns(trace)], axis=1))
    rank, launch = R.numpy(t.column("rank")).astype(np.int64), R.numpy(t.column("launch")).astype(np.int64)
    key = (rank << 32) | launch
    keys, inv = np.unique(key, return_inverse=True)
    first = np.full(len(keys), np.iinfo(np.int64).max)
    last = np.full(len(keys), np.iinfo(np.int64).min)
    ok = hi != R.MISSING
    np.minimum.at(first, inv[ok], lo[ok])
    np.maximum.at(last, inv[ok], hi[ok])
    step = R.column(t, "step", fill=-1)
    layer = R.column(t, "layer", fill=-1)
    one = np.zeros(len(keys), np.int64)
    one[inv] = np.arange(len(inv))
    k_rank, k_launch = keys >> 32, keys & 0xFFFFFFFF
    spec_of = {sp.rank: sp for sp in trace.specs}
    dev0 = np.array([K.device_ns_of(trace.origins.get(int(r), 0), S.table_clock(spec_of[int(r)]))
                     - trace.offsets.get(int(r), 0) for r in k_rank], np.int64)
    st, la = step[one], layer[one]
    return pa.Table.from_arrays([
        pa.array(k_rank, pa.int16()), pa.array(k_launch, pa.int32()),
        pa.array(st, pa.int64(), mask=st < 0), pa.array(la, pa.int32(), mask=la < 0),
        pa.array(first), pa.array(last), pa.array(first + dev0), pa.array(last + dev0)], schema=LAUNCH_SCHEMA)


def device_step_ns(trace, rank: int) -> int:
    """The step of the rank's device clock as its readings show it: the greatest common
    divisor of the differences of its distinct stamps (at least 16 of them), else the
    clock's tick. A stamp read ``t`` happened in ``[t, t + step)``."""
    t = trace.tasks.filter(pc.equal(trace.tasks.column("rank"), rank))
    vals = np.concatenate([R.column(t, c) for c in _stamp_columns(trace)] or [np.zeros(0, np.int64)])
    vals = np.unique(vals[vals != R.MISSING])
    d = np.diff(vals)
    spec = next(sp for sp in trace.specs if sp.rank == rank)
    tick = max(int(round(S.tick_ns(S.table_clock(spec)))), 1)
    return max(int(np.gcd.reduce(d)), tick) if d.size >= 16 else tick


_SYMBOL = re.compile(r"^(?:void\s+)?(?:[\w:]*::)?([A-Za-z_]\w*)")


def symbol(name: str) -> str:
    """A kernel's function name as profilers print it, bare: ``void ns::foo<4>(int)``
    and ``foo`` are both ``foo``."""
    m = _SYMBOL.match(name.strip())
    return m.group(1) if m else name.strip()


def _codes(table: pa.Table, name: str):
    """A dictionary column as (its values, each row's code); -1 (the last slot) for null."""
    col = table.column(name)
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    values = col.dictionary.to_pylist()
    codes = R.numpy(R.filled(col.indices, len(values))) if len(col) else np.zeros(0, np.int64)
    return values, np.asarray(codes, np.int64)


def candidates(acts: pa.Table, kernel: str, grid: int | None, device: int | None, where: str) -> np.ndarray:
    """Rows of ``acts`` that may be the instrumented kernel: a kernel of that name
    (``symbol``), of that many CTAs where both sides know the grid, on ``device`` if given."""
    kinds, kcode = _codes(acts, "kind")
    names, ncode = _codes(acts, "name")
    want = symbol(kernel)
    is_kernel = np.array([k == "kernel" for k in kinds] + [False], bool)[kcode]
    ok = is_kernel & np.array([symbol(n) == want for n in names] + [False], bool)[ncode]
    if not ok.any():
        seen = Counter()
        for code, count in zip(*np.unique(ncode[is_kernel], return_counts=True)):
            seen[symbol(names[code])] += int(count)
        listed = ", ".join(f"{n} x{c}" for n, c in seen.most_common(6)) or "none"
        raise AttachError(f"{where} has no kernel named {want!r} (its kernels: {listed}); give the instrumented "
                          "kernel's name as the profiler shows it (--kernel NAME)")
    if device is not None:
        ok &= R.column(acts, "device", fill=-1) == device
        if not ok.any():
            raise AttachError(f"{where} has no {want!r} kernel on device {device}")
    if grid:
        g = np.stack([R.column(acts, c, fill=-1) for c in ("grid_x", "grid_y", "grid_z")], axis=1)
        known = (g >= 0).all(axis=1)
        same = np.where(known, np.prod(np.maximum(g, 1), axis=1) == grid, True)
        if (ok & known).any() and not (ok & same).any():
            grids = sorted({tuple(x) for x in g[ok & known].tolist()})[:4]
            raise AttachError(f"{where}: the {want!r} kernels ran grids {grids}, the trace's spec says {grid} CTAs: "
                              "another build or another kernel of the same name")
        ok &= same
    return np.flatnonzero(ok)


class Pairing(NamedTuple):
    """``launch_rows[i]`` (rows of ``launches``) ran as ``kernel_rows[i]`` (rows of the
    activities); ``how`` says by what (step offset, or order)."""

    launch_rows: np.ndarray
    kernel_rows: np.ndarray
    how: str


def _describe(acts: pa.Table, rows, k: int = 4) -> str:
    s = R.column(acts, "start_ns")
    shown = [f"{int(s[r]):,} ns" for r in rows[:k]]
    return f"[{', '.join(shown)}{', ...' if len(rows) > k else ''}]"


def pair(ls: pa.Table, acts: pa.Table, cand: np.ndarray, where: str, step_offset: int | None = None) -> Pairing:
    """Pair a rank's launches (``launches`` rows) with candidate kernels: within each
    step where both sides carry steps (the offset between the two step counters the
    one that makes every step's counts agree, or ``step_offset``), else over the whole
    trace; in time order (launches by their first stamp, kernels by their start)."""
    n = ls.num_rows
    lstep = R.column(ls, "step", fill=-1)
    kstep = R.column(acts, "step", fill=-1)[cand]
    by_time = np.argsort(R.column(ls, "device_first_ns"), kind="stable")
    if n and (lstep >= 0).all() and (kstep >= 0).all() and len(cand):
        return _by_steps(ls, acts, cand, lstep, kstep, where, step_offset)
    if len(cand) != n:
        raise AttachError(f"{where}: {n} instrumented launches but {len(cand)} kernel events of that name "
                          f"{_describe(acts, cand)}; without step markers on both sides (a launch-slot header's "
                          "step, the profiler's ProfilerStep#N) only equal counts can be paired: profile exactly "
                          "the captured launches, or capture with slot headers and call prof.step() each step")
    return Pairing(by_time, cand, "time order (no step markers)")


def _by_steps(ls, acts, cand, lstep, kstep, where, step_offset) -> Pairing:
    tsteps, tcount = np.unique(lstep, return_counts=True)
    kcount = Counter(kstep.tolist())
    offsets = [step_offset] if step_offset is not None else sorted({int(f) - int(tsteps[0]) for f in kcount})
    fits = [k for k in offsets if all(kcount.get(int(s) + k, 0) == int(c) for s, c in zip(tsteps, tcount))]
    if not fits:
        want = ", ".join(f"step {int(s)}: {int(c)}" for s, c in zip(tsteps[:6], tcount[:6]))
        have = ", ".join(f"#{s}: {c}" for s, c in sorted(kcount.items())[:8])
        raise AttachError(f"{where}: no pairing of the trace's steps with the profiler's: the trace has launches "
                          f"{want}; the profiler's steps hold kernels {have}"
                          + (f" (with --step-offset {step_offset})" if step_offset is not None else ""))
    if len(fits) > 1:
        raise AmbiguousSteps(f"{where}: the trace's steps {tsteps[:6].tolist()} pair with the profiler's steps at "
                             f"several offsets {fits[:6]} (every step holds the same launches): give --step-offset K "
                             "(profiler step = trace step + K), or a calibrated trace and --host-clock", fits)
    k = fits[0]
    ldev = R.column(ls, "device_first_ns")
    kst = R.column(acts, "start_ns")
    lrows, krows = [], []
    for s in tsteps.tolist():
        lr = np.flatnonzero(lstep == s)
        kr = cand[kstep == s + k]
        lrows.append(lr[np.argsort(ldev[lr], kind="stable")])
        krows.append(kr[np.argsort(kst[kr], kind="stable")])
    return Pairing(np.concatenate(lrows), np.concatenate(krows), f"steps (profiler step = trace step {k:+d}), "
                                                                 "then time order")
