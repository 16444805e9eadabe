"""The run overview panel: every launch of a run as a cell of a heat map (step x
layer for launches with a slot header, capture x slot for a run without them;
``viewer.run_grid``), coloured by its kernel time (``timeline.analysis.launches``'
one definition), one rank's own span, the start skew across ranks or its anomalies;
the typical (p50), p99 and slowest launches marked, the launch shown below outlined;
what a click, a button (slowest / typical / p99 / previous / next) or a key does: the
address of the launch to open (``search_for``, ``?run=R&launch=KEY``).

Everything here reads a run's ``RunOverview``, never its rows."""

from __future__ import annotations

import math
import urllib.parse

import numpy as np

from timeline.analysis import launches as LA
from viewer import figures as F
from viewer import run_grid as VRG
from viewer.client import finite_us

METRICS = {  # metric -> (colour bar title, what a cell's colour means)
    "kernel": ("kernel µs",
               "colour: the launch's kernel time, its first CTA start to its last CTA end over its ranks on their "
               "common time axis (timeline.analysis.launches, as every command has it), µs; darker is slower"),
    "rank": ("kernel µs<br>(rank {rank})",
             "colour: rank {rank}'s own span of the launch (its first CTA start to its last CTA end), µs; darker is "
             "slower; blank: the rank has no such launch"),
    "skew": ("start skew µs",
             "colour: start skew across ranks, µs (last rank's start minus first rank's start on their common axis; "
             "ranks appended by separate processes placed on the host clock by their calibrations, blank without "
             "them); darker is more skewed"),
    "anomalies": ("anomalies",
                  "colour: anomaly lines of the launch over all ranks (stamps missing or doubtful); white is none"),
}
MARKS = "◆ typical (p50 of the kernel time) · ▲ p99 · ★ slowest · ✕ has anomalies · □ shown below"
ACTIONS = ("slowest", "typical", "p99", "prev", "next")
SCALE = [[0.0, "#fff7ec"], [0.25, "#fdd49e"], [0.5, "#fc8d59"], [0.75, "#d7301f"], [1.0, "#7f0000"]]
PICK_STYLE = {"typical": ("diamond", "#1f4e79"), "p99": ("triangle-up", "#5b2a86"), "slowest": ("star", "#000000")}
TICK_CHARS = 22  # a row's name on the axis (a capture's name is shortened; its cell's hover names it whole)
LINKED = ("ranks", "grouping", "tab")  # what a drill-down keeps of the address


def per_launch(ov: VRG.RunOverview, metric: str, rank) -> tuple:
    """``(value per launch, metric, rank)``: the metric's values (ns, or a count);
    an unknown metric or rank is the default (kernel time)."""
    t = ov.q.times
    if metric == "rank" and rank in ov.ranks:
        return ov.q.per_rank[ov.ranks.index(rank)], metric, rank
    if metric == "skew":
        return LA.floats(t.column("skew_ns")), metric, rank
    if metric == "anomalies":
        return LA.floats(t.column("anomalies")), metric, rank
    return ov.q.kernel, "kernel", rank


def metric_grid(ov: VRG.RunOverview, metric: str, rank) -> tuple:
    """``(z µs-or-count per [row, column] of the grid, colour bar title, scale note)``."""
    v, metric, rank = per_launch(ov, metric, rank)
    title, note = METRICS[metric]
    z = VRG.values(ov, v) * (1.0 if metric == "anomalies" else 1e-3)
    return z, title.format(rank=rank), note.format(rank=rank)


def _cell_text(ov: VRG.RunOverview, binned: bool) -> str:
    """The hover line of a cell: its launch key (as every command prints it)."""
    form = ov.grid.form
    if form == VRG.HEADED:
        return ("steps %{x} · layer %{y}: its slowest launch" if binned
                else "launch %{x}:%{y} (step %{x} · layer %{y})")
    if form == VRG.CAPTURED:
        return "capture %{y} · slots %{x}: its slowest launch" if binned else "launch %{y}:%{x}"
    return "launches %{x}: the slowest" if binned else "launch %{x}"


