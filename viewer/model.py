"""The dashboard's data model: a trace's intervals as flat numpy arrays, sorted once
into Gantt rows, and the window query every zoom runs.

Contract: nothing here holds a Python object per interval. ``TraceData`` copies the
columns of ``Trace.intervals`` into numpy arrays once per trace; ``build_view``
assigns every interval to a row for one grouping and one row filter, sorts once by
(row, start) and keeps two search keys, ``row * KEY_SPAN + start`` and
``row * KEY_SPAN + running max of end``, so that ``window`` finds the intervals
overlapping a (rows, time) rectangle with two ``searchsorted`` calls over the rows
in view instead of a scan. A row is one CTA x wave of one rank and launch; the
grouping only decides the row order and the group a row is labelled with:

- ``rank``: rank, launch, CTA, wave;
- ``cta``: rank, CTA, wave: a CTA x wave keeps one row across launches, which
  follow each other in time on it (a row is then one CTA x wave of one rank);
- ``placement``: rank, launch, hardware unit (AMD: XCC -> SE -> CU flattened;
  NVIDIA: the SM), CTA, wave;
- ``stage``: rank, launch, stage, CTA, wave (a CTA x wave row per stage it ran).

Times are integer ns from the trace origin (the ``*_ns`` columns), as the trace
stores them; figures convert to µs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.contract import schema as S
from timeline.core import rows
from timeline.core.trace import Trace
from timeline.errors import TimelineError

GROUPINGS = ("rank", "cta", "placement", "stage")
KEY_BITS = 41  # ns of trace span a search key holds: 2**41 ns ~ 36 minutes
KEY_SPAN = 1 << KEY_BITS
MAX_ROWS = 1 << (62 - KEY_BITS)  # rows a search key holds


class ViewError(TimelineError):
    """A request the data model cannot answer (unknown grouping, trace too long)."""


def _np(table: pa.Table, name: str, dtype, fill=-1) -> np.ndarray:
    """Column ``name`` as a numpy array of ``dtype``; nulls (e.g. an AMD trace's
    ``sm``, a row without placement word) become ``fill``."""
    return rows.column(table, name, fill=fill, dtype=dtype, codes=True)


class TraceData:
    """One trace's intervals as numpy columns plus its task index.

    Per interval: ``rank launch stage (index) task cta wave hw_unit xcc se cu sm
    phase (interval index) start end`` (ns) and ``tid``, the task it belongs to.
    Per task (``n_tasks`` of them): ``task_first`` (one of its intervals) and
    ``task_dur`` (µs of each of its intervals, NaN where the task has no such
    interval)."""

    def __init__(self, trace: Trace):
        iv = trace.intervals
        self.trace = trace
        self.n = iv.num_rows
        self.stage_names = tuple(trace.spec.stage_names)
        self.interval_names = tuple(S.interval_names(trace.phases))
        self.wait_index = trace.spec.wait_index  # the declared wait for producers (None: none)
        self.vendor = S.vendor_of(trace.spec.arch)
        self.rank = _np(iv, "rank", np.int16)
        self.launch = _np(iv, "launch", np.int32)
        self.stage = _np(iv, "stage_index", np.int16)
        self.task = _np(iv, "task", np.int32)
        self.cta = _np(iv, "cta", np.int32)
        self.wave = _np(iv, "wave", np.int16)
        self.hw_unit = _np(iv, "hw_unit", np.int32)
        self.xcc = _np(iv, "xcc", np.int16)
        self.se = _np(iv, "se", np.int16)
        self.cu = _np(iv, "cu", np.int16)
        self.sm = _np(iv, "sm", np.int16)
        self.phase = _np(iv, "phase_index", np.int16)
        self.start = _np(iv, "start_ns", np.int64, 0)
        self.end = _np(iv, "end_ns", np.int64, 0)
        self.multi_wave = bool(self.n and self.wave.max() > 0)  # rows say "w1" only if waves differ
        self.ranks = np.unique(self.rank).tolist()
        self.launches = np.unique(self.launch).tolist()
        self.launch_keys = trace.launch_keys  # {launch: LaunchKey}: how every command names a launch
        self.t_min = int(self.start.min()) if self.n else 0
        self.t_max = int(self.end.max()) if self.n else 0
        if self.t_max - self.t_min >= KEY_SPAN:
            raise ViewError(
                f"the trace spans {(self.t_max - self.t_min) / 1e9:.0f} s; the viewer's search "
                f"keys hold {KEY_SPAN / 1e9:.0f} s. Split the trace by launch (Trace.filter) first")
        self._index_tasks()
        self._unplaced_lanes()
        self._task_marks(trace)

    @property
    def keyed(self) -> bool:
        """Whether some launch is named by more than its number (a slot header's
        ``STEP:LAYER``, a run's ``CAPTURE:SLOT``)."""
        return any(k.headed or k.capture is not None for k in self.launch_keys.values())

    def launch_text(self, launch: int) -> str:
        """Launch ``launch`` as a row label names it: its key (``4:3``, ``s5i.arrow:40``),
        ``L3`` for a trace file's launch known by its number alone."""
        k = self.launch_keys.get(int(launch))
        return f"L{launch}" if k is None or not (k.headed or k.capture is not None) else str(k)

    def _unplaced_lanes(self):
        """``lane`` per interval: ``rows.NO_CTA`` for a placed one; else the lane of
        its task among its rank and launch's tasks without a placement word
        (``timeline.core.rows.lanes`` over the tasks' spans), its own Gantt row, never a
        CTA's (the rule the exports draw by, ``timeline.core.rows.tracks``)."""
        self.lane = np.full(self.n, rows.NO_CTA, np.int64)
        un = self.cta < 0
        if not un.any():
            return
        t_first = np.full(self.n_tasks, np.iinfo(np.int64).max, np.int64)
        t_last = np.full(self.n_tasks, np.iinfo(np.int64).min, np.int64)
        np.minimum.at(t_first, self.tid[un], self.start[un])
        np.maximum.at(t_last, self.tid[un], self.end[un])
        t_un = np.unique(self.tid[un])
        rep = self.task_first[t_un]
        group = self.rank[rep].astype(np.int64) * (1 << 32) + self.launch[rep]
        lane = np.full(self.n_tasks, rows.NO_CTA, np.int64)
        lane[t_un] = rows.lanes(group, t_first[t_un], t_last[t_un])
        self.lane[un] = lane[self.tid[un]]

    def _task_marks(self, trace: Trace):
        """``task_marks`` ``(n_tasks, marks)``: each task's mark times (ns, ``NS_MISSING``
        where unwritten), found by the task's key in the tasks table."""
        self.mark_names = tuple(trace.marks)
        self.task_marks = np.full((self.n_tasks, len(self.mark_names)), S.NS_MISSING, np.int64)
        if not self.mark_names or not self.n_tasks:
            return
        t = trace.tasks
        kt = [_np(t, c, dt) for c, dt in (("rank", np.int16), ("launch", np.int32), ("stage_index", np.int16),
                                          ("task", np.int32), ("cta", np.int32), ("wave", np.int16))]
        ki = [self.rank, self.launch, self.stage, self.task, self.cta, self.wave]
        both = _pack([np.concatenate((a, b)) for a, b in zip(ki, kt)])  # one radix for both sides
        keys = both[: self.n][self.task_first]  # sorted: task ids number the keys in order
        pos = np.searchsorted(keys, both[self.n:])
        hit = (pos < keys.size) & (keys[np.minimum(pos, keys.size - 1)] == both[self.n:])
        for k, name in enumerate(self.mark_names):
            v = _np(t, f"{name}_ns", np.int64, S.NS_MISSING)
            self.task_marks[pos[hit], k] = v[hit]

    @property
    def n_classes(self) -> int:
        """Stage x interval combinations: an interval's class is ``stage * I + phase``."""
        return len(self.stage_names) * max(len(self.interval_names), 1)

    def classes(self, idx=slice(None)) -> np.ndarray:
        return self.stage[idx].astype(np.int32) * max(len(self.interval_names), 1) + self.phase[idx]

    def _index_tasks(self):
        """Number the tasks: one per distinct (rank, launch, stage, task, CTA, wave),
        numbered in that order (``Trace.intervals`` does not promise an order)."""
        n_i = len(self.interval_names)
        if self.n == 0:
            self.tid = np.zeros(0, np.int32)
            self.task_first = np.zeros(0, np.int64)
            self.task_dur = np.zeros((0, n_i), np.float32)
            self.n_tasks = 0
            return
        key = _pack([self.rank, self.launch, self.stage, self.task, self.cta, self.wave])
        uniq, first, tid = np.unique(key, return_index=True, return_inverse=True)
        self.n_tasks = int(uniq.size)
        self.task_first = first
        self.tid = tid.astype(np.int32).reshape(-1)
        dur = np.full((self.n_tasks, n_i), np.nan, dtype=np.float32)
        dur[self.tid, self.phase] = (self.end - self.start) / 1e3
        self.task_dur = dur

    def task_intervals(self, tid: int) -> np.ndarray:
        """Interval indices of task ``tid``, in interval (phase) order."""
        idx = np.flatnonzero(self.tid == tid)
        return idx[np.argsort(self.phase[idx], kind="stable")]


class View(NamedTuple):
    """The intervals of one grouping and row filter, sorted by (row, start).

    Sorted position ``i`` holds interval ``order[i]`` in row ``row[i]``; row ``r``
    spans positions ``row_start[r]:row_start[r + 1]``. ``skey``/``ekey`` are the
    search keys (module docstring). Per row: ``rows`` holds ``rank launch group
    cta wave``, where ``group`` is the value of the grouping's middle key (hardware
    unit or stage index; -1 for ``rank``) and ``group_id`` numbers the groups
    (rank, launch[, middle key]) in row order, for labels and separators."""

    grouping: str
    order: np.ndarray
    row: np.ndarray
    skey: np.ndarray
    ekey: np.ndarray
    cls: np.ndarray
    row_start: np.ndarray
    rows: dict
    group_id: np.ndarray
    t_first: int = 0  # first start and last end (ns) of the view's intervals
    t_last: int = 0

    @property
    def n_rows(self) -> int:
        return int(self.row_start.size - 1)

    @property
    def n(self) -> int:
        return int(self.order.size)


def _pack(cols) -> np.ndarray:
    """Columns of small non-negative-after-shift ints -> one int64 sort key that
    orders like the tuple of columns (mixed radix, each radix its column's range)."""
    key = np.zeros(cols[0].size, dtype=np.int64)
    for c in cols:
        c = c.astype(np.int64)
        lo = int(c.min()) if c.size else 0
        span = (int(c.max()) - lo + 1) if c.size else 1
        key = key * span + (c - lo)
    return key


def _row_time_order(code: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """The stable permutation that sorts by (``code``, ``rel``), both non-negative
    int64: one stable argsort of the two packed into one int64 when their bits fit
    (timsort: fast on the long presorted runs of trace order, where ``np.lexsort``
    sorts from scratch), else ``np.lexsort``."""
    if code.size == 0:
        return np.zeros(0, np.int64)
    rel_bits = int(rel.max()).bit_length()
    if int(code.max()).bit_length() + rel_bits <= 63:
        return np.argsort((code << rel_bits) | rel, kind="stable")
    return np.lexsort((rel, code))


def build_view(data: TraceData, grouping: str = "rank", *, ranks=None, launches=None,
               ctas=None, stages=None) -> View:
    """Rows for ``grouping`` over the intervals whose rank / launch / stage (index) is
    in the given lists and whose CTA lies in ``ctas = (lo, hi)`` (inclusive);
    ``None`` keeps all. One sort of the kept intervals, O(n log n)."""
    if grouping not in GROUPINGS:
        raise ViewError(f"unknown row grouping {grouping!r}; choose one of {list(GROUPINGS)}")
    keep = np.ones(data.n, dtype=bool)
    for arr, vals in ((data.rank, ranks), (data.launch, launches), (data.stage, stages)):
        if vals is not None:
            keep &= np.isin(arr, np.asarray(list(vals), dtype=arr.dtype))
    if ctas is not None:  # a CTA range: rows without a CTA are in none
        lo, hi = ctas
        keep &= (data.cta >= lo) & (data.cta <= hi) & (data.lane < 0)
    idx = np.flatnonzero(keep)
    mid_all = {"rank": None, "cta": None, "placement": data.hw_unit, "stage": data.stage}[grouping]
    launch_all = None if grouping == "cta" else data.launch
    cols = [data.rank[idx]]
    if launch_all is not None:
        cols.append(launch_all[idx])
    if mid_all is not None:
        cols.append(mid_all[idx])
    cols += [data.lane[idx], data.cta[idx], data.wave[idx]]  # a group's unplaced lanes after its CTAs
    if idx.size == 0:
        empty = np.zeros(0, np.int64)
        return View(grouping, empty, empty.astype(np.int32), empty, empty, empty.astype(np.int32),
                    np.zeros(1, np.int64), {k: empty for k in ("rank", "launch", "group", "cta", "wave", "lane")},
                    empty)
    code = _pack(cols)
    rel = data.start[idx] - data.t_min
    perm = _row_time_order(code, rel)
    code = code[perm]
    order = idx[perm]
    boundary = np.flatnonzero(code[1:] != code[:-1]) + 1
    row_start = np.concatenate(([0], boundary, [code.size])).astype(np.int64)
    n_rows = row_start.size - 1
    if n_rows >= MAX_ROWS:
        raise ViewError(f"{n_rows} rows exceed the viewer's {MAX_ROWS}; filter ranks or launches")
    row = np.repeat(np.arange(n_rows, dtype=np.int32), np.diff(row_start))
    base = row.astype(np.int64) << KEY_BITS
    skey = base + rel[perm]
    ekey = np.maximum.accumulate(base + (data.end[order] - data.t_min))
    first = order[row_start[:-1]]
    rows = {
        "rank": data.rank[first],
        "launch": data.launch[first] if launch_all is not None else np.full(n_rows, -1, np.int32),
        "group": mid_all[first] if mid_all is not None else np.full(n_rows, -1, np.int32),
        "cta": data.cta[first],
        "wave": data.wave[first],
        "lane": data.lane[first],
    }
    g = _pack([rows["rank"], rows["launch"], rows["group"]])
    group_id = np.concatenate(([0], np.cumsum(g[1:] != g[:-1]))).astype(np.int32)
    # compact dtypes: a view costs 4 + 4 + 8 + 8 + 2 = 26 bytes per interval
    order = order.astype(np.int32) if data.n < (1 << 31) else order
    cls = data.classes(order).astype(np.int16 if data.n_classes < (1 << 15) else np.int32)
    t_first = int(data.start[order].min())
    return View(grouping, order, row, skey, ekey, cls, row_start, rows, group_id,
                t_first, int(data.end[order].max()))


def window(view: View, r0: int, r1: int, t0_ns: int, t1_ns: int, t_min: int,
           class_ok: np.ndarray | None = None) -> np.ndarray:
    """Sorted positions of the intervals in rows ``[r0, r1)`` that overlap
    ``[t0_ns, t1_ns]`` (ns from the trace origin; ``t_min`` is the data's
    ``t_min``) and whose class passes ``class_ok`` (a bool per class), in (row,
    start) order. Two ``searchsorted`` over the rows in view, then one gather."""
    r0 = max(int(r0), 0)
    r1 = min(int(r1), view.n_rows)
    if r1 <= r0 or t1_ns < t0_ns:
        return np.zeros(0, np.int64)
    rows = np.arange(r0, r1, dtype=np.int64) << KEY_BITS
    lo_t = min(max(int(t0_ns) - t_min, 0), KEY_SPAN - 1)
    hi_t = int(t1_ns) - t_min
    if hi_t < 0:
        return np.zeros(0, np.int64)
    hi_t = min(hi_t, KEY_SPAN - 1)
    a = view.row_start[r0]
    b = view.row_start[r1]
    lo = np.searchsorted(view.ekey[a:b], rows + lo_t, side="left") + a
    hi = np.searchsorted(view.skey[a:b], rows + hi_t, side="right") + a
    pos = _ranges(lo, hi)
    if class_ok is not None and pos.size:
        pos = pos[class_ok[view.cls[pos]]]
    return pos


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(lo[k], hi[k])`` for all k with hi > lo, vectorized."""
    cnt = np.maximum(hi - lo, 0)
    total = int(cnt.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    nz = cnt > 0
    lo, cnt = lo[nz], cnt[nz]
    step = np.ones(total, dtype=np.int64)
    heads = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    step[0] = lo[0]
    step[heads[1:]] = lo[1:] - (lo[:-1] + cnt[:-1] - 1)
    return np.cumsum(step)


def class_mask(data: TraceData, stages=None, phases=None) -> np.ndarray:
    """A bool per class: its stage index is in ``stages`` and its interval index in
    ``phases`` (``None`` keeps all)."""
    n_i = max(len(data.interval_names), 1)
    ok_s = np.ones(len(data.stage_names), dtype=bool)
    ok_p = np.ones(n_i, dtype=bool)
    if stages is not None:
        ok_s[:] = False
        ok_s[[int(s) for s in stages]] = True
    if phases is not None:
        ok_p[:] = False
        ok_p[[int(p) for p in phases]] = True
    return (ok_s[:, None] & ok_p[None, :]).reshape(-1)


def placement_text(vendor: str, xcc, se, cu, sm) -> str:
    """The hardware place of a CTA as users name it: ``XCC x SE y CU z`` (AMD) or
    ``SM n`` (NVIDIA); ``?`` when the placement word was missing (-1)."""
    if vendor == "nvidia":
        return f"SM {sm}" if sm >= 0 else "SM ?"
    if min(xcc, se, cu) < 0:
        return "XCC ? CU ?"
    return f"XCC {xcc} SE {se} CU {cu}"


def group_label(data: TraceData, view: View, r: int) -> str:
    """The label of row ``r``'s group: ``r0 4:3`` (rank, launch key; ``r0 L1`` for a
    launch known by its number alone) plus the hardware unit or stage of the grouping;
    ``r0`` alone when launches share rows."""
    rk, la, g = (int(view.rows[k][r]) for k in ("rank", "launch", "group"))
    head = f"r{rk}" if view.grouping == "cta" else f"r{rk} {data.launch_text(la)}"
    if view.grouping == "stage":
        return f"{head} · {data.stage_names[g] if 0 <= g < len(data.stage_names) else g}"
    if view.grouping == "placement":
        i = int(view.order[view.row_start[r]])
        return f"{head} · {placement_text(data.vendor, data.xcc[i], data.se[i], data.cu[i], data.sm[i])}"
    return head


def cta_label(data: TraceData, view: View, r: int) -> str:
    """``cta 5 w2`` (``cta 5`` when the trace has one stamping wave per task), or
    ``unplaced · lane k`` for a row of tasks without a placement word."""
    lane = int(view.rows["lane"][r])
    if lane >= 0:
        return rows.track_name(rows.NO_CTA, rows.NO_CTA, lane)
    wave = f" w{int(view.rows['wave'][r])}" if data.multi_wave else ""
    return f"cta {int(view.rows['cta'][r])}{wave}"


def row_label(data: TraceData, view: View, r: int) -> str:
    """The label of one row: its group, CTA and wave."""
    return f"{group_label(data, view, r)} · {cta_label(data, view, r)}"
