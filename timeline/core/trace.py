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

from timeline.core import grouped as GR
from timeline.core import launchkey as KY
from timeline.core import rows as R
from timeline.core.rows import anomalies_table  # noqa: F401  (its home is rows; collect, legacy use it here)
from timeline.contract import schema as S
from timeline._version import __version__
from timeline.core.filemeta import Meta, TraceFileError, read_meta
from timeline.core.filemeta import refuse as _refuse
from timeline.core.checksum import CHECKSUM_DIGESTS, checksum_digest, table_checksum  # noqa: F401  (home: checksum)

ARROW_EXTENSIONS = (".arrow", ".feather", ".ipc")  # Arrow IPC file, zstd
TRACE_EXTENSIONS = ARROW_EXTENSIONS + (".parquet",)  # what save writes and viewers list


def intervals_from_tasks(tasks: pa.Table, phases) -> pa.Table:
    """One row per consecutive phase pair of every task row (``start→hint``, ...),
    grouped by pair (all ``start→hint`` rows in tasks order, then ``hint→staged``,
    ...): each group's placement columns are the tasks table's own, zero-copy where
    every row has the pair. The rule (which intervals exist, which are inherited):
    ``timeline.core.rows.phase_intervals``."""
    P = len(phases)
    names = S.interval_names(phases)
    if P < 2 or tasks.num_rows == 0:
        return R.empty(S.INTERVALS_SCHEMA)
    keep_cols = ["rank", "launch", "stage", "stage_index", "task", "cta", "wave",
                 "hw_unit", "xcc", "se", "cu", "sm"]
    base = tasks.select(keep_cols)
    dictionary = R.strings(names)
    iv = R.phase_intervals(R.phase_matrix(tasks, phases))
    parts = []
    for j in range(P - 1):
        valid = iv.valid[:, j]
        if valid.all():
            b, s, e, inh = base, iv.start[:, j], iv.end[:, j], iv.inherited[:, j]
        else:
            b = base.filter(R.arrow(valid))
            s, e, inh = iv.start[valid, j], iv.end[valid, j], iv.inherited[valid, j]
        m = len(s)
        phase = pa.DictionaryArray.from_arrays(R.arrow(np.full(m, j, np.int32)), dictionary)
        cols = [b.column(c) for c in keep_cols] + [pa.chunked_array([a]) for a in (
            phase, R.arrow(np.full(m, j, np.int16)), R.arrow(s), R.arrow(e), R.arrow(e - s), R.arrow(inh))]
        parts.append(pa.Table.from_arrays(cols, schema=S.INTERVALS_SCHEMA))
    return pa.concat_tables(parts)


