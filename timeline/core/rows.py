"""Rows of a trace's tables: the one home of each rule that everything reading them
applies. Which rows a selection names (``check``, ``select``: one error type, one
message), a column as numpy (``column``), a task row's phase times with what was
written (``phase_matrix``), the phase-interval rule (``phase_intervals``: a missing
phase inherits the previous one's time, ``timeline.contract.schema.inherit_missing``), a
row's extent (``extent``) and the track a row is drawn on (``tracks``: a row
without a placement word goes to its rank and launch's "unplaced" lanes, never to
a CTA's). The analyses, the exports, the intervals table, the CLI and the dashboard
call these; none restates them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.contract import schema as S
from timeline.errors import TimelineError

MISSING = S.NS_MISSING  # an unwritten phase in an ns matrix


class SelectionError(TimelineError):
    """A selection names a rank, launch or stage the trace does not have, or is not a list."""


class Selection(NamedTuple):
    """Ranks, launches (ints) and stages (names) of a trace; None: all of them."""

    ranks: list | None = None
    launches: list | None = None
    stages: list | None = None

    @property
    def everything(self) -> bool:
        return self.ranks is None and self.launches is None and self.stages is None


def brief(values, head: int = 16) -> str:
    """A list as a message shows it: whole when short, else its first ``head`` values,
    the last and how many (a selection may name millions)."""
    values = list(values)
    if len(values) <= head:
        return str(values)
    return f"[{', '.join(map(repr, values[:head]))}, ..., {values[-1]!r}] ({len(values):,} values)"


def has(what: str, present) -> str:
    """``"it has launches [0, 1]"``, or why it has none."""
    if not len(present):
        return "it has no task rows at all (every slot unwritten or dropped: see its anomaly report)"
    return f"it has {what}{'es' if what.endswith('h') else 's'} {brief(present)}"


def _checked(what: str, asked, present, cast):
    if asked is None:
        return None
    if isinstance(asked, (str, int, np.integer)):
        raise SelectionError(f"{what}s must be a list, e.g. [{asked!r}]; got {asked!r}")
    try:
        values = [cast(v) for v in asked]
    except (TypeError, ValueError):
        raise SelectionError(f"{what}s must be a list of {cast.__name__}s; got {asked!r}") from None
    missing = sorted(set(values) - set(present))
    if missing:
        raise SelectionError(f"{what} {brief(missing)} not in this trace; {has(what, present)}")
    return values


def check(trace, ranks=None, launches=None, stages=None) -> Selection:
    """The selection, each value present in ``trace`` (ranks and launches ints,
    stages names of its specs), else a ``SelectionError`` naming what it has: a typo
    never selects nothing silently."""
    names = list(dict.fromkeys(n for sp in trace.specs for n in sp.stage_names))
    return Selection(_checked("rank", ranks, trace.ranks, int), _checked("launch", launches, trace.launches, int),
                     _checked("stage", stages, names, str))


def select(table: pa.Table, sel: Selection) -> pa.Table:
    """Rows of ``table`` (tasks or intervals) in the selection (``check`` it first)."""
    mask = None
    for col, vals in (("rank", sel.ranks), ("launch", sel.launches), ("stage", sel.stages)):
        if vals is None:
            continue
        c = table.column(col)
        if pa.types.is_dictionary(c.type):
            c = pc.cast(c, c.type.value_type)
        m = pc.is_in(c, value_set=from_python(vals, c.type))
        mask = m if mask is None else pc.and_(mask, m)
    return table if mask is None else table.filter(mask)


def column(table: pa.Table, name: str, fill=MISSING, dtype=None, codes: bool = False) -> np.ndarray:
    """Column ``name`` as a numpy array, nulls replaced by ``fill``; a dictionary
    column as its values, or with ``codes`` its indices; ``dtype``: a contiguous
    array of that type."""
    col = table.column(name)
    if pa.types.is_dictionary(col.type):
        col = pa.chunked_array([c.indices for c in col.chunks], col.type.index_type) if codes \
            else pc.cast(col, col.type.value_type)
    out = numpy(filled(col, fill))
    return out if dtype is None else np.ascontiguousarray(out, dtype=dtype)


def rank_rows(rank: np.ndarray, ranks) -> dict:
    """Per rank of ``ranks``, its rows: None (every row), a slice (the rows come sorted by
    rank: one run each) or a boolean mask."""
    if rank.size and bool((rank[1:] >= rank[:-1]).all()):
        rs = list(ranks)
        lo, hi = np.searchsorted(rank, rs, "left"), np.searchsorted(rank, rs, "right")
        return {r: None if (a, b) == (0, rank.size) else slice(int(a), int(b)) for r, a, b in zip(rs, lo, hi)}
    return {r: None if rank.size and (rank == r).all() else rank == r for r in ranks}


def as_mask(rows, n: int):
    """``rank_rows``' slice as a boolean mask of ``n`` rows (None and masks as they are)."""
    if not isinstance(rows, slice):
        return rows
    m = np.zeros(n, dtype=bool)
    m[rows] = True
    return m


