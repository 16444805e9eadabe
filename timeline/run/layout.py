"""The run dataset on disk (docs/FORMAT.md, "Run dataset"): where each part lives, the
manifest records that commit an append, the per-file checksums and the one way a file
is written (a temporary name, fsync, rename; nothing is ever rewritten).

A run directory::

    RUN/run.json                                   the build (stages, phases, marks): created once
    RUN/manifest/<append>.json                     one record per append: specs, clocks, parts, checksums
    RUN/tasks/rank=R/step=S/part-<append>.parquet  task rows (raw ticks; ns derived on read)
    RUN/launches/part-<append>.parquet             one row per (rank, launch) of the append
    RUN/stages/part-<append>.parquet               one row per (rank, launch, stage): the stage report
    RUN/anomalies/part-<append>.parquet            the append's anomaly report

An append is committed when its manifest record exists: parts no record names (a
writer that died mid-append) are never read by ``open_run``."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from timeline.errors import TimelineError
from timeline.core import rows as R
from timeline.core.checksum import crc32

RUN_FORMAT = "mono-timeline-run"
RUN_FORMAT_VERSION = 1
BUILD_FILE = "run.json"
MANIFEST_DIR = "manifest"
TABLES = ("tasks", "launches", "stages", "anomalies")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Hive's name for a null partition value (DuckDB, polars, Arrow)
TMP_PREFIX = "."  # temporary names start with a dot: Arrow, DuckDB globs and polars skip them
HASH = "blake2b"
PART_CRC = "crc32"  # a part's CRC-32 (hex), beside its blake2b where the part was written since: what a read checks
RECORD_KEYS = ("append", "capture", "specs", "origins", "offsets", "parts")
PART_KEYS = frozenset({"table", "path", "rows", "bytes", HASH})


class RunError(TimelineError):
    """A run directory that cannot be read or appended to as asked: missing, of another
    build, a damaged or truncated part (named), a selection it does not hold."""


def new_append_id() -> str:
    """A unique, time-ordered id of one append: ``<ns since epoch>-<random hex>``, so
    concurrent writers never pick the same names and records list in append order."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"


def step_dir(step) -> str:
    """The Hive partition value of a step (``NULL_PARTITION`` for none)."""
    return NULL_PARTITION if step is None else str(int(step))


def tasks_part_path(rank: int, step, append: str, piece: int = 0) -> str:
    """Relative path of one (rank, step)'s task part of an append (``piece`` k > 0: its
    k-th further part, where a streamed append wrote more than one)."""
    tail = f"-{piece}" if piece else ""
    return f"tasks/rank={int(rank)}/step={step_dir(step)}/part-{append}{tail}.parquet"


def small_part_path(table: str, append: str) -> str:
    """Relative path of an append's launches / stages / anomalies part."""
    return f"{table}/part-{append}.parquet"


def file_digest(path) -> str:
    """blake2b-128 (hex) of a file's bytes."""
    return file_digests(path, (HASH,))[HASH]


def file_digests(path, kinds=(PART_CRC, HASH)) -> dict:
    """A file's checksums of ``kinds``, in one pass over its bytes: ``crc32`` (ISA-L's
    CRC-32, hex: what a read checks, several times blake2b's speed) and ``blake2b``
    (128 bits, hex: what releases before crc32 check, and ``run info --verify`` besides)."""
    h, crc = (hashlib.blake2b(digest_size=16) if HASH in kinds else None), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            if h is not None:
                h.update(chunk)
            if PART_CRC in kinds:
                crc = crc32(chunk, crc)
    return {**({PART_CRC: f"{crc:08x}"} if PART_CRC in kinds else {}), **({HASH: h.hexdigest()} if h else {})}


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(run_dir: Path, append: str) -> Path:
    """Where a streamed append keeps its parts until it commits: a directory of its own
    (a leading dot: globs skip it), removed whole if the append fails."""
    return Path(run_dir) / f"{TMP_PREFIX}staging-{append}"


def temp_name(final: Path) -> Path:
    """The temporary name a file is written under before its rename."""
    return final.with_name(f"{TMP_PREFIX}{final.name}.{uuid.uuid4().hex[:8]}.tmp")


