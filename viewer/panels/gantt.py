"""The Gantt panel: the figure for a selection and window, what a zoom, the time
boxes or "full" do to the window, and the pinned task of a click. What travels
through the browser is a ``client.ViewState``."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import dash
import numpy as np
import pyarrow as pa
from dash import html

from timeline.analysis import stages as A
from timeline.core import rows
from viewer import figures as F
from viewer import model as M
from viewer.client import ViewState, clamp_px, client_list, finite_us, sorted_ints, us_to_ns
from viewer.ids import GanttOut
from viewer.state import ERROR, NO, guarded

CONC_BINS = 4096  # bins of the full-range stage concurrency, sliced while zooming
AHEAD = 4  # first figures of just-opened traces kept (``draw_ahead``)
AHEAD_WAIT_S = 60.0  # how long the Gantt callback waits for a figure being drawn ahead
AHEAD_BUSY = 2  # figures drawn ahead at once, at most (a burst of trace requests starts no more threads)


@dataclass(frozen=True)
class GanttQuery:
    """What the page asks the Gantt for: the callback's inputs as the browser sent
    them, built once by ``wiring.on_gantt`` and read by name here (each is checked
    where it is used: a bad value is a message, never a traceback)."""

    name: str | None  # the open trace's file name (None: no trace open)
    grouping: str = "rank"  # rows by "rank" (rank · launch), "cta", "placement" or "stage"
    ranks: object = None  # the rank filter: a list of ranks (None or empty: every rank)
    launches: object = None  # the launch filter (None or empty: every launch)
    stages: object = None  # the stage filter: stage indices (None: every stage)
    phases: object = None  # the interval filter: interval indices (None: every interval)
    ctas: object = None  # the CTA filter: CTA numbers (None: every CTA)
    trigger: str = "filters"  # which input fired: "gantt" (a zoom), "t0", "t1", "reset", "filters"
    relayout: object = None  # the plot's relayoutData, for a zoom
    t0: object = None  # the "from" time box as typed (µs), for trigger "t0"
    t1: object = None  # the "to" time box as typed (µs), for trigger "t1"
    px: object = None  # the plot area's [width, height] in px (clamped to client.PX_LIMITS)
    state: object = None  # the last view: a client.ViewState as the browser holds it


class Drawn(NamedTuple):
    """``gantt``'s result: the figure, the new view state, the window's boxes (µs)."""

    figure: dict
    state: ViewState
    t0: float
    t1: float
    status: str


def extent(data: M.TraceData, view: M.View) -> tuple:
    """First start and last end (ns) of the intervals in a row layout: the time
    window that shows all of a selection."""
    if view.n == 0:
        return data.t_min, max(data.t_max, data.t_min + 1)
    return view.t_first, max(view.t_last, view.t_first + 1)


def normalize(data: M.TraceData, ranks, launches, stages, phases, ctas):
    """The filters as cache keys: sorted tuples, ``None`` for "all" (an empty rank or
    launch choice, every stage, every phase, the full CTA range), so that the same
    selection always finds the same cached row layout and analysis tables."""
    def norm(values, present):
        v = sorted_ints(values) if values else None
        return None if v is None or set(v) >= set(present) else v

    ranks, launches, stages, phases, ctas = (client_list(v, what) for v, what in (
        (ranks, "rank"), (launches, "launch"), (stages, "stage"), (phases, "phase"), (ctas, "CTA")))
    def every(values, n):  # an empty choice stays empty (nothing shown); all of them is None
        v = sorted_ints(values)
        return None if v is None or set(v) >= set(range(n)) else v

    ranks, launches = norm(ranks, data.ranks), norm(launches, data.launches)
    stages, phases = every(stages, len(data.stage_names)), every(phases, len(data.interval_names))
    if ctas:
        lo, hi = int(min(ctas)), int(max(ctas))
        placed = data.cta[data.lane < 0]  # the full range of CTAs keeps the rows without one too
        ctas = None if placed.size == 0 or (lo <= int(placed.min()) and hi >= int(placed.max())) else (lo, hi)
    else:
        ctas = None
    return ranks, launches, stages, phases, ctas


def parse_relayout(rel: dict | None):
    """``(x range µs or None, y range or None, autorange)`` from plotly's relayoutData
    (either time axis: the Gantt's ``xaxis`` or the concurrency chart's ``xaxis2``)."""
    if not rel:
        return None, None, False
    auto = any(rel.get(f"{a}.autorange") for a in ("xaxis", "yaxis", "xaxis2"))

    def axis_range(ax, what):
        if f"{ax}.range[0]" in rel and f"{ax}.range[1]" in rel:
            return finite_us(rel[f"{ax}.range[0]"], what), finite_us(rel[f"{ax}.range[1]"], what)
        if isinstance(rel.get(f"{ax}.range"), list) and len(rel[f"{ax}.range"]) >= 2:
            return tuple(finite_us(v, what) for v in rel[f"{ax}.range"][:2])
        return None

    x = axis_range("xaxis", "zoom") or axis_range("xaxis2", "zoom")
    return x, axis_range("yaxis", "row zoom"), auto


def concurrency_table(app, item, ranks, launches, t0, t1, bins):
    """``(table, note)``: the concurrency analysis for the window, sliced from one
    full-range table of ``CONC_BINS`` bins (cached per selection) while the window
    still spans at least ``bins / 2`` of its bins, else computed for the window
    itself; ``note`` says why there is no table (the analysis refused)."""
    if item.data.n == 0:
        return None, ""
    d = item.data
    try:
        full = app.analysis(item, ("conc", ranks, launches), lambda: A.concurrency(
            item.trace, bins=CONC_BINS, t0_ns=d.t_min, t1_ns=d.t_max + 1, ranks=ranks, launches=launches))
        bin_ns = max(1, -(-(d.t_max + 1 - d.t_min) // CONC_BINS))
        if (t1 - t0) / bin_ns >= bins / 2:
            tns = rows.numpy(full.column("time_ns"))
            keep = (tns + bin_ns > t0) & (tns <= t1)
            return A.coarsen(full.filter(pa.array(keep)), max(1, int((t1 - t0) / bin_ns) // bins)), ""
        return app.analysis(item, ("conc", ranks, launches, t0, t1, bins), lambda: A.concurrency(
            item.trace, bins=bins, t0_ns=t0, t1_ns=t1, ranks=ranks, launches=launches)), ""
    except A.AnalysisError as e:
        return None, f"stage concurrency: {e}"


def window(state, trigger, rel, t0_in, t1_in, full_t, n_rows, same_selection, same_rows) -> tuple:
    """The ``(t0, t1, r0, r1)`` to draw: the last window (``state``) where the
    selection is the same, moved by ``trigger`` (a zoom, the boxes, ``reset``),
    clamped to the layout's rows."""
    t0, t1 = (state.t0, state.t1) if state and same_selection else full_t
    r0, r1 = (state.r0, state.r1) if state and same_rows else (0, n_rows)
    if trigger == "gantt":
        x, y, auto = parse_relayout(rel)
        if auto:
            (t0, t1), r0, r1 = full_t, 0, n_rows
        elif x is None and y is None:
            raise dash.exceptions.PreventUpdate  # autosize and other non-zoom events
        if x is not None:
            t0, t1 = int(min(x) * 1e3), int(math.ceil(max(x) * 1e3))
        if y is not None:
            r0, r1 = max(0, int(math.floor(min(y) + 0.5))), min(n_rows, int(math.ceil(max(y) + 0.5)))
    elif trigger in ("t0", "t1"):
        t0, t1 = us_to_ns(t0_in, "from", t0), us_to_ns(t1_in, "to", t1)
    elif trigger == "reset":
        (t0, t1), r0, r1 = full_t, 0, n_rows
    t1 = max(t1, t0 + 1)
    r0, r1 = (min(max(int(r), 0), n_rows) for r in (r0, r1))
    return (int(t0), int(t1)) + ((r0, r1) if r1 > r0 else (0, n_rows))