def phase_matrix(tasks: pa.Table, phases) -> np.ndarray:
    """``(rows, phases)`` int64 ns of the task rows, ``MISSING`` where a phase was not
    written. Column-major (each phase contiguous): a reduction over a row's few
    phases then runs along whole columns."""
    if tasks.num_rows == 0 or not len(phases):
        return np.zeros((tasks.num_rows, len(phases)), dtype=np.int64)
    return np.stack([column(tasks, f"{p}_ns", dtype=np.int64) for p in phases], axis=0).T


def inherited(ns: np.ndarray) -> np.ndarray:
    """``ns`` with every missing phase at the previous phase's time (the mono
    kernels' rule, ``schema.inherit_missing``); a missing first phase stays missing."""
    if ns.shape[1] == 0:
        return ns.copy()
    return np.stack(S.inherit_missing(list(ns.T), MISSING), axis=0).T


class PhaseIntervals(NamedTuple):
    """Per task row and consecutive phase pair j, each ``(rows, phases - 1)``: the
    interval's ``start`` and ``end`` (ns), whether it exists (``valid``) and whether
    an end point was inherited rather than written (``inherited``)."""

    start: np.ndarray
    end: np.ndarray
    valid: np.ndarray
    inherited: np.ndarray


def phase_intervals(ns: np.ndarray) -> PhaseIntervals:
    """The intervals of an ns matrix (``phase_matrix``): a missing phase inherits the
    previous one's time (the interval into it lasts 0, the next starts there, both
    ``inherited``); an interval before a row's first written phase, or one that would
    run backwards, does not exist (the anomaly report counts those)."""
    written = ns != MISSING
    ff = ns if written.all() else inherited(ns)  # read-only use: nothing to inherit, no copy
    start, end = ff[:, :-1], ff[:, 1:]
    valid = (start != MISSING) & (end >= start)
    return PhaseIntervals(start, end, valid, ~(written[:, :-1] & written[:, 1:]))


def extent(ns: np.ndarray):
    """Each row's ``(first, last)``: its earliest and latest written phase (ns);
    ``first`` is the int64 max and ``last`` ``MISSING`` for a row with none."""
    return extent_of([ns[:, j] for j in range(ns.shape[1])], ns.shape[0])


def extent_of(columns, rows: int | None = None):
    """``extent`` of an ns matrix given as one array per phase (``columns``; ``rows``
    where there are none): callers that read the phases column by column need no matrix."""
    big = np.iinfo(np.int64).max
    n = len(columns[0]) if rows is None else rows
    first, last = np.full(n, big), np.full(n, MISSING)
    for col in columns:  # phase by phase: whole columns (MISSING is the int64 minimum)
        np.maximum(last, col, out=last)
        np.minimum(first, col, out=first)
    holed = np.flatnonzero(first == MISSING)  # a row with an unwritten phase: its least written one
    if holed.size:
        sub = np.stack([col[holed] for col in columns], axis=1)
        first[holed] = np.where(sub != MISSING, sub, big).min(axis=1)
    return first, last


def interval_extent(iv: PhaseIntervals):
    """Each row's ``(first, last)``: its first interval's start and its last one's end
    (the span an export draws for the task); the int64 max and min for a row with none."""
    big = np.iinfo(np.int64).max
    return (np.where(iv.valid, iv.start, big).min(axis=1, initial=big),
            np.where(iv.valid, iv.end, -big).max(axis=1, initial=-big))


# -- tracks: where a row is drawn; rows without a placement word -----------------------------
UNPLACED = "unplaced"  # the label of the tracks (export threads, Gantt rows) of rows without a CTA
NO_CTA = -1  # a row's CTA / wave in numpy form when its placement word was missing (null in the tables)


