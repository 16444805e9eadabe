"""The Compare tab's A/B verdict: why is B (the trace or run open, by default) slower
than A (a trace file or run picked from the trace directory)? ``timeline explain B
--baseline A``'s answer (``viewer.explained``, the one home: ``timeline.query.explain``)
and two Gantts, B's explained launch (its typical one) above A's typical launch, the
named culprits' chains drawn on both: from the culprit's task to the launch's last
end along the gating edges, in B's launch and in A's."""

from __future__ import annotations

import dash
from dash import html

from timeline.query import explain as QX
from viewer import explained as XD
from viewer import run_source as VRS
from viewer import segments as VSG
from viewer.page import msg
from viewer.panels import explain as XP
from viewer.panels import gantt as VG
from viewer.state import ERROR, guarded

PX = [1000, 300]  # each side's Gantt plot area
CHAINS = 3  # culprits whose chains are drawn
COLOURS = ("rgba(214,39,40,0.85)", "rgba(31,119,180,0.85)", "rgba(44,160,44,0.85)")
NO_FIGURE = {"data": [], "layout": {"height": 40, "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


def drawable(app, source: str, key) -> tuple:
    """``(store name, launches filter)`` that draws launch ``key`` of ``source``: a
    run's launch by its name, a trace file's by its launch number."""
    if XD.is_run(app, source):
        return VRS.launch_name(XD.whole(source), key), None
    n = XD.launch_number(app.store.get(source).trace, str(key))
    return source, None if n is None else [n]


def side_figure(app, source: str, key, culprits: list) -> tuple:
    """``(figure, line)``: launch ``key`` of ``source`` as a Gantt with each culprit's
    chain (``culprits``: ``{rank, stage, task}``) drawn over it; ``line`` says which."""
    name, launches = drawable(app, source, key)
    drawn = VG.gantt(app, VG.GanttQuery(name, "rank", None, launches, None, None, None, px=PX))
    fig = drawn.figure
    item = app.store.get(name)
    drawn_chains = 0
    for k, c in enumerate(culprits[:CHAINS]):
        trace = XP.chain_trace(app, item, {**c, "key": str(key), "culprit": k}, drawn.state, COLOURS[k % len(COLOURS)])
        if trace is not None:
            trace["name"] = f"culprit {k + 1}: {c['says']}"
            fig["data"].append(trace)
            drawn_chains += 1
    return fig, drawn_chains


def culprits_of(doc: dict) -> list:
    """The named (significant) culprits of B's explained launch, as ``{rank, stage,
    task, says}``: the first evidence row of each."""
    out = []
    for e in doc["explained"][:1]:
        for c in e["culprits"]:
            if c["significant"]:
                row = c["evidence"]["rows"][0]
                out.append({"rank": row["rank"], "stage": row["stage"], "task": row["task"], "says": c["says"]})
    return out


def shift_text(rec: dict | None) -> str:
    """B - A of the kernel time with its interval, as ``stats.Shift.says`` words it, from
    the document's ``baseline.shift`` record (its interval at its level, n a side)."""
    if not rec:
        return "B and A do not compare"
    f = lambda x, s: "-inf" if x is None and s < 0 else "+inf" if x is None else f"{x:+.3f}"  # noqa: E731
    sig = "significant" if rec["significant"] else ("not significant" if not rec["reason"] else rec["reason"])
    return (f"B - A = {f(rec['estimate_us'], 0)} µs [{f(rec['low_us'], -1)}, {f(rec['high_us'], 1)}] "
            f"({rec['level']:.0%}, {rec['launches_a']} vs {rec['launches_b']} launches, by {rec['by']}): {sig}")


def shown(name: str) -> str:
    """A source as the tab names it: a segment as ``RUN · steps 20-39 · layers 0-1``."""
    return VSG.label(name) if VSG.is_segment(name) else name


def compare_ab(app, a, b) -> tuple:
    """``(verdict children, B's figure, B's title, A's figure, A's title)`` of the tab's
    A/B question."""
    if not a or not b:
        return msg("pick A (the baseline) to explain why B is slower than it", "info"), NO_FIGURE, "", NO_FIGURE, ""
    doc = XD.document(app, b, QX.Ask(baseline=a), "pick another A")
    key_b = doc["explained"][0]["launch"] if doc["explained"] else XD.typical_of(app, b)
    key_a = XD.typical_of(app, a)
    named = culprits_of(doc)
    out = [html.B("A/B verdict: "), html.Span(doc["verdict"], id="cmp-verdict-text")]
    base = doc.get("baseline") or {}
    if base:
        out.append(html.Div(f"{base.get('matched', '')}; " + shift_text(base.get("shift")), className="status",
                            id="cmp-shift"))
    out += [html.Div(f"culprit {k + 1}: {c['says']}", className="status") for k, c in enumerate(named[:CHAINS])]
    if doc.get("across") and doc["across"].get("culprits"):
        out.append(html.Div(doc["across"]["says"], className="status"))
    fig_b, nb = side_figure(app, b, key_b, named) if key_b is not None else (NO_FIGURE, 0)
    fig_a, na = side_figure(app, a, key_a, named) if key_a is not None else (NO_FIGURE, 0)
    chains = ""
    if named:
        chains = f"; the culprits' chains drawn ({nb} here)" if nb else \
            "; no chain drawn (the trace declares no task graph, or the rows are not by rank)"
    title_b = f"B: {shown(b)} · launch {key_b}" + (" (explained)" if doc["explained"] else " (typical)") + chains
    title_a = f"A: {shown(a)} · typical launch {key_a}" + (f"; the culprits' chains drawn ({na} here)" if na else "")
    return out, fig_b, title_b, fig_a, title_a


@guarded(ERROR, NO_FIGURE, "", NO_FIGURE, "")
def on_ab(app, a, b, tab, _panels=None):
    """The Compare tab's A/B verdict and Gantts, while the tab is shown (after the
    first paint)."""
    if tab != "compare":
        raise dash.exceptions.PreventUpdate
    return compare_ab(app, a, b)


def wire(d, app) -> None:
    """The A/B callback on the Dash app ``d``."""
    from functools import partial

    from dash import Input, Output

    d.callback(Output("cmp-verdict", "children"), Output("cmp-gantt-b", "figure"),
               Output("cmp-gantt-b-title", "children"), Output("cmp-gantt-a", "figure"),
               Output("cmp-gantt-a-title", "children"), Input("cmp-a", "value"), Input("cmp-b", "value"),
               Input("tabs", "value"), Input("panel-key", "data"), prevent_initial_call=True)(partial(on_ab, app))


__all__ = ["CHAINS", "compare_ab", "culprits_of", "drawable", "on_ab", "side_figure", "wire"]
