"""``Trace``: the Arrow tables of one or more ranks' timeline builds, their specs and
anomaly report; saving and loading (Arrow IPC or Parquet, by extension).

Only the ``tasks`` table is stored: ``intervals`` (one row per consecutive phase
pair of a task) is derived from it on load, so a file cannot hold two tables that
disagree.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline import schema as S

__version__ = "0.1.0"


ARROW_EXTENSIONS = (".arrow", ".feather", ".ipc")  # Arrow IPC file, zstd
TRACE_EXTENSIONS = ARROW_EXTENSIONS + (".parquet",)  # what save writes and viewers list


class TraceFileError(ValueError):
    """A file that is missing, not a trace, or written by an incompatible release."""


def anomalies_table(rows) -> pa.Table:
    """The anomaly report from ``(rank, kind, launch, stage, phase, count, stamps)`` tuples."""
    cols = list(zip(*rows)) if rows else [[] for _ in S.ANOMALIES_SCHEMA]
    return pa.table([pa.array(list(c), f.type) for c, f in zip(cols, S.ANOMALIES_SCHEMA)],
                    schema=S.ANOMALIES_SCHEMA)


def _column_np(tasks: pa.Table, name: str, fill) -> np.ndarray:
    col = tasks.column(name)
    return pc.fill_null(col, fill).to_numpy() if col.null_count else col.to_numpy()


def intervals_from_tasks(tasks: pa.Table, phases) -> pa.Table:
    """One row per consecutive phase pair of every task row (``start→hint``, ...),
    grouped by pair (all ``start→hint`` rows in tasks order, then ``hint→staged``,
    ...): each group's placement columns are the tasks table's own, zero-copy where
    every row has the pair.

    The mono kernels' rule for a missing mark: it inherits the previous phase's time
    (the interval into it has duration 0, the next one starts where the last
    written phase was); such intervals carry ``inherited=True``. Intervals before a
    row's first written phase, and intervals that would run backwards, are left
    out (the anomaly report counts them)."""
    P = len(phases)
    names = S.interval_names(phases)
    if P < 2 or tasks.num_rows == 0:
        return S.INTERVALS_SCHEMA.empty_table()
    keep_cols = ["rank", "launch", "stage", "stage_index", "task", "cta", "wave",
                 "hw_unit", "xcc", "se", "cu", "sm"]
    base = tasks.select(keep_cols)
    sentinel = S.NS_MISSING
    dictionary = pa.array(list(names))
    parts = []
    ns = [_column_np(tasks, f"{p}_ns", sentinel) for p in phases]
    written = [c != sentinel for c in ns]
    ff = S.inherit_missing(ns, sentinel)
    for j in range(P - 1):
        prev, end = ff[j], ff[j + 1]
        valid = (prev != sentinel) & (end >= prev)
        inherited = ~(written[j] & written[j + 1])
        if valid.all():
            b, s, e, inh = base, prev, end, inherited
        else:
            b = base.filter(pa.array(valid))
            s, e, inh = prev[valid], end[valid], inherited[valid]
        m = len(s)
        phase = pa.DictionaryArray.from_arrays(pa.array(np.full(m, j, np.int32)), dictionary)
        cols = [b.column(c) for c in keep_cols] + [
            pa.chunked_array([phase]),
            pa.chunked_array([pa.array(np.full(m, j, np.int16))]),
            pa.chunked_array([pa.array(s)]),
            pa.chunked_array([pa.array(e)]),
            pa.chunked_array([pa.array(e - s)]),
            pa.chunked_array([pa.array(inh)]),
        ]
        parts.append(pa.Table.from_arrays(cols, schema=S.INTERVALS_SCHEMA))
    return pa.concat_tables(parts)


class Trace:
    """The tables of a timeline build: ``tasks`` (stored), ``intervals`` (derived),
    ``anomalies`` (the collector's report), one ``Spec`` per rank, and each rank's
    origin tick (ns columns count from it, after any multi-rank alignment offset)."""

    def __init__(self, tasks: pa.Table, specs, anomalies: pa.Table | None = None, *,
                 origins=None, offsets=None, synthetic: bool = False):
        self.specs = list(specs)
        if not self.specs:
            raise ValueError("a Trace needs at least one Spec")
        phases = self.specs[0].phases
        for sp in self.specs[1:]:
            if sp.phases != phases:
                raise ValueError(f"ranks disagree on phases: {phases} vs {sp.phases}")
        want = S.tasks_schema(phases)
        if not tasks.schema.remove_metadata().equals(want):
            tasks = tasks.select(want.names).cast(want)
        self.tasks = tasks.replace_schema_metadata(None)
        self.anomalies = anomalies if anomalies is not None else anomalies_table([])
        self.origins = {int(k): int(v) for k, v in (origins or {}).items()}
        self.offsets = {int(k): int(v) for k, v in (offsets or {}).items()}
        self.synthetic = bool(synthetic)

    # -- views ------------------------------------------------------------------
    @property
    def spec(self) -> S.Spec:
        """The first rank's spec (all ranks share stages and phases)."""
        return self.specs[0]

    @property
    def phases(self) -> tuple:
        return self.spec.phases

    @cached_property
    def intervals(self) -> pa.Table:
        return intervals_from_tasks(self.tasks, self.phases)

    @property
    def anomaly_count(self) -> int:
        """Anomaly lines that mean data is missing or doubtful (size_mismatch of an
        all-zero tail counts too: the spec and the buffer disagree)."""
        return int(pc.sum(self.anomalies.column("count")).as_py() or 0)

    def anomaly_summary(self) -> dict:
        """``{kind: total count}`` over the report."""
        out: dict = {}
        for kind, count in zip(self.anomalies.column("kind").to_pylist(),
                               self.anomalies.column("count").to_pylist()):
            out[kind] = out.get(kind, 0) + count
        return out

    @property
    def ranks(self) -> list:
        return sorted(set(pc.unique(self.tasks.column("rank")).to_pylist()))

    @property
    def launches(self) -> list:
        return sorted(set(pc.unique(self.tasks.column("launch")).to_pylist()))

    def __repr__(self):
        return (f"Trace({self.spec.kernel!r}, ranks={len(self.specs)}, tasks={self.tasks.num_rows}, "
                f"anomalies={self.anomaly_summary() or 'none'}{', synthetic' if self.synthetic else ''})")

    def filter(self, *, ranks=None, launches=None, stages=None) -> "Trace":
        """A Trace of the rows whose rank / launch / stage is in the given lists."""
        mask = None
        for col, vals in (("rank", ranks), ("launch", launches), ("stage", stages)):
            if vals is None:
                continue
            column = self.tasks.column(col)
            if col == "stage":
                column = pc.cast(column, pa.string())
            m = pc.is_in(column, value_set=pa.array(list(vals), column.type))
            mask = m if mask is None else pc.and_(mask, m)
        tasks = self.tasks if mask is None else self.tasks.filter(mask)
        return Trace(tasks, self.specs, self.anomalies, origins=self.origins,
                     offsets=self.offsets, synthetic=self.synthetic)

    # -- files ------------------------------------------------------------------
    def metadata(self) -> dict:
        return {
            S.META_SPEC: self.spec.to_json().encode(),
            S.META_SPECS: json.dumps([sp.to_dict() for sp in self.specs]).encode(),
            S.META_ANOMALIES: json.dumps(self.anomalies.to_pylist()).encode(),
            S.META_CLOCK: json.dumps(self.spec.clock._asdict()).encode(),
            S.META_ORIGIN: json.dumps({"origins": self.origins, "offsets": self.offsets}).encode(),
            S.META_VERSION: __version__.encode(),
            S.META_LAYOUT: str(S.LAYOUT_VERSION).encode(),
            S.META_SYNTHETIC: b"1" if self.synthetic else b"0",
        }

    def save(self, path) -> Path:
        """Write the trace: ``.arrow`` / ``.feather`` / ``.ipc`` (Arrow IPC file, zstd)
        or ``.parquet`` (zstd), chosen by extension."""
        path = Path(path)
        table = self.tasks.replace_schema_metadata(self.metadata())
        ext = path.suffix.lower()
        if ext in ARROW_EXTENSIONS:
            opts = pa.ipc.IpcWriteOptions(compression="zstd")
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=opts) as w:
                w.write_table(table, max_chunksize=1 << 20)
        elif ext == ".parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, str(path), compression="zstd")
        else:
            raise TraceFileError(
                f"cannot tell the format of {str(path)!r} from its extension: use .arrow "
                "(Arrow IPC) or .parquet")
        return path


