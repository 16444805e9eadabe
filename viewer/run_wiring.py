"""The run overview in the page (``install``): its section above the Gantt, carried
in the layout response like the first view; its callbacks (the figure, a click or
a button opening a launch, the address that names the view); the keys that step
through launches. The logic is ``viewer.panels.overview``; this module reads Dash's
context and hands the inputs on, as ``viewer.wiring`` does.

A launch opens by a new address (``?run=R&launch=KEY``, pushed to the browser's
history, so Back returns to the launch before): the trace callback then loads it
and the Gantt and every panel below follow, as for any trace. Beside the overview:
``timeline explain``'s verdict on the launch shown (against the run's typical launch)
and, over the run's slow launches, its stable culprits beside the p99 verdict
(``viewer.explained``: ``timeline.query.explain``, asked after the first paint)."""

from __future__ import annotations

import urllib.parse
from functools import partial

import dash
import flask
from dash import Input, Output, Patch, State, dcc, html

from timeline.query import explain as QX
from viewer import explained as XD
from viewer import run_grid as VRG
from viewer import run_source as VRS
from viewer import segments as VSG
from viewer.client import ViewState
from viewer.page import TABS, msg
from viewer.panels import changes as VCM
from viewer.panels import overview as VO
from viewer.state import ERROR, NO, guarded

CSS = """
.overview { margin: 4px 14px 0; border: 1px solid #d5dbe1; border-radius: 4px; padding: 4px 8px; }
.ov-head { font-size: 13px; display: flex; gap: 12px; align-items: baseline; }
.ov-row { display: flex; gap: 10px; }
.ov-controls { width: 236px; flex: none; font-size: 12px; }
.ov-controls button { margin: 2px 2px 2px 0; font-size: 12px; }
.ov-main { flex: 1; min-width: 0; }
.ov-explain { width: 260px; flex: none; font-size: 12px; border-left: 1px solid #ddd; padding-left: 10px; }
.ov-scale { font-size: 12px; color: #444; }
.ov-progress { font-size: 12px; color: #1f4e79; font-weight: 600; min-height: 16px; }
"""
EXPLAIN_SLOT = "timeline explain on the launch shown: working it out (it reads the run's typical launches) …"
CHANGES_SLOT = "change points (timeline changes): searching the run's steps …"
ACROSS_SLOT = f"the stable culprits over the run's slow launches: working them out (up to {XD.ACROSS} launches) …"
BUTTONS = (("ov-slowest", "slowest"), ("ov-typical", "typical"), ("ov-p99", "p99"), ("ov-prev", "◀ previous (p)"),
           ("ov-next", "next (n) ▶"))
KEYS_SCRIPT = """function(_) { if (!window._ovKeys) { window._ovKeys = true;
    document.addEventListener('keydown', function(e) {
        var t = e.target, tag = (t && t.tagName || '').toLowerCase();
        if (e.ctrlKey || e.metaKey || e.altKey || tag === 'input' || tag === 'textarea' || tag === 'select'
            || (t && t.isContentEditable)) return;
        var id = {n: 'ov-next', ArrowRight: 'ov-next', p: 'ov-prev', ArrowLeft: 'ov-prev'}[e.key];
        var b = id && document.getElementById(id);
        var box = document.getElementById('run-overview');
        if (b && box && box.style.display !== 'none') { b.click(); e.preventDefault(); } }); }
    return window.dash_clientside.no_update; }"""
# the address bar names the view shown (a reload or a copied address opens it again)
ADDRESS_SCRIPT = """function(href) { if (href && href.indexOf('?run=') === 0 && window.location.search !== href)
    window.history.replaceState(window.history.state, '', window.location.pathname + href);
    return window.dash_clientside.no_update; }"""
