"""The run overview panel: every launch of a run as a cell of a step x layer heat
map (kernel time of the slowest rank or of one rank, start skew across ranks,
anomalies), the typical (p50), p99 and slowest launches marked, the launch shown
below outlined; what a click, a button (slowest / typical / p99 / previous / next)
or a key does: the address of the launch to open (``search_for``).

Everything here reads a run's ``Overview`` (``viewer.run_source``), never its rows."""

from __future__ import annotations

import math
import urllib.parse

import numpy as np

from viewer import figures as F
from viewer import run_source as VRS
from viewer.client import finite_us

METRICS = {  # metric -> (colour bar title, what a cell's colour means)
    "kernel": ("kernel µs<br>(slowest rank)",
               "colour: the launch's kernel time on its slowest rank (first CTA start to last CTA end), µs; "
               "darker is slower"),
    "rank": ("kernel µs<br>(rank {rank})",
             "colour: the launch's kernel time on rank {rank}, µs; darker is slower; blank: the rank has no such launch"),
    "skew": ("start skew µs",
             "colour: start skew across ranks, µs (last rank's start minus first rank's start; ranks appended by "
             "separate processes placed on the host clock by their calibrations, blank without them); darker is "
             "more skewed"),
    "anomalies": ("anomalies",
                  "colour: anomaly lines of the launch over all ranks (stamps missing or doubtful); white is none"),
}
MARKS = "◆ typical (p50 of the slowest-rank kernel time) · ▲ p99 · ★ slowest · ✕ has anomalies · □ shown below"
ACTIONS = ("slowest", "typical", "p99", "prev", "next")
SCALE = [[0.0, "#fff7ec"], [0.25, "#fdd49e"], [0.5, "#fc8d59"], [0.75, "#d7301f"], [1.0, "#7f0000"]]
PICK_STYLE = {"typical": ("diamond", "#1f4e79"), "p99": ("triangle-up", "#5b2a86"), "slowest": ("star", "#000000")}


def metric_grid(ov: VRS.Overview, metric: str, rank) -> tuple:
    """``(z ns-or-count per [layer, step], colour bar title, scale note)`` of a metric;
    an unknown metric or rank is the default (slowest rank's kernel time)."""
    if metric == "rank" and rank in ov.ranks:
        z = ov.per_rank[ov.ranks.index(rank)].astype(np.float64)
    elif metric in ("skew", "anomalies"):
        z = ov.skew if metric == "skew" else ov.anomalies
    else:
        metric, z = "kernel", ov.kernel
    title, note = METRICS[metric]
    scale = 1.0 if metric == "anomalies" else 1e-3
    return z * scale, title.format(rank=rank), note.format(rank=rank)


def columns(ov: VRS.Overview) -> tuple:
    """``(bin width, first step of each column)``: steps binned so that at most
    ``MAX_CELLS`` columns are drawn."""
    f = max(1, math.ceil(ov.steps.size / VRS.MAX_CELLS))
    return f, ov.steps[::f]


def binned(z: np.ndarray, f: int) -> np.ndarray:
    """``z`` with every ``f`` columns merged into their largest value (NaN: none)."""
    if f == 1:
        return z
    pad = (-z.shape[1]) % f
    zz = np.pad(z, ((0, 0), (0, pad)), constant_values=np.nan).reshape(z.shape[0], -1, f)
    with np.errstate(all="ignore"):
        return np.where(np.isnan(zz).all(axis=2), np.nan, np.nanmax(np.where(np.isnan(zz), -np.inf, zz), axis=2))


