"""Appending a ``Trace`` to a run: its task rows as one Parquet part per (rank, step),
its per-launch aggregates (``launches``), per-launch stage report (``stages``) and
anomaly report as one small part each, then the manifest record that commits them.
Several processes may append to one run at once: every name an append writes carries
its own append id, and the build file is created once (by a hard link, atomically)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline._version import __version__
from timeline.run import aggregate as RA
from timeline.run import captures as RC
from timeline.run import layout as RL

STAGE_QUANTILES = (0.5, 0.9, 0.99)  # the per-launch stage report's interval quantiles a run keeps
PARTITION_COLUMNS = ("rank", "step")  # in the path (Hive), not in the task part
ROW_GROUP_ROWS = 1 << 15  # a launch read: 0.45x the time of 1 << 17, +1.0 % bytes (bench/results/row_groups_cpu.txt)
TASK_CODEC = "lz4"  # a task part's: encode 0.69x, read 0.66x zstd's time, 1.05x its bytes (docs/RUN.md)
# the small parts (launches, stages, anomalies): lz4 too, 2.9 -> 1.7 ms a 1 M-interval file's three, 109 -> 124 kB
PARQUET_OPTIONS = {"compression": "lz4"}
WRITER_THREADS = max(1, min(4, os.cpu_count() or 1))  # task parts encoded at once


def stored_task_columns(phases, marks) -> list:
    """The task columns a part holds: the tasks schema less the partition columns and
    the ``<phase>_ns`` / ``<mark>_ns`` columns (derived on read from the raw ticks and
    the append's origins and offsets, ``timeline.trace.retime``)."""
    ns = {f"{p}_ns" for p in (*phases, *marks)}
    return [n for n in S.tasks_schema(phases, marks).names if n not in ns and n not in PARTITION_COLUMNS]


def tick_columns(phases, marks) -> list:
    return [f"{p}_tick" for p in (*phases, *marks)]


def task_part_options(phases, marks) -> dict:
    """Parquet options of a task part: ``TASK_CODEC`` (LZ4_RAW); ticks delta-encoded
    (DELTA_BINARY_PACKED: consecutive stamps differ by little), the stage names
    dictionary-encoded, the rest plain (the codec takes their repeats; a dictionary each
    cost 35 % of the encode time for 1.5 % of the size); values taken a row group at a
    time (``write_batch_size``: the same bytes, 5 % less encode time than 1,024 at a
    time). docs/RUN.md has the sizes and speeds this was chosen by."""
    ticks = tick_columns(phases, marks)
    return {"compression": TASK_CODEC, "use_dictionary": ["stage"], "column_encoding": {c: "DELTA_BINARY_PACKED" for c in ticks},
            "row_group_size": ROW_GROUP_ROWS, "write_batch_size": ROW_GROUP_ROWS,
            "write_statistics": ["launch", "layer"]}


def build_of(spec: S.Spec) -> dict:
    """What every trace of a run shares (``run.json``): kernel, stages, phases, marks."""
    return {"format": RL.RUN_FORMAT, "run_format": RL.RUN_FORMAT_VERSION, "kernel": spec.kernel,
            "stages": [[n, c] for n, c in spec.stages], "phases": list(spec.phases), "marks": list(spec.marks)}


def _same_build(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("stages", "phases", "marks"))


def ensure_build(run_dir: Path, spec: S.Spec, *, create: bool = True) -> None:
    """Create the run (its directory and ``run.json``) if absent (unless not
    ``create``), else check that ``spec`` is of the run's build: a ``RunError`` naming
    both otherwise."""
    want = build_of(spec)
    path = run_dir / RL.BUILD_FILE
    if not create and not path.exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        RL.write_json(path, want, exclusive=True)  # two first writers: one wins, the other checks against it
    have = read_build(run_dir)
    if not _same_build(have, want):
        raise RL.RunError(
            f"run {str(run_dir)!r} holds {have.get('kernel')!r} (stages {[n for n, _ in have['stages']]}, phases "
            f"{have['phases']}); this trace is {spec.kernel!r} (stages {list(spec.stage_names)}, phases "
            f"{list(spec.phases)}): append it to a run of its own")


def read_build(run_dir: Path) -> dict:
    """The run's ``run.json``; a ``RunError`` naming it when damaged."""
    return RL.read_json(Path(run_dir) / RL.BUILD_FILE, "build file", required=("stages", "phases", "kernel"))


def partition_groups(tasks: pa.Table):
    """``[(rank, step or None, rows)]``: the task rows of each (rank, step) in (rank, step)
    order, ``rows`` None (all), a slice (a group's rows contiguous: found from the runs of
    equal neighbours, as a merge of per-rank captures leaves them) or row indices."""
    rank = R.numpy(tasks.column("rank")).astype(np.int64)
    step_col = tasks.column("step")
    step = R.numpy(R.filled(step_col, -1)).astype(np.int64)  # -1: no slot header (a header's step is >= 0)
    if tasks.num_rows and (rank == rank[0]).all() and (step == step[0]).all():
        return [(int(rank[0]), None if step[0] < 0 else int(step[0]), None)]
    if not tasks.num_rows:
        return []
    start = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])])
    run_gid, ng, (gr, gs) = GR.group_ids(rank[start], step[start])
    if ng == start.size:  # one run per group: slices
        stop = np.r_[start[1:], rank.size]
        at = np.argsort(run_gid)
        return [(int(gr[g]), None if gs[g] < 0 else int(gs[g]), slice(int(start[at[g]]), int(stop[at[g]])))
                for g in range(ng)]
    gid = np.repeat(run_gid, np.diff(np.r_[start, rank.size]))
    order = GR.group_order(gid)
    bounds = np.searchsorted(gid[order], np.arange(ng + 1))
    return [(int(gr[g]), None if gs[g] < 0 else int(gs[g]), order[bounds[g]:bounds[g + 1]]) for g in range(ng)]