# a click on an unbinned overview opens its cell's launch from the browser (one server round trip
# fewer): the cell's column and row name its launch key (step:layer, capture:slot or a number); a
# binned overview's click goes to the server (``on_open``: the cell's slowest launch)
CLICK_SCRIPT = """function(click, fig, search) { var nu = window.dash_clientside.no_update;
    var m = fig && fig.layout && fig.layout.meta, p = click && click.points && click.points[0];
    var cd = p && p.customdata;  // a change mark's (its two segments): the Compare tab opens instead
    if (Array.isArray(cd) && cd.length === 2 && String(cd[0]).indexOf('%s') > 0) return [nu, nu];
    if (!m || m.binned || !m.run || !p || p.x === undefined || p.y === undefined || p.x === null) return [nu, nu];
    if (typeof p.z === 'number' && !isFinite(p.z)) return [nu, nu];
    var x = String(p.x), y = String(p.y);
    var key = m.form === 'step:layer' ? x + ':' + y : m.form === 'capture:slot' ? y + ':' + x : x;
    var q = new URLSearchParams(search || ''), out = new URLSearchParams();
    out.set('run', m.run); out.set('launch', key);
    %s.forEach(function(k) { if (q.get(k)) out.set(k, q.get(k)); });
    var s = '?' + out.toString().replace(/%%2C/g, ',').replace(/%%2F/g, '/').replace(/%%3A/g, ':');
    if (q.get('run') === m.run && q.get('launch') === key) return [nu, nu];
    return [s, 'loading launch ' + key + ' …']; }""" % (
    VSG.SEP, "[" + ", ".join(f"'{k}'" for k in VO.LINKED) + "]")
CLEAR_SCRIPT = "function(_s, _b) { return ''; }"


def section(app, search: str | None):
    """The overview's part of the page for the address ``search``: filled in for a
    run's page, hidden (but present, for the callbacks) otherwise."""
    run = app.run_of(search) if hasattr(app, "run_of") else None
    figure, summary, scale, ranks, note = {"data": [], "layout": {}}, "", "", [], None
    if run is not None:
        try:
            ov = app.runs.overview(run)
            shown = VRS.parse_name(app.requested(search))
            figure = VO.figure(ov, "kernel", None, shown[1] if shown and shown[0] == run else None, run)
            summary, scale, ranks = VO.summary(ov, run), VO.METRICS["kernel"][1], ov.ranks
        except Exception as e:  # noqa: BLE001 - the page says why; the trace callback too
            note = msg(f"run overview: {e}")
    return html.Div(id="run-overview", className="overview", style=None if run else {"display": "none"}, children=[
        dcc.Store(id="ov-run", data=run), dcc.Store(id="ov-keys"), dcc.Store(id="ov-changes"),
        html.Div(className="ov-head", children=[html.B("Run overview"), html.Span(summary, id="ov-summary")]),
        html.Div(note, id="ov-msg"),
        html.Div(className="ov-row", children=[
            html.Div(className="ov-controls", children=[
                dcc.RadioItems(id="ov-metric", value="kernel", options=[
                    {"label": " kernel time", "value": "kernel"},
                    {"label": " kernel time of one rank", "value": "rank"},
                    {"label": " start skew across ranks", "value": "skew"},
                    {"label": " anomalies", "value": "anomalies"}]),
                dcc.Dropdown(id="ov-rank", options=rank_options(ranks), value=ranks[0] if ranks else None,
                             clearable=False, placeholder="rank"),
                html.Div([html.Button(label, id=bid, n_clicks=0) for bid, label in BUTTONS]),
                html.Div(id="ov-progress", className="ov-progress"),
                html.A("link to this view", id="ov-link", href=""),
            ]),
            html.Div(className="ov-main", children=dcc.Graph(
                id="ov-graph", figure=figure, style={"height": f"{figure['layout'].get('height', 200)}px"},
                config={"displaylogo": False, "displayModeBar": False})),
            html.Div(className="ov-explain", children=[
                html.Div(id="ov-explain", children=[html.B("Explain verdict"),
                                                    html.Div(EXPLAIN_SLOT, className="status")]),
                html.Div(id="ov-across", children=[html.Div(ACROSS_SLOT, className="status")])]),
        ]),
        html.Div(className="ov-scale", children=[html.Span(scale, id="ov-scale"), " · ", VO.MARKS]),
        html.Div(CHANGES_SLOT if run else "", id="ov-changes-says", className="ov-scale"),
    ])