class Trace:
    """The tables of a timeline build: ``tasks`` (stored), ``intervals`` (derived),
    ``anomalies`` (the collector's report), one ``Spec`` per rank, and each rank's
    origin tick (ns columns count from it, after any multi-rank alignment offset);
    ``keys``: each launch's ``LaunchKey`` where the trace was read out of a run (its
    launches renumbered), else ``launch_keys`` derives them from the slot headers."""

    def __init__(self, tasks: pa.Table, specs, anomalies: pa.Table | None = None, *,
                 origins=None, offsets=None, synthetic: bool = False, notes=(), keys=None):
        self.specs = list(specs)
        if not self.specs:
            raise ValueError("a Trace needs at least one Spec")
        phases, marks = self.specs[0].phases, self.specs[0].marks
        for sp in self.specs[1:]:
            if sp.phases != phases or sp.marks != marks:
                raise ValueError(f"ranks disagree on phases or marks: {phases} {marks} vs {sp.phases} {sp.marks}")
        want = S.tasks_schema(phases, marks)
        if not tasks.schema.remove_metadata().equals(want):
            tasks = tasks.select(want.names).cast(want)
        self.tasks = tasks.replace_schema_metadata(None)
        self.anomalies = anomalies if anomalies is not None else anomalies_table([])
        self.origins = {int(k): int(v) for k, v in (origins or {}).items()}
        self.offsets = {int(k): int(v) for k, v in (offsets or {}).items()}
        self.synthetic = bool(synthetic)
        self.notes = tuple(notes)  # what load could not check (e.g. a file without a checksum)
        self._keys = dict(keys) if keys else None

    # -- views ------------------------------------------------------------------
    @property
    def spec(self) -> S.Spec:
        """The first rank's spec (all ranks share stages and phases)."""
        return self.specs[0]

    @property
    def phases(self) -> tuple:
        return self.spec.phases

    @property
    def marks(self) -> tuple:
        return self.spec.marks

    @cached_property
    def intervals(self) -> pa.Table:
        return intervals_from_tasks(self.tasks, self.phases)

    @cached_property
    def interval_count(self) -> int:
        """``intervals.num_rows`` without building the table (a count is what a
        progress line needs; bench/run_append_profile.py times both)."""
        if "intervals" in self.__dict__ or len(self.phases) < 2 or self.tasks.num_rows == 0:
            return self.intervals.num_rows
        return int(R.phase_intervals(R.phase_matrix(self.tasks, self.phases)).valid.sum())

    @property
    def anomaly_count(self) -> int:
        """Anomaly lines that mean data is missing or doubtful (size_mismatch of an
        all-zero tail counts too: the spec and the buffer disagree); the notices
        (``NOTICE_KINDS``: what the hardware did) are not counted."""
        return sum(n for kind, n in self.anomaly_summary().items() if kind not in S.NOTICE_KINDS)

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

    @cached_property
    def launch_keys(self) -> dict:
        """``{launch: LaunchKey}``: as given (``keys``: a run's launches), else (step,
        layer) from the slot headers where one launch alone carries it, else the launch
        number (``timeline.core.launchkey``)."""
        if self._keys is not None:
            return {la: self._keys.get(la, KY.LaunchKey(slot=la)) for la in self.launches}
        named = GR.launch_headers(self.tasks)
        owners: dict = {}
        for la, k in named.items():
            owners.setdefault(k, []).append(la)
        return {la: KY.of(*k) if None not in k and len(owners[k]) == 1 else KY.LaunchKey(slot=la)
                for la, k in sorted(named.items())}

    def __repr__(self):
        return (f"Trace({self.spec.kernel!r}, ranks={len(self.specs)}, tasks={self.tasks.num_rows}, "
                f"anomalies={self.anomaly_summary() or 'none'}{', synthetic' if self.synthetic else ''})")

    def filter(self, *, ranks=None, launches=None, stages=None) -> "Trace":
        """A Trace of the rows whose rank / launch / stage is in the given lists
        (unchecked: ``timeline.core.rows.check`` a selection a user typed first)."""
        sel = R.Selection(ranks, launches, None if stages is None else list(stages))
        tasks = R.select(self.tasks, sel)
        return Trace(tasks, self.specs, self.anomalies, origins=self.origins,
                     offsets=self.offsets, synthetic=self.synthetic, notes=self.notes, keys=self._keys)

    def with_graph(self, graph) -> "Trace":
        """The same trace with its specs declaring ``graph`` (``timeline.contract.graph``),
        checked against the stages."""
        specs = [sp.replace(graph=graph) for sp in self.specs]
        return Trace(self.tasks, specs, self.anomalies, origins=self.origins, offsets=self.offsets,
                     synthetic=self.synthetic, notes=self.notes, keys=self._keys)

    def with_keys(self, keys: dict) -> "Trace":
        """The same trace naming its launches by ``keys`` (``{launch: LaunchKey}``): a
        run's launches read back and renumbered keep the keys the run knows them by."""
        return Trace(self.tasks, self.specs, self.anomalies, origins=self.origins, offsets=self.offsets,
                     synthetic=self.synthetic, notes=self.notes, keys=keys)

    def with_headers(self, headers: KY.Headers, where: str) -> "Trace":
        """The same trace with the slot headers ``headers`` says its launches had
        (``headed_tasks``); ``where`` names it in a refusal."""
        return Trace(headed_tasks(self.tasks, headers, where), self.specs, self.anomalies, origins=self.origins,
                     offsets=self.offsets, synthetic=self.synthetic, notes=self.notes)

    # -- files ------------------------------------------------------------------
    def metadata(self) -> dict:
        """The file metadata ``save`` writes, its checksum (``table_checksum``) included."""
        meta = {
            S.META_SPEC: self.spec.to_json().encode(),
            S.META_SPECS: json.dumps([sp.to_dict() for sp in self.specs]).encode(),
            S.META_ANOMALIES: json.dumps(self.anomalies.to_pylist()).encode(),
            S.META_CLOCK: json.dumps(self.spec.clock._asdict()).encode(),
            S.META_ORIGIN: json.dumps({"origins": self.origins, "offsets": self.offsets}).encode(),
            S.META_VERSION: __version__.encode(),
            S.META_LAYOUT: str(S.LAYOUT_VERSION).encode(),
            S.META_SYNTHETIC: b"1" if self.synthetic else b"0",
        }
        meta[S.META_CHECKSUM] = table_checksum(self.tasks, meta).encode()
        return meta

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