def launch_rows(trace, capture: str, append: str) -> pa.Table:
    """One row per (rank, launch) of the trace: its slot's step and layer, the capture,
    its first start and last end (ns on the append's time axis), kernel_ns, distinct
    tasks, task rows, intervals and anomalies (those ``Trace.anomaly_count`` counts)."""
    t = trace.tasks
    rank, launch = R.column(t, "rank").astype(np.int64), R.column(t, "launch").astype(np.int64)
    gid, ng, (gr, gl) = GR.group_ids(rank, launch)
    ns = R.phase_matrix(t, trace.phases)
    first, last = R.extent(ns)
    start, end = GR.group_min_max(gid, ng, first, last)
    iv = R.phase_intervals(ns)
    intervals = np.bincount(gid, weights=iv.valid.sum(axis=1), minlength=ng).astype(np.int64)
    rows = np.bincount(gid, minlength=ng).astype(np.int64)
    tasks = GR.distinct_count(gid, ng, R.column(t, "stage_index").astype(np.int64), R.column(t, "task").astype(np.int64))
    rep = np.zeros(ng, dtype=np.int64)
    rep[gid] = np.arange(t.num_rows)
    return RA.launch_table(gr, gl, t.column("step").take(pa.array(rep)), t.column("layer").take(pa.array(rep)),
                           start, end, tasks, rows, intervals, RA.anomaly_counts(trace, gr, gl), capture, append)


def keyed(table: pa.Table, launches: pa.Table, capture: str, append: str) -> pa.Table:
    """``table`` (rows keyed by rank and launch) with each row's step, layer, capture and append."""
    idx = RA.launch_index(R.column(launches, "rank", fill=0), R.column(launches, "launch", fill=0), table)
    take = R.arrow(idx, mask=idx < 0)
    n = table.num_rows
    return (table.append_column("step", launches.column("step").take(take))
            .append_column("layer", launches.column("layer").take(take))
            .append_column("capture", RA.repeated(capture, n)).append_column("append", RA.repeated(append, n)))


def stage_rows(trace, launches: pa.Table, capture: str, append: str) -> pa.Table:
    """The stage report of every (rank, launch) (``analysis.stage_report(by_launch=True)``,
    interval quantiles ``STAGE_QUANTILES``), keyed by step, layer and capture."""
    from timeline.analysis import stages as A

    if trace.tasks.num_rows == 0:
        report = A.stage_report(trace, by_launch=True, quantiles=STAGE_QUANTILES).slice(0, 0)
    else:
        report = A.stage_report(trace, by_launch=True, quantiles=STAGE_QUANTILES)
    return keyed(report, launches, capture, append)


