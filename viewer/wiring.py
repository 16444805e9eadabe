"""The wiring: the Dash app over an ``App`` (``build``: the page, the routes, one
line per callback), the page's first view, and the server's request guards. The
callbacks' logic lives in ``viewer.panels``; the adapters here only read Dash's
context (which input fired) and hand the inputs on."""

from __future__ import annotations

import urllib.parse
from functools import partial
from pathlib import Path

import dash
import flask
from dash import ALL, Input, Output, State

from viewer import charts as CH
from viewer.client import GANTT_PX
from viewer.ids import GANTT_PROPS, TRACE_PROPS, TraceOut, outputs
from viewer.page import (CSS, PLOTLY_EARLY, TABLES, PlotlyBundle, layout, msg, plotly_bundle, preload_links,
                         serve_plotly)
from viewer.panels import export as VX
from viewer.panels import gantt as VG
from viewer.panels import strip as VST
from viewer.panels import tables as VT
from viewer.panels import trace as VTR
from viewer.run_wiring import install as install_overview, linked_window
from viewer.state import ERROR, FIRST_VIEW_CACHE, NO, guarded, log, lru_get

GANTT_FILTERS = ("grouping", "ranks", "launches", "stages", "phases", "ctas")  # the Gantt's filter inputs
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # hosts served uncompressed (see ``build``)
PX_SCRIPT = """function(_) { var g = document.getElementById('gantt');
    var w = g ? Math.max(400, Math.min(3000, g.clientWidth - 210)) : 1000;
    return [Math.round(w), 560]; }"""
# only zooms and pans reach the server: plotly's autosize and other layout events stay in
# the browser (a late autosize would otherwise cancel a zoom in flight)
ZOOM_KEY = r"/^(xaxis2?|yaxis)\.(range|autorange)/"
ZOOM_SCRIPT = """function(rel) { if (!rel) return window.dash_clientside.no_update;
    var zoom = Object.keys(rel).some(k => %s.test(k));
    return zoom ? rel : window.dash_clientside.no_update; }""" % ZOOM_KEY
# a zoom goes straight to the zoom store (``set_props``), not through dcc.Graph's relayout
# handler: that one also copies the new axis into the ``figure`` prop, and the changed prop
# makes dcc.Graph run Plotly.react on the whole figure again (on the main thread,
# its typed arrays decoded anew) before the zoom's request can leave. Other layout events
# still reach dcc.Graph's handler. dcc.Graph binds its handlers after its first plot:
# tried each frame until they are there (once per plot element).
ZOOM_HOOK = """function(_) {
    function hook() { var gd = document.querySelector('#gantt .js-plotly-plot'), ev = gd && gd._ev;
        if (!ev || typeof ev.listeners !== 'function') return false;
        if (gd._timelineZoom) return true;
        var dcc = ev.listeners('plotly_relayout');
        if (!dcc.length) return false;
        gd.removeAllListeners('plotly_relayout');
        gd.on('plotly_relayout', function(rel) {
            if (rel && Object.keys(rel).some(k => %s.test(k)))
                window.dash_clientside.set_props('zoom', {data: Object.assign({}, rel)});
            else dcc.forEach(function(f) { f(rel); }); });
        gd._timelineZoom = true; return true; }
    (function retry(n) { if (!hook() && n > 0) requestAnimationFrame(function() { retry(n - 1); }); })(600);
    return window.dash_clientside.no_update; }""" % ZOOM_KEY

# the first view's panel key (``page.layout``) reaches the panels once the Gantt is painted (or
# after 5 s without a figure), so that their requests and tables come after the first paint
PAINTED_SCRIPT = """function(panels) { if (!panels) return window.dash_clientside.no_update;
    return new Promise(function(done) { var t0 = performance.now();
        function poll() { var g = document.querySelector('#gantt .js-plotly-plot');
            if ((g && g._fullLayout && g.layout && g.layout.meta) || performance.now() - t0 > 5000)
                requestAnimationFrame(function() { done(panels); });
            else requestAnimationFrame(poll); }
        requestAnimationFrame(poll); }); }"""


# -- the first view ------------------------------------------------------------------------------
def first_view(app, search: str | None) -> dict:
    """The page's first view for the address's search string (``?trace=...``):
    ``{"search": search, "props": {(id, prop): value}}``, what the trace callback and
    then the Gantt callback would set, computed here so that the layout response
    carries the first figure (one round trip instead of three before anything is
    drawn). Cached per search string while the trace files (names, modification
    times) and the bar limit stay the same."""
    search = search or ""
    names = tuple(app.catalog.names())
    try:
        item = app.store.get(app.requested(search))
        opened = (str(item.path), item.mtime)
    except Exception:  # noqa: BLE001 - select reports it in the page; not cached
        return _first_view(app, search)
    return lru_get(app.first_views, app.first_lock, (search, names, opened, app.bar_limit, app.gl_limit),
                   lambda: _first_view(app, search), FIRST_VIEW_CACHE)