def status_line(info: dict, bar_limit: int, height: int, gl_limit: int | None = None) -> str:
    """The line above the Gantt: what is drawn and how (``info["drawn"]``: bars as
    an image beyond ``gl_limit``)."""
    if info["mode"] == "raster":
        return (f"aggregated view: {info['intervals']:,} intervals in {info['rows']:,} rows, drawn as "
                f"occupancy per pixel; zoom in (≤ {bar_limit:,} intervals, ≤ {F.ROWS_PER_PX * height:,} rows) "
                "for exact bars")
    if info["mode"] == "bars" and info.get("drawn") == "image":
        return (f"{info['intervals']:,} intervals in {info['rows']:,} rows, exact bars drawn as an image; "
                f"zoom in (≤ {gl_limit:,} intervals) for a task's hover text, or click a bar to pin its task")
    if info["mode"] == "bars":
        return f"{info['intervals']:,} intervals in {info['rows']:,} rows, exact bars"
    return "nothing to draw"


def opening_key(q: GanttQuery) -> str | None:
    """The key of a query that opens its trace (a filter change from no view or
    another trace's: nothing of the last view carries over), None for any other:
    such a query's figure depends on nothing else (``draw_ahead``)."""
    state = ViewState.from_client(q.state)
    if q.trigger != "filters" or (state is not None and state.name == q.name) or not q.name:
        return None
    return json.dumps([q.name, q.grouping, q.ranks, q.launches, q.stages, q.phases, q.ctas, list(clamp_px(q.px))],
                      sort_keys=True, default=str)


