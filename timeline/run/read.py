"""Reading a run: ``open_run`` -> ``Run``, whose ``launches()`` / ``stages()`` read the
small per-append parts only, ``launch()`` one launch's task rows back into today's
in-memory ``Trace``, and ``sql()`` DuckDB over the whole dataset (``timeline.run.views``).
Only committed parts are read (those a manifest record names); each is checked against
its record (size at open, checksum before its rows are used)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.run import captures as RC
from timeline.run import layout as RL
from timeline.run import write as RW

KEY_COLUMNS = ("rank", "stage", "step", "layer", "capture", "launch", "append")  # a row's key: read with any columns

ON_DAMAGE = ("raise", "skip")


class Run:
    """A run directory opened for reading (``open_run``): its build, committed appends,
    the parts left out as damaged (``damaged``: ``[(path, why)]``, with
    ``on_damage="skip"``) and the readers below."""

    def __init__(self, path: Path, build: dict | None, records: list, damaged: list, on_damage: str):
        self.path, self.build, self.records = path, build, records
        self.damaged, self.on_damage = damaged, on_damage
        self._verified: set = set()
        self._small: dict = {}
        self._raw: dict = {}
        self._repeated: dict | None = None
        self._named: dict | None = None
        self._con = None

    # -- the build ------------------------------------------------------------------
    @property
    def phases(self) -> tuple:
        return tuple(self.build["phases"]) if self.build else S.DEFAULT_PHASES

    @property
    def marks(self) -> tuple:
        return tuple(self.build.get("marks", ())) if self.build else ()

    def parts(self, table: str) -> list:
        """``[(record, entry)]`` of the committed, undamaged parts of ``table``."""
        bad = {p for p, _ in self.damaged}
        return [(rec, e) for rec in self.records for e in rec["parts"] if e["table"] == table and e["path"] not in bad]

    def verified(self, entry: dict) -> bool:
        """Whether a part's bytes are the ones its record names (the checksum, once per
        Run); a damaged part raises ``RunError`` naming it, or with ``on_damage="skip"``
        joins ``damaged`` and is left out (False)."""
        if entry["path"] in self._verified:
            return True
        why = RL.check_part(self.path, entry, full=True)
        if why is None:
            self._verified.add(entry["path"])
            return True
        return self._damaged(entry["path"], why)

    def _damaged(self, path: str, why: str) -> bool:
        if self.on_damage == "raise":
            raise RL.RunError(f"run {str(self.path)!r}: part {path} is refused: {why}; open the run with "
                             "on_damage='skip' (CLI: --skip-damaged) to read the rest, or re-add its trace")
        self.damaged.append((path, why))
        self._con = None  # views name files: rebuild them without it
        return False

    def _read_raw(self, table: str, columns: tuple | None = None) -> pa.Table:
        """Every committed part of a small table (launches, stages, anomalies), concatenated,
        as stored (``columns``: those alone)."""
        if (table, columns) in self._raw:
            return self._raw[(table, columns)]
        tables = [RL.read_parquet(self.path / e["path"], columns=columns) for _, e in self.parts(table)
                  if self.verified(e)]
        tables = [t for t in tables if t.num_rows] or tables[:1]
        out = pa.concat_tables(tables, promote_options="permissive") if tables else None
        if table == "launches":
            from timeline.run import report as RP

            out = RP.with_host_starts(RL.empty_launches() if out is None else out, self.records)
        self._raw[(table, columns)] = out
        return out

    @property
    def repeated(self) -> dict:
        """``{append: (launch key, earlier append)}``: appends that repeat an earlier
        append's launch key (a run written before appends were checked), each read as a
        capture of its own (``captures.repeats``; ``run info --verify`` names them)."""
        if self._repeated is None:
            self._repeated = RC.repeats(self._read_raw("launches"), self.records)
        return self._repeated

    @property
    def named(self) -> dict:
        """``{append: capture name}`` of the appends whose launches are keyed
        ``NAME:SLOT``: added ``as_capture``, or ``repeated`` (``captures.names``)."""
        if self._named is None:
            self._named = RC.names(self.records, self.repeated)
        return self._named

    def _read_small(self, table: str, columns: tuple | None = None) -> pa.Table:
        """A small table as read: the rows of ``named`` appends keyed by their capture
        (``columns``: those and the ``KEY_COLUMNS`` alone)."""
        at = (table, None if columns is None else tuple(sorted({*columns, *KEY_COLUMNS})))
        if at not in self._small:
            self._small[at] = RC.rekeyed(self._read_raw(*at), self.named)
        return self._small[at]

    # -- small tables -----------------------------------------------------------------
    def launches(self, *, rank=None, step=None, layer=None) -> pa.Table:
        """One row per (rank, launch) of every append (``layout.LAUNCH_COLUMNS``: rank, step,
        layer, capture, launch slot, start/end/kernel ns on the append's time axis,
        tasks, task rows, intervals, anomalies, append id; then ``report.PLACED_COLUMNS``:
        the start on the host clock by the append's calibration of the rank, ± ns, null
        without one, and the start's ± ns on its append's axis), selected by rank / step
        / layer (an int or a list each), in (step, layer, rank, capture, launch) order.
        Reads the per-append launch parts and manifest records only, never a task row;
        sorted once a run (each launch read asks for it)."""
        t = self._small.get(("launches", "sorted"))
        if t is None:
            t = self._small[("launches", "sorted")] = self._read_small("launches").sort_by(
                [("step", "ascending"), ("layer", "ascending"), ("rank", "ascending"), ("capture", "ascending"),
                 ("launch", "ascending")])
        return _select(t, rank=rank, step=step, layer=layer)  # a stable sort: the same rows in the same order

    def stages(self, *, rank=None, step=None, layer=None, columns=None) -> pa.Table | None:
        """The per-launch stage report of every launch (one row per (rank, launch,
        stage): ``analysis.stage_report(by_launch=True)``'s columns with interval
        p50 / p90 / p99, keyed by step, layer, capture and append; ``columns``: those and
        the ``KEY_COLUMNS`` alone, where a caller needs few); None in an empty run."""
        t = self._read_small("stages", None if columns is None else tuple(columns))
        return None if t is None else _select(t, rank=rank, step=step, layer=layer)

    def anomalies(self, *, rank=None, step=None, layer=None) -> pa.Table | None:
        """Every append's anomaly report, keyed by step, layer, capture and append."""
        t = self._read_small("anomalies")
        return None if t is None else _select(t, rank=rank, step=step, layer=layer)

    @property
    def intervals_total(self) -> int:
        t = self._read_small("launches")
        return int(pc.sum(t.column("intervals")).as_py() or 0)

    # -- task rows --------------------------------------------------------------------
    def record(self, append: str) -> dict:
        for rec in self.records:
            if rec["append"] == append:
                return rec
        raise RL.RunError(f"run {str(self.path)!r} has no append {append!r}")

    def launch(self, step=None, layer=None, ranks=None, *, capture=None, slot=None, without=()):
        """The in-memory ``Trace`` of one launch, (step, layer), across ``ranks`` (default:
        every rank that has it), its rows renumbered launch 0: every analysis, export and
        the dashboard work on it unchanged. A run without slot headers names a launch by
        ``capture`` and ``slot`` (its launch number in that capture). Ranks of one append
        keep that append's time axis exactly; ranks appended separately are merged
        (``timeline.merge``: by their clock calibrations, else by first stamp, with the note).
        ``without``: nullable task columns (``contract.tables.nullable_columns``) left unread,
        null in it."""
        from timeline.run import launchset

        if set(without) - S.nullable_columns(self.phases, self.marks):
            raise RL.RunError(f"without={sorted(without)}: only nullable task columns can be left unread")
        return launchset.launch_trace(self, step, layer, ranks, capture=capture, slot=slot, without=tuple(without))

    # -- SQL ----------------------------------------------------------------------------
    def sql(self, query: str, *, budget: int | None = None) -> pa.Table:
        """DuckDB (embedded) over views ``tasks``, ``intervals``, ``anomalies``,
        ``launches`` and ``stages`` (docs/RUN.md lists their columns). A result past the
        memory budget (``layout.memory_budget()``) is refused in one line, not swapped in."""
        from timeline.run import views as RV

        if self._con is None:
            self._con = RV.connect(self)
        return RV.fetch(self._con, query, budget or RL.memory_budget())


