"""The Explain tab: ``timeline explain``'s verdict on the trace's slowest launch
(against the median launch), its culprits as buttons; a click on one pins the
culprit's task in the pinned-task panel and draws its chain, from it to the
launch's last end along the gating edges, over the Gantt."""

from __future__ import annotations

import dash
import numpy as np
from dash import ALL, Input, Output, State, html

from viewer import figures as F
from viewer.client import ViewState
from viewer.page import msg
from viewer.panels import gantt as VG
from viewer.state import ERROR, NO, guarded

MIN_LAUNCHES = 3  # fewer give no typical launch (explain_commands says the same)
CHAIN_COLOR = "rgba(214,39,40,0.85)"


def analysed(app, item):
    """``(document, explained)`` of the trace's slowest launch, cached per trace."""
    from timeline.analysis import explain as X
    from timeline.analysis import explain_report as XR

    def make():
        tr = item.trace
        launches, kernel = X.kernel_times(tr)
        typ = X.typical(tr, source=f"median of {len(tr.launches)} launches") \
            if len(tr.launches) >= MIN_LAUNCHES else None
        explained = [X.explain_launch(tr, int(launches[int(np.argmax(kernel))]), typ, own=True)] \
            if typ is not None else []
        skews = X.allreduce_skew(tr) if tr.spec.graph else []
        return XR.document(tr, item.name, f"timeline explain {item.name}", (launches, kernel), explained, skews,
                           typ), explained

    return app.analysis(item, ("explain",), make)


@guarded(ERROR, None, None)
def on_explain(app, key, tab, _panels=None):
    """The tab's verdict, culprit buttons and their identities (``explain-pins``); on
    the page's first view, once the panels' key arrives (after the first paint)."""
    if tab != "explain":
        raise dash.exceptions.PreventUpdate
    if not key or not key.get("name"):
        return "No trace.", None, None
    item = app.store.get(key["name"])
    if item.data.n == 0:
        return msg("no intervals: nothing to explain", "info"), None, None
    doc, _ = analysed(app, item)
    head = [html.B("verdict: "), html.Span(doc["verdict"], id="explain-verdict-text"),
            html.Div(f"{doc['method']}; typical {doc['typical']['kernel_us']:g} µs ({doc['typical']['from']}), "
                     f"noise {doc['typical']['noise_us']:g} µs", style={"fontSize": "12px", "color": "#555"})]
    head += [html.Div(s["says"]) for s in doc["allreduce"]]
    buttons, pins = [], []
    for e in doc["explained"]:
        for k, c in enumerate(e["culprits"][:8]):
            save = "" if c["saving_us"] is None else f" · saves {c['saving_us']:g} µs"
            label = f"{'★ ' if c['significant'] else ''}{c['says']}: {c['excess_us']:+g} µs{save}"
            buttons.append(html.Button(label, id={"type": "culprit", "i": len(pins)}, n_clicks=0,
                                       className="culprit", style={"display": "block", "margin": "3px 0"}))
            pins.append({**c["evidence"]["rows"][0], "chain_launch": e["launch"], "culprit": len(pins)})
    if not buttons:
        buttons = [html.Div("no culprit to show")]
    return head, buttons, pins


def _task_index(m, pin) -> int:
    """The merged task (``edges.Tasks``) of a pinned culprit's first row, -1 if absent."""
    hit = np.flatnonzero((m.rank == pin["rank"]) & (m.launch == pin["launch"]) & (m.task == pin["task"])
                         & (m.stage == pin["stage_index"]))
    return int(hit[0]) if hit.size else -1


def _chain_trace(app, item, pin, vs):
    """The culprit's chain (from its task to its launch's last end along the gating
    edges) as a Gantt line trace over the row layout ``vs`` shows, or None."""
    from timeline.analysis import edges as E

    tr = item.trace
    if not tr.spec.graph or vs is None or vs.grouping not in ("rank", "cta"):
        return None
    g = app.analysis(item, ("edges",), lambda: E.edges(tr))
    t = _task_index(g.tasks, {**pin, "stage_index": tr.spec.stage_names.index(pin["stage"])})
    steps = E.path_steps(g, pin["chain_launch"])
    at = [k for k, step in enumerate(steps) if step.task == t]
    part = [E.Step(t, -1, None)] + (steps[at[0] + 1:] if at else [])  # from the culprit on; its own hand-off not drawn
    view = app.view(item, vs.grouping, vs.ranks, vs.launches, vs.ctas, vs.stages)
    trace, = F.path_trace(VG.chain_segments(g, view, vs.grouping, [part])) or [None]
    if trace is not None:
        trace.update(name="culprit's chain", line={"color": CHAIN_COLOR, "width": 6},
                     meta={"kind": "culprit-chain", "segments": trace["meta"]["segments"], "tasks": len(part),
                           "culprit": pin.get("culprit")})
    return trace