def placed(table: pa.Table) -> np.ndarray:
    """Per row: whether it has a CTA (its placement word was read, or derived). A row
    without one (``Flag.NO_PLACEMENT``: ``cta`` and ``wave`` null) is kept by the
    collector and must be shown apart from every CTA's rows (``tracks``)."""
    col = table.column("cta")
    if not col.null_count:
        return np.ones(table.num_rows, dtype=bool)
    return numpy(pc.is_valid(col))


def lanes(group: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per row, its lane within its ``group``: the lowest-numbered lane whose rows all
    ended by the row's ``first`` (ns), taken in (first, last, row) order, so that
    rows of one lane never overlap in time (a touching end and start do not
    overlap). Interval partitioning: no more lanes than rows overlapping at one
    time. Why: a track of one export or Gantt row holds nested or disjoint spans
    only; rows without a CTA overlap freely (they ran on different CTAs). A group
    whose rows never overlap is one lane without a loop; others go row by row."""
    import heapq

    n = len(group)
    out = np.zeros(n, dtype=np.int64)
    order = np.lexsort((np.arange(n), last, first, group))
    g, f, e = group[order], first[order], np.maximum(last, first)[order]
    cuts = np.flatnonzero(g[1:] != g[:-1]) + 1
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, n].tolist()):
        if (f[lo + 1:hi] >= np.maximum.accumulate(e[lo:hi - 1])).all():
            continue  # each row starts after every earlier one ended: all on lane 0
        busy, free, count = [], [], 0
        for k in range(lo, hi):
            while busy and busy[0][0] <= f[k]:
                heapq.heappush(free, heapq.heappop(busy)[1])
            lane = heapq.heappop(free) if free else count
            count += lane == count
            heapq.heappush(busy, (int(e[k]), lane))
            out[order[k]] = lane
    return out


class Tracks(NamedTuple):
    """Per row, the track it is drawn on: ``cta`` and ``wave`` (``NO_CTA`` where the
    row has no placement) and ``lane`` (``NO_CTA`` for a placed row; else its lane
    among its rank and launch's unplaced rows, ``lanes``)."""

    cta: np.ndarray
    wave: np.ndarray
    lane: np.ndarray

    @property
    def unplaced(self) -> np.ndarray:
        return self.lane >= 0


def tracks(tasks: pa.Table, phases) -> Tracks:
    """The tracks of the task rows: a placed row on its (CTA, wave), a row without a
    placement word on an ``UNPLACED`` lane of its (rank, launch) (``lanes`` over its
    ``extent``): never on a real CTA's track, never dropped. The one rule the
    exports and the dashboard draw by."""
    cta = column(tasks, "cta", fill=NO_CTA, dtype=np.int64)
    wave = column(tasks, "wave", fill=NO_CTA, dtype=np.int64)
    lane = np.full(tasks.num_rows, NO_CTA, dtype=np.int64)
    un = ~placed(tasks)
    if un.any():
        sub = tasks.filter(arrow(un))
        first, last = extent(phase_matrix(sub, phases))
        group = column(sub, "rank", dtype=np.int64) * (1 << 32) + column(sub, "launch", dtype=np.int64)
        lane[un] = lanes(group, first, last)
        cta[un], wave[un] = NO_CTA, NO_CTA
    return Tracks(cta, wave, lane)


def track_name(cta: int, wave: int, lane: int = NO_CTA) -> str:
    """The label of a track: ``CTA c · wave w``, or ``unplaced · lane k`` for a lane of
    rows without a placement word."""
    return f"{UNPLACED} · lane {lane}" if lane >= 0 else f"CTA {cta} · wave {wave}"


# -- numpy to Arrow without pyarrow's conversion --------------------------------------------
def arrow(values, mask=None) -> pa.Array:
    """A numeric or bool numpy array as an Arrow array, null where ``mask`` is true:
    numeric data in its own buffer (no copy when contiguous), bools bit-packed. Not
    ``pa.array``: pyarrow's conversion of Python or numpy input imports pandas first
    when pandas is installed (a fifth of a second in a fresh process)."""
    a = np.ascontiguousarray(values)
    n = len(a)
    nulls = None if mask is None else np.asarray(mask, dtype=bool)
    validity = None if nulls is None or not nulls.any() else pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    count = 0 if validity is None else int(nulls.sum())
    if a.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), n, [validity, pa.py_buffer(np.packbits(a, bitorder="little"))],
                                     null_count=count)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), n, [validity, pa.py_buffer(a)], null_count=count)