def rank_options(ranks) -> list:
    """The overview's rank dropdown: one option per rank of the run."""
    return [{"label": f"rank {r}", "value": r} for r in ranks]


def shown_key(key, run):
    """The launch of ``run`` the page shows (``trace-key``), None when it shows another."""
    parsed = VRS.parse_name((key or {}).get("name")) if isinstance(key, dict) else None
    return parsed[1] if parsed and parsed[0] == run else None


def _marks_of(marks, run):
    """The change marks the page keeps (``ov-changes``) when they are ``run``'s, else None."""
    return marks if isinstance(marks, dict) and marks.get("run") == run else None


@guarded(NO, NO, NO, NO, NO, NO)
def on_figure(app, metric, rank, key, run, marks=None):
    """The overview figure for the metric; only the outline moves when the launch
    shown changes (a ``Patch``); the run of a launch picked elsewhere replaces it,
    and the rank dropdown takes that run's ranks (the rank kept where it has it)."""
    parsed = VRS.parse_name((key or {}).get("name")) if isinstance(key, dict) else None
    if parsed is None:
        if run is None:
            raise dash.exceptions.PreventUpdate
        return NO, NO, {"display": "none"}, NO, NO, NO
    if parsed[0] != run or dash.ctx.triggered_id != "trace-key":
        ov = app.runs.overview(parsed[0])
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
        if parsed[0] != run and rank not in ov.ranks:
            rank = ov.ranks[0] if ov.ranks else None
        metric = metric if metric in VO.METRICS else "kernel"
        fig = VCM.apply(VO.figure(ov, metric, rank, parsed[1], parsed[0]), _marks_of(marks, parsed[0]))
        ranks = (rank_options(ov.ranks), rank) if parsed[0] != run else (NO, NO)
        return fig, VO.metric_grid(ov, metric, rank)[2], None, parsed[0], *ranks
    patch = Patch()
    m = _marks_of(marks, run)
    patch["layout"]["shapes"] = VO.selection_shapes(app.runs.overview(run), parsed[1]) + (m["shapes"] if m else [])
    return patch, NO, None, NO, NO, NO


@guarded(NO, ERROR)  # a refusal (a run outside the trace directory, ...) shows where the progress note goes
def on_open(app, click, *rest):
    """A click on the overview or a button: the address of the launch to open and a
    note that it is loading; nothing when it is the launch shown."""
    *_clicks, run, key, search, metric, rank = rest
    if run is None:
        raise dash.exceptions.PreventUpdate
    ov = app.runs.overview(run)
    trig = dash.ctx.triggered_id
    shown = shown_key(key, run)
    if trig == "ov-graph":
        if VCM.picked(click) is not None:
            raise dash.exceptions.PreventUpdate  # a change mark: the Compare tab opens (``on_marks_pick``)
        if not (isinstance(click, dict) and VRG.columns(ov) > 1):
            raise dash.exceptions.PreventUpdate  # the browser opened it (``CLICK_SCRIPT``)
        target = VO.clicked(ov, click, metric, rank)
    else:
        target = VO.target(ov, str(trig or "").removeprefix("ov-"), shown)
    if target is None or target == shown:
        raise dash.exceptions.PreventUpdate
    return (VO.search_for(run, target, search),
            f"loading launch {target} ({ov.tasks_of(target):,} tasks across ranks) …")


def _shown(run, panels):
    """The launch of ``run`` the panels follow (``panel-key``), None when another."""
    name = panels[0] if isinstance(panels, (list, tuple)) and panels and isinstance(panels[0], str) else None
    parsed = VRS.parse_name(name)
    return parsed[1] if parsed and parsed[0] == run else None


@guarded(ERROR)
def on_verdict(app, run, panels=None):
    """The explain verdict beside the overview: the launch shown against the run's
    typical launch (``timeline.query.explain``); asked once the Gantt is painted (the
    panels' key), again for each launch opened."""
    key = _shown(run, panels)
    if run is None or key is None:
        raise dash.exceptions.PreventUpdate
    doc = XD.document(app, run, QX.Ask(launches=[key]), "compare it with another run in the Compare tab")
    return [html.B(f"Explain verdict: launch {key} (shown)"), html.Div(doc["verdict"], id="ov-verdict"),
            html.Div(XD.typical_line(doc), className="status")]


