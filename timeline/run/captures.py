"""What keeps a run's captures apart (docs/RUN.md, "Captures"): a capture's
**fingerprint** (a content hash of what defines it), the refusal of an append that
repeats a capture or a launch key the run holds, and the one rule by which a run
written before these checks reads an append that repeats an earlier one's launch keys
(as another capture, ``CAPTURE:SLOT``, never merged into the earlier launches).

A launch key of a run, per rank: ``STEP:LAYER`` from its slot header, else
``CAPTURE:SLOT``; an append added ``as_capture`` (``run add --as-capture NAME``) is
keyed ``NAME:SLOT`` whatever its headers say. Every function here takes arrays and
records, not a run: ``fingerprint`` and ``refusal`` are what an append (in this process
or a worker's) calls on one loaded capture."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import rows as R
from timeline.core.checksum import Checksum
from timeline.run import layout as RL

DEFINING = ("rank", "launch", "stage_index", "task", "placement", "flags")  # and every tick column
PREFIX = "fp:"


def defining_columns(phases, marks) -> list:
    """The task columns a capture's fingerprint digests: each row's task, where it ran (the
    placement word) and its raw stamps (``DEFINING`` and every ``<phase>_tick`` /
    ``<mark>_tick``); not what is derived from them (CTA, wave and the other placement
    fields, the ns) nor step and layer (``run add --step`` gives those to a headerless
    capture)."""
    return [*DEFINING, *(f"{p}_tick" for p in (*phases, *marks))]


def _meta(specs, origins: dict, offsets: dict) -> dict:
    """The fingerprint's metadata: the capture's specs (kernel, rank, clock, calibrations)
    and each rank's origin and offset, canonical JSON bytes."""
    sp = sorted((s.to_dict() for s in specs), key=lambda d: d.get("rank", 0))
    axis = {"origins": {str(k): int(v) for k, v in sorted(origins.items())},
            "offsets": {str(k): int(v) for k, v in sorted(offsets.items())}}
    return {b"specs": json.dumps(sp, sort_keys=True).encode(), b"axis": json.dumps(axis, sort_keys=True).encode()}


class Fingerprint:
    """A capture's fingerprint fed its task rows in pieces, in row order (a stream's
    blocks): ``timeline.core.checksum.Checksum`` (CRC-32 a column) over
    ``defining_columns`` (``fields``: theirs in the tasks schema) and ``_meta``; one
    result however the rows were cut."""

    def __init__(self, specs, origins, offsets, phases, marks):
        from timeline.contract import schema as S

        self._cols = defining_columns(phases, marks)
        self.fields = [S.tasks_schema(phases, marks).field(n) for n in self._cols]
        self._sum = Checksum(_meta(specs, origins or {}, offsets or {}))

    def update(self, tasks: pa.Table) -> "Fingerprint":
        self._sum.update(tasks.select(self._cols))
        return self

    def adopt(self, file_sum: Checksum | None) -> bool:
        """Take the digests of the defining columns from ``file_sum``, a trace file's
        checksum fed every row this fingerprint digests (``TraceStream.checksum``, after
        a whole pass) instead of digesting them again: where it is CRC-32 and held each
        column under the tasks schema's type (``Checksum.columns``), the same fingerprint
        at no cost (4 ms of a 1 M-interval file's `run add`). False where it cannot."""
        if file_sum is None or file_sum.digest != self._sum.digest:
            return False
        held = file_sum.columns(self.fields)
        if held is None:
            return False
        self._sum.adopt(held)
        return True

    def hexdigest(self) -> str:
        return PREFIX + self._sum.hexdigest().partition(":")[2]


def fingerprint(trace) -> str:
    """The fingerprint of one loaded capture (a ``Trace``): the same capture read again,
    from its file or its ``Trace``, with or without ``--step``, gives the same one."""
    return Fingerprint(trace.specs, trace.origins, trace.offsets, trace.phases, trace.marks).update(
        trace.tasks).hexdigest()


# -- launch keys ----------------------------------------------------------------------------
def key_strings(launches: pa.Table, names: dict | None = None) -> np.ndarray:
    """Each launches row's key with its rank, ``"r<rank> <STEP:LAYER or CAPTURE:SLOT>"``:
    ``names`` (append -> capture name) keys those appends' rows ``NAME:SLOT``."""
    n = launches.num_rows
    rank = R.column(launches, "rank", fill=0).astype(np.int64)
    step, layer = launches.column("step"), launches.column("layer")
    headed = R.numpy(pc.and_(step.is_valid(), layer.is_valid())) if n else np.zeros(0, bool)
    append = launches.column("append").to_pylist()
    capture = launches.column("capture").to_pylist()
    if names:
        capture = [names.get(a, c) for a, c in zip(append, capture)]
        headed &= ~np.isin(np.array(append, dtype=object), list(names))
    s, y = R.column(launches, "step", fill=0), R.column(launches, "layer", fill=0)
    slot = R.column(launches, "launch", fill=0)
    return np.array([f"r{r} {a}:{b}" if h else f"r{r} {c}:{t}"
                     for r, h, a, b, c, t in zip(rank.tolist(), headed.tolist(), s.tolist(), y.tolist(), capture,
                                                 slot.tolist())], dtype=object)