def _select(t: pa.Table, **keys) -> pa.Table:
    """Rows of ``t`` whose columns hold the given value(s) (None: any); numpy masks, not
    Arrow scalars (whose conversion imports pandas)."""
    mask = None
    for col, want in keys.items():
        if want is None:
            continue
        values = list(want) if isinstance(want, (list, tuple, set, range, np.ndarray)) else [want]
        c = t.column(col)
        m = np.isin(R.numpy(R.filled(c, 0)), np.array(values, dtype=np.int64)) & R.numpy(c.is_valid())
        mask = m if mask is None else mask & m
    return t if mask is None else t.filter(R.arrow(mask))


def open_run(run_dir, *, on_damage: str = "raise") -> Run:
    """Open the run at ``run_dir``: its build and committed manifest records, every part
    checked to exist at its recorded size (checksums are checked before a part's rows are
    first used). ``on_damage="raise"`` (default): a missing, truncated or damaged part is
    a ``RunError`` naming it; ``"skip"``: it is left out, listed in ``Run.damaged``, and
    the rest of the run reads."""
    if on_damage not in ON_DAMAGE:
        raise RL.RunError(f"on_damage={on_damage!r}: give one of {list(ON_DAMAGE)}")
    path = Path(run_dir)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise RL.RunError(f"run {str(path)!r} {what}: a run is a directory `timeline run add` creates")
    has_build = (path / RL.BUILD_FILE).exists()
    records = RL.committed_records(path)
    if records and not has_build:
        raise RL.RunError(f"run {str(path)!r} has manifest records but no {RL.BUILD_FILE}: it is damaged")
    if not has_build and not (path / RL.MANIFEST_DIR).is_dir():
        raise RL.RunError(f"{str(path)!r} is a directory but not a run (no {RL.MANIFEST_DIR}/ or {RL.BUILD_FILE}); "
                         "create one with `timeline run add`")
    run = Run(path, RW.read_build(path) if has_build else None, records, [], on_damage)
    for rec in records:
        for e in rec["parts"]:
            why = RL.check_part(path, e, full=False)
            if why is not None:
                run._damaged(e["path"], why)
    return run


__all__ = ["ON_DAMAGE", "Run", "open_run"]