def _first_view(app, search: str) -> dict:
    t = VTR.select(app, search, None, False)
    win = linked_window(search)  # a linked time window (&t0=..&t1=.., µs) as if typed in the boxes
    g = VG.on_gantt(app, VG.GanttQuery(key_name(t.key), t.grouping, t.ranks, t.launches, t.stages, t.phases,
                                       t.ctas, px=list(GANTT_PX), **({} if win is None else
                                                                     dict(trigger="t0", t0=win[0], t1=win[1]))))
    props = dict(zip(TRACE_PROPS, t))
    props.update(zip(GANTT_PROPS, g))
    return {"search": search, "props": {k: v for k, v in props.items() if v is not NO}}


def page_search(referrer: str | None) -> str | None:
    """The search string (``?trace=...``, or ``""``) of the page whose script asks for
    Dash's layout, from that request's ``Referer`` (the page's address: the layout
    request comes from the page itself, same origin); None without one."""
    if not referrer:
        return None
    query = urllib.parse.urlsplit(referrer).query
    return f"?{query}" if query else ""


# -- request guards --------------------------------------------------------------------------------
def loopback_host_only():
    """Refuse a request whose ``Host`` header names anything but this machine, when
    the server is bound to loopback: a page on another site whose name resolves to
    127.0.0.1 (DNS rebinding) would otherwise read the dashboard."""
    host = flask.request.host.rsplit(":", 1)[0] if not flask.request.host.startswith("[") \
        else flask.request.host[1:].split("]")[0]
    if host not in LOOPBACK:
        return flask.Response("timeline-view serves this machine only (Host must be 127.0.0.1, localhost "
                              "or ::1); bind another address with --host to serve a network", 403,
                              mimetype="text/plain")
    return None


def malformed(e):
    """Any request a callback could not take (one that names no callback, a body Dash
    cannot parse): one line, status 400, the traceback in the server's log only."""
    from werkzeug.exceptions import HTTPException

    if isinstance(e, HTTPException):
        return e
    log.exception("malformed request to %s", flask.request.path)
    return flask.Response(f"timeline-view: malformed request ({type(e).__name__})\n", 400, mimetype="text/plain")


# -- the callbacks' adapters ------------------------------------------------------------------------
@guarded(*(ERROR if p == ("banners", "children") else NO for p in TRACE_PROPS), named=TraceOut)
def on_trace(app, search, picked, page_search):
    by_picker = dash.ctx.triggered_id == "trace-select"
    # the initial call, or dcc.Location reporting the address as it mounts: the layout
    # already shows this address's view (the page reloads on a new address)
    if not by_picker and page_search is not None and (search or "") == page_search:
        raise dash.exceptions.PreventUpdate
    t = VTR.select(app, search, picked, by_picker)
    chosen = (t.grouping, t.ranks, t.launches, t.stages, t.phases, t.ctas)
    if key_name(t.key) and app.px is not None and NO not in chosen:
        # the Gantt callback follows this answer: its figure drawn meanwhile
        VG.draw_ahead(app, VG.GanttQuery(key_name(t.key), t.grouping, t.ranks, t.launches, t.stages, t.phases,
                                         t.ctas, px=app.px))
    return t


def key_name(key) -> str | None:
    """The trace file name in the trace callback's key (None: no trace open)."""
    return key.get("name") if isinstance(key, dict) else None


def on_gantt(app, key, grouping, ranks, launches, stages, phases, ctas, rel, t0, t1, _reset, px, state):
    """The Gantt callback's inputs (in the order ``build`` registers them) as one ``GanttQuery``."""
    trigger = {"zoom": "gantt", "t0": "t0", "t1": "t1", "reset": "reset"}.get(dash.ctx.triggered_id, "filters")
    app.px = px
    return VG.on_gantt(app, VG.GanttQuery(key_name(key), grouping, ranks, launches, stages, phases, ctas,
                                          trigger, rel, t0, t1, px, state))


@guarded(ERROR)
def on_click(app, click, key, state):
    return VG.details(app, key["name"], click, state) if key and key.get("name") else "No trace."


