"""Appending a ``Trace`` to a run: its task rows as one Parquet part per (rank, step),
its per-launch aggregates (``launches``), per-launch stage report (``stages``) and
anomaly report as one small part each, then the manifest record that commits them.
Several processes may append to one run at once: every name an append writes carries
its own append id, and the build file is created once (by a hard link, atomically)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline._version import __version__
from timeline.run import layout as L

STAGE_QUANTILES = (0.5, 0.9, 0.99)  # the per-launch stage report's interval quantiles a run keeps
PARTITION_COLUMNS = ("rank", "step")  # in the path (Hive), not in the task part
ROW_GROUP_ROWS = 1 << 17
PARQUET_OPTIONS = {"compression": "zstd"}


def stored_task_columns(phases, marks) -> list:
    """The task columns a part holds: the tasks schema less the partition columns and
    the ``<phase>_ns`` / ``<mark>_ns`` columns (derived on read from the raw ticks and
    the append's origins and offsets, ``timeline.trace.retime``)."""
    ns = {f"{p}_ns" for p in (*phases, *marks)}
    return [n for n in S.tasks_schema(phases, marks).names if n not in ns and n not in PARTITION_COLUMNS]


def tick_columns(phases, marks) -> list:
    return [f"{p}_tick" for p in (*phases, *marks)]


def task_part_options(phases, marks) -> dict:
    """Parquet options of a task part: zstd; ticks delta-encoded (DELTA_BINARY_PACKED:
    consecutive stamps differ by little), every other column dictionary-encoded.
    docs/RUN.md has the sizes this was chosen by."""
    ticks = tick_columns(phases, marks)
    other = [c for c in stored_task_columns(phases, marks) if c not in ticks]
    return {**PARQUET_OPTIONS, "use_dictionary": other, "column_encoding": {c: "DELTA_BINARY_PACKED" for c in ticks},
            "row_group_size": ROW_GROUP_ROWS}


def build_of(spec: S.Spec) -> dict:
    """What every trace of a run shares (``run.json``): kernel, stages, phases, marks."""
    return {"format": L.RUN_FORMAT, "run_format": L.RUN_FORMAT_VERSION, "kernel": spec.kernel,
            "stages": [[n, c] for n, c in spec.stages], "phases": list(spec.phases), "marks": list(spec.marks)}


def _same_build(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("stages", "phases", "marks"))


def ensure_build(run_dir: Path, spec: S.Spec) -> None:
    """Create the run (its directory and ``run.json``) if absent, else check that
    ``spec`` is of the run's build: a ``RunError`` naming both otherwise."""
    run_dir.mkdir(parents=True, exist_ok=True)
    want = build_of(spec)
    path = run_dir / L.BUILD_FILE
    if not path.exists():
        L.write_json(path, want, exclusive=True)  # two first writers: one wins, the other checks against it
    have = read_build(run_dir)
    if not _same_build(have, want):
        raise L.RunError(
            f"run {str(run_dir)!r} holds {have.get('kernel')!r} (stages {[n for n, _ in have['stages']]}, phases "
            f"{have['phases']}); this trace is {spec.kernel!r} (stages {list(spec.stage_names)}, phases "
            f"{list(spec.phases)}): append it to a run of its own")


def read_build(run_dir: Path) -> dict:
    """The run's ``run.json``; a ``RunError`` for a damaged one."""
    path = Path(run_dir) / L.BUILD_FILE
    try:
        build = json.loads(path.read_text())
        assert build.get("format") == L.RUN_FORMAT and "stages" in build and "phases" in build
    except (ValueError, AssertionError, AttributeError, UnicodeDecodeError):
        raise L.RunError(f"run {str(run_dir)!r}: {L.BUILD_FILE} is damaged; it names the run's build "
                         "(rewrite it from any manifest record's specs)") from None
    return build


def _partition_groups(tasks: pa.Table):
    """``[(rank, step or None, row indices)]``: the task rows of each (rank, step)."""
    rank = R.numpy(tasks.column("rank")).astype(np.int64)
    step_col = tasks.column("step")
    step = R.numpy(R.filled(step_col, -1)).astype(np.int64)  # -1: no slot header (a header's step is >= 0)
    if tasks.num_rows and (rank == rank[0]).all() and (step == step[0]).all():
        return [(int(rank[0]), None if step[0] < 0 else int(step[0]), None)]
    gid, ng, (gr, gs) = GR.group_ids(rank, step)
    order = np.argsort(gid, kind="stable")
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
    step, layer = t.column("step").take(pa.array(rep)), t.column("layer").take(pa.array(rep))
    anomalies = np.zeros(ng, dtype=np.int64)
    a = trace.anomalies
    if a.num_rows:
        keys = {(int(r), int(l)): i for i, (r, l) in enumerate(zip(gr, gl))}
        for r, l, kind, n in zip(*(a.column(c).to_pylist() for c in ("rank", "launch", "kind", "count"))):
            i = keys.get((r, l))
            if i is not None and kind not in S.NOTICE_KINDS:
                anomalies[i] += n
    valid = start != S.NS_MISSING
    return pa.table({
        "rank": pa.array(gr.astype(np.int16)), "step": step.combine_chunks() if ng else pa.array([], pa.int64()),
        "layer": layer.combine_chunks() if ng else pa.array([], pa.int32()),
        "capture": pa.array([capture] * ng, pa.string()), "launch": pa.array(gl.astype(np.int32)),
        "start_ns": R.arrow(start, mask=~valid), "end_ns": R.arrow(end, mask=~valid),
        "kernel_ns": R.arrow(np.where(valid, end - start, 0), mask=~valid),
        "tasks": pa.array(tasks.astype(np.int64)), "rows": pa.array(rows), "intervals": pa.array(intervals),
        "anomalies": pa.array(anomalies), "append": pa.array([append] * ng, pa.string())})


def _keyed(table: pa.Table, launches: pa.Table, capture: str, append: str) -> pa.Table:
    """``table`` (rows keyed by rank and launch) with each row's step, layer, capture and append."""
    keys = {(r, l): i for i, (r, l) in enumerate(zip(launches.column("rank").to_pylist(),
                                                     launches.column("launch").to_pylist()))}
    idx = [keys.get((r, l)) for r, l in zip(table.column("rank").to_pylist(), table.column("launch").to_pylist())]
    take = pa.array(idx, pa.int64())
    n = table.num_rows
    return (table.append_column("step", launches.column("step").take(take))
            .append_column("layer", launches.column("layer").take(take))
            .append_column("capture", pa.array([capture] * n, pa.string()))
            .append_column("append", pa.array([append] * n, pa.string())))


def stage_rows(trace, launches: pa.Table, capture: str, append: str) -> pa.Table:
    """The stage report of every (rank, launch) (``analysis.stage_report(by_launch=True)``,
    interval quantiles ``STAGE_QUANTILES``), keyed by step, layer and capture."""
    from timeline import analysis as A

    if trace.tasks.num_rows == 0:
        report = A.stage_report(trace, by_launch=True, quantiles=STAGE_QUANTILES).slice(0, 0)
    else:
        report = A.stage_report(trace, by_launch=True, quantiles=STAGE_QUANTILES)
    return _keyed(report, launches, capture, append)


def _origins(trace) -> tuple:
    """``(origins, offsets, note)``: the trace's, or for ranks it has none of (a file
    written before origins), the rank's earliest stamp, with a note saying so."""
    origins, note = dict(trace.origins), None
    missing = [r for r in trace.ranks if r not in origins]
    if missing:
        tasks, rank = trace.tasks, R.numpy(trace.tasks.column("rank"))
        for r in missing:
            ticks = np.concatenate([R.numpy(tasks.column(c))[rank == r] for c in tick_columns(trace.phases, trace.marks)])
            ticks = ticks[ticks != 0]
            origins[r] = int(ticks.min()) if ticks.size else 0
        note = (f"ranks {missing} had no origin (a trace file from before origins): their ns count from their "
                "first stamp here")
    return origins, dict(trace.offsets), note


def append(run_dir, trace, *, capture=None, progress=None) -> list:
    """Append ``trace`` (any ranks and launches of the run's build) to the run at
    ``run_dir``, creating it if absent; return the relative paths of the parts written.
    Each (rank, launch) is keyed by the slot header's (step, layer), or by (capture,
    launch) where they are null; ``capture`` defaults to the append's id. Every part is
    written under a temporary name, fsynced and renamed; the manifest record written
    last commits them, so a crash leaves the run as it was (docs/RUN.md)."""
    run_dir = Path(run_dir)
    ensure_build(run_dir, trace.spec)
    aid = L.new_append_id()
    capture = str(capture) if capture is not None else aid
    phases, marks = trace.phases, trace.marks
    keep = stored_task_columns(phases, marks)
    opts = task_part_options(phases, marks)
    groups = _partition_groups(trace.tasks)
    if progress is not None:
        progress(0, len(groups) + 1)
    parts = []
    for i, (rank, step, idx) in enumerate(groups):
        rows = trace.tasks if idx is None else trace.tasks.take(pa.array(idx))
        entry = L.write_parquet(run_dir, L.tasks_part_path(rank, step, aid), rows.select(keep), **opts)
        parts.append({"table": "tasks", "rank": rank, "step": step, **entry})
        if progress is not None:
            progress(i + 1, len(groups) + 1)
    launches = launch_rows(trace, capture, aid)
    for name, table in (("launches", launches), ("stages", stage_rows(trace, launches, capture, aid)),
                        ("anomalies", _keyed(trace.anomalies, launches, capture, aid))):
        parts.append({"table": name, **L.write_parquet(run_dir, L.small_part_path(name, aid), table, **PARQUET_OPTIONS)})
    origins, offsets, note = _origins(trace)
    record = {"format": L.RUN_FORMAT, "run_format": L.RUN_FORMAT_VERSION, "append": aid, "capture": capture,
              "written_by": __version__, "specs": [sp.to_dict() for sp in trace.specs],
              "origins": {str(r): int(v) for r, v in origins.items()},
              "offsets": {str(r): int(v) for r, v in offsets.items()}, "synthetic": trace.synthetic,
              "notes": list(trace.notes) + ([note] if note else []), "parts": parts}
    L.write_json(L.manifest_path(run_dir, aid), record)
    if progress is not None:
        progress(len(groups) + 1, len(groups) + 1)
    return [p["path"] for p in parts]


def create(run_dir) -> Path:
    """An empty run directory (no build yet: the first append records it)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise L.RunError(f"{str(run_dir)!r} exists and is not a directory: a run is a directory")
    (run_dir / L.MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
    return run_dir


__all__ = ["STAGE_QUANTILES", "append", "build_of", "create", "ensure_build", "launch_rows", "read_build",
           "stage_rows", "stored_task_columns", "task_part_options", "tick_columns"]
