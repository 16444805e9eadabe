"""The Chip tab: a launch's chip map, its units (XCD, SE, CU; or SM: in placement
order) by time bins of the launch's window (``timeline.analysis.chip_time.over_time``),
each cell coloured by what the unit mostly did in it (busy, waiting or idle), with the
imbalance (the busiest unit over the mean, per level) and the tail sentence
(``timeline chip``'s ``tail.says``) above it. A click on a unit's row links to the
Gantt: the launch shown and the CTA range of the CTAs placed on that unit."""

from __future__ import annotations

from functools import partial

import dash
import numpy as np
from dash import Input, Output, State, html

from timeline.analysis import chip as CHP
from timeline.analysis import chip_time as CHT
from timeline.core import rows as R
from timeline.errors import TimelineError
from timeline.query.chip import tail_says
from viewer.page import msg
from viewer.state import NO, guarded

STATES = ("idle", "waiting", "busy")  # a cell's value: the index of what its unit mostly did
COLOURS = ("#e9ecef", "#f28e2b", "#4e79a7")
NO_FIGURE = {"data": [], "layout": {"height": 80, "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


def which(trace, ranks, launches) -> tuple:
    """``(rank, launch)`` the map shows: the first of the selection, else the launch
    with the longest window (the slowest) of the lowest rank."""
    rank = int(min(ranks)) if ranks else int(R.column(trace.tasks, "rank", dtype=np.int64).min())
    if launches:
        return rank, int(min(launches))
    tails = [t for t in CHP.chip(trace).tail.to_pylist() if t["rank"] == rank]
    return rank, int(max(tails, key=lambda t: t["window_ns"])["launch"])


def unit_ctas(trace, launch: int, rank: int) -> dict:
    """``{unit name: [lowest CTA, highest CTA]}`` of the launch's placed rows on ``rank``
    (the unit names of ``timeline.analysis.chip``)."""
    t = R.select(trace.tasks, R.check(trace, launches=[launch], ranks=[rank]))
    keep = R.placed(t)
    if CHP.vendor_levels(t, trace.spec.arch) != "cta":
        keep &= R.numpy(t.column("hw_unit").is_valid())
    levels, ids = CHP.levels_of(t, trace.spec.arch, keep)
    fine = CHP.unit_level(levels)
    gid, cta = ids[fine.name], R.column(t, "cta", dtype=np.int64)[keep]
    lo = np.full(len(fine.names), np.iinfo(np.int64).max)
    hi = np.full(len(fine.names), -1)
    np.minimum.at(lo, gid, cta)
    np.maximum.at(hi, gid, cta)
    return {n: [int(a), int(b)] for n, a, b in zip(fine.names, lo, hi) if b >= 0}


def figure(cells, launch: int, rank: int) -> dict:
    """The heat map of ``over_time``'s cells of one (rank, launch): a row per unit in
    chip order, the first at the top; hover: the busy / waiting / idle shares."""
    sel = (R.column(cells, "rank", dtype=np.int64) == rank) & (R.column(cells, "launch", dtype=np.int64) == launch)
    c = {k: R.column(cells, k, dtype=np.int64)[sel] for k in ("bin", "from_ns", "width_ns", "busy_ns", "wait_ns",
                                                                "idle_ns")}
    unit = cells.column("unit").combine_chunks().filter(sel)
    codes = np.asarray(unit.indices)
    names = unit.dictionary.to_pylist()
    order = sorted(set(codes.tolist()))
    nb = int(c["bin"].max()) + 1
    row = np.searchsorted(np.array(order), codes)
    shares = np.stack([c["idle_ns"], c["wait_ns"], c["busy_ns"]]) / np.maximum(c["width_ns"], 1)
    z = np.zeros((len(order), nb), np.int64)
    z[row, c["bin"]] = shares.argmax(axis=0)
    text = np.empty((len(order), nb), object)
    text[row, c["bin"]] = [f"busy {b:.0%} · waiting {w:.0%} · idle {i:.0%}" for i, w, b in shares.T]
    x = np.zeros(nb)
    x[c["bin"]] = c["from_ns"] / 1e3
    ys = [names[k] for k in order]
    scale = [[k / 3, col] for k, col in enumerate(COLOURS) for k in (k, k + 1)]
    trace = {"type": "heatmap", "z": z.tolist(), "x": x.tolist(), "y": ys, "text": text.tolist(),
             "zmin": -0.5, "zmax": 2.5,
             "colorscale": scale, "colorbar": {"tickvals": [0, 1, 2], "ticktext": list(STATES), "len": 0.5},
             "hovertemplate": "%{y} at %{x:.3f} µs: %{text}<br>click: its CTAs in the Gantt<extra></extra>"}
    return {"data": [trace], "layout": {
        "height": max(300, 8 * len(ys) + 80), "margin": {"l": 70, "r": 10, "t": 10, "b": 40},
        "xaxis": {"title": {"text": f"µs from launch {launch}'s start (rank {rank})"}},
        "yaxis": {"autorange": "reversed", "type": "category", "tickfont": {"size": 9}}}}


def summary(c: CHP.Chip, rank: int, launch: int) -> list:
    """The lines above the map: each level's imbalance and the tail sentence."""
    pick = lambda tab: [r for r in tab.to_pylist() if r["rank"] == rank and r["launch"] == launch]  # noqa: E731
    levels = [f"{r['level']}: the busiest ({r['busiest']}) {r['max_over_mean']:.3f}× the mean of {r['units']}"
              for r in pick(c.levels)]
    tail = pick(c.tail)
    return [html.Div(f"launch {launch}, rank {rank} · imbalance " + "; ".join(levels), id="chip-imbalance"),
            html.Div(tail_says(tail[0]) if tail else "no tail: no placed rows", id="chip-tail")]


def chip_view(app, name: str, ranks, launches) -> tuple:
    """``(figure, summary, link)`` of the trace ``name``'s chip map (kept per selection);
    ``link``: the launch shown and each unit's CTA range (``unit_ctas``), what a click
    reads (Dash's click data of a heat map carries no ``customdata``)."""
    item = app.store.get(name)
    tr = item.trace

    def make():
        rank, launch = which(tr, ranks, launches)
        c = CHP.chip(tr, [launch])
        cells = CHT.over_time(tr, [launch])
        link = {"launch": launch, "ctas": unit_ctas(tr, launch, rank)}
        return figure(cells, launch, rank), summary(c, rank, launch), link

    return app.analysis(item, ("chipmap", tuple(ranks or ()), tuple(launches or ())), make)


@guarded(NO_FIGURE, None, None)
def on_chip(app, panels, tab):
    """The tab's figure, summary and the launch it shows, once the tab is open."""
    if tab != "chip":
        raise dash.exceptions.PreventUpdate
    if not panels:
        return NO_FIGURE, None, None
    try:
        return chip_view(app, panels[0], panels[1], panels[2])
    except TimelineError as e:  # e.g. no placed rows: a message in the tab
        return NO_FIGURE, msg(str(e)), None


def picked(click, link) -> tuple | None:
    """``(unit, [lo, hi])``: the unit a click hit and its CTA range (None: no unit)."""
    pts = click.get("points") if isinstance(click, dict) else None
    p = pts[0] if isinstance(pts, list) and pts and isinstance(pts[0], dict) else {}
    ctas = (link or {}).get("ctas") or {}
    unit = p.get("y")
    return (unit, ctas[unit]) if isinstance(unit, str) and unit in ctas else None


@guarded(NO, NO, NO)
def on_unit(click, link):
    """A click on a unit: the Gantt shows the map's launch and the unit's CTAs."""
    hit = picked(click, link)
    if hit is None:
        raise dash.exceptions.PreventUpdate
    unit, ctas = hit
    return [link["launch"]], ctas, f"chip map: {unit} ran CTAs {ctas[0]}-{ctas[1]}"


def wire(d, app) -> None:
    """The tab's callbacks: the map once the tab opens; a click links it to the Gantt."""
    d.callback(Output("chip-graph", "figure"), Output("chip-says", "children"), Output("chip-launch", "data"),
               Input("panel-key", "data"), Input("tabs", "value"), prevent_initial_call=True)(partial(on_chip, app))
    d.callback(Output("launches", "value", allow_duplicate=True), Output("ctas", "value", allow_duplicate=True),
               Output("chip-linked", "children"), Input("chip-graph", "clickData"), State("chip-launch", "data"),
               prevent_initial_call=True)(on_unit)


__all__ = ["chip_view", "figure", "on_chip", "on_unit", "picked", "summary", "unit_ctas", "which", "wire"]
