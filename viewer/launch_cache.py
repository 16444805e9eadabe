"""The launches a run's page has opened, kept within a memory budget: least recently
used first out, sizes counted from what a loaded launch holds (its Arrow tables,
the numpy columns of its ``TraceData``, its cached row layouts and analysis
tables), so that a run of any size is served from a bounded server.

A loaded launch is a ``viewer.sources.Loaded``, as a trace file is: every panel
works on it unchanged; a ``Raw`` one is a launch read for an analysis only
(``timeline.query.explain`` reads a run's typical launches through the cache)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa

DEFAULT_BUDGET = 1 << 30  # bytes: timeline-view --memory-budget's default (1 GiB)


def _nbytes(value) -> int:
    """Bytes held by a numpy array, an Arrow table, a tuple / dict / list of them;
    0 for anything else (small Python values)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (pa.Table, pa.Array, pa.ChunkedArray)):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class Raw:
    """A launch's bare ``Trace`` (read for an analysis, not drawn: no ``TraceData``)."""

    def __init__(self, trace):
        self.trace = trace


def footprint(item) -> int:
    """Bytes a loaded launch holds now: its tables, its ``TraceData`` columns, its
    row layouts and cached analyses (they grow as the page asks for more). The
    tables and columns, fixed once loaded, are counted once (Arrow's ``nbytes``
    walks every buffer). A ``Raw`` trace: its tables, its intervals once made."""
    if isinstance(item, Raw):
        tr = item.trace
        return _nbytes(tr.tasks) + _nbytes(tr.anomalies) + _nbytes(vars(tr).get("intervals"))
    fixed = vars(item).get("_fixed_bytes")
    if fixed is None:
        tr = item.trace
        tr.intervals  # noqa: B018 - made on load (TraceData reads it): count it
        fixed = _nbytes(tr.tasks) + _nbytes(tr.anomalies) + _nbytes(tr.intervals)
        fixed += _nbytes(list(vars(item.data).values()))
        item._fixed_bytes = fixed
    n = fixed
    with item.lock:
        n += _nbytes(list(item.views.values())) + _nbytes(list(item.cache.values()))
    return n


class LaunchCache:
    """Loaded launches by name, their total ``footprint`` kept within ``budget`` bytes
    (the least recently used go first; the one just asked for always stays). Thread
    safe: Dash serves callbacks from several threads."""

    def __init__(self, budget: int = DEFAULT_BUDGET):
        self.budget = int(budget)
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict = {}  # name -> Event: one load per name at a time

    def names(self) -> list:
        with self._lock:
            return list(self._items)

    def held(self) -> int:
        """Bytes the launches in the cache hold now."""
        with self._lock:
            items = list(self._items.values())
        return sum(footprint(i) for i in items)

    def get(self, name: str, make):
        """The launch ``name``, loaded by ``make()`` on a miss (one load per name at a
        time: a second request for a launch being loaded waits for it); then the
        least recently used launches are dropped until the total fits the budget."""
        while True:
            with self._lock:
                item = self._items.get(name)
                if item is not None:
                    self._items.move_to_end(name)
                    break
                wait = self._loading.get(name)
                if wait is None:
                    self._loading[name] = threading.Event()
            if wait is not None:
                wait.wait()
                continue
            try:
                item = make()
            finally:
                with self._lock:
                    self._loading.pop(name).set()
            with self._lock:
                self._items[name] = item
                self._items.move_to_end(name)
            break
        self.trim(keep=name)
        return item

    def peek(self, name: str):
        """The launch ``name`` when it is in the cache (made as most recently used), else None."""
        with self._lock:
            item = self._items.get(name)
            if item is not None:
                self._items.move_to_end(name)
            return item

    def pop(self, name: str):
        """Take the launch ``name`` out of the cache (None when it is not there)."""
        with self._lock:
            return self._items.pop(name, None)

    def trim(self, keep: str | None = None):
        """Drop least recently used launches (never ``keep``) while over the budget."""
        with self._lock:
            items = list(self._items.items())
        sizes = {k: footprint(v) for k, v in items}
        total = sum(sizes.values())
        with self._lock:
            for k in list(self._items):
                if total <= self.budget:
                    break
                if k == keep:
                    continue
                self._items.pop(k, None)
                total -= sizes.get(k, 0)
__all__ = ["DEFAULT_BUDGET", "LaunchCache", "Raw", "footprint"]
