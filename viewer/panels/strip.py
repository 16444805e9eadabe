"""The framework's context strip above the Gantt (``timeline-view ... --context
FRAMEWORK``): the opened launch's step as the framework trace recorded it on that
GPU (``viewer.attached``), in lanes of host ops, kernels, copies and collectives
(the kinds the attach wing assigns, ``timeline.attach.context.KINDS``), the
instrumented kernel's own event highlighted, on the Gantt's time axis.

Zoom-linked: the strip's x range is the Gantt's window. A zoom on the Gantt reaches
the strip as a ``Patch`` of its range once the Gantt is drawn (``on_strip``, on the
``view-state`` the Gantt callback writes); a zoom on the strip goes to the Gantt's
zoom store as a zoom on the Gantt's own ``xaxis`` would (``install``: the page's
``ZOOM_SCRIPT``), and the strip follows the window the Gantt then draws. A page
without a framework trace attached has no strip and no strip callback."""

from __future__ import annotations

from functools import partial

import dash
import flask
import numpy as np
import pyarrow as pa
from dash import Input, Output, Patch, State, dcc, html

from timeline.core import rows as R
from viewer import figures as F
from viewer.client import ViewState
from viewer.ids import STRIP_PROPS, StripOut, outputs
from viewer.state import ERROR, NO, guarded

__all__ = ["COLOURS", "LANES", "STRIP_LIMIT", "install", "lane_rows", "on_strip", "strip_figure", "strip_of"]

LANES = (("host ops", ("host_op", "launch")), ("kernels", ("kernel", "instrumented")),
         ("copies", ("memcpy", "memset")), ("collectives", ("collective",)))  # (label, the kinds it draws)
COLOURS = {"host_op": "#8c96a3", "launch": "#c3c9d1", "kernel": "#4e79a7", "memcpy": "#59a14f",
           "memset": "#9fd08e", "collective": "#b07aa1", "instrumented": "#e15759"}
LABELS = {"host_op": "host op", "launch": "launch call (CUDA runtime / driver)", "kernel": "other kernel",
          "memcpy": "copy", "memset": "memset", "collective": "collective", "instrumented": "this launch's kernel"}
ROW_PX = 15  # a strip row's height
MAX_SUBROWS = 6  # rows a lane stacks its overlapping events in; deeper ones share its last row
SHARE_NS = 500  # events of a lane overlapping by less share a row (a profiler's kernel ends and starts
# overlap by a clock step)
STRIP_LIMIT = 20_000  # events drawn: beyond, the longest (and the instrumented kernel), said in the title
HIDE, SHOW = {"display": "none"}, {}
EMPTY = {"data": [], "layout": {}}


def lane_rows(kinds, start, end) -> tuple:
    """``(row, ticks)``: each event's strip row, lanes in ``LANES`` order (only those
    holding an event), a lane's overlapping events stacked on rows of their own
    (``timeline.core.rows.lanes``: interval partitioning, overlaps under ``SHARE_NS``
    ignored, at most ``MAX_SUBROWS`` a lane); ``ticks``: ``[(first row, label)]`` per lane."""
    lane_of = {k: i for i, (_, ks) in enumerate(LANES) for k in ks}
    lane = np.array([lane_of[k] for k in kinds], np.int64)
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    sub = np.minimum(R.lanes(lane, start, np.maximum(end - SHARE_NS, start)), MAX_SUBROWS - 1) \
        if lane.size else lane
    row, ticks, at = np.zeros(lane.size, np.int64), [], 0
    for i, (label, _) in enumerate(LANES):
        m = lane == i
        if not m.any():
            continue
        row[m] = at + sub[m]
        ticks.append((at, label))
        at += int(sub[m].max()) + 1
    return row, ticks


def _shown(rows: pa.Table) -> tuple:
    """The rows drawn: all of them up to ``STRIP_LIMIT``, else the instrumented kernel
    and the longest others; and how many were left out."""
    if rows.num_rows <= STRIP_LIMIT:
        return rows, 0
    dur = R.column(rows, "end_ns") - R.column(rows, "start_ns")
    mine = np.asarray(rows.column("kind").to_pylist()) == "instrumented"
    keep = np.sort(np.argsort(np.where(mine, np.iinfo(np.int64).min, -dur), kind="stable")[:STRIP_LIMIT])
    return rows.take(pa.array(keep)), rows.num_rows - STRIP_LIMIT


def _segments(s_us, e_us, y):
    x = np.empty(3 * s_us.size)
    x[0::3], x[1::3], x[2::3] = s_us, e_us, np.nan
    yy = np.empty(3 * s_us.size)
    yy[0::3], yy[1::3], yy[2::3] = y, y, np.nan
    return F.typed(x), F.typed(yy)


