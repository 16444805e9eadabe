"""The run overview's change marks: ``timeline changes RUN``'s change points (the one
home: ``timeline.query.changes``, asked after the first paint: the search reads the
run's summaries, seconds on a large run) drawn on the overview's step axis, each a
dashed line before its first step labelled with its size (the shift as a percentage
of the kernel time, with its interval) and its culprit, and a ▼ marker one clicks to
open the Compare tab on its two segments (``viewer.segments``: A the steps before,
B the steps after, over the layers it touches); each drift a shaded span from its
start, labelled with its shift.

``marks`` is what the page keeps (``ov-changes``): the shapes, annotations and the
marker trace ``apply`` adds to any overview figure of the run, so that a new metric
or the launch shown keeps them."""

from __future__ import annotations

import dash
from dash import Patch

from timeline.query import changes as QCH
from viewer import explained as XD
from viewer import run_grid as VRG
from viewer import segments as VSG
from viewer.state import NO, guarded, lru_get

COLOUR = {"slower": "#c0392b", "faster": "#1e8449"}
DRIFT = "rgba(31, 78, 121, 0.14)"
TOP = 46  # the overview's top margin with marks: room for their labels
NAME = "change points"  # the marker trace's name (the click script and the server tell it by this)


def document(app, run: str) -> dict:
    """``timeline changes RUN``'s document (``timeline.changes/1``) of the page's run,
    kept per run and modification time; every server path replaced by the run's name."""
    path = XD.path_of(app, run)
    key = ("changes", run, path.stat().st_mtime_ns)

    def make():
        return XD.scrub(QCH.changes(XD.source_of(app, run), source_text=run), {str(path): run})

    return lru_get(app.docs, app.docs_lock, key, make, XD.DOCS)


def column(ov: VRG.RunOverview, step: int) -> float | None:
    """The drawn column of ``step`` on the overview's x axis (its index; a merged column's),
    None where the grid has no steps or not that one."""
    if ov.grid.form != VRG.HEADED:
        return None
    xs = [int(x) for x in ov.grid.xs]
    at = next((i for i, x in enumerate(xs) if x >= step), None)
    return None if at is None else at // VRG.columns(ov)


def size_text(cp: dict) -> str:
    """A change point's size: ``+2.91% [2.60, 3.19]`` of the kernel time (its interval)."""
    p = cp.get("shift_pct") or {}
    if p.get("estimate") is None:
        return cp.get("direction", "")
    f = lambda v: "?" if v is None else f"{v:.2f}"  # noqa: E731
    return f"{p['estimate']:+.2f}% [{f(p.get('low'))}, {f(p.get('high'))}]"


def segments_of(run: str, cp: dict) -> tuple:
    """``(A, B)``: the segment before a change point and the one after, over its layers."""
    return (VSG.name(run, cp["before"]["steps"], cp.get("layers")),
            VSG.name(run, cp["after"]["steps"], cp.get("layers")))


def _label(cp: dict) -> str:
    """A change point's label on the axis: its step, size and culprit (when named)."""
    culprit = (cp.get("culprit") or {}).get("says")
    return f"step {cp['step']}: {size_text(cp)}" + (f"<br>{culprit}" if culprit else "")


def _drift(ov, d: dict, shapes: list, notes: list) -> None:
    """A drift's shaded span (its start to the last step) and its label."""
    c0, c1 = column(ov, d["start_step"]), len(VRG.column_labels(ov, VRG.columns(ov))) - 1
    if c0 is None:
        return
    shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": c0 - 0.5, "x1": c1 + 0.5, "y0": 0, "y1": 1,
                   "fillcolor": DRIFT, "line": {"width": 0}, "layer": "above", "name": "drift"})
    p = d.get("shift_pct") or {}
    size = "" if p.get("estimate") is None else f": {p['estimate']:+.2f}% [{p['low']:.2f}, {p['high']:.2f}]"
    notes.append({"xref": "x", "yref": "paper", "x": c0 - 0.5, "y": 1, "yanchor": "bottom", "xanchor": "left",
                  "showarrow": False, "text": f"drift from step {d['start_step']}{size}",
                  "font": {"size": 11, "color": "#1f4e79"}, "name": "drift"})