def retime(tasks: pa.Table, spec_of_rank: dict, origins: dict, offsets: dict) -> pa.Table:
    """Every ``<phase>_ns`` (and ``<mark>_ns``) column from the raw ticks: ns =
    ticks_to_ns(tick - origin of the row's rank) + offset of that rank, null where the
    tick is 0. The one home of
    that formula: merge applies it, load checks a file against it. Raises
    ``SpanError`` where a tick lies outside its rank's exact span."""
    first = spec_of_rank[next(iter(spec_of_rank))]
    of_rank = R.rank_rows(R.numpy(tasks.column("rank")), spec_of_rank)  # None: every row; a slice; a mask
    for p in first.phases + first.marks:
        tick = R.numpy(tasks.column(f"{p}_tick"))
        written = tick != 0
        ns = np.zeros(tick.shape, dtype=np.int64)
        for r, sp in spec_of_rank.items():
            sel = of_rank[r]
            if isinstance(sel, slice) and written[sel].all():  # one run of rows, every stamp written: no gather
                ns[sel] = S.ticks_to_ns(tick[sel] - origins.get(r, 0), S.table_clock(sp), inplace=True) + \
                    offsets.get(r, 0)
                continue
            sel = R.as_mask(sel, tick.size)
            m = written if sel is None else sel & written
            if m.all():  # a rank's whole table, every stamp written: no gather, no scatter, no copy
                ns = S.ticks_to_ns(tick - origins.get(r, 0), S.table_clock(sp), inplace=True)
                ns += offsets.get(r, 0)
            else:
                ns[m] = S.ticks_to_ns(tick[m] - origins.get(r, 0), S.table_clock(sp)) + offsets.get(r, 0)
        name = f"{p}_ns"
        tasks = tasks.set_column(tasks.schema.get_field_index(name), name, R.arrow(ns, mask=~written))
    return tasks


FILE_MAGIC = {b"ARROW1": "arrow", b"PAR1": "parquet"}


def headers_held(where: str) -> TraceFileError:
    """The refusal of ``--step`` for a file whose launches carry slot headers."""
    return _refuse(where, "its launches already carry slot headers, which --step would overwrite",
                   "add it without --step: its launches are keyed STEP:LAYER already (`timeline launches FILE`)")


def headed_tasks(tasks: pa.Table, headers: KY.Headers, where: str) -> pa.Table:
    """``tasks`` with the step and layer columns ``headers`` gives each launch slot
    (``KY.Headers``). Refused (``TraceFileError``) when a row already carries a header:
    the capture's own headers are never overwritten."""
    for name in ("step", "layer"):
        if tasks.column(name).null_count < tasks.num_rows:
            raise headers_held(where)
    launch = R.numpy(tasks.column("launch")).astype(np.int64)
    step, layer = headers.step_layer(launch)
    out = tasks.set_column(tasks.schema.get_field_index("step"), tasks.schema.field("step"),
                           R.arrow(np.asarray(step, dtype=np.int64)))
    return out.set_column(out.schema.get_field_index("layer"), out.schema.field("layer"),
                          R.arrow(np.asarray(layer, dtype=np.int32)))