def _hover(r: dict) -> str:
    where = (f"thread {r['tid']}" if r["kind"] in ("host_op", "launch")
             else f"GPU {r['device']} · stream {r['stream']}")
    name = r["name"] if len(r["name"]) <= 110 else r["name"][:107] + "…"
    name = name.replace("<", "&lt;").replace(">", "&gt;")
    return (f"<b>{name}</b><br>{LABELS[r['kind']]} · {where}<br>{r['start_ns'] / 1e3:,.3f} µs, "
            f"{(r['end_ns'] - r['start_ns']) / 1e3:,.3f} µs")


def strip_figure(strip, t0_ns: int, t1_ns: int) -> dict:
    """The strip of ``strip`` (a ``viewer.attached.Strip``) over the Gantt's window
    ``[t0_ns, t1_ns]``: one line-segment trace per kind (the instrumented kernel red,
    outlined), an invisible hover point per event, the lanes named on the y axis, the
    Gantt's left and right margins, so that the two time axes line up."""
    rows, left_out = _shown(strip.rows)
    kinds = rows.column("kind").to_pylist()
    s, e = R.column(rows, "start_ns"), R.column(rows, "end_ns")
    row, ticks = lane_rows(kinds, s, e)
    n = max(int(row.max()) + 1 if row.size else 1, 1)
    width = ROW_PX * 0.72
    kinds_a = np.asarray(kinds, dtype=object)
    traces = []
    for kind in COLOURS:
        m = kinds_a == kind
        if not m.any():
            continue
        x, y = _segments(s[m] / 1e3, e[m] / 1e3, row[m])
        if kind == "instrumented":
            traces.append({"type": "scatter", "mode": "lines", "x": x, "y": y, "hoverinfo": "skip",
                           "line": {"color": "#111111", "width": width + 4}, "showlegend": False,
                           "meta": {"kind": "outline"}})
        traces.append({"type": "scatter", "mode": "lines", "x": x, "y": y, "hoverinfo": "skip", "name": LABELS[kind],
                       "line": {"color": COLOURS[kind], "width": width}, "meta": {"kind": kind}})
    texts = [_hover(r) for r in rows.to_pylist()]
    traces.append({"type": "scatter", "mode": "markers", "x": F.typed((s + e) / 2e3), "y": F.typed(row.astype(float)),
                   "text": texts, "hovertemplate": "%{text}<extra></extra>", "showlegend": False,
                   "marker": {"size": ROW_PX, "opacity": 0, "symbol": "line-ew"}, "meta": {"kind": "hover"}})
    mine = np.flatnonzero(kinds_a == "instrumented")
    notes = [{"x": float((s[i] + e[i]) / 2e3), "y": float(row[i]), "text": "this launch", "showarrow": False,
              "font": {"size": 10, "color": "#ffffff"}, "xref": "x", "yref": "y"} for i in mine[:1]]
    shapes = [{"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": at - 0.5, "y1": at - 0.5,
               "line": {"color": "#ccd2d8", "width": 1}} for at, _ in ticks[1:]]
    layout = {
        "height": n * ROW_PX + 56, "margin": {"l": F.MARGIN_L, "r": F.MARGIN_R, "t": 24, "b": 30},
        "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff", "hovermode": "closest", "dragmode": "zoom",
        "showlegend": True, "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "font": {"size": 10},
                                       "itemclick": False, "itemdoubleclick": False},
        "xaxis": {"range": [t0_ns / 1e3, t1_ns / 1e3], "showgrid": True, "gridcolor": "#eee", "zeroline": False,
                  "tickfont": {"size": 10}},
        "yaxis": {"range": [n - 0.5, -0.5], "fixedrange": True, "tickmode": "array", "tickvals": [a for a, _ in ticks],
                  "ticktext": [t for _, t in ticks], "showgrid": False, "zeroline": False, "tickfont": {"size": 10}},
        "shapes": shapes, "annotations": notes,
        "meta": {"kind": "context", "rank": strip.rank, "launch": strip.launch, "events": rows.num_rows,
                 "left_out": left_out, "lanes": [t for _, t in ticks],
                 "instrumented": [[float(s[i] / 1e3), float(e[i] / 1e3)] for i in mine]},
    }
    return {"data": traces, "layout": layout}


