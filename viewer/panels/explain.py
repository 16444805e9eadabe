"""The Explain tab: ``timeline.query.explain``'s answer (``viewer.explained``) on the
launch shown, the slowest or the p99 launch of the trace or run, against its own
typical launch or against another trace or run (A/B); its culprits as buttons: a
click pins the culprit's task in the pinned-task panel and draws its chain, from it
to the launch's last end along the gating edges, over the Gantt (first opening its
launch when the Gantt does not show it)."""

from __future__ import annotations

import dash
import numpy as np
from dash import ALL, Input, Output, State, html

from timeline.query import explain as QX
from viewer import explained as XD
from viewer import figures as F
from viewer import run_source as VRS
from viewer.client import ViewState
from viewer.page import msg
from viewer.panels import gantt as VG
from viewer.panels import overview as VO
from viewer.state import ERROR, NO, guarded

CHAIN_COLOR = "rgba(214,39,40,0.85)"
WHICH = ("shown", "slowest", "p99")  # what the tab explains: the launch shown, the slowest, the p99 launch
CULPRIT_BUTTONS = 8


def shown_key(app, name: str, launches):
    """``(source, key of the launch shown or None)``: a run's launch, or a trace file's
    one selected launch (or its only one)."""
    parsed = VRS.parse_name(name)
    if parsed is not None:
        return parsed[0], parsed[1]
    tr = app.store.get(name).trace
    shown = list(launches) if launches else tr.launches
    return name, (tr.launch_keys[int(shown[0])] if len(shown) == 1 and int(shown[0]) in tr.launch_keys else None)


def ask_for(which: str, key, against) -> tuple:
    """``(Ask, note)``: what to ask ``explain`` for the tab's choice; ``note`` says when
    the launch shown is not one launch (the slowest is explained instead)."""
    base = against if isinstance(against, str) and against else None
    if which == "p99":
        return QX.Ask(p99=True, baseline=base), None
    if which == "shown" and key is not None:
        return QX.Ask(launches=[key], baseline=base), None
    note = "the Gantt shows several launches: the slowest is explained (select one launch to explain it)" \
        if which == "shown" else None
    return QX.Ask(top=1 if base else None, baseline=base), note


def analysed(app, name: str, launches, which: str, against) -> tuple:
    """``(document, note)`` of the tab's question on the trace or run shown."""
    source, key = shown_key(app, name, launches)
    ask, note = ask_for(which if which in WHICH else "slowest", key, against)
    hint = "pick a trace or run to explain it against (against, above)"
    return XD.document(app, source, ask, hint), note


@guarded(ERROR, None, None)
def on_explain(app, key, tab, panels, which, against):
    """The tab's verdict, culprit buttons and their identities (``explain-pins``); on
    the page's first view, once the panels' key arrives (after the first paint)."""
    if tab != "explain":
        raise dash.exceptions.PreventUpdate
    if not key or not key.get("name"):
        return "No trace.", None, None
    name = key["name"]
    item = app.store.get(name)
    if item.data.n == 0:
        return msg("no intervals: nothing to explain", "info"), None, None
    launches = panels[2] if isinstance(panels, (list, tuple)) and len(panels) == 3 and panels[0] == name else None
    doc, note = analysed(app, name, launches, which, against)
    head = [html.B("verdict: "), html.Span(doc["verdict"], id="explain-verdict-text"),
            html.Div(XD.typical_line(doc), style={"fontSize": "12px", "color": "#555"})]
    if doc.get("baseline"):
        b = doc["baseline"]
        head.append(html.Div(f"against A = {b['source']}: typical {XD.us(b.get('typical_us'))}, noise "
                             f"{XD.us(b.get('noise_us'))}; {b.get('matched', '')}", className="status"))
    if note:
        head.append(msg(note, "info"))
    head += [html.Div(s["says"]) for s in doc.get("allreduce") or []]
    buttons, pins = [], []
    for e in doc["explained"]:
        for c in e["culprits"][:CULPRIT_BUTTONS]:
            save = "" if c["saving_us"] is None else f" · saves {c['saving_us']:g} µs"
            label = f"{'★ ' if c['significant'] else ''}{c['says']}: {c['excess_us']:+g} µs{save}"
            buttons.append(html.Button(label, id={"type": "culprit", "i": len(pins)}, n_clicks=0,
                                       className="culprit", style={"display": "block", "margin": "3px 0"}))
            row = c["evidence"]["rows"][0]
            pins.append({"rank": row["rank"], "stage": row["stage"], "task": row["task"], "key": e["launch"],
                         "culprit": len(pins)})
    if not buttons:
        buttons = [html.Div("no culprit to show")]
    return head, buttons, pins


def _task_index(m, rank: int, launch: int, stage: int, task: int) -> int:
    """The merged task (``edges.Tasks``) of one task, -1 if absent."""
    hit = np.flatnonzero((m.rank == rank) & (m.launch == launch) & (m.task == task) & (m.stage == stage))
    return int(hit[0]) if hit.size else -1


