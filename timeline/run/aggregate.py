"""The per-launch aggregates an append stores, in one pass over its task rows: the
``launches`` rows and the per-launch stage report (``stages``) from one phase matrix,
one extent per row, one set of intervals and group numbers read off the rows' runs.
Task rows come launch by launch and stage by stage, so the rows of one (rank, launch,
stage) lie in a few runs found by comparing neighbours; every per-group count, minimum
and maximum is then taken over the runs, and each interval's quantiles over values
already grouped. The tables are ``write.launch_rows``'s and ``write.stage_rows``'s
(``analysis.stage_report(by_launch=True)``, keyed), value for value
(tests/test_run_aggregate.py); this computes them once instead of twice over."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.contract import schema as S
from timeline.core import grouped as GR
from timeline.core import rows as R


class Runs(NamedTuple):
    """Maximal runs of task rows of one (rank, launch, stage): each run's first row
    (``start``), length, its pair's number (pairs: the (rank, launch) tuples in
    lexicographic order, ``pair_rank`` / ``pair_launch``) and its group's number
    (``pair * stages + stage index``, the stage report's row)."""

    start: np.ndarray
    length: np.ndarray
    pair: np.ndarray
    group: np.ndarray
    pair_rank: np.ndarray
    pair_launch: np.ndarray

    @property
    def npair(self) -> int:
        return self.pair_rank.size

    @property
    def grouped(self) -> bool:
        """Whether the rows are in group order already (no group's rows split by another's)."""
        return bool((self.group[1:] > self.group[:-1]).all())

    def row_groups(self) -> np.ndarray:
        """Each row's group number."""
        return np.repeat(self.group, self.length)


def row_runs(tasks: pa.Table, nstages: int) -> Runs:
    """The runs of a non-empty tasks table (``Runs``)."""
    rank, launch = R.column(tasks, "rank", dtype=np.int64), R.column(tasks, "launch", dtype=np.int64)
    stage = R.column(tasks, "stage_index", dtype=np.int64)
    change = (rank[1:] != rank[:-1]) | (launch[1:] != launch[:-1]) | (stage[1:] != stage[:-1])
    start = np.flatnonzero(np.r_[True, change])
    length = np.diff(np.r_[start, rank.size])
    pair, _, (pr, pl) = GR.group_ids(rank[start], launch[start])
    return Runs(start, length, pair, pair * nstages + stage[start], pr, pl)


def launch_index(pair_rank, pair_launch, table: pa.Table) -> np.ndarray:
    """Each row of ``table`` (its ``rank`` and ``launch`` columns) as the index of its
    (rank, launch) among the pairs ``pair_rank`` / ``pair_launch``; -1 where it names
    none (or a null). One sort of the pairs and a search, not a dict per row."""
    def key(rank, launch):  # a rank (int16) and a launch (int32) packed in one int64
        return np.asarray(rank, dtype=np.int64) * (1 << 32) + np.asarray(launch, dtype=np.int64)

    pairs = key(pair_rank, pair_launch)
    out = np.full(table.num_rows, -1, dtype=np.int64)
    if not pairs.size or not table.num_rows:
        return out
    order = np.argsort(pairs, kind="stable")
    rows = key(R.column(table, "rank", fill=0), R.column(table, "launch", fill=0))
    at = np.minimum(np.searchsorted(pairs[order], rows), pairs.size - 1)
    hit = (pairs[order][at] == rows) & R.numpy(table.column("rank").is_valid()) & R.numpy(table.column("launch").is_valid())
    out[hit] = order[at[hit]]
    return out


def anomaly_counts(trace, pair_rank, pair_launch) -> np.ndarray:
    """Per (rank, launch) pair, the anomalies ``Trace.anomaly_count`` counts (notices not)."""
    out = np.zeros(pair_rank.size, dtype=np.int64)
    a = trace.anomalies
    if a.num_rows:
        idx = launch_index(pair_rank, pair_launch, a)
        counted = (idx >= 0) & ~np.isin(np.array(a.column("kind").to_pylist(), dtype=object), list(S.NOTICE_KINDS))
        np.add.at(out, idx[counted], R.column(a, "count", fill=0, dtype=np.int64)[counted])
    return out


def repeated(text: str, n: int) -> pa.Array:
    """``text`` ``n`` times as a string array (not ``pa.array`` of a list: that imports
    pandas, a fifth of a second of ``timeline run add``)."""
    return R.strings([text]).take(R.arrow(np.zeros(n, dtype=np.int64)))


def launch_table(pair_rank, pair_launch, step, layer, start, end, tasks, rows, intervals, anomalies,
                 capture: str, append: str) -> pa.Table:
    """The ``launches`` part's table (``layout.LAUNCH_COLUMNS``) of per-pair arrays:
    ``step`` / ``layer`` Arrow arrays, the rest numpy, ``start`` / ``end`` ``NS_MISSING``
    where the launch has no written stamp."""
    n = pair_rank.size
    valid = start != S.NS_MISSING
    return pa.table({
        "rank": R.arrow(pair_rank.astype(np.int16)),
        "step": step.combine_chunks() if n else R.arrow(np.zeros(0, np.int64)),
        "layer": layer.combine_chunks() if n else R.arrow(np.zeros(0, np.int32)),
        "capture": repeated(capture, n), "launch": R.arrow(pair_launch.astype(np.int32)),
        "start_ns": R.arrow(start, mask=~valid), "end_ns": R.arrow(end, mask=~valid),
        "kernel_ns": R.arrow(np.where(valid, end - start, 0), mask=~valid),
        "tasks": R.arrow(tasks.astype(np.int64)), "rows": R.arrow(rows.astype(np.int64)),
        "intervals": R.arrow(intervals.astype(np.int64)), "anomalies": R.arrow(anomalies),
        "append": repeated(append, n)})


def _interval_counts(runs: Runs, keep: np.ndarray, ngroups: int, all_rows: np.ndarray) -> np.ndarray:
    """Per group, how many rows ``keep`` marks (``all_rows`` when it marks every row)."""
    if keep.all():
        return all_rows
    per_run = np.add.reduceat(keep, runs.start, dtype=np.int64)
    return np.bincount(runs.group, weights=per_run, minlength=ngroups).astype(np.int64)


def aggregates(trace, capture: str, append: str, quantiles) -> tuple:
    """``(launches, stages)`` of ``trace``: ``write.launch_rows(trace, capture, append)``
    and ``write.stage_rows(...)`` with interval ``quantiles``, computed together."""
    from timeline.analysis import stages as A

    t, spec = trace.tasks, trace.spec
    nst = len(spec.stages)
    runs = row_runs(t, nst)
    npair, ng = runs.npair, runs.npair * nst
    ns = R.phase_matrix(t, trace.phases)
    first, last = R.extent(ns)
    run_first, run_last = np.minimum.reduceat(first, runs.start), np.maximum.reduceat(last, runs.start)
    scope = GR.group_min_max(runs.pair, npair, run_first, run_last)
    rows_g = np.bincount(runs.group, weights=runs.length, minlength=ng).astype(np.int64)
    row_group = runs.row_groups()
    tasks_g = GR.distinct_count(row_group, ng, R.column(t, "task", dtype=np.int64))
    cols = {"rank": R.arrow(np.repeat(runs.pair_rank, nst).astype(np.int16)),
            "launch": R.arrow(np.repeat(runs.pair_launch, nst).astype(np.int32)),
            "stage": GR.stage_strings(spec, np.tile(np.arange(nst), npair)), "tasks": R.arrow(tasks_g)}
    cols.update(A.span_columns(scope, GR.group_min_max(runs.group, ng, run_first, run_last), nst))
    intervals = np.zeros(npair, dtype=np.int64)
    names = S.interval_names(trace.phases)
    if names:
        iv = R.phase_intervals(ns)
        order = None if runs.grouped else GR.group_order(row_group)
        for j, name in enumerate(names):
            dur, keep = iv.end[:, j] - iv.start[:, j], iv.valid[:, j]
            counts = _interval_counts(runs, keep, ng, rows_g)
            intervals += counts.reshape(npair, nst).sum(axis=1)
            if order is not None:
                dur, keep = dur[order], keep[order]
            values = dur if counts is rows_g else dur[keep]
            cols.update(A.quantile_columns(name, GR.grouped_quantiles(counts, values, quantiles), quantiles))
    pair_last = np.zeros(npair, dtype=np.int64)  # each pair's last row: its step and layer
    np.maximum.at(pair_last, runs.pair, runs.start + runs.length - 1)
    take = R.arrow(pair_last)
    launches = launch_table(runs.pair_rank, runs.pair_launch, t.column("step").take(take), t.column("layer").take(take),
                            *scope, tasks_g.reshape(npair, nst).sum(axis=1), rows_g.reshape(npair, nst).sum(axis=1),
                            intervals, anomaly_counts(trace, runs.pair_rank, runs.pair_launch), capture, append)
    by_pair = R.arrow(np.repeat(np.arange(npair, dtype=np.int64), nst))
    stages = (pa.table(cols).append_column("step", launches.column("step").take(by_pair))
              .append_column("layer", launches.column("layer").take(by_pair))
              .append_column("capture", repeated(capture, ng)).append_column("append", repeated(append, ng)))
    return launches, stages


__all__ = ["Runs", "aggregates", "anomaly_counts", "launch_index", "launch_table", "repeated", "row_runs"]