def fsync_file(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path, *, exclusive: bool = False, synced: bool = False) -> bool:
    """fsync ``tmp`` (unless ``synced``: done already), then give it its final name
    (``exclusive``: only if ``final`` does not exist yet, by a hard link; returns False
    and removes ``tmp`` when it did) and fsync the directory: after a crash the file is
    either whole under its name or absent. Never replaces a file already published
    unless asked."""
    if not synced:
        fsync_file(tmp)
    if exclusive:
        try:
            os.link(tmp, final)
        except FileExistsError:
            tmp.unlink()
            return False
        tmp.unlink()
    else:
        if final.exists():
            tmp.unlink()
            raise RunError(f"{final} exists already: a run's files are never rewritten")
        os.rename(tmp, final)
    _fsync_dir(final.parent)
    return True


SEAL = "record_blake2b"  # a JSON file's checksum of its own other entries


def _seal_of(obj: dict) -> str:
    body = json.dumps({k: v for k, v in obj.items() if k != SEAL}, sort_keys=True)
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def write_json(final: Path, obj: dict, *, exclusive: bool = False) -> bool:
    """A JSON object written whole under a temporary name and published (``publish``),
    sealed: ``SEAL`` holds the blake2b of its other entries (``read_json`` checks it)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final)
    tmp.write_text(json.dumps({**obj, SEAL: _seal_of(obj)}, sort_keys=True))
    return publish(tmp, final, exclusive=exclusive)


def read_json(path: Path, what: str, *, required=()) -> dict:
    """A sealed JSON object (``write_json``): a ``RunError`` naming ``path`` when it is not
    valid JSON, lacks a ``required`` key or its seal does not match (a flipped byte)."""
    try:
        obj = json.loads(path.read_bytes().decode())
        assert isinstance(obj, dict) and obj.get("format") == RUN_FORMAT
        assert obj.get(SEAL) == _seal_of(obj), "seal"
        missing = [k for k in required if k not in obj]
        assert not missing, f"no {missing}"
    except (ValueError, AssertionError, UnicodeDecodeError) as e:
        why = "its checksum does not match its contents" if str(e) == "seal" else f"it is not a valid {what}"
        raise RunError(f"{what} {path} is damaged: {why}; move it aside (or restore it) to read the rest of "
                       "the run") from None
    return obj


def declare_required(table: pa.Table) -> pa.Table:
    """``table`` with every column that holds no null declared not nullable: Parquet
    then stores it REQUIRED, without a definition level per value (half the encode
    time of a task part). Which columns those are depends on the part's rows; a reader
    takes them back as nullable (``read_parquet``)."""
    fields = [f.with_nullable(False) if f.nullable and table.column(i).null_count == 0 else f
              for i, f in enumerate(table.schema)]
    return pa.Table.from_arrays(table.columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def nullable(table: pa.Table) -> pa.Table:
    """``table`` with every column declared nullable, as the run's tables are in memory
    (parts of one table concatenate whatever their columns held)."""
    if all(f.nullable for f in table.schema):
        return table
    schema = pa.schema([f.with_nullable(True) for f in table.schema], metadata=table.schema.metadata)
    return pa.Table.from_arrays(table.columns, schema=schema)


class Staged(NamedTuple):
    """A part written under its temporary name, not yet under its own
    (``publish_staged``): its manifest entry says what it will be; ``synced``: fsynced
    already, else by its publish (a ``run add --jobs`` worker leaves the wait on the
    disk to the commit, where the parts of an append are fsynced at once)."""
    tmp: Path
    final: Path
    entry: dict
    synced: bool = True


def finish_staged(run_dir: Path, rel: str, tmp: Path, rows: int, *, sync: bool = True) -> Staged:
    """A written temporary file as a ``Staged`` part: its checksums and size, fsynced
    (unless not ``sync``: then by ``publish_staged``)."""
    digests, size = file_digests(tmp), tmp.stat().st_size
    if sync:
        fsync_file(tmp)
    return Staged(tmp, run_dir / rel, {"path": rel, "rows": rows, "bytes": size, **digests}, sync)


def staged_name(staging: Path, rel: str) -> Path:
    """The temporary name of part ``rel`` in a ``staging_dir``."""
    return staging / f"{TMP_PREFIX}{rel.replace('/', '~')}.{uuid.uuid4().hex[:8]}.tmp"


def stage_parquet(run_dir: Path, rel: str, table: pa.Table, *, required: bool = False, staging: Path | None = None,
                  sync: bool = True, **options) -> Staged:
    """Write ``table`` for ``run_dir/rel`` under a temporary name (beside it, or in
    ``staging``; ``required``: columns without a null stored REQUIRED,
    ``declare_required``), fsynced (unless not ``sync``: by its publish), not yet published."""
    import pyarrow.parquet as pq

    final = run_dir / rel
    if staging is None:
        final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final) if staging is None else staged_name(staging, rel)
    pq.write_table(declare_required(table) if required else table, str(tmp), **options)
    return finish_staged(run_dir, rel, tmp, table.num_rows, sync=sync)


def publish_staged(staged: Staged) -> dict:
    """Give a staged part its name (``publish``: fsynced first unless it was, then a
    rename within the run's filesystem); its manifest entry."""
    staged.final.parent.mkdir(parents=True, exist_ok=True)
    publish(staged.tmp, staged.final, synced=staged.synced)
    return staged.entry


def write_parquet(run_dir: Path, rel: str, table: pa.Table, *, required: bool = False, **options) -> dict:
    """Write ``table`` to ``run_dir/rel`` (temporary name, fsync, rename) and return its
    manifest entry: path, rows, bytes and checksum. ``required``: columns without a
    null stored REQUIRED (``declare_required``)."""
    return publish_staged(stage_parquet(run_dir, rel, table, required=required, **options))


def read_parquet(path, *, where: tuple | None = None, columns=None, without=()) -> pa.Table:
    """A part's rows, every column nullable (``nullable``; ``where``: ``(column, value)``,
    only the rows holding it, reading only the row groups whose statistics may hold it;
    ``columns``: only those of them the part has; ``without``: not those). ``ParquetFile`` directly, not
    ``pyarrow.dataset``, which imports pandas (a second and a half of a command's start)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    f = pq.ParquetFile(str(path))
    schema, meta = f.schema_arrow, f.metadata  # each a property built anew on every access
    names = None if columns is None and not without else \
        [c for c in schema.names if (columns is None or c in columns) and c not in without]
    if where is None:
        return nullable(f.read(columns=names))
    column, value = where
    at = schema.get_field_index(column)
    groups = []
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(at).statistics
        if st is None or not st.has_min_max or st.min <= value <= st.max:
            groups.append(g)
    read = schema if names is None else pa.schema([schema.field(c) for c in names])
    table = f.read_row_groups(groups, columns=names) if groups else R.empty(read)
    return nullable(table.filter(pc.equal(table.column(column), R.scalar(value, table.column(column).type))))


def manifest_path(run_dir: Path, append: str) -> Path:
    return Path(run_dir) / MANIFEST_DIR / f"{append}.json"


def committed_records(run_dir: Path, seen: dict | None = None) -> list:
    """The manifest records of every committed append, in append order, each with its
    file name under ``"_file"``; a record that is not valid JSON of this format is a
    ``RunError`` naming it (a record is written whole or not at all). ``seen``: the
    records an earlier call read (``{file name: record}``), extended here: a record is
    never rewritten, so only the names not in it are read (``run add --jobs``' parent
    checks each append against every record: one read a record, not one an append)."""
    out = []
    mdir = Path(run_dir) / MANIFEST_DIR
    if not mdir.is_dir():
        return out
    for name in sorted(os.listdir(mdir)):  # names, not Paths: a Path's sort compares its parts (1.4 ms of 64)
        if name.startswith(TMP_PREFIX) or not name.endswith(".json"):
            continue
        if seen is not None and name in seen:
            out.append(seen[name])
            continue
        p = mdir / name
        rec = read_json(p, "manifest record", required=RECORD_KEYS)
        if not isinstance(rec["parts"], list) or not all(isinstance(e, dict) and PART_KEYS <= set(e)
                                                         for e in rec["parts"]):
            raise RunError(f"manifest record {p} is damaged: its parts are not {sorted(PART_KEYS)} entries")
        if rec.get("run_format", 1) > RUN_FORMAT_VERSION:
            raise RunError(f"run {str(run_dir)!r}: manifest record {p.name} is run format "
                           f"{rec['run_format']}; this release reads {RUN_FORMAT_VERSION}: upgrade mono-timeline")
        rec["_file"] = p.name
        out.append(rec)
        if seen is not None:
            seen[p.name] = rec
    return out


def check_part(run_dir: Path, entry: dict, *, full: bool, strong: bool = False) -> str | None:
    """Why the part ``entry`` (a manifest record's) is not the file that was written, or
    None: missing, another size (truncated), and with ``full`` another checksum: its
    crc32 where the entry has one (parts written before it: blake2b); ``strong``: every
    checksum the entry has (``run info --verify``)."""
    p = Path(run_dir) / entry["path"]
    try:
        size = p.stat().st_size
    except OSError:
        return "it is missing"
    if size != entry["bytes"]:
        return f"it is {size} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
    kinds = [k for k in (PART_CRC, HASH) if k in entry]  # the fast one first
    if not strong:
        kinds = kinds[:1] if full else []
    bad = bool(kinds) and any(v != entry[k] for k, v in file_digests(p, kinds).items())
    return "its checksum does not match the manifest's (a damaged file)" if bad else None


# -- the memory budget and the launches table -----------------------------------------------
DEFAULT_BUDGET = 2 << 30  # bytes one process may pull from a run (TIMELINE_MEMORY_BUDGET overrides)
LAUNCH_COLUMNS = ("rank", "step", "layer", "capture", "launch", "start_ns", "end_ns", "kernel_ns", "tasks", "rows",
                  "intervals", "anomalies", "append")


def memory_budget() -> int:
    """Bytes of run data one process may hold: ``TIMELINE_MEMORY_BUDGET`` (bytes, or
    with a K/M/G suffix) or 2 GiB."""
    text = os.environ.get("TIMELINE_MEMORY_BUDGET", "").strip().upper()
    if not text:
        return DEFAULT_BUDGET
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    try:
        return int(float(text.rstrip("KMG")) * scale)
    except ValueError:
        raise RunError(f"TIMELINE_MEMORY_BUDGET={text!r} is not a size: give bytes or e.g. 2G") from None


def over_budget(what: str, nbytes: int, budget: int) -> RunError:
    """The one error line of a read that would pull more than the memory budget."""
    return RunError(f"{what} would pull {nbytes / 2**30:.2f} GiB into this process, past its memory budget "
                      f"of {budget / 2**30:.2f} GiB (TIMELINE_MEMORY_BUDGET): narrow it with --launch KEY, --step / --layer / "
                      "--rank, or run it per launch with --engine dask")


def empty_launches() -> pa.Table:
    """A launches table of no rows (``LAUNCH_COLUMNS``, their types): an empty run's."""
    types = {"rank": pa.int16(), "step": pa.int64(), "layer": pa.int32(), "capture": pa.string(),
             "launch": pa.int32(), "append": pa.string()}
    return pa.table({c: pa.array([], types.get(c, pa.int64())) for c in LAUNCH_COLUMNS})


__all__ = ["BUILD_FILE", "DEFAULT_BUDGET", "LAUNCH_COLUMNS", "HASH", "PART_CRC", "MANIFEST_DIR", "NULL_PARTITION", "RUN_FORMAT", "RUN_FORMAT_VERSION", "RunError",
           "Staged", "TABLES", "check_part", "committed_records", "declare_required", "empty_launches", "file_digest", "file_digests", "finish_staged", "fsync_file", "manifest_path", "memory_budget", "new_append_id", "nullable", "over_budget", "publish", "publish_staged", "read_json", "read_parquet",
           "small_part_path", "stage_parquet", "staged_name", "staging_dir", "step_dir", "tasks_part_path", "temp_name", "write_json", "write_parquet"]