def chain_trace(app, item, pin, vs, color: str = CHAIN_COLOR):
    """The culprit's chain (from its task to its launch's last end along the gating
    edges) in ``item`` as a Gantt line trace over the row layout ``vs`` shows, or None
    (no task graph, rows that are not by rank, the task or launch not there)."""
    from timeline.analysis import edges as E

    tr = item.trace
    launch = XD.launch_number(tr, pin["key"])
    if not tr.spec.graph or vs is None or vs.grouping not in ("rank", "cta") or launch is None \
            or pin["stage"] not in tr.spec.stage_names:
        return None
    g = app.analysis(item, ("edges",), lambda: E.edges(tr))
    t = _task_index(g.tasks, pin["rank"], launch, tr.spec.stage_names.index(pin["stage"]), pin["task"])
    if t < 0:
        return None
    steps = E.path_steps(g, launch)
    at = [k for k, step in enumerate(steps) if step.task == t]
    part = [E.Step(t, -1, None)] + (steps[at[0] + 1:] if at else [])  # from the culprit on; its own hand-off not drawn
    view = app.view(item, vs.grouping, vs.ranks, vs.launches, vs.ctas, vs.stages)
    trace, = F.path_trace(VG.chain_segments(g, view, vs.grouping, [part])) or [None]
    if trace is not None:
        trace.update(name="culprit's chain", line={"color": color, "width": 6},
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


def pinned_table(item, pin):
    """The pinned-task panel of a culprit's task in ``item``, or a message."""
    d, tr = item.data, item.trace
    launch = XD.launch_number(tr, pin["key"])
    stage = tr.spec.stage_names.index(pin["stage"]) if pin["stage"] in tr.spec.stage_names else -1
    idx = np.flatnonzero((d.rank == pin["rank"]) & (d.launch == (-1 if launch is None else launch))
                         & (d.stage == stage) & (d.task == pin["task"]))
    if not idx.size:
        return msg("the culprit's task is not in the loaded intervals")
    return VG.task_table(d, d.task_intervals(int(d.tid[idx[0]])))


@guarded(ERROR, NO, NO, NO, NO)
def on_culprit(app, clicks, key, pins, state, search):
    """A culprit clicked: its task pinned (the task table); its chain drawn on the
    Gantt; when the Gantt does not show its launch, that launch opened first (a run's
    by its address, a trace file's by the Launches filter) and the chain left to
    ``on_view`` (``explain-pin``) once it is drawn."""
    trig = dash.ctx.triggered_id
    if not isinstance(trig, dict) or not pins or not any(clicks) or not key:
        raise dash.exceptions.PreventUpdate
    pin = pins[int(trig["i"])]
    name = key["name"]
    parsed = VRS.parse_name(name)
    if parsed is not None and str(parsed[1]) != pin["key"]:  # another launch of the run: open it
        run = parsed[0]
        other = VRS.launch_name(run, VRS.parse_launch(pin["key"]))
        return NO, NO, NO, {**pin, "name": other}, VO.search_for(run, pin["key"], search)
    item = app.store.get(name)
    table = pinned_table(item, pin)
    vs = ViewState.from_client(state)
    launch = XD.launch_number(item.trace, pin["key"])
    if parsed is None and vs is not None and vs.launches is not None and launch not in vs.launches:
        return table, NO, [launch], {**pin, "name": name}, NO
    return table, _drawn(chain_trace(app, item, pin, vs)), NO, None, NO


@guarded(NO, None, NO)
def on_view(app, state, pin):
    """The Gantt redrawn with a culprit's launch shown: its chain drawn once, its
    task pinned."""
    vs = ViewState.from_client(state)
    if not pin or vs is None or vs.name != pin.get("name"):
        raise dash.exceptions.PreventUpdate
    item = app.store.get(pin["name"])
    return _drawn(chain_trace(app, item, pin, vs)), None, pinned_table(item, pin)


def wire(d, app) -> None:
    """The tab's callbacks on the Dash app ``d``."""
    from functools import partial

    d.callback(Output("explain-verdict", "children"), Output("explain-culprits", "children"),
               Output("explain-pins", "data"), Input("trace-key", "data"), Input("tabs", "value"),
               Input("panel-key", "data"), Input("explain-which", "value"), Input("explain-against", "value"),
               prevent_initial_call=True)(partial(on_explain, app))
    d.callback(Output("details", "children", allow_duplicate=True), Output("explain-chain", "data", allow_duplicate=True),
               Output("launches", "value", allow_duplicate=True), Output("explain-pin", "data"),
               Output("url", "search", allow_duplicate=True),
               Input({"type": "culprit", "i": ALL}, "n_clicks"), State("trace-key", "data"),
               State("explain-pins", "data"), State("view-state", "data"), State("url", "search"),
               prevent_initial_call=True)(partial(on_culprit, app))
    d.callback(Output("explain-chain", "data", allow_duplicate=True), Output("explain-pin", "data", allow_duplicate=True),
               Output("details", "children", allow_duplicate=True),
               Input("view-state", "data"), State("explain-pin", "data"),
               prevent_initial_call=True)(partial(on_view, app))
    d.clientside_callback(REPLACE_CHAIN, Output("gantt", "figure", allow_duplicate=True),
                          Input("explain-chain", "data"), State("gantt", "figure"), prevent_initial_call=True)
