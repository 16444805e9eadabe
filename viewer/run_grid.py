"""A run's launches laid out as the overview's heat map (``RunOverview``): launches
with a slot header on a step x layer grid, a run without them on a capture x slot
grid (a row per capture, a column per launch slot), a trace file without headers on
one row of its launch numbers. The axes carry the actual values as categories (steps
0, 4, 8 are three columns named 0, 4, 8); past ``MAX_CELLS`` columns, neighbouring
columns merge (each cell its slowest launch). Every value comes from the run's
``timeline.query.overview`` (launch keys, kernel time, picks): nothing is computed
here but the layout."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from timeline.core import launchkey as KY
from timeline.query import overview as QO

MAX_CELLS = 600  # overview columns drawn; more are binned (each cell its slowest launch)
HEADED, CAPTURED, NUMBERED = "step:layer", "capture:slot", "launch"  # the grid's forms (how a cell's key reads)


class Grid(NamedTuple):
    """The heat map's layout: ``form`` (``HEADED``, ``CAPTURED``, ``NUMBERED``), the
    column values ``xs`` and row values ``ys`` (text: the axes' categories), each
    launch's ``col`` and ``row`` (-1: not on this grid), ``at[row, col]`` the launch
    there (-1: none), ``off`` the launches not on the grid, the axes' titles."""

    form: str
    xs: list
    ys: list
    col: np.ndarray
    row: np.ndarray
    at: np.ndarray
    off: int
    x_title: str
    y_title: str


def grid_of(keys: list, name: str) -> Grid:
    """The ``Grid`` of launches ``keys``: step x layer when any has a slot header (the
    others are ``off`` it), else capture x slot (a launch number alone: one row named
    ``name``)."""
    headed = [k.headed for k in keys]
    if any(headed):
        form, xv, yv = HEADED, [k.step if h else None for k, h in zip(keys, headed)], \
            [k.layer if h else None for k, h in zip(keys, headed)]
        titles = ("step", "layer")
    elif any(k.capture is not None for k in keys):
        form, xv, yv = CAPTURED, [k.slot for k in keys], [k.capture for k in keys]
        titles = ("launch slot", "capture")
    else:
        form, xv, yv = NUMBERED, [k.slot for k in keys], [name if k.slot is not None else None for k in keys]
        titles = ("launch", "")
    xs = sorted({v for v in xv if v is not None})
    ys = sorted({v for v in yv if v is not None}, key=lambda v: (isinstance(v, str), v))
    xi, yi = {v: i for i, v in enumerate(xs)}, {v: i for i, v in enumerate(ys)}
    col = np.array([xi.get(v, -1) if v is not None else -1 for v in xv], dtype=np.int64)
    row = np.array([yi.get(v, -1) if v is not None else -1 for v in yv], dtype=np.int64)
    row[col < 0], col[row < 0] = -1, -1
    at = np.full((len(ys), len(xs)), -1, np.int64)
    on = np.flatnonzero(col >= 0)
    at[row[on], col[on]] = on
    return Grid(form, [str(v) for v in xs], [str(v) for v in ys], col, row, at, int((col < 0).sum()), *titles)


class RunOverview(NamedTuple):
    """A run's ``QO.Overview`` (``q``) on its ``Grid``, under the run's name."""

    run: str
    q: QO.Overview
    grid: Grid

    @property
    def n(self) -> int:
        return self.q.n

    @property
    def ranks(self) -> list:
        return self.q.ranks

    def keys(self) -> list:
        return list(self.q.keys)

    def pick(self, which: str) -> KY.LaunchKey | None:
        """The ``typical``, ``p99`` or ``slowest`` launch's key (None for none)."""
        i = getattr(self.q, which)
        return None if i is None else self.q.keys[i]

    @property
    def typical(self):
        return self.pick("typical")

    @property
    def p99(self):
        return self.pick("p99")

    @property
    def slowest(self):
        return self.pick("slowest")

    def index(self, key) -> int | None:
        return None if key is None else self.q.index(key)

    def tasks_of(self, key) -> int:
        """Task rows of a launch across ranks (0 when the run has no such launch)."""
        i = self.index(key)
        return 0 if i is None else int(self.q.tasks[i])

    def kernel_of(self, key) -> float:
        i = self.index(key)
        return math.nan if i is None else float(self.q.kernel[i])

    def neighbour(self, key, delta: int):
        """The launch ``delta`` places after ``key`` in key order (clamped to the first
        and last); the typical one when ``key`` is not a launch of the run."""
        i = self.index(key)
        if i is None:
            return self.typical
        return self.q.keys[min(max(i + delta, 0), self.n - 1)]

    def cell(self, key) -> tuple | None:
        """``(column, row)`` of a launch on the grid, None when it is not on it."""
        i = self.index(key)
        if i is None or self.grid.col[i] < 0:
            return None
        return int(self.grid.col[i]), int(self.grid.row[i])


def overview_of(run: str, q: QO.Overview) -> RunOverview:
    return RunOverview(run, q, grid_of(q.keys, run))


def values(ov: RunOverview, per_launch: np.ndarray) -> np.ndarray:
    """A per-launch value laid on the grid: ``[row, column]``, NaN where no launch."""
    g = ov.grid
    z = np.full(g.at.shape, np.nan)
    on = g.at >= 0
    z[on] = np.asarray(per_launch, dtype=np.float64)[g.at[on]]
    return z


def columns(ov: RunOverview) -> int:
    """How many grid columns one drawn column holds (1 up to ``MAX_CELLS`` columns)."""
    return max(1, math.ceil(len(ov.grid.xs) / MAX_CELLS))


def binned(z: np.ndarray, f: int) -> np.ndarray:
    """``z`` with every ``f`` columns merged into their largest value (NaN: none)."""
    if f == 1:
        return z
    pad = (-z.shape[1]) % f
    zz = np.pad(z, ((0, 0), (0, pad)), constant_values=np.nan).reshape(z.shape[0], -1, f)
    with np.errstate(all="ignore"):
        return np.where(np.isnan(zz).all(axis=2), np.nan, np.nanmax(np.where(np.isnan(zz), -np.inf, zz), axis=2))


def column_labels(ov: RunOverview, f: int) -> list:
    """The drawn columns' names: a column's value, or ``first–last`` of a merged one."""
    xs = ov.grid.xs
    if f == 1:
        return list(xs)
    out = []
    for i in range(0, len(xs), f):
        j = min(i + f, len(xs)) - 1
        out.append(xs[i] if j == i else f"{xs[i]}–{xs[j]}")
    return out


__all__ = ["CAPTURED", "Grid", "HEADED", "MAX_CELLS", "NUMBERED", "RunOverview", "binned", "column_labels",
           "columns", "grid_of", "overview_of", "values"]