def first_ticks(tasks: pa.Table, phases, marks, ranks) -> dict:
    """``{rank: its earliest written tick in tasks}`` for ``ranks`` (None for a rank
    with none): the origin of a rank whose file recorded none."""
    rank, out = R.numpy(tasks.column("rank")), {}
    for r in ranks:
        ticks = np.concatenate([R.numpy(tasks.column(c))[rank == r] for c in tick_columns(phases, marks)])
        ticks = ticks[ticks != 0]
        out[r] = int(ticks.min()) if ticks.size else None
    return out


def origin_note(missing) -> str:
    return (f"ranks {sorted(missing)} had no origin (a trace file from before origins): their ns count from their "
            "first stamp here")


def _origins(trace) -> tuple:
    """``(origins, offsets, note)``: the trace's, or for ranks it has none of (a file
    written before origins), the rank's earliest stamp, with a note saying so."""
    origins, note = dict(trace.origins), None
    missing = [r for r in trace.ranks if r not in origins]
    if missing:
        first = first_ticks(trace.tasks, trace.phases, trace.marks, missing)
        origins.update({r: t or 0 for r, t in first.items()})
        note = origin_note(missing)
    return origins, dict(trace.offsets), note


def record(aid: str, capture: str, specs, origins: dict, offsets: dict, synthetic: bool, notes, parts, *,
           fingerprint: str | None = None, as_capture: bool = False) -> dict:
    """The manifest record that commits an append (docs/FORMAT.md §7): with the capture's
    ``fingerprint`` (``captures.fingerprint``) and whether it was added ``as_capture``."""
    return {"format": RL.RUN_FORMAT, "run_format": RL.RUN_FORMAT_VERSION, "append": aid, "capture": capture,
            "written_by": __version__, "specs": [sp.to_dict() for sp in specs],
            "origins": {str(r): int(v) for r, v in origins.items()},
            "offsets": {str(r): int(v) for r, v in offsets.items()}, "synthetic": bool(synthetic),
            "notes": list(notes), "parts": parts, "fingerprint": fingerprint, "as_capture": bool(as_capture)}


def launches_of(run_dir: Path):
    """``records -> their launches rows``: the reader ``captures.refusal`` is given."""
    def read(records) -> pa.Table:
        tables = [RL.read_parquet(Path(run_dir) / e["path"]) for r in records for e in r["parts"]
                  if e["table"] == "launches"]
        return pa.concat_tables(tables, promote_options="permissive") if tables else RL.empty_launches()
    return read


def check_capture(run_dir: Path, *, aid: str, capture: str, fp: str, as_capture: bool, launches: pa.Table,
                  seen: dict | None = None) -> None:
    """A ``RunError`` (one line) where the append may not join the run
    (``captures.refusal``: the same capture again, a launch key the run holds);
    ``seen``: ``layout.committed_records``' records read before."""
    why = RC.refusal(run_dir, RL.committed_records(run_dir, seen), launches_of(run_dir), aid=aid, capture=capture, fp=fp,
                     as_capture=as_capture, launches=launches)
    if why is not None:
        raise RL.RunError(why)


def check_dir(run_dir: Path) -> None:
    """A ``RunError`` where ``run_dir`` is neither a run nor new nor empty (``captures.is_run_or_new``)."""
    why = RC.is_run_or_new(run_dir)
    if why is not None:
        raise RL.RunError(why)


def aggregate_tables(trace, capture: str, append: str, baseline: bool = False) -> tuple:
    """``(launches, stages)`` tables of an append: in one pass (``aggregate.aggregates``),
    or with ``baseline`` as ``launch_rows`` and ``stage_rows`` compute them apart (the
    same tables; bench/run_append_profile.py times both)."""
    if baseline or trace.tasks.num_rows == 0:
        launches = launch_rows(trace, capture, append)
        return launches, stage_rows(trace, launches, capture, append)
    return RA.aggregates(trace, capture, append, STAGE_QUANTILES)