def draw_ahead(app, q: GanttQuery):
    """Start drawing the Gantt that opens trace ``q.name`` in a thread, so that it is
    ready (or under way) when the browser, having applied the trace callback's
    answer, asks for it: a launch drill-down overlaps the two."""
    key = opening_key(q)
    if key is None:
        return
    fut: Future = Future()
    with app.first_lock:
        if sum(not f.done() for f in app.ahead.values()) >= AHEAD_BUSY:
            return  # as many being drawn already: the Gantt callback draws this one itself
        app.ahead[key] = fut
        while len(app.ahead) > AHEAD:
            app.ahead.popitem(last=False)

    def work():
        try:
            fut.set_result(_gantt(app, q))
        except BaseException as e:  # noqa: BLE001 - the Gantt callback draws it again and reports it
            fut.set_exception(e)

    threading.Thread(target=work, name="draw-ahead", daemon=True).start()


def gantt(app, q: GanttQuery) -> Drawn:
    """The Gantt of trace ``q.name`` for a selection. ``q.state`` carries the last
    window; ``q.trigger`` says which input fired: a zoom (``gantt``), the time boxes,
    ``reset``, or a filter / trace change (rows start over; the time window stays
    unless the trace, ranks or launches changed: then it fits the selection). A
    query that opens its trace takes the figure ``draw_ahead`` drew, if any."""
    key = opening_key(q)
    with app.first_lock:
        fut = app.ahead.pop(key, None) if key is not None else None
    if fut is not None:
        try:
            return fut.result(timeout=AHEAD_WAIT_S)
        except Exception:  # noqa: BLE001 - drawn here instead, where an error is reported
            pass
    return _gantt(app, q)


def _gantt(app, q: GanttQuery) -> Drawn:
    """``gantt`` without the figures drawn ahead."""
    name = q.name
    item = app.store.get(name)
    d = item.data
    grouping = q.grouping if q.grouping in M.GROUPINGS else "rank"
    state, (width, height) = ViewState.from_client(q.state), clamp_px(q.px)
    ranks, launches, stages_t, phases_t, ctas_t = normalize(d, q.ranks, q.launches, q.stages, q.phases, q.ctas)
    view = app.view(item, grouping, ranks, launches, ctas_t, stages_t)
    stages_key = stages_t if grouping == "stage" else None
    fkey = repr([name, grouping, ranks, launches, ctas_t, stages_key])
    same = state is not None and (state.name, state.ranks, state.launches) == (name, ranks, launches)
    t0, t1, r0, r1 = window(state, q.trigger, q.relayout, q.t0, q.t1, extent(d, view), view.n_rows, same,
                            state is not None and state.fkey == fkey)
    conc, conc_note = concurrency_table(app, item, ranks, launches, t0, t1, width)
    shown = list(stages_t) if stages_t is not None else list(range(len(d.stage_names)))
    fig, info = F.gantt_figure(d, view, r0=r0, r1=r1, t0_ns=t0, t1_ns=t1, class_ok=M.class_mask(d, stages_t, phases_t),
                               stages=shown, width_px=width, height_px=height, bar_limit=app.bar_limit,
                               gl_limit=app.gl_limit,
                               concurrency=conc, concurrency_note=conc_note,
                               note="this trace has no intervals" if d.n == 0 else "")
    fig["data"] += F.path_trace(path_segments(app, item, view, grouping, launches))
    if info["mode"] == "empty" and d.n:
        fig["layout"]["annotations"].append({
            "text": "nothing in this window with these filters", "xref": "paper", "yref": "paper",
            "x": 0.5, "y": 0.6, "showarrow": False, "font": {"size": 15, "color": "#666"}})
    new = ViewState(name=name, fkey=fkey, grouping=grouping, t0=t0, t1=t1, r0=r0, r1=r1,
                    panels=[name, ranks, launches], ranks=ranks, launches=launches, ctas=ctas_t, stages=stages_key)
    return Drawn(fig, new, round(t0 / 1e3, 3), round(t1 / 1e3, 3), status_line(
        {**info, "drawn": fig["layout"]["meta"]["drawn"]}, app.bar_limit, height, app.gl_limit))


def path_segments(app, item, view, grouping, launches) -> list:
    """The exact critical path of every launch shown, as ``((x µs, row), (x µs, row))``
    segments over the row layout: each task's stretch on the path on its row (wave
    0's), each hand-off from its producer's row to its consumer's. Only for a trace
    with a task graph, rows by rank · launch or by rank · CTA."""
    tr = item.trace
    if not tr.spec.graph or grouping not in ("rank", "cta") or view.n_rows == 0:
        return []
    from timeline.analysis import edges as E

    g = app.analysis(item, ("edges",), lambda: E.edges(tr))
    return chain_segments(g, view, grouping, [E.path_steps(g, launch) for launch in (launches or tr.launches)])