def file_format(path) -> str | None:
    """``"arrow"`` or ``"parquet"`` by the file's first bytes (its magic), None for
    anything else: the one place a trace file is told from other files."""
    with open(path, "rb") as f:
        head = f.read(8)
    return next((fmt for magic, fmt in FILE_MAGIC.items() if head.startswith(magic)), None)


READ_ERRORS = (pa.ArrowException, OSError, ValueError, IndexError, KeyError, TypeError, OverflowError)


def damaged(where: str, e: Exception) -> TraceFileError:
    """The one line for a file Arrow or Parquet cannot decode (``READ_ERRORS``)."""
    return _refuse(f"{where} could not be read as a trace", f"it is damaged ({type(e).__name__}: "
                   f"{str(e).splitlines()[0] if str(e) else 'no detail'})",
                   "re-copy it, or re-export it from its stamp buffer")


def not_a_trace(path: Path, where: str) -> TraceFileError:
    """The one line for a file that is neither format (``file_format`` None)."""
    with open(path, "rb") as f:
        head = f.read(8)
    return TraceFileError(
        f"{where} is neither an Arrow IPC file nor a Parquet file (first bytes "
        f"{head[:8]!r}); a trace file is what Trace.save or `timeline convert` writes")


def trace_path(path) -> tuple:
    """``(Path, quoted name)`` of a trace file to read; a ``TraceFileError`` where it
    is missing, a directory or not a regular file."""
    path = Path(path)
    where = repr(str(path))
    if not path.exists():
        raise TraceFileError(f"trace file {where} does not exist")
    if path.is_dir():
        raise TraceFileError(f"{where} is a directory, not a trace file")
    if not path.is_file():
        raise TraceFileError(f"{where} is not a regular file (a FIFO or a device?); give a trace file")
    return path, where


def _read_table(path: Path, where: str) -> pa.Table:
    fmt = file_format(path)
    try:
        if fmt == "arrow":
            with pa.memory_map(str(path), "r") as src:
                table = pa.ipc.open_file(src).read_all()
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(str(path))
        else:
            raise not_a_trace(path, where)
        table.validate(full=True)  # offsets and lengths of a crafted file, before any use
    except TraceFileError:
        raise
    except READ_ERRORS as e:
        raise damaged(where, e) from None
    return table


def _conform(table: pa.Table, phases, marks, where: str) -> pa.Table:
    """The table's columns as ``tasks_schema(phases, marks)``: every column present,
    each castable without loss (a fractional time in an int column is refused), nulls
    only in ``nullable_columns``."""
    want = S.tasks_schema(phases, marks)
    for name in ("step", "layer"):  # files written before slot headers: identity unknown
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, want.field(name).type))
    missing = [n for n in want.names if n not in table.column_names]
    if missing:
        raise _refuse(where, f"it lacks the tasks columns {missing} its spec's phases {list(phases)} need")
    extra = [n for n in table.column_names if n not in want.names]
    if extra:
        raise _refuse(where, f"it holds columns {extra} its spec's phases {list(phases)} do not name")
    try:
        tasks = table.select(want.names).cast(want).replace_schema_metadata(None)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise _refuse(where, f"a column does not hold the type the format says ({str(e).splitlines()[0]})") from None
    may_lack = S.nullable_columns(phases, marks)
    holed = [n for n in want.names if n not in may_lack and tasks.column(n).null_count]
    if holed:
        raise _refuse(where, f"columns {holed} hold nulls; the format has a value in every row of them")
    return tasks