def append(run_dir, trace, *, capture=None, progress=None, baseline: bool = False, as_capture: bool = False) -> list:
    """Append ``trace`` (any ranks and launches of the run's build) to the run at
    ``run_dir``, creating it if absent; return the relative paths of the parts written.
    Each (rank, launch) is keyed by the slot header's (step, layer), or by (capture,
    launch) where they are null; ``capture`` defaults to the append's id. Refused
    (``RunError``, nothing committed) where the run holds this capture already (its
    fingerprint) or one of its launch keys, unless ``as_capture``: then it joins as a
    capture of its own, its launches keyed ``capture:SLOT`` (docs/RUN.md, "Captures").
    Every part is written under a temporary name, fsynced and renamed; the manifest
    record written last commits them, so a crash leaves the run as it was. ``baseline``:
    the slower path this one replaced (the aggregates apart, every column stored
    nullable): the same dataset (tests/test_run_aggregate.py), for the bench to time
    against."""
    run_dir = Path(run_dir)
    check_dir(run_dir)
    ensure_build(run_dir, trace.spec)
    aid = RL.new_append_id()
    capture = str(capture) if capture is not None else aid
    keep = stored_task_columns(trace.phases, trace.marks)
    opts = task_part_options(trace.phases, trace.marks)
    groups = partition_groups(trace.tasks)
    done = [0]

    def write_part(group) -> dict:
        rank, step, idx = group
        rows = trace.tasks if idx is None else (trace.tasks.slice(idx.start, idx.stop - idx.start)
                                                if isinstance(idx, slice) else trace.tasks.take(R.arrow(idx)))
        entry = RL.write_parquet(run_dir, RL.tasks_part_path(rank, step, aid), rows.select(keep),
                                 required=not baseline, **opts)
        done[0] += 1
        if progress is not None:
            progress(done[0], len(groups) + 1)
        return {"table": "tasks", "rank": rank, "step": step, **entry}

    with ThreadPoolExecutor(max_workers=WRITER_THREADS) as pool:  # Parquet encodes without the GIL
        fp = pool.submit(RC.fingerprint, trace)
        written = pool.map(write_part, groups)
        launches, stages = aggregate_tables(trace, capture, aid, baseline)  # meanwhile, here
        small = _small_parts(run_dir, pool, aid, (("launches", launches), ("stages", stages),
                                                  ("anomalies", keyed(trace.anomalies, launches, capture, aid))))
        try:
            check_capture(run_dir, aid=aid, capture=capture, fp=fp.result(), as_capture=as_capture, launches=launches)
        except RL.RunError:
            for p in list(written) + [f.result() for f in small]:  # this append's own uncommitted parts
                (run_dir / p["path"]).unlink(missing_ok=True)
            raise
        parts = list(written) + [f.result() for f in small]
    origins, offsets, note = _origins(trace)
    rec = record(aid, capture, trace.specs, origins, offsets, trace.synthetic,
                 list(trace.notes) + ([note] if note else []), parts, fingerprint=fp.result(), as_capture=as_capture)
    RL.write_json(RL.manifest_path(run_dir, aid), rec)
    if progress is not None:
        progress(len(groups) + 1, len(groups) + 1)
    return [p["path"] for p in parts]


def _small_parts(run_dir: Path, pool, aid: str, tables) -> list:
    """The append's ``(name, table)`` small parts submitted to ``pool``: futures of their entries."""
    def write_small(name: str, table: pa.Table) -> dict:
        return {"table": name, **RL.write_parquet(run_dir, RL.small_part_path(name, aid), table, **PARQUET_OPTIONS)}

    return [pool.submit(write_small, name, table) for name, table in tables]


def create(run_dir) -> Path:
    """An empty run directory (no build yet: the first append records it)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RL.RunError(f"{str(run_dir)!r} exists and is not a directory: a run is a directory")
    (run_dir / RL.MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
    return run_dir


__all__ = ["STAGE_QUANTILES", "TASK_CODEC", "aggregate_tables", "append", "build_of", "check_capture", "check_dir", "create",
           "ensure_build", "launches_of", "first_ticks", "keyed",
           "launch_rows", "origin_note", "partition_groups", "read_build", "record", "stage_rows", "stored_task_columns",
           "task_part_options", "tick_columns"]