def chain_segments(g, view, grouping, paths) -> list:
    """``path_segments`` of ``paths`` (``edges.path_steps`` lists of ``Step``, or
    parts of them) over the row layout ``view``."""
    m = g.tasks
    launch_key = grouping == "rank"
    rows = {(int(r), int(la) if launch_key else -1, int(c)): i for i, (r, la, c, w) in enumerate(zip(
        view.rows["rank"], view.rows["launch"], view.rows["cta"], view.rows["wave"])) if int(w) == 0}

    def row(t):
        return rows.get((int(m.rank[t]), int(m.launch[t]) if launch_key else -1, int(m.cta[t])))

    out = []
    for steps in paths:
        for step in reversed(steps):
            cur, p = step.task, step.producer
            r = row(cur)
            begin = m.wait_end[cur] if step.handoff else m.start[cur]
            if r is not None:
                out.append(((begin / 1e3, r), (m.end[cur] / 1e3, r)))
            if step.handoff and r is not None and row(p) is not None:
                out.append(((m.end[p] / 1e3, row(p)), (m.wait_end[cur] / 1e3, r)))
    return out


EMPTY_FIGURE = {"data": [], "layout": {"xaxis": {"visible": False}, "yaxis": {"visible": False}}}


@guarded(NO, NO, NO, NO, ERROR, NO, named=GanttOut)  # a bad input keeps the figure and says why
def on_gantt(app, q: GanttQuery):
    """The Gantt callback: ``gantt`` for ``q`` as a ``GanttOut``, the panels' key only
    when it changed; an empty figure when no trace is open."""
    if not q.name:
        return GanttOut(EMPTY_FIGURE, None, None, None, "", None)
    drawn = gantt(app, q)
    # the panels below follow the rank / launch selection, and only after the Gantt is drawn
    old = ViewState.from_client(q.state)
    panels = NO if old is not None and old.panels == drawn.state.panels else drawn.state.panels
    return GanttOut(drawn.figure, drawn.state.to_client(), drawn.t0, drawn.t1, drawn.status, panels)


def details(app, name, click, state):
    """The pinned-task panel for a click on the Gantt: the task whose interval in the
    clicked row (``y``) is nearest the clicked time (``x``, a hover point is the
    middle of an interval or task). Found again on the server from the current row
    layout (``state``), as Dash's clickData does not carry typed-array customdata."""
    item = app.store.get(name)
    d = item.data
    state = ViewState.from_client(state)
    pts = (click or {}).get("points") if isinstance(click, dict) else None
    hint = "Click a bar to pin its task here."
    if not isinstance(pts, list) or not pts or not isinstance(pts[0], dict) or "x" not in pts[0] \
            or "y" not in pts[0] or state is None or state.name != name or state.grouping not in M.GROUPINGS:
        return hint
    view = app.view(item, state.grouping, state.ranks, state.launches, state.ctas, state.stages)
    row, t = int(round(finite_us(pts[0]["y"], "clicked row"))), finite_us(pts[0]["x"], "clicked time") * 1e3
    if not 0 <= row < view.n_rows:
        return hint
    idx = view.order[int(view.row_start[row]):int(view.row_start[row + 1])]
    gap = np.maximum(np.maximum(d.start[idx] - t, t - d.end[idx]), 0)
    return task_table(d, d.task_intervals(int(d.tid[idx[int(np.argmin(gap))]])))


def task_table(d: M.TraceData, ivs) -> html.Table:
    """One task's identity, placement, times and phase durations (``ivs``: its
    intervals' indices)."""
    i = int(ivs[0])
    place = M.placement_text(d.vendor, int(d.xcc[i]), int(d.se[i]), int(d.cu[i]), int(d.sm[i]))
    head = [("stage", d.stage_names[d.stage[i]]), ("task", int(d.task[i])), ("rank", int(d.rank[i])),
            ("launch", str(d.launch_keys.get(int(d.launch[i]), int(d.launch[i])))), ("CTA", int(d.cta[i]) if d.cta[i] >= 0 else rows.UNPLACED),
            ("wave", int(d.wave[i]) if d.wave[i] >= 0 else rows.UNPLACED),
            ("placement", place), ("start", f"{d.start[ivs[0]] / 1e3:,.3f} µs"),
            ("end", f"{d.end[ivs[-1]] / 1e3:,.3f} µs"),
            ("duration", f"{(d.end[ivs[-1]] - d.start[ivs[0]]) / 1e3:,.3f} µs")]
    trs = [html.Tr([html.Td(k), html.Td(str(v))]) for k, v in head]
    trs += [html.Tr([html.Td(d.interval_names[d.phase[j]]), html.Td(f"{(d.end[j] - d.start[j]) / 1e3:,.3f} µs")])
            for j in ivs]
    return html.Table(html.Tbody(trs), id="details-table")