def title(strip, left_out: int = 0) -> list:
    """The line above the strip: the launch, its step, the file, the clock fit's bound,
    the anomaly where the launch is one."""
    counts = {label: sum(k in ks for k in strip.rows.column("kind").to_pylist()) for label, ks in LANES}
    step = f"ProfilerStep#{strip.step}" if strip.step is not None else "no step marker: its kernel ± 0.2 ms"
    out = [html.B("Framework context"), f" · rank {strip.rank} · launch {strip.launch} · {step} · "
           f"{strip.framework}: " + ", ".join(f"{label} {n:,}" for label, n in counts.items())
           + f"; this launch's kernel in red; clock fit ± {strip.bound_ns:,.0f} ns"]
    if left_out:
        out.append(f" ({left_out:,} of the shortest events left out)")
    if strip.anomaly:
        out.append(html.Span(f" ⚠ ANOMALY: this launch's stamps fall {strip.outside_ns:,} ns outside its kernel "
                             "event (left where the fit puts them)", style={"color": "#8a1c17"}))
    return out


def strip_of(app, state):
    """What the strip shows for the Gantt's ``state`` (a ``ViewState`` as the browser
    keeps it): None (no strip: another trace, no state), a sentence (why there is
    no strip on this trace's page), or ``(Strip, ViewState)``."""
    st, ctx = ViewState.from_client(state), app.context
    if st is None or ctx is None or not ctx.covers(st.name):
        return None
    item = app.store.get(st.name)
    launches = list(st.launches) if st.launches else item.data.launches
    if len(launches) != 1:
        return "Framework context: pick one launch (Launches) to see its step as the framework trace recorded it"
    ranks = [r for r in (st.ranks or item.data.ranks) if r in ctx.att.fits]
    if not ranks:
        return "Framework context: no rank shown has a framework trace attached"
    got = ctx.strip(item, ranks[0], launches[0])
    return f"Framework context: {got}" if isinstance(got, str) else (got, st)


@guarded(NO, NO, NO, ERROR, NO, named=StripOut)
def on_strip(app, state, drawn):
    """The strip callback, on every Gantt drawn: a launch's strip drawn once, then
    only its x range moved to the Gantt's window (a ``Patch``)."""
    got = strip_of(app, state)
    if got is None:
        return StripOut(EMPTY, HIDE, HIDE, "", None)
    if isinstance(got, str):
        return StripOut(EMPTY, HIDE, SHOW, got, None)
    strip, st = got
    key = [st.name, strip.rank, strip.launch]
    if drawn == key:
        patch = Patch()
        patch["layout"]["xaxis"]["range"] = [st.t0 / 1e3, st.t1 / 1e3]
        return StripOut(patch, NO, NO, NO, NO)
    fig = strip_figure(strip, st.t0, st.t1)
    said = title(strip, fig["layout"]["meta"]["left_out"])
    return StripOut(fig, {"height": f"{fig['layout']['height']}px"}, SHOW, said, key)


def box():
    """The strip's part of the page (filled by ``on_strip``)."""
    return html.Div(id="context-box", style=HIDE, children=[
        dcc.Store(id="context-drawn"),
        html.Div(id="context-title", className="status"),
        dcc.Graph(id="context", figure=EMPTY, style=HIDE,
                  config={"displaylogo": False, "displayModeBar": False, "scrollZoom": True})])


def _insert(node, before: str, new) -> bool:
    """Put ``new`` in the children of the component holding the one of id ``before``, ahead of it."""
    kids = getattr(node, "children", None)
    if not isinstance(kids, list):
        return False
    for i, c in enumerate(kids):
        if getattr(c, "id", None) == before:
            kids.insert(i, new)
            return True
    return any(_insert(c, before, new) for c in kids)


def install(dash_app, app, zoom_script: str):
    """Add the strip to a built page whose ``app.context`` is set: its box above the
    Gantt in every layout (the first view's strip filled in), its callback, and the
    strip's zooms sent to the Gantt's zoom store by ``zoom_script`` (the page's own)."""
    inner = dash_app.layout

    def page_layout():
        root = inner()
        b = box()
        _insert(root, "gantt-status", b)
        if flask.has_request_context():  # the first view's strip, as the callback would draw it
            try:
                out = on_strip(app, getattr(root["view-state"], "data", None), None)
                for (cid, prop), v in zip(STRIP_PROPS, out):
                    if v is not NO:
                        setattr(b[cid] if cid != "context-box" else b, prop, v)
            except dash.exceptions.PreventUpdate:
                pass
        return root

    dash_app.layout = page_layout
    dash_app.validation_layout = page_layout()
    d = dash_app
    d.callback(*outputs(STRIP_PROPS), Input("view-state", "data"), State("context-drawn", "data"),
               prevent_initial_call=True)(partial(on_strip, app))
    d.clientside_callback(zoom_script, Output("zoom", "data", allow_duplicate=True), Input("context", "relayoutData"),
                          prevent_initial_call=True)
    return d