def selection_shapes(ov: VRG.RunOverview, key) -> list:
    """The outline around the launch shown below (none when it is not on the grid)."""
    cell = ov.cell(key)
    if cell is None:
        return []
    c, r = cell[0] // VRG.columns(ov), cell[1]
    return [{"type": "rect", "xref": "x", "yref": "y", "x0": c - 0.5, "x1": c + 0.5, "y0": r - 0.5, "y1": r + 0.5,
             "line": {"color": "#00a2ff", "width": 3}, "name": "shown"}]


def _axis(labels: list, title: str, dtick: bool) -> dict:
    """A category axis of ``labels`` (long names shortened on the ticks)."""
    short = [s if len(s) <= TICK_CHARS else s[:TICK_CHARS - 1] + "…" for s in labels]
    out = {"type": "category", "title": {"text": title}, "showgrid": False, "zeroline": False,
           "categoryorder": "array", "categoryarray": labels}
    if dtick or short != labels:
        out.update(tickmode="array", tickvals=labels, ticktext=short)
    return out


def figure(ov: VRG.RunOverview, metric: str = "kernel", rank=None, shown=None, run: str = "") -> dict:
    """The overview heat map of ``run``: a column per step (or slot; merged past
    ``MAX_CELLS``, each cell its slowest launch), a row per layer (or capture), the
    actual values on the axes; colour = the metric (``METRICS``); the picks and the
    launches with anomalies marked; the launch ``shown`` outlined."""
    z, title, _ = metric_grid(ov, metric, rank)
    f = VRG.columns(ov)
    z = VRG.binned(z, f)
    xs, ys = VRG.column_labels(ov, f), ov.grid.ys
    unit = "" if metric == "anomalies" else " µs"
    data = [{
        "type": "heatmap", "x": xs, "y": ys, "z": F.typed(z.astype(np.float32)), "colorscale": SCALE,
        "xgap": 1 if len(xs) < 120 else 0, "ygap": 1 if len(ys) < 60 else 0, "hoverongaps": False,
        "colorbar": {"title": {"text": title, "side": "right"}, "thickness": 12, "len": 1.0},
        "hovertemplate": f"{_cell_text(ov, f > 1)}<br>%{{z:,.1f}}{unit}<extra></extra>", "name": "launches"}]
    an = VRG.binned(VRG.values(ov, LA.floats(ov.q.times.column("anomalies"))), f)
    li, ci = np.nonzero(np.nan_to_num(an) > 0)
    if li.size:
        data.append({"type": "scatter", "mode": "markers", "x": [xs[c] for c in ci], "y": [ys[r] for r in li],
                     "marker": {"symbol": "x-thin-open", "size": 7, "color": "#333", "line": {"width": 1.5}},
                     "name": "anomalies", "hoverinfo": "skip", "showlegend": False})
    for pick in ("typical", "p99", "slowest"):
        key = ov.pick(pick)
        cell = ov.cell(key)
        if cell is not None:
            sym, col = PICK_STYLE[pick]
            data.append({"type": "scatter", "mode": "markers", "x": [xs[cell[0] // f]], "y": [ys[cell[1]]],
                         "name": pick, "hovertemplate": f"{pick}: launch {str(key).replace('%{', '% {')}<extra></extra>",
                         "marker": {"symbol": sym, "size": 11, "color": col, "line": {"color": "#fff", "width": 1}},
                         "showlegend": False})
    height = int(min(420, max(170, 26 * len(ys) + 90)))
    g = ov.grid
    xtitle = g.x_title + (f" (cells of {f} {g.x_title}s, each its slowest launch)" if f > 1 else "")
    return {"data": data, "layout": {
        "height": height, "margin": {"l": 60 if g.form == VRG.HEADED else 150, "r": 20, "t": 10, "b": 40},
        "uirevision": "overview", "plot_bgcolor": "#f4f4f4", "clickmode": "event",
        "meta": {"run": run, "binned": f > 1, "form": g.form},  # what the page's click script reads
        "xaxis": _axis(xs, xtitle, False), "yaxis": _axis(ys, g.y_title, len(ys) <= 24),
        "shapes": selection_shapes(ov, shown)}}


def _kernel_text(ov: VRG.RunOverview, key) -> str:
    k = ov.kernel_of(key)
    return "–" if key is None or math.isnan(k) else f"{k / 1e3:,.1f} µs (launch {key})"


def summary(ov: VRG.RunOverview, run: str) -> str:
    """The line above the overview: the run's size and the picks' kernel times."""
    tasks = int(ov.q.tasks.sum())
    out = (f"run {run}: {ov.n:,} launches × {len(ov.ranks)} ranks · {tasks:,} tasks · "
           f"typical {_kernel_text(ov, ov.typical)} · p99 {_kernel_text(ov, ov.p99)} · "
           f"slowest {_kernel_text(ov, ov.slowest)}")
    if ov.grid.off:
        out += (f" · {ov.grid.off:,} launches without a step / layer header are not on the grid (◀ previous / "
                "next ▶ reach them)")
    return out


def _label_index(labels: list, v) -> int | None:
    """The position of a clicked category ``v`` (its text, or a whole number) in ``labels``."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return None
    if isinstance(v, float):
        v = finite_us(v, "clicked cell")
        if v != int(v):
            return None
        v = int(v)
    text = str(v)
    return labels.index(text) if text in labels else None


def clicked(ov: VRG.RunOverview, click, metric: str, rank):
    """The launch a click on the overview names: the cell under it (a merged cell: its
    launch with the largest value of the metric); None for a click on no launch or
    anything that is not a plotly click."""
    pts = click.get("points") if isinstance(click, dict) else None
    if not isinstance(pts, list) or not pts or not isinstance(pts[0], dict) or "x" not in pts[0] or "y" not in pts[0]:
        return None
    f = VRG.columns(ov)
    ci = _label_index(VRG.column_labels(ov, f), pts[0]["x"])
    li = _label_index(ov.grid.ys, pts[0]["y"])
    if ci is None or li is None:
        return None
    z, _, _ = metric_grid(ov, metric, rank)
    seg = z[li, ci * f:(ci + 1) * f]
    at = ov.grid.at[li, ci * f:(ci + 1) * f]
    if seg.size == 0 or (at < 0).all():
        return None
    j = int(np.argmax(np.where(np.isnan(seg) | (at < 0), -np.inf, seg))) if not np.isnan(seg).all() else \
        int(np.flatnonzero(at >= 0)[0])
    return ov.q.keys[int(at[j])]


def target(ov: VRG.RunOverview, action: str, shown):
    """The launch a button or key opens: a pick, or the previous / next launch in key
    order (step, then layer; capture, then slot) from the one shown."""
    if action in ("slowest", "typical", "p99"):
        return ov.pick(action)
    if action in ("prev", "next"):
        return ov.neighbour(shown, -1 if action == "prev" else 1)
    return None


def search_for(run: str, key, current: str | None, view=None, keep=LINKED) -> str:
    """The address (search string) of a launch of ``run``: ``?run=R&launch=KEY`` (each
    percent-encoded as needed) plus what ``keep`` names of the current address, plus
    ``view`` (a dict: ranks, grouping, t0, t1, tab) when given."""
    q = urllib.parse.parse_qs((current or "").lstrip("?"))
    out = [("run", run), ("launch", str(key))]
    out += [(k, q[k][0]) for k in keep if q.get(k) and k not in (view or {})]
    out += [(k, str(v)) for k, v in (view or {}).items() if v not in (None, "")]
    return "?" + urllib.parse.urlencode(out, safe=",/:")


__all__ = ["ACTIONS", "LINKED", "MARKS", "METRICS", "clicked", "figure", "metric_grid", "per_launch", "search_for",
           "selection_shapes", "summary", "target"]