@guarded(None, None, ERROR)
def on_report(app, panels, by_launch, tab, prev):
    if tab != "report":
        raise dash.exceptions.PreventUpdate
    if not panels:
        return None, None, None
    cols, rows, note = VT.stage_report(app, panels[0], panels[1], panels[2], bool(by_launch))
    return (*VT.table_out("stage-report", cols, rows, prev), note)


@guarded(CH.idle_figure(None), None, None, None, None, ERROR)
def on_idle(app, panels, tab, prev, prev_gaps):
    if tab != "idle":
        raise dash.exceptions.PreventUpdate
    if not panels:
        return CH.idle_figure(None), None, None, None, None, None
    fig, cols, rows, note = VT.idle(app, panels[0], panels[1], panels[2])
    gap_cols, gap_rows = VT.gaps(app, panels[0], panels[1], panels[2])
    return (fig, *VT.table_out("idle-table", cols, rows, prev), *VT.table_out("gap-table", gap_cols, gap_rows, prev_gaps),
            note)


@guarded(None, None, ERROR)
def on_critical(app, panels, tab, prev):
    if tab != "critical":
        raise dash.exceptions.PreventUpdate
    if not panels:
        return None, None, None
    cols, rows, note = VT.critical(app, panels[0], panels[1], panels[2])
    return (*VT.table_out("critical-table", cols, rows, prev), note)


@guarded(VT.NO_FIGURE, None, None, ERROR)
def on_whatif(app, panels, scales, tab, prev):
    if tab != "whatif":
        raise dash.exceptions.PreventUpdate
    if not panels:
        return VT.NO_FIGURE, None, None, None
    fig, cols, rows, note = VT.whatif(app, panels[0], scales)
    return (fig, *VT.table_out("whatif-table", cols, rows, prev), note)


@guarded({"data": [], "layout": {}}, None, None, ERROR)
def on_compare(app, a, b, scope, _panels, prev):
    fig, cols, rows, note = VT.compare(app, a, b, scope)
    return (fig, *VT.table_out("cmp-table", cols, rows, prev), note)


@guarded(NO, NO)  # a malformed sort request leaves the table as it is
def on_sort(table_id, clicks, data):
    trig = dash.ctx.triggered_id
    out = VT.resort(table_id, data, trig.get("col") if trig and any(clicks or ()) else None)
    if out is None:
        raise dash.exceptions.PreventUpdate
    return out


@guarded(NO, ERROR)
def on_export(app, _n, key, ranks, launches, stages):
    if not key or not key.get("name"):
        return NO, msg("no trace to export")
    return VX.export(app, key["name"], ranks or None, launches or None, stages), None


# -- the app ------------------------------------------------------------------------------------------
def _page(app, dash_app, plotly: PlotlyBundle):
    """Dash's index page with plotly.js loading from the head and the CSS inline.
    plotly.js (the largest script, the slowest to evaluate) is what the first paint
    waits for; dcc.Graph would ask for it only once the layout and its
    own chunk have loaded. Instead it loads asynchronously while the server builds
    the layout; dcc.Graph uses ``window.Plotly`` when set (the documented way to
    bring one's own plotly.js): until the script has run it is a promise that the
    script's load resolves. The layout carries the first view (``first_view``)."""
    prefix, route = dash_app.config.requests_pathname_prefix, plotly.route
    dash_app.server.add_url_rule(f"/{route}", "timeline_view_plotly", partial(serve_plotly, plotly))
    dash_app.index_string = dash_app.index_string.replace(
        "{%css%}", "{%css%}" + PLOTLY_EARLY.format(src=prefix + route) + preload_links(prefix)
        + f"<style>{CSS}</style>")

    def page_layout():
        # Dash validates the layout once at build time, outside any request
        search = page_search(flask.request.referrer) if flask.has_request_context() else None
        return layout(None if search is None else first_view(app, search))

    dash_app.layout = page_layout