@guarded(ERROR)
def on_across(app, run, panels=None):
    """The p99 launch's verdict and the stable culprits over the run's slow launches
    (``Ask(p99=True, across=ACROSS)``: it explains up to ``ACROSS`` launches), made
    once per run, after the first paint."""
    if run is None or _shown(run, panels) is None:
        raise dash.exceptions.PreventUpdate
    doc = XD.document(app, run, QX.Ask(p99=True, across=XD.ACROSS), "compare it with another run in the Compare tab")
    out = [html.B("p99 launch"), html.Div(doc["verdict"], id="ov-p99-verdict", className="status")]
    across = doc.get("across")
    if across:
        out += [html.B("Stable culprits over the slow launches"), html.Div(across["says"], id="ov-across-says")]
        out += [html.Div(f"• {c['says']}", className="ov-culprit") for c in across["culprits"][:5]]
    return out


@guarded(NO, NO, ERROR)
def on_marks(app, run, panels=None, have=None, key=None):
    """The change marks of the run shown (``timeline changes``, ``viewer.panels.changes``),
    asked once per run after the first paint (the panels' key): kept in ``ov-changes``,
    added to the figure the browser holds (a ``Patch``), its verdict below the overview."""
    if run is None or _shown(run, panels) is None or _marks_of(have, run) is not None:
        raise dash.exceptions.PreventUpdate
    ov = app.runs.overview(run)
    if ov.grid.form != VRG.HEADED:  # no slot headers: no steps to search (timeline changes refuses it)
        return {"run": run, **VCM.marks(ov, {}, run)}, NO, ""
    doc = VCM.document(app, run)
    m = {"run": run, **VCM.marks(ov, doc, run)}
    drawn = len(m["points"])
    note = f"change points (timeline changes {run}): {doc['says']}" + (
        " · click a ▼ to compare its segments" if drawn else "")
    return m, VCM.patch(m, VO.selection_shapes(ov, shown_key(key, run))), note


@guarded(NO)
def on_link(app, state, key, tab, search, a=None, b=None):
    """The link callback: ``view_link``."""
    return view_link(state, key, tab, search, a, b)


def view_link(state, key, tab, search, a=None, b=None):
    """The address of the view shown: run and launch (or trace), ranks, launches,
    row grouping, time window (µs), tab; on the Compare tab over two step segments
    (a change mark's), A and B (``&compare=..&compare_b=..``)."""
    st = ViewState.from_client(state)
    name = (key or {}).get("name") if isinstance(key, dict) else None
    if st is None or not name or st.name != name:
        raise dash.exceptions.PreventUpdate
    view = {"ranks": ",".join(map(str, st.ranks)) if st.ranks else None, "grouping": st.grouping,
            "t0": f"{st.t0 / 1e3:.3f}", "t1": f"{st.t1 / 1e3:.3f}", "tab": tab if tab in TABS else None}
    if tab == "compare" and VSG.is_segment(a) and VSG.is_segment(b):
        view.update(compare=a, compare_b=b)
    parsed = VRS.parse_name(name)
    if parsed is not None:
        return VO.search_for(parsed[0], parsed[1], search, view, keep=())
    if st.launches:
        view["launches"] = ",".join(map(str, st.launches))
    return "?" + urllib.parse.urlencode([("trace", name)] + [(k, v) for k, v in view.items() if v], safe=",/")


def linked_window(search: str | None) -> tuple | None:
    """The time window an address names (``&t0=..&t1=..``, µs, as typed in the
    page's boxes), None without one: the first view opens on it."""
    q = urllib.parse.parse_qs((search or "").lstrip("?"))
    if not q.get("t0") or not q.get("t1"):
        return None
    return q["t0"][0][:64], q["t1"][0][:64]


