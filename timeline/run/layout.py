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

import pyarrow as pa

RUN_FORMAT = "mono-timeline-run"
RUN_FORMAT_VERSION = 1
BUILD_FILE = "run.json"
MANIFEST_DIR = "manifest"
TABLES = ("tasks", "launches", "stages", "anomalies")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Hive's name for a null partition value (DuckDB, polars, Arrow)
TMP_PREFIX = "."  # temporary names start with a dot: Arrow, DuckDB globs and polars skip them
HASH = "blake2b"


class RunError(ValueError):
    """A run directory that cannot be read or appended to as asked: missing, of another
    build, a damaged or truncated part (named), a selection it does not hold."""


def new_append_id() -> str:
    """A unique, time-ordered id of one append: ``<ns since epoch>-<random hex>``, so
    concurrent writers never pick the same names and records list in append order."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"


def step_dir(step) -> str:
    """The Hive partition value of a step (``NULL_PARTITION`` for none)."""
    return NULL_PARTITION if step is None else str(int(step))


def tasks_part_path(rank: int, step, append: str) -> str:
    """Relative path of one (rank, step)'s task part of an append."""
    return f"tasks/rank={int(rank)}/step={step_dir(step)}/part-{append}.parquet"


def small_part_path(table: str, append: str) -> str:
    """Relative path of an append's launches / stages / anomalies part."""
    return f"{table}/part-{append}.parquet"


def file_digest(path) -> str:
    """blake2b-128 (hex) of a file's bytes."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(final: Path) -> Path:
    """The temporary name a file is written under before its rename."""
    return final.with_name(f"{TMP_PREFIX}{final.name}.{uuid.uuid4().hex[:8]}.tmp")


def publish(tmp: Path, final: Path, *, exclusive: bool = False) -> bool:
    """fsync ``tmp``, then give it its final name (``exclusive``: only if ``final`` does
    not exist yet, by a hard link; returns False and removes ``tmp`` when it did) and
    fsync the directory: after a crash the file is either whole under its name or
    absent. Never replaces a file already published unless asked."""
    fd = os.open(str(tmp), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
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


def write_json(final: Path, obj, *, exclusive: bool = False) -> bool:
    """A JSON file written whole under a temporary name and published (``publish``)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final)
    tmp.write_text(json.dumps(obj, sort_keys=True))
    return publish(tmp, final, exclusive=exclusive)


def write_parquet(run_dir: Path, rel: str, table: pa.Table, **options) -> dict:
    """Write ``table`` to ``run_dir/rel`` (temporary name, fsync, rename) and return its
    manifest entry: path, rows, bytes and checksum."""
    import pyarrow.parquet as pq

    final = run_dir / rel
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final)
    pq.write_table(table, str(tmp), **options)
    digest, size = file_digest(tmp), tmp.stat().st_size
    publish(tmp, final)
    return {"path": rel, "rows": table.num_rows, "bytes": size, HASH: digest}


def manifest_path(run_dir: Path, append: str) -> Path:
    return Path(run_dir) / MANIFEST_DIR / f"{append}.json"


def committed_records(run_dir: Path) -> list:
    """The manifest records of every committed append, in append order, each with its
    file name under ``"_file"``; a record that is not valid JSON of this format is a
    ``RunError`` naming it (a record is written whole or not at all)."""
    out = []
    mdir = Path(run_dir) / MANIFEST_DIR
    if not mdir.is_dir():
        return out
    for p in sorted(mdir.iterdir()):
        if p.name.startswith(TMP_PREFIX) or p.suffix != ".json":
            continue
        try:
            rec = json.loads(p.read_text())
            assert rec.get("format") == RUN_FORMAT and isinstance(rec.get("parts"), list)
        except (ValueError, AssertionError, AttributeError, UnicodeDecodeError) as e:
            raise RunError(f"run {str(run_dir)!r}: manifest record {p.name} is damaged "
                           f"({type(e).__name__}); move it aside to read the rest of the run") from None
        if rec.get("run_format", 1) > RUN_FORMAT_VERSION:
            raise RunError(f"run {str(run_dir)!r}: manifest record {p.name} is run format "
                           f"{rec['run_format']}; this release reads {RUN_FORMAT_VERSION}: upgrade mono-timeline")
        rec["_file"] = p.name
        out.append(rec)
    return out


def check_part(run_dir: Path, entry: dict, *, full: bool) -> str | None:
    """Why the part ``entry`` (a manifest record's) is not the file that was written, or
    None: missing, another size (truncated), and with ``full`` another checksum."""
    p = Path(run_dir) / entry["path"]
    try:
        size = p.stat().st_size
    except OSError:
        return "it is missing"
    if size != entry["bytes"]:
        return f"it is {size} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
    if full and file_digest(p) != entry[HASH]:
        return "its checksum does not match the manifest's (a damaged file)"
    return None


__all__ = ["BUILD_FILE", "HASH", "MANIFEST_DIR", "NULL_PARTITION", "RUN_FORMAT", "RUN_FORMAT_VERSION", "RunError",
           "TABLES", "check_part", "committed_records", "file_digest", "manifest_path", "new_append_id", "publish",
           "small_part_path", "step_dir", "tasks_part_path", "temp_name", "write_json", "write_parquet"]