def build(app, compress: bool = False, host: str | None = "127.0.0.1", plotly: PlotlyBundle | None = None) -> dash.Dash:
    """The Dash app over ``app`` (a ``viewer.state.App``). ``plotly``: the plotly.js it
    serves (``page.plotly_bundle``; None: the ``plotly`` package's). ``compress``: send responses
    compressed (flask-compress): worth it over a network, not on loopback, where
    compressing costs more than it saves. ``host``: the address it will be bound to;
    on loopback every request must name a loopback ``Host``."""
    # no assets folder: Dash would otherwise serve (and inject into the page) whatever an
    # ``assets/`` directory beside the working directory holds; the CSS is inline
    d = dash.Dash("timeline-view", title="timeline-view", update_title=None, serve_locally=True, compress=compress,
                  assets_folder=str(Path(__file__).parent / "no-assets"), assets_ignore=".*")
    _page(app, d, plotly or plotly_bundle())
    if host in LOOPBACK:
        d.server.before_request(loopback_host_only)
    d.server.register_error_handler(Exception, malformed)
    d.clientside_callback(PX_SCRIPT, Output("px", "data"), Input("url", "pathname"))
    d.clientside_callback(ZOOM_SCRIPT, Output("zoom", "data"), Input("gantt", "relayoutData"))
    d.clientside_callback(ZOOM_HOOK, Output("zoom", "data", allow_duplicate=True), Input("gantt", "figure"),
                          prevent_initial_call="initial_duplicate")
    d.clientside_callback(PAINTED_SCRIPT, Output("panel-key", "data", allow_duplicate=True), Input("panel-first", "data"),
                          prevent_initial_call="initial_duplicate")
    d.callback(*outputs(TRACE_PROPS), Input("url", "search"), Input("trace-select", "value"),
               State("page-search", "data"))(partial(on_trace, app))
    d.callback(*outputs(GANTT_PROPS), Input("trace-key", "data"), *(Input(c, "value") for c in GANTT_FILTERS),
               Input("zoom", "data"), Input("t0", "value"), Input("t1", "value"), Input("reset", "n_clicks"),
               State("px", "data"), State("view-state", "data"),
               prevent_initial_call=True)(partial(on_gantt, app))  # the layout holds the first view
    d.callback(Output("details", "children"), Input("gantt", "clickData"), State("trace-key", "data"),
               State("view-state", "data"), prevent_initial_call=True)(partial(on_click, app))
    d.callback(Output("stage-report", "children"), Output("stage-report-data", "data"), Output("report-msg", "children"),
               Input("panel-key", "data"), Input("by-launch", "value"), Input("tabs", "value"),
               State("stage-report-data", "data"), prevent_initial_call=True)(partial(on_report, app))
    d.callback(Output("idle-graph", "figure"), Output("idle-table", "children"), Output("idle-table-data", "data"),
               Output("gap-table", "children"), Output("gap-table-data", "data"), Output("idle-msg", "children"),
               Input("panel-key", "data"), Input("tabs", "value"), State("idle-table-data", "data"),
               State("gap-table-data", "data"), prevent_initial_call=True)(partial(on_idle, app))
    d.callback(Output("critical-table", "children"), Output("critical-table-data", "data"),
               Output("critical-msg", "children"), Input("panel-key", "data"), Input("tabs", "value"),
               State("critical-table-data", "data"), prevent_initial_call=True)(partial(on_critical, app))
    d.callback(Output("whatif-graph", "figure"), Output("whatif-table", "children"),
               Output("whatif-table-data", "data"), Output("whatif-msg", "children"), Input("panel-key", "data"), Input("whatif-scales", "value"),
               Input("tabs", "value"), State("whatif-table-data", "data"), prevent_initial_call=True)(partial(on_whatif, app))
    d.callback(Output("cmp-graph", "figure"), Output("cmp-table", "children"), Output("cmp-table-data", "data"),
               Output("cmp-msg", "children"), Input("cmp-a", "value"), Input("cmp-b", "value"),
               Input("cmp-scope", "value"), Input("panel-key", "data"), State("cmp-table-data", "data"),
               prevent_initial_call=True)(partial(on_compare, app))  # first after the first paint: panel-key
    for table_id in TABLES:  # a click on a column header sorts by it; a second click reverses
        d.callback(Output(table_id, "children", allow_duplicate=True),
                   Output(f"{table_id}-data", "data", allow_duplicate=True),
                   Input({"type": "sort", "table": table_id, "col": ALL}, "n_clicks"),
                   State(f"{table_id}-data", "data"), prevent_initial_call=True)(partial(on_sort, table_id))
    from viewer.panels import abcompare as VAB
    from viewer.panels import explain as XP

    from viewer.panels import chipmap as VCP

    XP.wire(d, app)
    VAB.wire(d, app)
    VCP.wire(d, app)
    d.callback(Output("download", "data"), Output("export-msg", "children"), Input("export-chrome", "n_clicks"),
               State("trace-key", "data"), State("ranks", "value"), State("launches", "value"),
               State("stages", "value"), prevent_initial_call=True)(partial(on_export, app))
    if hasattr(app, "runs"):  # a run's overview above the Gantt (viewer.run_wiring)
        install_overview(d, app, page_search)
    if getattr(app, "context", None) is not None:  # the framework's context strip (--context), above the Gantt
        VST.install(d, app, ZOOM_SCRIPT)
    return d