def _drawn(trace):
    """``trace`` for ``explain-chain`` (NO for None): the browser puts it on the Gantt
    in place of the chain drawn before (``REPLACE_CHAIN``), so a second click shows one
    chain, not two; the figure never travels back to the server for it."""
    return NO if trace is None else trace


# the Gantt's figure with its culprit chains (meta.kind 'culprit-chain') replaced by the new one
REPLACE_CHAIN = """function(chain, fig) {
    if (!chain || !fig) { return window.dash_clientside.no_update; }
    var data = (fig.data || []).filter(function(t) { return !(t.meta && t.meta.kind === 'culprit-chain'); });
    return Object.assign({}, fig, {data: data.concat([chain])});
}"""


@guarded(ERROR, NO, NO, NO)
def on_culprit(app, clicks, key, pins, state):
    """A culprit clicked: its task pinned (the task table); its chain drawn on the
    Gantt, or, when the Gantt does not show its launch, that launch selected and the
    chain left to ``on_view`` (``explain-pin``) once it is drawn."""
    trig = dash.ctx.triggered_id
    if not isinstance(trig, dict) or not pins or not any(clicks) or not key:
        raise dash.exceptions.PreventUpdate
    pin = pins[int(trig["i"])]
    item = app.store.get(key["name"])
    d, tr = item.data, item.trace
    idx = np.flatnonzero((d.rank == pin["rank"]) & (d.launch == pin["launch"])
                         & (d.stage == tr.spec.stage_names.index(pin["stage"])) & (d.task == pin["task"]))
    if not idx.size:
        return msg("the culprit's task is not in the loaded intervals"), NO, NO, NO
    table = VG.task_table(d, d.task_intervals(int(d.tid[idx[0]])))
    vs = ViewState.from_client(state)
    if vs is not None and vs.launches is not None and pin["chain_launch"] not in vs.launches:
        return table, NO, [pin["chain_launch"]], {**pin, "name": key["name"]}
    return table, _drawn(_chain_trace(app, item, pin, vs)), NO, None


@guarded(NO, None)
def on_view(app, state, pin):
    """The Gantt redrawn with a culprit's launch selected: its chain drawn once."""
    vs = ViewState.from_client(state)
    if not pin or vs is None or vs.name != pin.get("name"):
        raise dash.exceptions.PreventUpdate
    return _drawn(_chain_trace(app, app.store.get(pin["name"]), pin, vs)), None


def wire(d, app) -> None:
    """The tab's two callbacks on the Dash app ``d``."""
    from functools import partial

    d.callback(Output("explain-verdict", "children"), Output("explain-culprits", "children"),
               Output("explain-pins", "data"), Input("trace-key", "data"), Input("tabs", "value"),
               Input("panel-key", "data"), prevent_initial_call=True)(partial(on_explain, app))
    d.callback(Output("details", "children", allow_duplicate=True), Output("explain-chain", "data", allow_duplicate=True),
               Output("launches", "value", allow_duplicate=True), Output("explain-pin", "data"),
               Input({"type": "culprit", "i": ALL}, "n_clicks"), State("trace-key", "data"),
               State("explain-pins", "data"), State("view-state", "data"),
               prevent_initial_call=True)(partial(on_culprit, app))
    d.callback(Output("explain-chain", "data", allow_duplicate=True), Output("explain-pin", "data", allow_duplicate=True),
               Input("view-state", "data"), State("explain-pin", "data"),
               prevent_initial_call=True)(partial(on_view, app))
    d.clientside_callback(REPLACE_CHAIN, Output("gantt", "figure", allow_duplicate=True),
                          Input("explain-chain", "data"), State("gantt", "figure"), prevent_initial_call=True)