def empty(schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` with no rows (``Schema.empty_table`` goes through
    ``pa.array``: see ``arrow``)."""
    return pa.Table.from_batches([], schema=schema)


def strings(items, mask=None) -> pa.Array:
    """Python strings as an Arrow ``string`` array, null where ``mask`` is true, without
    ``pa.array`` (nor ``pa.scalar``, which imports pandas too: see ``arrow``)."""
    enc = [str(s).encode() for s in items]
    offsets = np.zeros(len(enc) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in enc], out=offsets[1:])
    nulls = None if mask is None else np.asarray(mask, dtype=bool)
    validity = None if nulls is None or not nulls.any() else pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    count = 0 if validity is None else int(nulls.sum())
    return pa.Array.from_buffers(pa.string(), len(enc), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(enc))],
                                 null_count=count)


def scalar(value, type: pa.DataType) -> pa.Scalar:
    """``value`` as an Arrow scalar of ``type`` (a plain type or string), for compute
    kernels: ``pa.scalar`` and the kernels' own conversion of a Python value import
    pandas (see ``arrow``)."""
    if type == pa.string() or type == pa.large_string():
        return strings([value]).cast(type)[0]
    return arrow(np.array([value], dtype=np_dtype(type)))[0]


_NUMPY_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
                pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
                pa.float32(): np.float32, pa.float64(): np.float64}


def is_plain(t: pa.DataType) -> bool:
    """Whether ``numpy`` reads values of type ``t`` straight from their buffers: a
    fixed-width numeric type or bool."""
    return t in _NUMPY_TYPES or t == pa.bool_()


def np_dtype(t: pa.DataType) -> np.dtype:
    """The numpy dtype of a fixed-width numeric or bool Arrow type (``is_plain``;
    ``DataType.to_pandas_dtype`` imports pandas: see ``arrow``)."""
    return np.dtype(bool) if t == pa.bool_() else np.dtype(_NUMPY_TYPES[t])


def _chunk_numpy(c: pa.Array) -> np.ndarray:
    if c.type == pa.bool_():
        bits = np.frombuffer(c.buffers()[1], np.uint8)
        return np.unpackbits(bits, bitorder="little", count=c.offset + len(c))[c.offset:].astype(bool)
    return np.frombuffer(c.buffers()[1], np_dtype(c.type), count=c.offset + len(c))[c.offset:]


def numpy(values) -> np.ndarray:
    """An Arrow array or chunked array as numpy, read from its buffers (``to_numpy``
    imports pandas: see ``arrow``): numeric and bool values without nulls; floats
    with nulls as NaN. Anything else goes through ``to_numpy``. Read-only when it
    is a view of Arrow's memory."""
    if values.null_count and pa.types.is_floating(values.type):
        values = filled(values, np.nan)
    if values.null_count or not is_plain(values.type):
        return values.to_numpy(zero_copy_only=False)
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    if len(chunks) == 1:
        return _chunk_numpy(chunks[0])
    return np.concatenate([_chunk_numpy(c) for c in chunks]) if chunks else np.empty(0, np_dtype(values.type))


def filled(values, fill):
    """``values`` (an Arrow array or chunked array of a numeric or bool type) with every null
    replaced by ``fill``; ``values`` itself when it has none. Not ``pc.fill_null``
    with a Python value: that goes through ``pa.scalar`` (see ``arrow``)."""
    if not values.null_count:
        return values
    return pc.fill_null(values, arrow(np.array([fill], dtype=np_dtype(values.type)))[0])


def from_python(values, type: pa.DataType) -> pa.Array:
    """Python values (no None) as an Arrow array of ``type``: a string or a numeric
    type (``pa.array`` of a list imports pandas: see ``arrow``)."""
    if type == pa.string():
        return strings(values)
    return arrow(np.array(list(values), dtype=np_dtype(type)))


def anomalies_table(rows) -> pa.Table:
    """The anomaly report (``ANOMALIES_SCHEMA``) from ``(rank, kind, launch, stage,
    phase, count, stamps)`` tuples."""
    if not rows:
        return empty(S.ANOMALIES_SCHEMA)
    cols = list(zip(*rows))
    return pa.table([from_python(c, f.type) for c, f in zip(cols, S.ANOMALIES_SCHEMA)],
                    schema=S.ANOMALIES_SCHEMA)