def _any_repeat(launches: pa.Table, fixed: dict) -> bool:
    """Whether any launch key (``key_strings``) is held by two rows: columnar, no string a row."""
    rank = R.column(launches, "rank", fill=0).astype(np.int64)
    step, layer = launches.column("step"), launches.column("layer")
    headed = R.numpy(pc.and_(step.is_valid(), layer.is_valid()))
    if fixed:
        headed = headed & ~R.numpy(pc.is_in(launches.column("append"), pa.array(list(fixed), pa.string())))
    cap = pc.dictionary_encode(pc.cast(launches.column("capture"), pa.string())).combine_chunks().indices
    a = np.where(headed, R.column(launches, "step", fill=0).astype(np.int64), R.numpy(cap).astype(np.int64))
    b = np.where(headed, R.column(launches, "layer", fill=0).astype(np.int64),
                 R.column(launches, "launch", fill=0).astype(np.int64))
    order = np.lexsort((b, a, rank, headed))
    cols = np.stack([headed[order], rank[order], a[order], b[order]])
    return bool((cols[:, 1:] == cols[:, :-1]).all(axis=0).any())


def repeats(launches: pa.Table, records: list) -> dict:
    """The one rule for launch keys held twice: ``{append: (key, earlier append)}`` for
    every append (of ``records``, in their order) any of whose launch keys an earlier
    append holds; such an append is read as another capture, whole (``names``). Appends
    added ``as_capture`` hold their own name's keys only."""
    fixed = {r["append"]: r["capture"] for r in records if r.get("as_capture")}
    if launches.num_rows < 2 or not _any_repeat(launches, fixed):
        return {}
    keys = key_strings(launches, fixed)
    append = np.array(launches.column("append").to_pylist(), dtype=object)
    held: dict = {}
    out: dict = {}
    for rec in records:
        mine = keys[append == rec["append"]].tolist()
        clash = next((k for k in mine if k in held), None)
        if clash is not None and rec["append"] not in fixed:
            out[rec["append"]] = (clash, held[clash])
            continue
        held.update({k: rec["append"] for k in mine if k not in held})
    return out


def names(records: list, repeated: dict) -> dict:
    """``{append: capture name}`` of the appends read as captures of their own: those
    added ``as_capture`` and those that ``repeats`` names, the latter by their capture's
    name, or ``NAME@APPEND`` where another append has that name."""
    count: dict = {}
    for r in records:
        count[r["capture"]] = count.get(r["capture"], 0) + 1
    out = {r["append"]: r["capture"] for r in records if r.get("as_capture")}
    for r in records:
        if r["append"] in repeated:
            out[r["append"]] = r["capture"] if count[r["capture"]] == 1 else f"{r['capture']}@{r['append']}"
    return out


def duplicates(records: list, repeated: dict, named: dict) -> list:
    """One line per append that repeats another, in append order: launch keys an earlier
    append holds (``repeats``: a run written before appends were checked), saying how the
    run reads it, or the same fingerprint (two writers of one capture at once)."""
    out, seen = [], {}
    for r in records:
        aid, fp = r["append"], r.get("fingerprint")
        again = seen.get(fp) if fp and not r.get("as_capture") else None
        same = f" (the capture of append {again} again, {fp[:19]}…)" if again else ""
        if aid in repeated:
            key, holder = repeated[aid]
            rank, _, name = key.partition(" ")
            out.append(f"append {aid} repeats launch {name} of rank {rank[1:]} of append {holder}{same}: read as "
                       f"capture {named[aid]!r} (its launches keyed {named[aid]}:SLOT); move its record "
                       f"manifest/{aid}.json aside to leave it out")
        elif again:
            out.append(f"append {aid} (capture {r['capture']!r}) is the capture of append {again} again ({fp[:19]}…)")
        if fp:
            seen.setdefault(fp, aid)
    return out


def rekeyed(table: pa.Table, named: dict) -> pa.Table:
    """``table`` (launches, stages or anomalies rows, with step, layer, capture and
    append) with the rows of the ``named`` appends keyed ``NAME:SLOT``: step and layer
    null, capture their name."""
    if table is None or not named or table.num_rows == 0:
        return table
    append = table.column("append").to_pylist()
    mask = np.isin(np.array(append, dtype=object), list(named))
    if not mask.any():
        return table
    m = R.arrow(mask)
    out = table
    for col in ("step", "layer"):
        at = out.schema.get_field_index(col)
        c = out.column(col)
        out = out.set_column(at, out.schema.field(at), pc.if_else(m, pa.nulls(len(c), c.type), c))
    cap = [named.get(a, c) for a, c in zip(append, table.column("capture").to_pylist())]
    at = out.schema.get_field_index("capture")
    return out.set_column(at, out.schema.field(at), pa.array(cap, out.schema.field(at).type))