def _read_table(path: Path) -> pa.Table:
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"ARROW1"):
        with pa.memory_map(str(path), "r") as src:
            return pa.ipc.open_file(src).read_all()
    if head.startswith(b"PAR1"):
        import pyarrow.parquet as pq

        return pq.read_table(str(path))
    raise TraceFileError(
        f"{str(path)!r} is neither an Arrow IPC file nor a Parquet file (first bytes "
        f"{head[:8]!r}); a trace file is what Trace.save or `timeline convert` writes")


def load(path) -> Trace:
    """Read a trace file (Arrow IPC or Parquet, told apart by their magic bytes)."""
    path = Path(path)
    if not path.exists():
        raise TraceFileError(f"trace file {str(path)!r} does not exist")
    if path.is_dir():
        raise TraceFileError(f"{str(path)!r} is a directory, not a trace file")
    try:
        table = _read_table(path)
    except TraceFileError:
        raise
    except (pa.ArrowInvalid, OSError) as e:
        raise TraceFileError(f"{str(path)!r} could not be read as a trace: {e}") from e
    meta = table.schema.metadata or {}
    if S.META_SPEC not in meta:
        raise TraceFileError(
            f"{str(path)!r} is an Arrow/Parquet table but not a mono-timeline trace (no spec "
            "in its metadata); convert a stamp buffer with `timeline convert`")
    layout = int(meta.get(S.META_LAYOUT, b"1"))
    if layout != S.LAYOUT_VERSION:
        raise TraceFileError(
            f"{str(path)!r} was written for layout version {layout}; this release reads "
            f"{S.LAYOUT_VERSION}")
    if S.META_SPECS in meta:
        specs = [S.Spec.from_dict(d) for d in json.loads(meta[S.META_SPECS])]
    else:
        specs = [S.Spec.from_json(meta[S.META_SPEC].decode())]
    rows = json.loads(meta.get(S.META_ANOMALIES, b"[]"))
    anomalies = anomalies_table([tuple(r[f.name] for f in S.ANOMALIES_SCHEMA) for r in rows])
    org = json.loads(meta.get(S.META_ORIGIN, b"{}"))
    return Trace(table, specs, anomalies, origins=org.get("origins"), offsets=org.get("offsets"),
                 synthetic=meta.get(S.META_SYNTHETIC) == b"1")
