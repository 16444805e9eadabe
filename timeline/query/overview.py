"""A trace file's or a run's launches as one table to draw (the dashboard's run
overview): each launch's ``launches.launch_times`` row (its key, kernel time, skew,
anomalies) with its task rows across ranks and each rank's own span, in key order
(launches with a slot header by step, then layer; the others by capture, then slot),
and its typical (p50), p99 and slowest launches by ``timeline.analysis.launches``'
rules. Read from the source's per-(rank, launch) rows, never a task row."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.analysis import launches as LA
from timeline.core import launchkey as KY
from timeline.core import rows as R
from timeline.query.source import QueryError, key_column


class Overview(NamedTuple):
    """``times``: the source's ``launch_times`` rows in key order; ``keys`` their
    ``LaunchKey``s; ``tasks`` each launch's task rows across ranks; ``ranks`` the
    source's ranks and ``per_rank[i, j]`` rank ``ranks[i]``'s own span of launch
    ``j`` (ns, NaN where it has none); ``typical``, ``p99``, ``slowest``: launch
    indices (None without timed launches)."""

    times: pa.Table
    keys: list
    tasks: np.ndarray
    ranks: list
    per_rank: np.ndarray
    typical: int | None
    p99: int | None
    slowest: int | None

    @property
    def n(self) -> int:
        return len(self.keys)

    @property
    def kernel(self) -> np.ndarray:
        """Each launch's kernel time (ns, NaN untimed): ``launches.kernel``."""
        return LA.kernel(self.times)

    def index(self, key) -> int | None:
        """The position of launch ``key`` (a ``LaunchKey`` as this source keys it, or
        its printed form), None when absent."""
        want = str(key)
        return next((i for i, k in enumerate(self.keys) if str(k) == want), None)

    def find(self, src, want: KY.LaunchKey) -> int:
        """The position of the one launch ``want`` names in ``src`` (``Source.resolve``:
        the one rule of what a key names); ``QueryError`` when it names none or several."""
        hit = src.resolve(want, self.times)
        if len(hit) != 1:
            raise QueryError(f"launch {want} names {len(hit)} launches: {KY.brief([self.keys[i] for i in hit])}")
        return hit[0]


def key_order(keys: list) -> list:
    """Indices of ``keys`` in key order: (step, layer) ones first by step then layer,
    then (capture, slot) ones by capture then slot."""
    def sort_key(i):
        k = keys[i]
        if k.headed:
            return 0, k.step, k.layer, "", 0
        return 1, 0, 0, k.capture or "", -1 if k.slot is None else k.slot
    return sorted(range(len(keys)), key=sort_key)


def overview(src) -> Overview:
    """The ``Overview`` of ``src`` (a ``timeline.query.source.Source``)."""
    times = src.times()
    order = key_order(LA.keys(times))
    times = times.take(pa.array(order, pa.int64())) if order else times
    keys = LA.keys(times)
    at = {str(k): i for i, k in enumerate(keys)}
    rows = src.rank_rows()
    row_launch = np.array([at.get(k, -1) for k in key_column(rows).to_pylist()], dtype=np.int64)
    ok = row_launch >= 0
    n = len(keys)
    tasks = np.zeros(n, np.int64)
    np.add.at(tasks, row_launch[ok], R.numpy(R.filled(rows.column("tasks"), 0)).astype(np.int64)[ok])
    rank = R.numpy(rows.column("rank")).astype(np.int64)
    ranks = sorted(set(rank.tolist()))
    per_rank = np.full((len(ranks), n), np.nan)
    if ranks and n:
        ri = np.searchsorted(np.asarray(ranks), rank)
        per_rank[ri[ok], row_launch[ok]] = LA.floats(rows.column("kernel_ns"))[ok]
    k = LA.kernel(times)
    top = LA.slowest(k)
    return Overview(times, keys, tasks, ranks, per_rank, LA.at_quantile(k, 0.5), LA.at_quantile(k, 0.99),
                    top[0] if top else None)


__all__ = ["Overview", "key_order", "overview"]
