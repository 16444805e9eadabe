"""Change points across a run's steps, from its per-launch and per-(rank, stage)
summaries alone (docs/CHANGES.md): per layer, the series of kernel times over steps
(and their median over layers); per (rank, stage), the stage's span over steps (the
median over layers); each searched for level shifts (``timeline.analysis.segments``),
the series' change points within a few steps of each other taken as one change.

Each change point is then said with the one statistical rule
(``timeline.analysis.stats``): the layers it touches (each layer's kernel times after
against before, Benjamini–Hochberg over layers; none significant alone: every layer),
the shift of their kernel time with its interval (launches of a step as one block),
and the (rank, stage) spans that moved (the same test, adjusted over every (rank,
stage)); a change whose kernel-time shift is not significant is left out and
counted (a span that moved without moving the kernel is not a slower run). A series that drifts
is a drift, once. Why a change happened (the culprit) is asked of explain's A/B path
by ``timeline.query.changes``, which reads the few launches that needs."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.analysis import AnalysisError
from timeline.analysis import segments as SEG
from timeline.analysis import stats as ST
from timeline.core import grouped as GR
from timeline.core import rows as R

SPANS_LISTED = 8  # at most this many moved (rank, stage) spans a change point lists


class ChangesError(AnalysisError):
    """A run whose launches cannot be put on a step axis (no slot headers)."""


class Series(NamedTuple):
    """The values searched: ``steps`` (the run's distinct steps, in order), ``kernel``
    (steps x layers, ns, NaN where missing) of ``layers``, ``spans`` (steps x groups x
    layers, ns) of the (rank, stage) ``groups``."""

    steps: np.ndarray
    layers: np.ndarray
    kernel: np.ndarray
    groups: list
    spans: np.ndarray

    def names(self) -> list:
        """Each searched column's name, in ``matrix`` order."""
        return ([f"kernel layer {int(la)}" for la in self.layers] + ["kernel (median over layers)"]
                + [f"span rank {r} {s}" for r, s in self.groups])

    def matrix(self) -> np.ndarray:
        """steps x columns: each layer's kernel time, their median, each (rank, stage)'s
        span (median over layers)."""
        with np.errstate(all="ignore"):
            mid = np.nanmedian(self.kernel, axis=1, keepdims=True)
            spans = np.nanmedian(self.spans, axis=2) if self.spans.size else np.zeros((self.steps.size, 0))
        return np.concatenate([self.kernel, mid, spans], axis=1)


def series(times: pa.Table, stage_rows: pa.Table | None) -> Series:
    """The ``Series`` of a run's ``launch_times`` table (step, layer, kernel_ns) and its
    stage rows (rank, stage, step, layer, span_us); launches without a slot header are
    left out (a ``ChangesError`` where none has one)."""
    step, layer = (R.numpy(R.filled(times.column(c), -1)).astype(np.int64) for c in ("step", "layer"))
    ok = R.numpy(times.column("step").is_valid()) & R.numpy(times.column("layer").is_valid())
    if not ok.any():
        raise ChangesError("no launch carries a slot header (step, layer): change points are over steps; capture "
                           "with slot headers, or add files with `timeline run add --step S --layers-per-step L`")
    steps, layers = np.unique(step[ok]), np.unique(layer[ok])
    kernel = np.full((steps.size, layers.size), np.nan)
    k = R.numpy(R.filled(times.column("kernel_ns"), -1)).astype(np.float64)
    kernel[np.searchsorted(steps, step[ok]), np.searchsorted(layers, layer[ok])] = np.where(k[ok] >= 0, k[ok], np.nan)
    groups, spans = [], np.zeros((steps.size, 0, layers.size))
    if stage_rows is not None and stage_rows.num_rows:
        t = stage_rows.filter(pc.is_valid(stage_rows.column("step")))
        s_step, s_layer = (R.numpy(R.filled(t.column(c), -1)).astype(np.int64) for c in ("step", "layer"))
        rank = R.numpy(t.column("rank")).astype(np.int64)
        names = t.column("stage").combine_chunks().dictionary_encode()
        gid, _, (gr, gs) = GR.group_ids(rank, R.numpy(names.indices).astype(np.int64))
        stage_names = names.dictionary.to_pylist()
        groups = [(int(r), stage_names[int(s)]) for r, s in zip(gr, gs)]
        spans = np.full((steps.size, len(groups), layers.size), np.nan)
        keep = np.isin(s_step, steps) & np.isin(s_layer, layers)
        spans[np.searchsorted(steps, s_step[keep]), gid[keep], np.searchsorted(layers, s_layer[keep])] = \
            R.numpy(R.filled(t.column("span_us"), np.nan)).astype(np.float64)[keep] * 1e3
    return Series(steps, layers, kernel, groups, spans)


class Point(NamedTuple):
    """A change point: at step index ``at`` (``low``..``high`` its confidence set), the
    segment before from ``before`` and after up to ``after`` (indices, exclusive end),
    the ``columns`` of ``Series.matrix`` whose search found it, its summed ``gain``."""

    at: int
    low: int
    high: int
    before: int
    after: int
    columns: list
    gain: float


class Drift(NamedTuple):
    """A drift: from step index ``start`` on, the ``columns`` that drift, each one's
    ``slope`` (ns a step; NaN for a column whose change point the drift's line explains)."""

    start: int
    columns: list
    slopes: list


class Found(NamedTuple):
    """What the search found: ``points``, ``drifts``, the ``penalty`` used, the ``columns``
    searched and the steps."""

    points: list
    drifts: list
    penalty: float
    columns: int
    steps: int


def find(s: Series, level: float = ST.LEVEL) -> Found:
    """The change points and drifts of ``s`` (the module docstring)."""
    y = s.matrix()
    n, cols = y.shape
    z, raw = SEG.scores(y), SEG.standardize(y)
    pen = SEG.penalty(n, cols)
    sigma = SEG.noise(y)
    found, drifting = [], []
    for j in range(cols):
        cps = SEG.search(z[:, j], pen)
        h = SEG.drifts(raw[:, j], cps, pen)
        if h is not None:
            drifting.append((j, h))
        elif cps:
            found.append(SEG.Found(j, cps))
    groups = SEG.clusters(found)
    reps = [int(np.median([cp for _, cp in g])) for g in groups]
    points = []
    for i, g in enumerate(groups):
        cols_i = sorted({c for c, _ in g})
        lo = reps[i - 1] if i else 0
        hi = reps[i + 1] if i + 1 < len(reps) else n
        where = SEG.located(z[:, cols_i], lo, hi, level)
        if where is None:
            continue
        at, low, high, gain = where
        points.append(Point(at, low, high, lo, hi, cols_i, gain))
    found_drifts = _drifts(drifting, sigma, n)
    kept = []
    for p in points:
        d = next((d for d in found_drifts if (SEG.step_beyond_ramp(raw[:, p.columns], d.start, p.at) < pen).all()),
                 None)
        if d is None:
            kept.append(p)
            continue
        fresh = [c for c in p.columns if c not in d.columns]  # a drift's step in series the hinge alone missed
        d.columns.extend(fresh)
        d.slopes.extend(float("nan") for _ in fresh)
    return Found(kept, found_drifts, pen, cols, n)


def _drifts(drifting: list, sigma: np.ndarray, n: int) -> list:
    """The drifting columns grouped by where they start (within a quarter of the run:
    a ramp's start is loosely fixed by noisy series)."""
    out = []
    for j, h in sorted(drifting, key=lambda x: x[1].start):
        if out and h.start - out[-1].start <= max(SEG.TOLERANCE, n // 4):
            out[-1].columns.append(j)
            out[-1].slopes.append(h.slope * float(sigma[j]))
        else:
            out.append(Drift(h.start, [j], [h.slope * float(sigma[j])]))
    return out


class Said(NamedTuple):
    """A change point said: the ``layers`` it touches (indices into ``Series.layers``),
    the ``shift`` of their kernel time (ns) and its ``relative`` form (a fraction of
    before's median), before's median ``before_ns``, the moved ``spans`` (``(group,
    Shift in µs)``, the largest first) and the ``ranks`` they are on."""

    layers: list
    shift: ST.Shift
    relative: ST.Shift
    before_ns: float
    spans: list
    ranks: list


def _blocks(rows: int, cols: int) -> np.ndarray:
    """Each value's step block of a rows x cols slice, raveled."""
    return np.repeat(np.arange(rows), cols)


def segment_shift(a: np.ndarray, b: np.ndarray, level: float) -> ST.Shift:
    """B - A of two segments' steps x launches slices (``stats.shift``, a step's
    launches one block)."""
    return ST.shift(a.ravel(), b.ravel(), level=level, blocks_a=_blocks(*a.shape) if a.shape[1] > 1 else None,
                    blocks_b=_blocks(*b.shape) if b.shape[1] > 1 else None)


def say(s: Series, p: Point, level: float = ST.LEVEL) -> Said | None:
    """``p`` said with the statistics (the module docstring); None where no test confirms it."""
    k = s.kernel
    a, b = slice(p.before, p.at), slice(p.at, p.after)
    q = ST.adjust([ST.pvalue(k[a, j], k[b, j]) for j in range(k.shape[1])])
    layers = [int(j) for j in np.flatnonzero(q < 1 - level)] or list(range(k.shape[1]))
    shift = segment_shift(k[a][:, layers], k[b][:, layers], level)
    before = float(np.nanmedian(k[a][:, layers]))
    spans = []
    if s.groups:
        sp = s.spans[:, :, layers]
        qs = ST.adjust([ST.pvalue(sp[a, g].ravel(), sp[b, g].ravel()) for g in range(len(s.groups))])
        hits = [g for g in np.flatnonzero(qs < 1 - level)]
        spans = [(int(g), segment_shift(sp[a, g], sp[b, g], level)) for g in hits]
        spans.sort(key=lambda x: -abs(x[1].estimate))
    if not shift.significant:  # a change point is where the kernel time changes: spans alone locate it
        return None
    ranks = sorted({s.groups[g][0] for g, _ in spans})
    return Said(layers, shift, shift.scaled(before), before, spans[:SPANS_LISTED], ranks)


def confirmed(s: Series, points: list, level: float = ST.LEVEL) -> tuple:
    """``([(Point, Said)], dropped)``: the change points ``say`` confirms, each one's
    segments reaching its confirmed neighbours (a dropped one no longer cuts them),
    said again until none more is dropped."""
    n, dropped = s.steps.size, 0
    while True:
        bounded = [p._replace(before=points[i - 1].at if i else 0,
                              after=points[i + 1].at if i + 1 < len(points) else n) for i, p in enumerate(points)]
        said = [(p, say(s, p, level)) for p in bounded]
        keep = [p for p, x in said if x is not None]
        if len(keep) == len(points):
            return said, dropped
        dropped += len(points) - len(keep)
        points = keep


__all__ = ["ChangesError", "Drift", "Found", "Point", "SPANS_LISTED", "Said", "Series", "confirmed", "find",
           "say", "segment_shift", "series"]