def cell_of(ov: VRS.Overview, key: VRS.Key | None) -> tuple | None:
    """``(x, y)`` of a launch's cell in the figure (its column's first step, its layer)."""
    if key is None:
        return None
    si = np.searchsorted(ov.steps, key.step)
    if si >= ov.steps.size or ov.steps[si] != key.step or key.layer not in ov.layers:
        return None
    f, xs = columns(ov)
    return int(xs[si // f]), int(key.layer)


def selection_shapes(ov: VRS.Overview, key: VRS.Key | None) -> list:
    """The outline around the launch shown below (none when it is not on the grid)."""
    cell = cell_of(ov, key)
    if cell is None:
        return []
    f, xs = columns(ov)
    i = int(np.searchsorted(xs, cell[0]))
    x0 = xs[i - 1] if i > 0 else xs[i] - (xs[1] - xs[0] if xs.size > 1 else 1)
    x1 = xs[i + 1] if i + 1 < xs.size else xs[i] + (xs[i] - x0)
    li = int(np.searchsorted(ov.layers, cell[1]))
    ys = ov.layers
    y0 = ys[li - 1] if li > 0 else ys[li] - (ys[1] - ys[0] if ys.size > 1 else 1)
    y1 = ys[li + 1] if li + 1 < ys.size else ys[li] + (ys[li] - y0)
    return [{"type": "rect", "xref": "x", "yref": "y", "x0": (x0 + xs[i]) / 2, "x1": (xs[i] + x1) / 2,
             "y0": (y0 + ys[li]) / 2, "y1": (ys[li] + y1) / 2, "line": {"color": "#00a2ff", "width": 3},
             "name": "shown"}]


def figure(ov: VRS.Overview, metric: str = "kernel", rank=None, shown: VRS.Key | None = None, run: str = "") -> dict:
    """The overview heat map of ``run``: x = step (binned past ``MAX_CELLS`` columns,
    each cell its slowest launch), y = layer, colour = the metric (``METRICS``), the
    picks and the launches with anomalies marked, the launch ``shown`` outlined."""
    z, title, _ = metric_grid(ov, metric, rank)
    f, xs = columns(ov)
    z = binned(z, f)
    data = [{
        "type": "heatmap", "x": F.typed(xs.astype(np.float64)), "y": F.typed(ov.layers.astype(np.float64)),
        "z": F.typed(z.astype(np.float32)), "colorscale": SCALE, "xgap": 1 if xs.size < 120 else 0,
        "ygap": 1 if ov.layers.size < 60 else 0, "hoverongaps": False,
        "colorbar": {"title": {"text": title, "side": "right"}, "thickness": 12, "len": 1.0},
        "hovertemplate": f"{ov.axis} %{{x}} · layer %{{y}}<br>%{{z:,.1f}}<extra></extra>", "name": "launches"}]
    an = binned(ov.anomalies, f)
    li, ci = np.nonzero(np.nan_to_num(an) > 0)
    if li.size:
        data.append({"type": "scatter", "mode": "markers", "x": xs[ci].tolist(), "y": ov.layers[li].tolist(),
                     "marker": {"symbol": "x-thin-open", "size": 7, "color": "#333", "line": {"width": 1.5}},
                     "name": "anomalies", "hoverinfo": "skip", "showlegend": False})
    for pick in ("typical", "p99", "slowest"):
        cell = cell_of(ov, getattr(ov, pick))
        if cell is not None:
            sym, col = PICK_STYLE[pick]
            data.append({"type": "scatter", "mode": "markers", "x": [cell[0]], "y": [cell[1]], "name": pick,
                         "marker": {"symbol": sym, "size": 11, "color": col, "line": {"color": "#fff", "width": 1}},
                         "hovertemplate": f"{pick}: {ov.axis} %{{x}} · layer %{{y}}<extra></extra>",
                         "showlegend": False})
    height = int(min(420, max(170, 26 * ov.layers.size + 90)))
    return {"data": data, "layout": {
        "height": height, "margin": {"l": 60, "r": 20, "t": 10, "b": 40}, "uirevision": "overview",
        "meta": {"run": run, "binned": f > 1, "axis": ov.axis},  # what the page's click script reads
        "xaxis": {"title": {"text": ov.axis + (f" (cells of {f} steps, each its slowest launch)" if f > 1 else "")},
                  "showgrid": False, "zeroline": False},
        "yaxis": {"title": {"text": "layer"}, "showgrid": False, "zeroline": False,
                  "dtick": 1 if ov.layers.size <= 24 else None},
        "shapes": selection_shapes(ov, shown), "plot_bgcolor": "#f4f4f4", "clickmode": "event"}}


def summary(ov: VRS.Overview, run: str) -> str:
    """The line above the overview: the run's size and the picks' kernel times."""
    def k(key):
        i = None if key is None else ov.index(key)
        return "–" if i is None else f"{ov.launches.column('kernel_ns')[i].as_py() / 1e3:,.1f} µs " \
                                     f"({ov.axis} {key.step}, layer {key.layer})"

    tasks = int(sum(v for v in ov.launches.column("tasks").to_pylist() if v))
    out = (f"run {run}: {ov.n:,} launches × {len(ov.ranks)} ranks · {tasks:,} tasks · "
           f"typical {k(ov.typical)} · p99 {k(ov.p99)} · slowest {k(ov.slowest)}")
    if ov.unkeyed:
        out += f" · {ov.unkeyed:,} rank launches without a step / layer header are not drawn"
    return out


def clicked(ov: VRS.Overview, click, metric: str, rank) -> VRS.Key | None:
    """The launch a click on the overview names: the cell under it (a binned cell:
    its launch with the largest value of the metric); None for a click on no launch
    or anything that is not a plotly click."""
    pts = click.get("points") if isinstance(click, dict) else None
    if not isinstance(pts, list) or not pts or not isinstance(pts[0], dict) or "x" not in pts[0] or "y" not in pts[0]:
        return None
    x, y = finite_us(pts[0]["x"], "clicked step"), finite_us(pts[0]["y"], "clicked layer")
    f, xs = columns(ov)
    ci = int(np.searchsorted(xs, x, side="right")) - 1
    li = int(np.searchsorted(ov.layers, round(y)))
    if ci < 0 or li >= ov.layers.size or ov.layers[li] != round(y):
        return None
    z, _, _ = metric_grid(ov, metric, rank)
    seg = z[li, ci * f:(ci + 1) * f]
    if seg.size == 0 or np.isnan(seg).all():
        return None
    j = ci * f + int(np.nanargmax(np.where(np.isnan(seg), -np.inf, seg)))
    return VRS.Key(int(ov.steps[j]), int(ov.layers[li]))


def target(ov: VRS.Overview, action: str, shown: VRS.Key | None) -> VRS.Key | None:
    """The launch a button or key opens: a pick, or the previous / next launch in
    launch order (step, then layer) from the one shown."""
    if action in ("slowest", "typical", "p99"):
        return getattr(ov, action)
    if action in ("prev", "next"):
        return ov.neighbour(shown, -1 if action == "prev" else 1)
    return None


LINKED = ("ranks", "grouping", "tab")  # what a drill-down keeps of the address


def search_for(run: str, key: VRS.Key, current: str | None, view=None, keep=LINKED) -> str:
    """The address (search string) of a launch of ``run``: ``?run=R&step=S&layer=L``
    plus what ``keep`` names of the current address, plus ``view`` (a dict:
    ranks, grouping, t0, t1, tab) when given."""
    q = urllib.parse.parse_qs((current or "").lstrip("?"))
    out = [("run", run), ("step", str(key.step)), ("layer", str(key.layer))]
    out += [(k, q[k][0]) for k in keep if q.get(k) and k not in (view or {})]
    out += [(k, str(v)) for k, v in (view or {}).items() if v not in (None, "")]
    return "?" + urllib.parse.urlencode(out, safe=",/")