def marks(ov: VRG.RunOverview, doc: dict, run: str) -> dict:
    """``{shapes, annotations, trace, says, points}``: the overview's marks of the
    change document ``doc`` (``points``: each drawn change point's step, size and
    segments, in the marker trace's order)."""
    shapes, notes, xs, custom, hover, colours, points = [], [], [], [], [], [], []
    labels = VRG.column_labels(ov, VRG.columns(ov))
    for cp in doc.get("change_points") or []:
        c = column(ov, cp["step"])
        if c is None:
            continue
        col = COLOUR.get(cp.get("direction"), "#333")
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": c - 0.5, "x1": c - 0.5, "y0": 0, "y1": 1,
                       "line": {"color": col, "width": 2, "dash": "dash"}, "name": "change"})
        notes.append({"xref": "x", "yref": "paper", "x": c - 0.5, "y": 1, "yanchor": "bottom", "showarrow": False,
                      "text": _label(cp), "font": {"size": 11, "color": col}, "name": "change"})
        a, b = segments_of(run, cp)
        xs.append(labels[c])
        custom.append([a, b])
        colours.append(col)
        hover.append(f"{_label(cp)}<br>click: compare steps {cp['after']['steps'][0]}-"
                     f"{cp['after']['steps'][1]} (B) with {cp['before']['steps'][0]}-{cp['before']['steps'][1]} (A)")
        points.append({"step": cp["step"], "size": size_text(cp), "a": a, "b": b})
    for d in doc.get("drifts") or []:
        _drift(ov, d, shapes, notes)
    top = ov.grid.ys[-1] if ov.grid.ys else None
    trace = {"type": "scatter", "mode": "markers", "x": xs, "y": [top] * len(xs), "customdata": custom,
             "name": NAME, "showlegend": False, "hovertemplate": [h.replace("%{", "% {") + "<extra></extra>"
                                                                   for h in hover],
             "marker": {"symbol": "triangle-down", "size": 15, "color": colours, "line": {"color": "#fff", "width": 1}}}
    return {"shapes": shapes, "annotations": notes, "trace": trace if xs else None, "says": doc.get("says", ""),
            "points": points}


def apply(fig: dict, m: dict | None) -> dict:
    """``fig`` (an overview figure) with the marks ``m`` added (none: as it is)."""
    if not m:
        return fig
    lay = fig.setdefault("layout", {})
    lay["shapes"] = list(lay.get("shapes") or []) + m["shapes"]
    lay["annotations"] = list(lay.get("annotations") or []) + m["annotations"]
    if m["shapes"]:
        lay.setdefault("margin", {})["t"] = TOP
    if m["trace"]:
        fig["data"] = list(fig.get("data") or []) + [m["trace"]]
    return fig


def patch(m: dict, selection: list) -> Patch:
    """The ``Patch`` that adds the marks to the figure the browser holds (its outline
    ``selection`` kept)."""
    p = Patch()
    p["layout"]["shapes"] = selection + m["shapes"]
    p["layout"]["annotations"] = m["annotations"]
    if m["shapes"]:
        p["layout"]["margin"]["t"] = TOP
    if m["trace"]:
        p["data"].append(m["trace"])
    return p


def picked(click) -> tuple | None:
    """``(A, B)`` of the change mark a click hit, None for any other point."""
    pts = click.get("points") if isinstance(click, dict) else None
    p = pts[0] if isinstance(pts, list) and pts and isinstance(pts[0], dict) else {}
    cd = p.get("customdata")
    if isinstance(cd, list) and len(cd) == 2 and all(VSG.is_segment(x) for x in cd):
        return cd[0], cd[1]
    return None


@guarded(NO, NO, NO, NO, NO)
def on_pick(click, opts_a, opts_b):
    """A click on a change mark: the Compare tab with A the segment before and B the
    segment after (each added to its dropdown's options)."""
    ab = picked(click)
    if ab is None:
        raise dash.exceptions.PreventUpdate
    a, b = ab
    add = lambda opts, v: [o for o in (opts or []) if not VSG.is_segment(o.get("value"))] + VSG.options([v])  # noqa: E731
    return "compare", add(opts_a, a), a, add(opts_b, b), b


__all__ = ["NAME", "apply", "column", "document", "marks", "on_pick", "patch", "picked", "segments_of", "size_text"]