def _check_rows(tasks: pa.Table, meta: Meta, where: str, first_row: int = 0) -> None:
    """Every row names a (rank, launch, stage, task) its spec has, the stage's name
    is its index's, and every ns value is ``retime``'s from the raw ticks, exactly.
    ``first_row``: the file's row number of the table's first (a block of it)."""
    def _first_bad(mask: np.ndarray) -> str:
        return f"{int(mask.sum())} rows, the first at row {first_row + int(np.argmax(mask))}"

    spec_of = {sp.rank: sp for sp in meta.specs}
    col = {n: R.numpy(tasks.column(n)) for n in ("rank", "launch", "stage_index", "task")}
    ranks = np.array(sorted(spec_of))
    bad = col["rank"] != ranks[0] if ranks.size == 1 else ~np.isin(col["rank"], ranks)  # one rank: a compare
    if bad.any():
        raise _refuse(where, f"rank column holds ranks its specs lack ({_first_bad(bad)}; specs: {list(ranks)})")
    names = meta.specs[0].stage_names
    counts = np.array([c for _, c in meta.specs[0].stages])
    si = col["stage_index"]
    bad = (si < 0) | (si >= len(names))
    if bad.any():
        raise _refuse(where, f"stage_index outside 0..{len(names) - 1} ({_first_bad(bad)})")
    bad = (col["task"] < 0) | (col["task"] >= counts[si])
    launches = spec_of[int(ranks[0])].launches if ranks.size == 1 else \
        np.array([spec_of[int(r)].launches for r in ranks])[np.searchsorted(ranks, col["rank"])]
    bad |= (col["launch"] < 0) | (col["launch"] >= launches)
    if bad.any():
        raise _refuse(where, f"a launch or task number past its spec's slots ({_first_bad(bad)})")
    stage = tasks.column("stage")
    pos = [np.array([names.index(n) if n in names else -1 for n in c.dictionary.to_pylist()] or [-1])
           for c in stage.chunks]
    named = np.concatenate([p[R.numpy(c.indices)] for p, c in zip(pos, stage.chunks)]
                           or [np.zeros(0, int)])
    bad = named != si
    if bad.any():
        raise _refuse(where, f"stage names disagree with stage_index ({_first_bad(bad)})")
    if meta.origins is None:
        return
    try:
        want = retime(tasks, spec_of, meta.origins, meta.offsets)
    except S.SpanError as e:
        raise _refuse(where, f"its ticks cannot be put on one exact time axis ({e})") from None
    for p in meta.specs[0].phases + meta.specs[0].marks:
        if not want.column(f"{p}_ns").equals(tasks.column(f"{p}_ns")):
            raise _refuse(where, f"column {p}_ns is not the time its {p}_tick column gives "
                          "(ns = (tick - origin) at the spec's clock + offset)")


def file_notes(meta: Meta, where: str) -> list:
    """What a file's metadata leaves unchecked (``Trace.notes``): no checksum, no origins."""
    notes = []
    if meta.checksum is None:
        notes.append(f"{where} has no checksum (written before checksums): damage to it cannot be detected")
    if meta.origins is None:
        notes.append(f"{where} has no origins: its ns columns could not be checked against its ticks")
    return notes


def checksum_mismatch(where: str) -> TraceFileError:
    return _refuse(where, "its checksum does not match its contents: the file was changed or damaged "
                   "after it was written", "re-copy it, or re-export it from its stamp buffer")


def load(path) -> Trace:
    """Read a trace file (Arrow IPC or Parquet, told apart by their magic bytes) and
    check it: checksum, metadata, columns and every row against its specs. Anything
    damaged or inconsistent is one ``TraceFileError`` line; a file without a
    checksum (older releases) loads with a note in ``Trace.notes``. Whole: a file
    too large for memory streams with ``timeline.core.tracestream``."""
    path, where = trace_path(path)
    table = _read_table(path, where)
    raw = table.schema.metadata or {}
    meta = read_meta(raw, where)
    if meta.checksum is not None and \
            table_checksum(table.replace_schema_metadata(None), raw, checksum_digest(meta.checksum, where)) != meta.checksum:
        raise checksum_mismatch(where)
    tasks = _conform(table, meta.specs[0].phases, meta.specs[0].marks, where)
    _check_rows(tasks, meta, where)
    return Trace(tasks, meta.specs, meta.anomalies, origins=meta.origins, offsets=meta.offsets,
                 synthetic=meta.synthetic, notes=file_notes(meta, where))
