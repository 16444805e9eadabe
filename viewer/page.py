"""The page: its CSS, plotly.js served early, the layout (controls, Gantt, pinned
task, tabs), and the plain-HTML table panels. Nothing here reads a trace."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import re
from pathlib import Path
from typing import NamedTuple

import flask
from dash import dcc, html

from timeline.errors import TimelineError

from viewer import figures as F
from viewer.client import GANTT_PX

TABS = ("report", "idle", "critical", "whatif", "explain", "anomalies", "compare", "chip")


def msg(text: str, kind: str = "error") -> html.Div:
    """A message box; ``kind`` is error, warning, info or synthetic (its CSS class)."""
    return html.Div(text, className=f"msg msg-{kind}")


CSS = """
body { font-family: Inter, Helvetica, Arial, sans-serif; margin: 0; color: #222; }
.top { display: flex; align-items: center; gap: 16px; padding: 8px 14px; background: #1f2d3d; color: #fff; }
.top h1 { font-size: 18px; margin: 0; }
.top .picker { width: 360px; color: #222; }
.info { font-size: 12px; opacity: .85; }
.msg { padding: 8px 14px; margin: 6px 14px; border-radius: 4px; font-weight: 600; }
.msg-error { background: #fde2e1; color: #8a1c17; border: 1px solid #e15759; }
.msg-warning { background: #fff3cd; color: #7a5500; border: 1px solid #edc948; }
.msg-synthetic { background: #ffe8cc; color: #8a4b00; border: 2px dashed #f28e2b; font-size: 15px; letter-spacing: .04em; }
.msg-info { background: #e8f1fa; color: #1f4e79; }
.body { display: flex; gap: 10px; padding: 6px 14px; }
.side { width: 250px; flex: none; font-size: 13px; }
.side label.head { display: block; font-weight: 700; margin: 10px 0 3px; }
.main { flex: 1; min-width: 0; }
.details { width: 260px; flex: none; font-size: 12px; border-left: 1px solid #ddd; padding-left: 10px; }
.details table { border-collapse: collapse; width: 100%; }
.details td { padding: 1px 4px; border-bottom: 1px solid #eee; }
.status { font-size: 12px; color: #555; min-height: 16px; }
.tabs { padding: 0 14px 20px; }
.grid { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
.grid th, .grid td { padding: 2px 6px; border-bottom: 1px solid #e3e3e3; white-space: nowrap; }
.grid th { background: #f3f5f7; position: sticky; top: 0; }
.grid td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid button.sort { background: none; border: 0; padding: 0; font: inherit; font-weight: 700; cursor: pointer; }
.win input { width: 84px; padding: 3px 4px; border: 1px solid #bbb; border-radius: 3px; }
.ask { display: flex; gap: 10px; align-items: center; margin: 8px 0; font-size: 13px; }
.ab { margin: 8px 0; }
"""


PLOTLY_EARLY = (
    "<script>window.Plotly = new Promise(function(ok, no) {{ window._plotlyLoad = [ok, no]; }});</script>"
    '<script async src="{src}" onload="window._plotlyLoad[0]()" '
    "onerror=\"window._plotlyLoad[1](new Error('plotly.js did not load'))\"></script>")


# Dash asks for a component's code chunk only once the layout holding it has arrived: three
# round trips in series before the first paint. Preloaded, they arrive with the page's scripts.
DCC_CHUNKS = ("dropdown", "graph", "slider")
PRELOAD = '<link rel="preload" as="script" href="{prefix}_dash-component-suites/dash/dcc/async-{chunk}.js">'


def preload_links(prefix: str) -> str:
    """The ``<link rel=preload>`` tags of the dcc chunks every page needs (``DCC_CHUNKS``)."""
    return "".join(PRELOAD.format(prefix=prefix, chunk=c) for c in DCC_CHUNKS)


COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"
TRACE_TYPES = ("bar", "heatmap", "image", "scatter", "scattergl")  # every plotly.js trace type the
# dashboard's figures draw: what a plotly.js bundle it serves must hold (tools/plotly_bundle.py builds one)
BUNDLE_HEADER = rb"/\* timeline-view plotly\.js (\S+) traces=([a-z0-9,]+) \*/"  # a bundle's first line


class BundleError(TimelineError):
    """A plotly.js bundle given to the dashboard cannot serve its figures."""


class PlotlyBundle(NamedTuple):
    """The plotly.js the page loads: its version, the trace types it holds (None: all,
    the ``plotly`` package's own bundle) and the bytes served, compile hint first."""

    version: str
    traces: tuple | None
    body: bytes

    @property
    def route(self) -> str:
        """Its URL path below the app's prefix: version and content hash, so that a
        browser may cache it for a year."""
        return f"_timeline-view/plotly-{self.version}-{hashlib.sha256(self.body).hexdigest()[:10]}.min.js"


def plotly_version() -> str:
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


def plotly_bundle(path: Path | None = None) -> PlotlyBundle:
    """The plotly.js to serve: with no ``path`` the bundle the ``plotly`` package
    ships (the one Dash would serve, every trace type); else a bundle of only the
    trace types the dashboard draws (``tools/plotly_bundle.py``: less to load and to
    evaluate before the first paint). Either goes out behind
    V8's explicit compile hint ``//# allFunctionsCalledOnLoad``: plotly.js calls most
    of its functions while it initializes, and with the hint Chromium compiles them
    on a background thread while the file downloads (bench/viewer.py --browser times
    the first paint with both bundles). A given bundle must say it was built for this
    plotly.js version with every type of ``TRACE_TYPES``: else ``BundleError``."""
    if path is None:
        return _package_bundle()
    try:
        body = Path(path).read_bytes()
    except OSError as e:
        raise BundleError(f"--plotly-js {str(path)!r}: cannot read it ({e.strerror}); build it with "
                          "`make plotly-bundle` or leave the option out to serve plotly's own bundle") from None
    m = re.fullmatch(BUNDLE_HEADER, body.split(b"\n", 1)[0])
    if m is None:
        raise BundleError(f"--plotly-js {str(path)!r} is not a bundle built by tools/plotly_bundle.py (its first "
                          "line names no version and trace types): rebuild it with `make plotly-bundle`")
    version, traces = m.group(1).decode(), tuple(m.group(2).decode().split(","))
    missing = sorted(set(TRACE_TYPES) - set(traces))
    if version != plotly_version() or missing:
        why = (f"lacks the trace types {', '.join(missing)}" if missing
               else f"is plotly.js {version}, the plotly package here ships {plotly_version()}")
        raise BundleError(f"--plotly-js {str(path)!r} {why}: rebuild it with `make plotly-bundle`")
    return PlotlyBundle(version, traces, COMPILE_HINT + body)


@functools.lru_cache(maxsize=1)
def _package_bundle() -> PlotlyBundle:
    body = (Path(importlib.util.find_spec("plotly").origin).parent / "package_data" / "plotly.min.js").read_bytes()
    return PlotlyBundle(plotly_version(), None, COMPILE_HINT + body)


def bundle_header(version: str, traces) -> bytes:
    """The first line of a plotly.js bundle of ``traces`` for plotly.js ``version``
    (``BUNDLE_HEADER``), which ``plotly_bundle`` reads back."""
    return f"/* timeline-view plotly.js {version} traces={','.join(sorted(traces))} */\n".encode()


def serve_plotly(bundle: PlotlyBundle):
    """The route of ``bundle``: its URL names version and content, so cached for a year."""
    resp = flask.Response(bundle.body, mimetype="application/javascript")
    resp.headers["Cache-Control"] = "public, max-age=31536000, immutable"
    return resp


def _controls():
    return html.Div(className="side", children=[
        html.Label("Rows", className="head"),
        dcc.RadioItems(id="grouping", value="rank", options=[
            {"label": " rank · launch · CTA · wave", "value": "rank"},
            {"label": " rank · CTA · wave (launches side by side)", "value": "cta"},
            {"label": " hardware placement (XCC → CU / SM)", "value": "placement"},
            {"label": " stage", "value": "stage"}]),
        html.Label("Ranks", className="head"),
        dcc.Dropdown(id="ranks", multi=True, placeholder="all ranks"),
        html.Label("Launches", className="head"),
        dcc.Dropdown(id="launches", multi=True, placeholder="all launches"),
        html.Label("Stages", className="head"),
        dcc.Checklist(id="stages", inputStyle={"marginRight": "4px"}),
        html.Label("Phases", className="head"),
        dcc.Checklist(id="phases", inputStyle={"marginRight": "4px"}),
        html.Label("CTA range", className="head"),
        dcc.RangeSlider(id="ctas", min=0, max=1, step=1, value=[0, 1], allowCross=False,
                        tooltip={"placement": "bottom"}),
        html.Label("Time window (µs)", className="head"),
        html.Div(className="win", children=[
            dcc.Input(id="t0", type="text", inputMode="decimal", debounce=True, placeholder="from",
                      style={"width": "80px"}), " – ",
            dcc.Input(id="t1", type="text", inputMode="decimal", debounce=True, placeholder="to",
                      style={"width": "80px"}),
            html.Button("full", id="reset", n_clicks=0, style={"marginLeft": "4px"})]),
        html.Label("Export the selection", className="head"),
        html.Button("Chrome trace JSON", id="export-chrome", n_clicks=0),
        dcc.Download(id="download"),
        html.Div(id="export-msg"),
        html.Div("PNG: the camera icon of the figure's toolbar.", style={"fontSize": "11px", "color": "#666"}),
    ])


def _tabs():
    return dcc.Tabs(id="tabs", className="tabs", value="report", children=[
        dcc.Tab(label="Stage report", value="report", id="tab-report", children=[
            dcc.Checklist(id="by-launch", options=[{"label": " per rank and launch", "value": "y"}], value=[]),
            html.Div(id="report-msg"),
            html.Div(id="stage-report"), dcc.Store(id="stage-report-data")]),
        dcc.Tab(label="Idle per CTA", value="idle", id="tab-idle", children=[
            html.Div(id="idle-msg"),
            dcc.Graph(id="idle-graph", config={"displaylogo": False}),
            html.Div(id="idle-table"), dcc.Store(id="idle-table-data"),
            html.B("The largest gaps between a wave's tasks"),
            html.Div(id="gap-table"), dcc.Store(id="gap-table-data")]),
        dcc.Tab(label="Critical path", value="critical", id="tab-critical", children=[
            html.Div(id="critical-msg"),
            html.Div(id="critical-table"), dcc.Store(id="critical-table-data")]),
        dcc.Tab(label="What if", value="whatif", id="tab-whatif", children=[
            dcc.Input(id="whatif-scales", type="text", debounce=True, style={"width": "420px", "margin": "8px 0"},
                      placeholder="norm.compute=0.5, up=1.2, down.compute=+1000"),
            html.Div(id="whatif-msg"),
            dcc.Graph(id="whatif-graph", config={"displaylogo": False}),
            html.Div(id="whatif-table"), dcc.Store(id="whatif-table-data")]),
        dcc.Tab(label="Explain", value="explain", id="tab-explain", children=[  # viewer.panels.explain
            html.Div(className="ask", children=[
                html.Span("explain"),
                dcc.RadioItems(id="explain-which", value="slowest", inline=True, options=[
                    {"label": " the launch shown ", "value": "shown"},
                    {"label": " the slowest launch ", "value": "slowest"},
                    {"label": " the p99 launch ", "value": "p99"}]),
                html.Span("against"),
                dcc.Dropdown(id="explain-against", placeholder="its own typical launch (or pick a trace or run: A/B)",
                             style={"width": "380px"})]),
            html.Div(id="explain-verdict", style={"margin": "8px 0"}), html.Div(id="explain-culprits"),
            dcc.Store(id="explain-pins"), dcc.Store(id="explain-pin"),
            dcc.Store(id="explain-chain")]),
        dcc.Tab(label="Anomalies", value="anomalies", id="tab-anomalies", children=[html.Div(id="anomalies")]),
        dcc.Tab(label="Compare", value="compare", id="tab-compare", children=[  # viewer.panels.abcompare
            html.Div(style={"display": "flex", "gap": "12px", "margin": "8px 0"}, children=[
                html.Div([html.Label("A (the baseline: before)"),
                          dcc.Dropdown(id="cmp-a", placeholder="a trace or run")], style={"width": "320px"}),
                html.Div([html.Label("B (after: the one open)"), dcc.Dropdown(id="cmp-b")], style={"width": "320px"})]),
            html.Div(id="cmp-verdict", className="ab"),
            html.Div(id="cmp-gantt-b-title", className="status"),
            dcc.Graph(id="cmp-gantt-b", config={"displaylogo": False}),
            html.Div(id="cmp-gantt-a-title", className="status"),
            dcc.Graph(id="cmp-gantt-a", config={"displaylogo": False}),
            html.B("Stage spans, A and B"),
            dcc.RadioItems(id="cmp-scope", value="launch", inline=True, options=[
                {"label": " a typical launch (median over launches) ", "value": "launch"},
                {"label": " each trace whole", "value": "trace"}]),
            html.Div(id="cmp-msg"),
            dcc.Graph(id="cmp-graph", config={"displaylogo": False}),
            html.Div(id="cmp-table"), dcc.Store(id="cmp-table-data")]),
        dcc.Tab(label="Chip", value="chip", id="tab-chip", children=[  # viewer.panels.chipmap
            html.Div(id="chip-says", className="ab"), html.Div(id="chip-linked", className="status"),
            dcc.Graph(id="chip-graph", config={"displaylogo": False}), dcc.Store(id="chip-launch")]),
    ])


def layout(first: dict | None = None):
    """The page; ``first`` (``App.first_view``) fills in its first view, so that the
    browser draws the Gantt from the layout response, without waiting for the trace
    and Gantt callbacks: the page's search string it was made for goes to the
    ``page-search`` store, the trace callback skips its initial call while the
    address still says the same. The panels below wait: their key goes to
    ``panel-first``, which ``wiring.PAINTED_SCRIPT`` hands on once the Gantt is
    painted, so that their requests and tables do not hold up the first paint."""
    root = html.Div([
        dcc.Location(id="url"),
        dcc.Store(id="page-search", data=None if first is None else first["search"]),
        dcc.Store(id="trace-key"),
        dcc.Store(id="view-state"),
        dcc.Store(id="panel-key"),
        dcc.Store(id="panel-first"),  # the first view's panel key, moved to panel-key once the Gantt is painted
        dcc.Store(id="zoom"),
        dcc.Store(id="px"),
        html.Div(className="top", children=[
            html.H1("timeline-view"),
            html.Div(className="picker", children=dcc.Dropdown(id="trace-select", clearable=False)),
            html.Div(id="trace-info", className="info")]),
        html.Div(id="banners"),
        html.Div(className="body", children=[
            _controls(),
            html.Div(className="main", children=[
                html.Div(id="gantt-status", className="status"),
                dcc.Graph(id="gantt", style={"height": f"{F.figure_height(GANTT_PX[1])}px"}, config={
                    "displaylogo": False, "scrollZoom": True,
                    "toImageButtonOptions": {"format": "png", "filename": "timeline", "scale": 2}})]),
            html.Div(className="details", children=[
                html.B("Pinned task"), html.Div(id="details", children="Click a bar to pin its task here.")])]),
        _tabs(),
    ])
    for (cid, prop), value in ((first or {}).get("props") or {}).items():
        setattr(root["panel-first" if (cid, prop) == ("panel-key", "data") else cid], prop, value)
    return root


def table_records(table, digits: int = 3):
    """An Arrow table as ``columns`` (``name``, ``id``, ``type``) and row dicts
    (floats rounded, NaN as None): what ``grid`` draws."""
    cols = [{"name": c, "id": c, "type": "numeric" if table.schema.field(c).type != "string" else "text"}
            for c in table.column_names]
    rows = table.to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float):
                r[k] = None if math.isnan(v) else round(v, digits)
    return cols, rows


TABLE_ROWS = 400  # rows a table panel draws (the rest: a note)
TABLES = ("stage-report", "idle-table", "gap-table", "critical-table", "whatif-table", "cmp-table")  # the sortable tables


def sort_rows(cols: list, rows: list, sort) -> list:
    """``rows`` sorted by ``sort = [column id, descending]`` (None: as they are);
    empty cells (None) last either way. Sorting is stable."""
    if not sort or not rows:
        return rows
    key, desc = sort[0], bool(sort[1])
    have = [r for r in rows if r.get(key) is not None]
    return sorted(have, key=lambda r: r[key], reverse=desc) + [r for r in rows if r.get(key) is None]


def grid(table_id: str, cols: list, rows: list, sort=None) -> html.Div:
    """A table panel as plain HTML (no DataTable: its 630 kB of JavaScript would
    load with the first view): the rows sorted by ``sort`` (``sort_rows``), at most
    ``TABLE_ROWS`` of them, each column header a button that sorts by it (the
    ``{"type": "sort", "table": table_id, "col": i}`` ids of ``build``'s sort callback)."""
    if not cols:
        return html.Div()
    shown = sort_rows(cols, rows, sort)[:TABLE_ROWS]
    num = [c.get("type") == "numeric" for c in cols]
    head = []
    for i, c in enumerate(cols):
        arrow = (" ▼" if sort[1] else " ▲") if sort and sort[0] == c["id"] else ""
        head.append(html.Th(html.Button(c["name"] + arrow, id={"type": "sort", "table": table_id, "col": i},
                                        className="sort", title=f"sort by {c['name']}")))
    body = [html.Tr([html.Td("" if r.get(c["id"]) is None else str(r[c["id"]]), className="num" if n else None)
                     for c, n in zip(cols, num)]) for r in shown]
    out = [html.Table([html.Thead(html.Tr(head)), html.Tbody(body)], className="grid")]
    if len(rows) > len(shown):
        out.append(html.Div(f"{len(shown)} of {len(rows)} rows shown (sort to see others first)", className="status"))
    return html.Div(out, style={"overflowX": "auto"})