# -- refusing an append -----------------------------------------------------------------------
def candidates(records: list, parts, capture: str) -> list:
    """The committed records whose launches could share a key with an append writing
    task ``parts`` (``[(rank, step)]``) as ``capture``: one holding a task part of the
    same (rank, step) with a step, or, of the same capture name, of the same rank
    without one. The only records whose launches parts a refusal reads."""
    headed = {k for k in parts if k[1] is not None}
    headless = {r for r, s in parts if s is None}
    out = []
    for rec in records:
        theirs = {(e.get("rank"), e.get("step")) for e in rec["parts"] if e["table"] == "tasks"}
        if theirs & headed or (rec["capture"] == capture and {r for r, s in theirs if s is None} & headless):
            out.append(rec)
    return out


def refusal(run_dir, records: list, launches_of, *, aid: str, capture: str, fp: str, as_capture: bool,
            launches: pa.Table) -> str | None:
    """Why an append (id ``aid``, ``capture``, fingerprint ``fp``, its ``launches`` rows)
    may not join the run whose committed ``records`` these are, or None: the same
    capture again (its fingerprint), an ``as_capture`` name the run holds, a launch key
    it holds twice itself, or one another append holds (``repeats``). ``launches_of(records)``: those records' launches
    rows (read only for ``candidates``)."""
    run = str(run_dir)
    for rec in records:
        if rec.get("fingerprint") == fp and (not as_capture or rec["capture"] == capture):
            return (f"run {run!r} holds this capture already (append {rec['append']}, capture {rec['capture']!r}, "
                    f"{fp[:19]}…): appended again, its launches would count twice; add it on purpose as another "
                    "capture with --as-capture NAME")
    if as_capture:
        taken = next((r for r in records if r["capture"] == capture), None)
        return None if taken is None else (
            f"run {run!r} has a capture named {capture!r} already (append {taken['append']}): choose another "
            "--as-capture NAME")
    if launches.num_rows > 1 and _any_repeat(launches, {}):  # its own slot headers repeat a key
        keys = key_strings(launches)
        rank, _, name = next(k for k in keys.tolist() if (keys == k).sum() > 1).partition(" ")
        return (f"this capture holds launch {name} of rank {rank[1:]} in more than one launch slot (its slot headers "
                "repeat it): they would be merged into one launch; add it as a capture of its own with --as-capture "
                "NAME (its launches keyed NAME:SLOT)")
    parts = {(int(r), None if s is None else int(s)) for r, s in zip(
        launches.column("rank").to_pylist(), launches.column("step").to_pylist())}
    near = candidates(records, parts, capture)
    if not near:
        return None
    new = {"append": aid, "capture": capture}
    held = launches_of(near)
    both = pa.concat_tables([held, launches.select(held.column_names)], promote_options="permissive")
    clash = repeats(both, [*near, new]).get(aid)
    if clash is None:
        return None
    key, holder = clash
    rank, _, name = key.partition(" ")
    owner = next(r for r in near if r["append"] == holder)
    return (f"run {run!r} holds launch {name} of rank {rank[1:]} already (capture {owner['capture']!r}, append "
            f"{holder}): another capture of that launch would be merged with it; add this one as a capture of its "
            "own with --as-capture NAME (its launches keyed NAME:SLOT)")


def is_run_or_new(run_dir) -> str | None:
    """Why ``run_dir`` cannot become a run, or None: a directory that holds other files
    and neither ``run.json`` nor a ``manifest/`` (an empty run, ``write.create``) is not
    one, and an append would mix a run into it."""
    from pathlib import Path

    p = Path(run_dir)
    if not p.exists():
        return None
    if not p.is_dir():
        return f"{str(p)!r} exists and is not a directory: a run is a directory"
    if (p / RL.BUILD_FILE).exists() or (p / RL.MANIFEST_DIR).is_dir():
        return None
    other = sorted(c.name for c in p.iterdir() if not c.name.startswith(RL.TMP_PREFIX))
    if not other:
        return None
    return (f"{str(p)!r} is a directory that is not a run (it holds {', '.join(other[:3])}"
            f"{' ...' if len(other) > 3 else ''} and no {RL.BUILD_FILE}): give a new or empty directory, or a run")


__all__ = ["DEFINING", "Fingerprint", "candidates", "defining_columns", "duplicates", "fingerprint", "is_run_or_new", "key_strings",
           "names", "refusal", "rekeyed", "repeats"]