def install(dash_app, app, page_search):
    """Add the overview to a built page: its section in every layout (the address's
    run filled in), its CSS, its callbacks."""
    inner = dash_app.layout
    dash_app.index_string = dash_app.index_string.replace("{%css%}", "{%css%}" + f"<style>{CSS}</style>")

    def page_layout():
        root = inner()
        search = page_search(flask.request.referrer) if flask.has_request_context() else None
        at = next(i for i, c in enumerate(root.children) if getattr(c, "id", None) == "banners")
        root.children.insert(at + 1, section(app, search))
        root["url"].refresh = False  # a launch opens by a new address, in the page
        try:  # the link to the first view, as the link callback would make it
            root["ov-link"].href = view_link(getattr(root["view-state"], "data", None), getattr(root["trace-key"], "data", None),
                                             root["tabs"].value, search, getattr(root["cmp-a"], "value", None),
                                             getattr(root["cmp-b"], "value", None))
        except dash.exceptions.PreventUpdate:
            pass
        return root

    dash_app.layout = page_layout
    dash_app.validation_layout = page_layout()  # what the callbacks are checked against (Dash made it before)
    d = dash_app
    d.clientside_callback(KEYS_SCRIPT, Output("ov-keys", "data"), Input("url", "pathname"))
    d.clientside_callback(CLICK_SCRIPT, Output("url", "search", allow_duplicate=True),
                          Output("ov-progress", "children", allow_duplicate=True), Input("ov-graph", "clickData"),
                          State("ov-graph", "figure"), State("url", "search"), prevent_initial_call=True)
    d.clientside_callback(CLEAR_SCRIPT, Output("ov-progress", "children", allow_duplicate=True),
                          Input("view-state", "data"), Input("banners", "children"), prevent_initial_call=True)
    d.clientside_callback(ADDRESS_SCRIPT, Output("ov-keys", "data", allow_duplicate=True),
                          Input("ov-link", "href"), prevent_initial_call=True)
    d.callback(Output("ov-graph", "figure"), Output("ov-scale", "children"), Output("run-overview", "style"),
               Output("ov-run", "data"), Output("ov-rank", "options"), Output("ov-rank", "value"),
               Input("ov-metric", "value"), Input("ov-rank", "value"),
               Input("trace-key", "data"), State("ov-run", "data"), State("ov-changes", "data"),
               prevent_initial_call=True)(partial(on_figure, app))
    d.callback(Output("url", "search"), Output("ov-progress", "children"), Input("ov-graph", "clickData"),
               *(Input(bid, "n_clicks") for bid, _ in BUTTONS), State("ov-run", "data"), State("trace-key", "data"),
               State("url", "search"), State("ov-metric", "value"), State("ov-rank", "value"),
               prevent_initial_call=True)(partial(on_open, app))
    d.callback(Output("ov-explain", "children"), Input("ov-run", "data"), Input("panel-key", "data"),
               prevent_initial_call=True)(partial(on_verdict, app))  # after the first paint: panel-key
    d.callback(Output("ov-across", "children"), Input("ov-run", "data"), Input("panel-key", "data"),
               prevent_initial_call=True)(partial(on_across, app))
    d.callback(Output("ov-changes", "data"), Output("ov-graph", "figure", allow_duplicate=True),
               Output("ov-changes-says", "children"), Input("ov-run", "data"), Input("panel-key", "data"),
               State("ov-changes", "data"), State("trace-key", "data"),
               prevent_initial_call=True)(partial(on_marks, app))  # after the first paint: panel-key
    d.callback(Output("tabs", "value", allow_duplicate=True), Output("cmp-a", "options", allow_duplicate=True),
               Output("cmp-a", "value", allow_duplicate=True), Output("cmp-b", "options", allow_duplicate=True),
               Output("cmp-b", "value", allow_duplicate=True), Input("ov-graph", "clickData"),
               State("cmp-a", "options"), State("cmp-b", "options"), prevent_initial_call=True)(VCM.on_pick)
    d.callback(Output("ov-link", "href"), Input("view-state", "data"), Input("trace-key", "data"),
               Input("tabs", "value"), State("url", "search"), State("cmp-a", "value"), State("cmp-b", "value"),
               prevent_initial_call=True)(partial(on_link, app))
    return d
