"""``timeline-view``: the Dash dashboard of per-CTA, per-wave Gantt timelines.

    timeline-view [TRACE ...] [--host 127.0.0.1] [--port 8050] [--trace-dir DIR] [--debug]

It reads trace files (Arrow IPC / Parquet, ``timeline.load``) and nothing else.
With no TRACE it opens ``DEFAULT_TRACE`` from the trace directory (the bundled
real trace in ``traces/``), or the first trace file there while that file is not
in the repository. The page can open any trace file inside ``--trace-dir`` or
named on the command line (``?trace=NAME`` or the picker), never a file outside
them (``viewer.sources``). Dash debug mode (the in-page traceback) is off unless
``--debug``; a failing callback shows a one-line message in the page and logs
its traceback on the server.

The page: a Gantt of rows = CTA x wave, grouped by rank and launch, hardware
placement or stage (``viewer.model``), drawn as WebGL bars or, with more
intervals in view than ``figures.BAR_LIMIT``, as a server-rendered occupancy
image that turns into bars as one zooms in (``viewer.figures``); the stage
concurrency chart on the same time axis; the stage report, idle time per CTA
and anomaly report of ``timeline.analysis``; a compare tab; Chrome-trace export.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
import math
import sys
import threading
import urllib.parse
from collections import OrderedDict
from pathlib import Path

import dash
import flask
import numpy as np
import pyarrow as pa
from dash import ALL, Input, Output, State, dcc, html

from timeline import analysis as A
from timeline import schema as S
from viewer import figures as F
from viewer import model as M
from viewer.sources import Catalog, SourceError, Store, scan

DEFAULT_TRACE_DIR = Path(__file__).resolve().parent.parent / "traces"
DEFAULT_TRACE = "h200_mono_demo.arrow"  # the bundled real trace (traces/), opened with no TRACE
FIRST_VIEW_CACHE = 8  # first views (App.first_view) kept, by address
VIEW_CACHE = 4  # row layouts (model.View) kept per trace
ANALYSIS_CACHE = 16  # analysis tables kept per trace
CONC_BINS = 4096  # bins of the full-range stage concurrency, sliced while zooming
TABS = ("report", "idle", "anomalies", "compare")
EXPORT_LIMIT = 250_000  # intervals a Chrome-trace download may hold (about 55 MB of JSON)
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # hosts served uncompressed (see ``build``)
GANTT_PX = (1000, 560)  # default plot-area width x height in pixels (the raster's size)

log = logging.getLogger("timeline-view")

# what the trace callback and the Gantt callback set, in their return order; the page's
# initial layout carries the same values for its first view (``App.first_view``)
TRACE_OUTPUTS = (
    ("trace-select", "value"), ("trace-select", "options"), ("trace-key", "data"), ("trace-info", "children"),
    ("banners", "children"), ("ranks", "options"), ("ranks", "value"), ("launches", "options"),
    ("launches", "value"), ("stages", "options"), ("stages", "value"), ("phases", "options"),
    ("phases", "value"), ("ctas", "max"), ("ctas", "value"), ("ctas", "marks"), ("anomalies", "children"),
    ("cmp-a", "options"), ("cmp-b", "options"), ("cmp-a", "value"), ("grouping", "value"), ("cmp-b", "value"),
    ("tabs", "value"))
GANTT_OUTPUTS = (("gantt", "figure"), ("view-state", "data"), ("t0", "value"), ("t1", "value"),
                 ("gantt-status", "children"), ("panel-key", "data"))



# -- what a client may send ------------------------------------------------------------------
# Every size, count and range a request carries goes through these before any work:
# a client can ask for anything, the server draws at most this (bench/viewer_hostile.py
# measures the memory a request at these limits costs).
PX_LIMITS = ((400, 3000), (200, 1200))  # plot-area width, height in px (the raster's size); the page asks
# for its plot's width up to 3000 and a height of 560
MAX_LIST = 4096  # values in one filter list (ranks, launches, stages, phases)
STATE_KEYS = {"name": str, "fkey": str, "grouping": str, "t0": int, "t1": int, "r0": int, "r1": int,
              "panels": list, "ranks": list, "launches": list, "ctas": list, "stages": list}


def clamp_px(px) -> tuple:
    """``(width, height)`` of the plot area a request asks for, each clamped to
    ``PX_LIMITS``; anything that is not two numbers gives the default size."""
    try:
        w, h = (int(float(v)) for v in px)
    except (TypeError, ValueError, OverflowError):
        return GANTT_PX
    (w0, w1), (h0, h1) = PX_LIMITS
    return min(max(w, w0), w1), min(max(h, h0), h1)


def client_list(values, what: str):
    """A filter list from a request as ints (None stays None): refused with a message
    when it is not a list of integers or longer than ``MAX_LIST``."""
    if values is None:
        return None
    if not isinstance(values, (list, tuple)) or len(values) > MAX_LIST:
        raise ValueError(f"the {what} filter must be a list of at most {MAX_LIST} values")
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"the {what} filter holds something that is not an integer") from None


def client_state(state) -> dict:
    """The view state a request carries back (``view-state``), keeping only the keys
    the server wrote with the types it wrote them (ints within the time axis's
    range): anything else is as if there were no state."""
    if not isinstance(state, dict):
        return {}
    out = {}
    for k, v in state.items():
        want = STATE_KEYS.get(k)
        if want is None or v is None:
            continue
        if not isinstance(v, want) or isinstance(v, bool) or (want is int and abs(v) > S.MAX_SPAN_NS):
            return {}
        if want is list and len(v) > MAX_LIST:
            return {}
        out[k] = v
    return out


def finite_us(v, what: str) -> float:
    """A time in µs from a request: a finite number within the time axis, else a
    ``ValueError`` naming it."""
    x = float(v)
    if not math.isfinite(x) or abs(x) * 1e3 > S.MAX_SPAN_NS:
        raise ValueError(f"the {what} is not a time on this trace's axis: {v!r}")
    return x


# -- helpers ------------------------------------------------------------------------------
def _msg(text: str, kind: str = "error") -> html.Div:
    """A message box; ``kind`` is error, warning, info or synthetic (its CSS class)."""
    return html.Div(text, className=f"msg msg-{kind}")


def guarded(*fallback):
    """Wrap a callback: an exception is logged with its traceback on the server and
    the callback returns ``fallback`` with the message put wherever a fallback item
    is the ``_ERROR`` placeholder, so the browser never sees a traceback."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args):
            try:
                return fn(*args)
            except dash.exceptions.PreventUpdate:
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes a message
                log.exception("callback %s failed", fn.__name__)
                text = str(e) if isinstance(e, (SourceError, M.ViewError, ValueError)) else \
                    f"{type(e).__name__}: {e}"
                out = tuple(_msg(f"{fn.__name__.replace('_', ' ')}: {text}") if f is _ERROR else f
                            for f in fallback)
                return out if len(out) > 1 else out[0]

        return inner

    return wrap


_ERROR = object()
NO = dash.no_update


def _lru_get(cache, lock, key, make, size):
    """``cache[key]``, made by ``make()`` on a miss; at most ``size`` entries, least
    recently used first out. ``lock`` guards the dict (callbacks run in threads);
    ``make`` runs outside it, so two threads may both make a value: the last wins."""
    with lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    value = make()
    with lock:
        cache[key] = value
        while len(cache) > size:
            cache.popitem(last=False)
    return value


def _opt_list(values):
    return None if values is None else tuple(sorted(int(v) for v in values))


def extent(data: M.TraceData, view: M.View) -> tuple:
    """First start and last end (ns) of the intervals in a row layout: the time
    window that shows all of a selection."""
    if view.n == 0:
        return data.t_min, max(data.t_max, data.t_min + 1)
    return view.t_first, max(view.t_last, view.t_first + 1)


def _us_to_ns(text, what: str, current: int) -> int:
    """A time-window box (µs, as typed) to ns; empty keeps ``current``."""
    if text is None or str(text).strip() == "":
        return current
    try:
        return int(round(finite_us(str(text)[:64].replace(",", ""), f"time window's {what!r} box") * 1e3))
    except ValueError:
        raise ValueError(f"the time window's {what!r} box holds {str(text)[:64]!r}, not a number of µs "
                         "on this trace's axis") from None


def normalize(data: M.TraceData, ranks, launches, stages, phases, ctas):
    """The filters as cache keys: sorted tuples, ``None`` for "all" (an empty rank or
    launch choice, every stage, every phase, the full CTA range), so that the same
    selection always finds the same cached row layout and analysis tables."""
    def norm(values, present):
        v = _opt_list(values) if values else None
        return None if v is None or set(v) >= set(present) else v

    ranks, launches, stages, phases, ctas = (client_list(v, what) for v, what in (
        (ranks, "rank"), (launches, "launch"), (stages, "stage"), (phases, "phase"), (ctas, "CTA")))
    ranks = norm(ranks, data.ranks)
    launches = norm(launches, data.launches)
    stages = None if stages is None else _opt_list(stages)
    if stages is not None and set(stages) >= set(range(len(data.stage_names))):
        stages = None
    phases = None if phases is None else _opt_list(phases)
    if phases is not None and set(phases) >= set(range(len(data.interval_names))):
        phases = None
    if ctas:
        lo, hi = int(min(ctas)), int(max(ctas))
        ctas = None if data.n == 0 or (lo <= int(data.cta.min()) and hi >= int(data.cta.max())) else (lo, hi)
    else:
        ctas = None
    return ranks, launches, stages, phases, ctas


def _table_records(table, digits: int = 3):
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
TABLES = ("stage-report", "idle-table", "cmp-table")  # the sortable table panels


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


# -- layout ---------------------------------------------------------------------------------
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
"""


PLOTLY_EARLY = (
    "<script>window.Plotly = new Promise(function(ok, no) {{ window._plotlyLoad = [ok, no]; }});</script>"
    '<script async src="{src}" onload="window._plotlyLoad[0]()" '
    "onerror=\"window._plotlyLoad[1](new Error('plotly.js did not load'))\"></script>")


COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"


def plotly_version() -> str:
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


@functools.lru_cache(maxsize=1)
def plotly_js() -> bytes:
    """The plotly.js bundle that the ``plotly`` package ships (the one Dash would
    serve), behind V8's explicit compile hint ``//# allFunctionsCalledOnLoad``:
    plotly.js calls most of its functions while it initializes, and with the hint
    Chromium compiles them on a background thread while the file downloads instead
    of one by one on the main thread as they are first called (measured here: 0.6 s
    of main-thread evaluation instead of 1.0 s). Other browsers read a comment."""
    path = Path(importlib.util.find_spec("plotly").origin).parent / "package_data" / "plotly.min.js"
    return COMPILE_HINT + path.read_bytes()


def _serve_plotly():
    """The route of ``plotly_js``: versioned URL, so cached for a year."""
    resp = flask.Response(plotly_js(), mimetype="application/javascript")
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
            html.Div(id="idle-table"), dcc.Store(id="idle-table-data")]),
        dcc.Tab(label="Anomalies", value="anomalies", id="tab-anomalies", children=[html.Div(id="anomalies")]),
        dcc.Tab(label="Compare", value="compare", id="tab-compare", children=[
            html.Div(style={"display": "flex", "gap": "12px", "margin": "8px 0"}, children=[
                html.Div([html.Label("A (before)"), dcc.Dropdown(id="cmp-a")], style={"width": "320px"}),
                html.Div([html.Label("B (after)"), dcc.Dropdown(id="cmp-b")], style={"width": "320px"})]),
            dcc.RadioItems(id="cmp-scope", value="launch", inline=True, options=[
                {"label": " a typical launch (median over launches) ", "value": "launch"},
                {"label": " each trace whole", "value": "trace"}]),
            html.Div(id="cmp-msg"),
            dcc.Graph(id="cmp-graph", config={"displaylogo": False}),
            html.Div(id="cmp-table"), dcc.Store(id="cmp-table-data")]),
    ])


def layout(first: dict | None = None):
    """The page; ``first`` (``App.first_view``) fills in its first view, so that the
    browser draws the Gantt from the layout response, without waiting for the trace
    and Gantt callbacks: the page's search string it was made for goes to the
    ``page-search`` store, the trace callback skips its initial call while the
    address still says the same."""
    root = html.Div([
        dcc.Location(id="url"),
        dcc.Store(id="page-search", data=None if first is None else first["search"]),
        dcc.Store(id="trace-key"),
        dcc.Store(id="view-state"),
        dcc.Store(id="panel-key"),
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
        setattr(root[cid], prop, value)
    return root


# -- the server-side pieces, pure enough to test without a browser ----------------------------
class App:
    """The dashboard's server state: the catalog of openable traces, the loaded ones,
    and the callbacks' logic as plain methods (the Dash wiring is ``build``)."""

    def __init__(self, catalog: Catalog, default: str | None, *, bar_limit: int = F.BAR_LIMIT):
        self.catalog = catalog
        self.store = Store(catalog)
        self.default = default
        self.bar_limit = bar_limit
        self.first_views = OrderedDict()  # (search, trace files, bar limit) -> first_view, small LRU
        self.first_lock = threading.Lock()

    # trace selection ---------------------------------------------------------------------
    def requested(self, search: str | None) -> str | None:
        """The trace named by the page's query string (``?trace=NAME``), else the default."""
        q = urllib.parse.parse_qs((search or "").lstrip("?"))
        return q["trace"][0] if q.get("trace") else self.default

    @staticmethod
    def initial(search: str | None, present_ranks, present_launches) -> tuple:
        """Initial ranks, launches and row grouping from the query string
        (``&ranks=0,1&launches=3&grouping=cta``), so that a view can be linked; values
        the trace does not have are dropped, an unknown grouping gives the default.
        (``&compare=OTHER&tab=compare`` preselect the compare tab's B trace and the
        panel shown, see ``select``.)"""
        q = urllib.parse.parse_qs((search or "").lstrip("?"))

        def ints(key, present):
            out = []
            for part in ",".join(q.get(key, [])).split(","):
                try:
                    v = int(part)
                except ValueError:
                    continue
                if v in present and v not in out:
                    out.append(v)
            return out or None

        grouping = q.get("grouping", ["rank"])[0]
        return (ints("ranks", set(present_ranks)), ints("launches", set(present_launches)),
                grouping if grouping in M.GROUPINGS else "rank")

    def select(self, search, picked, by_picker: bool) -> tuple:
        """The trace callback's logic: which trace the page shows (the picker's
        choice, else ``?trace=NAME``, else the default) and everything that follows
        from it: picker, banners, filter options, anomaly panel. A trace that cannot
        be opened gives a message in the banner and empty controls."""
        names = self.catalog.names()
        opts = [{"label": n, "value": n} for n in names]
        name = picked if by_picker and picked else self.requested(search)
        empty = [name, opts, {"name": None}, "", None, [], None, [], None, [], None, [], None,
                 1, [0, 1], {}, None, opts, opts, None, "rank", None, NO]
        if name is None:
            empty[4] = _msg("No trace to show: put a trace file in the trace directory or name one on the "
                            "command line (timeline-view TRACE).")
            return tuple(empty)
        try:
            item = self.store.get(name)
        except SourceError as e:
            empty[0] = None
            empty[4] = _msg(f"Cannot open trace: {e}")
            return tuple(empty)
        except Exception as e:  # noqa: BLE001 - a message, never a traceback, in the page
            log.exception("loading %s", name)
            empty[0] = None
            empty[4] = _msg(f"Cannot open trace {name!r}: {type(e).__name__}: {e}")
            return tuple(empty)
        tr, d = item.trace, item.data
        max_cta = int(d.cta.max()) if d.n else 0
        marks = {int(v): str(int(v)) for v in np.unique(np.linspace(0, max(max_cta, 1), 5).round())}
        query = search if not by_picker else ""
        ranks, launches, grouping = self.initial(query, tr.ranks, tr.launches)
        q = urllib.parse.parse_qs((query or "").lstrip("?"))
        other = q.get("compare", [None])[0]
        other = other if other in names else None
        tab = q.get("tab", [None])[0]
        tab = tab if tab in TABS else NO
        return (name, opts, {"name": name}, self.info(item), self.banners(item),
                [{"label": f"rank {r}", "value": r} for r in tr.ranks], ranks,
                [{"label": f"launch {la}", "value": la} for la in tr.launches], launches,
                [{"label": html.Span([html.Span("■ ", style={"color": F.stage_colour(i)}), s]), "value": i}
                 for i, s in enumerate(d.stage_names)], list(range(len(d.stage_names))),
                [{"label": f" {p}" + (" (wait for producers)" if i == d.wait_index else ""), "value": i}
                 for i, p in enumerate(d.interval_names)], list(range(len(d.interval_names))),
                max(max_cta, 1), [0, max(max_cta, 1)], marks, self.anomalies(item), opts, opts, name, grouping,
                other, tab)

    def view(self, item, grouping, ranks, launches, ctas, stages):
        key = (grouping, ranks, launches, ctas, stages if grouping == "stage" else None)
        return _lru_get(item.views, item.lock, key, lambda: M.build_view(
            item.data, grouping, ranks=ranks, launches=launches, ctas=ctas,
            stages=stages if grouping == "stage" else None), VIEW_CACHE)

    def analysis(self, item, key, make):
        return _lru_get(item.cache, item.lock, key, make, ANALYSIS_CACHE)

    def banners(self, item) -> list:
        """The prominent notes on a trace: synthetic, derived placement, what load could
        not check, anomalies, empty."""
        tr = item.trace
        out = []
        if tr.synthetic:
            out.append(_msg("SYNTHETIC trace: made by timeline.synth, not measured on a GPU", "synthetic"))
        if any(sp.extra.get("placement") == "derived" for sp in tr.specs):
            out.append(_msg("CTAs derived from the kernel's rotation rule (a legacy tensor has no placement): "
                            "no XCC/SE/CU was read from the hardware", "info"))
        for note in tr.notes:
            out.append(_msg(f"note: {note.replace(str(item.path), item.name)}", "info"))
        summary = tr.anomaly_summary()
        if summary:
            parts = ", ".join(f"{k} ×{v}" for k, v in sorted(summary.items()))
            out.append(_msg(f"⚠ This trace has {tr.anomaly_count} anomalies ({parts}): some stamps are "
                            "missing or doubtful; see the Anomalies tab.", "warning"))
        if item.data.n == 0:
            out.append(_msg(f"This trace has no intervals ({tr.tasks.num_rows} task rows): nothing to draw.",
                            "warning"))
        return out

    def info(self, item) -> str:
        tr, d = item.trace, item.data
        sp = tr.spec
        return (f"{sp.kernel} · {sp.arch} · {sp.clock.name} · ranks {len(tr.ranks)} · launches "
                f"{len(tr.launches)} · {tr.tasks.num_rows:,} task rows · {d.n:,} intervals · "
                f"{(d.t_max - d.t_min) / 1e3:,.1f} µs")

    # the Gantt -----------------------------------------------------------------------------
    @staticmethod
    def parse_relayout(rel: dict | None):
        """``(x range µs or None, y range or None, autorange)`` from plotly's
        relayoutData (either time axis: the Gantt's ``xaxis`` or the concurrency
        chart's ``xaxis2``)."""
        if not rel:
            return None, None, False
        auto = any(rel.get(f"{a}.autorange") for a in ("xaxis", "yaxis", "xaxis2"))
        x = y = None
        for ax in ("xaxis", "xaxis2"):
            if f"{ax}.range[0]" in rel and f"{ax}.range[1]" in rel:
                x = (finite_us(rel[f"{ax}.range[0]"], "zoom"), finite_us(rel[f"{ax}.range[1]"], "zoom"))
            elif isinstance(rel.get(f"{ax}.range"), list) and len(rel[f"{ax}.range"]) >= 2:
                x = tuple(finite_us(v, "zoom") for v in rel[f"{ax}.range"][:2])
        if "yaxis.range[0]" in rel and "yaxis.range[1]" in rel:
            y = (finite_us(rel["yaxis.range[0]"], "row zoom"), finite_us(rel["yaxis.range[1]"], "row zoom"))
        elif isinstance(rel.get("yaxis.range"), list) and len(rel["yaxis.range"]) >= 2:
            y = tuple(finite_us(v, "row zoom") for v in rel["yaxis.range"][:2])
        return x, y, auto

    def concurrency_table(self, item, ranks, launches, t0, t1, bins):
        """``(table, note)``: the concurrency analysis for the window, sliced from one
        full-range table of ``CONC_BINS`` bins (cached per selection) while the window
        still spans at least ``bins / 2`` of its bins, else computed for the window
        itself; ``note`` says why there is no table (the analysis refused)."""
        if item.data.n == 0:
            return None, ""
        try:
            full = self.analysis(item, ("conc", ranks, launches), lambda: A.concurrency(
                item.trace, bins=CONC_BINS, t0_ns=item.data.t_min, t1_ns=item.data.t_max + 1,
                ranks=ranks, launches=launches))
            bin_ns = max(1, -(-(item.data.t_max + 1 - item.data.t_min) // CONC_BINS))
            if (t1 - t0) / bin_ns >= bins / 2:
                tns = full.column("time_ns").to_numpy()
                keep = (tns + bin_ns > t0) & (tns <= t1)
                return coarsen(full.filter(pa.array(keep)), max(1, int((t1 - t0) / bin_ns) // bins)), ""
            return self.analysis(item, ("conc", ranks, launches, t0, t1, bins), lambda: A.concurrency(
                item.trace, bins=bins, t0_ns=t0, t1_ns=t1, ranks=ranks, launches=launches)), ""
        except A.AnalysisError as e:
            return None, f"stage concurrency: {e}"

    def gantt(self, name, grouping, ranks, launches, stages, phases, ctas, trigger, rel, t0_in, t1_in,
              px, state):
        """The Gantt callback's logic: ``(figure, new state, t0, t1, status)``.

        ``state`` carries the last window (``r0 r1 t0 t1`` and the filter key);
        ``trigger`` says which input fired: a zoom (``gantt``), the time inputs,
        ``reset``, or a filter / trace change (rows start over; the time window
        stays, unless the trace, ranks or launches changed: then it fits the
        selection)."""
        item = self.store.get(name)
        d = item.data
        grouping = grouping if grouping in M.GROUPINGS else "rank"
        state, px = client_state(state), clamp_px(px)
        ranks, launches, stages_t, phases_t, ctas_t = normalize(d, ranks, launches, stages, phases, ctas)
        view = self.view(item, grouping, ranks, launches, ctas_t, stages_t)
        fkey = repr([name, grouping, ranks, launches, ctas_t, stages_t if grouping == "stage" else None])
        state = state or {}
        full_t = extent(d, view)
        same_selection = state.get("name") == name and state.get("ranks") == ranks \
            and state.get("launches") == launches
        t0, t1 = (state.get("t0"), state.get("t1")) if same_selection else full_t
        if t0 is None:
            t0, t1 = full_t
        r0, r1 = (state.get("r0", 0), state.get("r1", view.n_rows)) if state.get("fkey") == fkey \
            else (0, view.n_rows)
        if trigger == "gantt":
            x, y, auto = self.parse_relayout(rel)
            if auto:
                (t0, t1), r0, r1 = full_t, 0, view.n_rows
            elif x is None and y is None:
                raise dash.exceptions.PreventUpdate  # autosize and other non-zoom events
            if x is not None:
                t0, t1 = int(min(x) * 1e3), int(math.ceil(max(x) * 1e3))
            if y is not None:
                r0 = max(0, int(math.floor(min(y) + 0.5)))
                r1 = min(view.n_rows, int(math.ceil(max(y) + 0.5)))
        elif trigger in ("t0", "t1"):
            t0 = _us_to_ns(t0_in, "from", t0)
            t1 = _us_to_ns(t1_in, "to", t1)
        elif trigger == "reset":
            (t0, t1), r0, r1 = full_t, 0, view.n_rows
        if t1 <= t0:
            t1 = t0 + 1
        r0, r1 = (min(max(int(r), 0), view.n_rows) for r in (r0, r1))
        if r1 <= r0:
            r0, r1 = 0, view.n_rows
        width, height = px
        cls = M.class_mask(d, stages_t, phases_t)
        shown = list(stages_t) if stages_t is not None else list(range(len(d.stage_names)))
        conc, conc_note = self.concurrency_table(item, ranks, launches, int(t0), int(t1), int(width))
        note = ""
        if d.n == 0:
            note = "this trace has no intervals"
        fig, info = F.gantt_figure(d, view, r0=r0, r1=r1, t0_ns=int(t0), t1_ns=int(t1), class_ok=cls,
                                   stages=shown, width_px=int(width), height_px=int(height),
                                   bar_limit=self.bar_limit, concurrency=conc, concurrency_note=conc_note,
                                   note=note)
        if info["mode"] == "empty" and not note:
            fig["layout"]["annotations"].append({
                "text": "nothing in this window with these filters", "xref": "paper", "yref": "paper",
                "x": 0.5, "y": 0.6, "showarrow": False, "font": {"size": 15, "color": "#666"}})
        if info["mode"] == "raster":
            status = (f"aggregated view: {info['intervals']:,} intervals in {info['rows']:,} rows, drawn as "
                      f"occupancy per pixel; zoom in (≤ {self.bar_limit:,} intervals, ≤ "
                      f"{F.ROWS_PER_PX * int(height):,} rows) for exact bars")
        elif info["mode"] == "bars":
            status = f"{info['intervals']:,} intervals in {info['rows']:,} rows, exact bars"
        else:
            status = "nothing to draw"
        new_state = {"name": name, "fkey": fkey, "t0": int(t0), "t1": int(t1), "r0": int(r0), "r1": int(r1),
                     "panels": [name, ranks, launches], "grouping": grouping, "ranks": ranks,
                     "launches": launches, "ctas": ctas_t, "stages": stages_t if grouping == "stage" else None}
        return fig, new_state, round(t0 / 1e3, 3), round(t1 / 1e3, 3), status

    @guarded(NO, NO, NO, NO, _ERROR, NO)  # a bad input keeps the figure and says why
    def on_gantt(self, key, grouping, ranks, launches, stages, phases, ctas, trigger, rel, t0, t1, px, state):
        """The Gantt callback: ``gantt`` for the trace in ``key`` and the panels' key,
        in ``GANTT_OUTPUTS`` order; an empty figure when no trace is open."""
        if not key or not key.get("name"):
            return {"data": [], "layout": {"xaxis": {"visible": False}, "yaxis": {"visible": False}}}, \
                None, None, None, "", None
        fig, new, a, b, status = self.gantt(key["name"], grouping, ranks, launches, stages, phases, ctas,
                                            trigger, rel, t0, t1, px, state)
        # the panels below follow the rank / launch selection, and only after the Gantt is drawn
        panels = NO if (state or {}).get("panels") == new["panels"] else new["panels"]
        return fig, new, a, b, status, panels

    def first_view(self, search: str | None) -> dict:
        """The page's first view for the address's search string (``?trace=...``):
        ``{"search": search, "props": {(id, prop): value}}``, what the trace callback
        and then the Gantt callback would set (``TRACE_OUTPUTS``, ``GANTT_OUTPUTS``),
        computed here so that the layout response carries the first figure (one
        round trip instead of three before anything is drawn). Cached per search
        string while the trace files (names, modification times) and the bar limit
        stay the same: every visit of the same address gets the same first view."""
        search = search or ""
        names = tuple(self.catalog.names())
        try:
            item = self.store.get(self.requested(search))
            opened = (str(item.path), item.mtime)
        except Exception:  # noqa: BLE001 - select reports it in the page; not cached
            return self._first_view(search)
        return _lru_get(self.first_views, self.first_lock, (search, names, opened, self.bar_limit),
                        lambda: self._first_view(search), FIRST_VIEW_CACHE)

    def _first_view(self, search: str) -> dict:
        props = dict(zip(TRACE_OUTPUTS, self.select(search, None, False)))
        g = self.on_gantt(props[("trace-key", "data")], props[("grouping", "value")], props[("ranks", "value")],
                          props[("launches", "value")], props[("stages", "value")], props[("phases", "value")],
                          props[("ctas", "value")], "filters", None, None, None, list(GANTT_PX), None)
        props.update(zip(GANTT_OUTPUTS, g))
        return {"search": search, "props": {k: v for k, v in props.items() if v is not NO}}

    def details(self, name, click, state):
        """The pinned-task panel for a click on the Gantt: the task whose interval in
        the clicked row (``y``) is nearest the clicked time (``x``, a hover point is
        the middle of an interval or task). Found again on the server from the
        current row layout (``state``), as Dash's clickData does not carry typed-array
        customdata."""
        item = self.store.get(name)
        d = item.data
        state = client_state(state)
        pts = (click or {}).get("points") if isinstance(click, dict) else None
        if not isinstance(pts, list) or not pts or not isinstance(pts[0], dict) or "x" not in pts[0] \
                or "y" not in pts[0] or state.get("name") != name or state.get("grouping") not in M.GROUPINGS:
            return "Click a bar to pin its task here."
        view = self.view(item, state["grouping"], *(None if v is None else tuple(v) for v in (
            client_list(state.get(k), k) for k in ("ranks", "launches", "ctas", "stages"))))
        row, t = int(round(finite_us(pts[0]["y"], "clicked row"))), finite_us(pts[0]["x"], "clicked time") * 1e3
        if not 0 <= row < view.n_rows:
            return "Click a bar to pin its task here."
        a, b = int(view.row_start[row]), int(view.row_start[row + 1])
        idx = view.order[a:b]
        gap = np.maximum(np.maximum(d.start[idx] - t, t - d.end[idx]), 0)
        tid = int(d.tid[idx[int(np.argmin(gap))]])
        ivs = d.task_intervals(tid)
        i = int(ivs[0])
        place = M.placement_text(d.vendor, int(d.xcc[i]), int(d.se[i]), int(d.cu[i]), int(d.sm[i]))
        head = [("stage", d.stage_names[d.stage[i]]), ("task", int(d.task[i])), ("rank", int(d.rank[i])),
                ("launch", int(d.launch[i])), ("CTA", int(d.cta[i])), ("wave", int(d.wave[i])),
                ("placement", place), ("start", f"{d.start[ivs[0]] / 1e3:,.3f} µs"),
                ("end", f"{d.end[ivs[-1]] / 1e3:,.3f} µs"),
                ("duration", f"{(d.end[ivs[-1]] - d.start[ivs[0]]) / 1e3:,.3f} µs")]
        rows = [html.Tr([html.Td(k), html.Td(str(v))]) for k, v in head]
        rows += [html.Tr([html.Td(d.interval_names[d.phase[j]]),
                          html.Td(f"{(d.end[j] - d.start[j]) / 1e3:,.3f} µs")]) for j in ivs]
        return html.Table(html.Tbody(rows), id="details-table")

    # the panels ------------------------------------------------------------------------------
    def stage_report(self, name, ranks, launches, by_launch):
        item = self.store.get(name)
        ranks, launches = _opt_list(ranks), _opt_list(launches)
        if item.data.n == 0:
            return [], [], _msg("no intervals: no stage report", "info")
        t = self.analysis(item, ("report", ranks, launches, bool(by_launch)), lambda: A.stage_report(
            item.trace, by_launch=bool(by_launch), ranks=ranks, launches=launches))
        if not by_launch:
            t = t.drop_columns([c for c in ("rank", "launch") if c in t.column_names])
        cols, rows = _table_records(t)
        return cols, rows, None

    def idle(self, name, ranks, launches):
        item = self.store.get(name)
        ranks, launches = _opt_list(ranks), _opt_list(launches)
        if item.data.n == 0:
            return F.idle_figure(None), [], [], None
        t = self.analysis(item, ("idle", ranks, launches), lambda: A.idle_per_cta(
            item.trace, ranks=ranks, launches=launches))
        top = t.take(np.argsort(-np.nan_to_num(t.column("idle_share").to_numpy(zero_copy_only=False)),
                                kind="stable")[:200])
        cols, rows = _table_records(top)
        return F.idle_figure(t), cols, rows, None

    @staticmethod
    def anomalies(item):
        tr = item.trace
        if tr.anomalies.num_rows == 0:
            return _msg("No anomalies: every stamp of the buffer is in a clean task row.", "info")
        rows = tr.anomalies.to_pylist()
        head = html.Tr([html.Th(c) for c in ("rank", "kind", "launch", "stage", "phase", "count", "stamps",
                                             "meaning")])
        body = [html.Tr([html.Td(str(r[c])) for c in ("rank", "kind", "launch", "stage", "phase", "count",
                                                      "stamps")] + [html.Td(S.ANOMALY_KINDS.get(r["kind"], ""))])
                for r in rows]
        return html.Div([
            _msg(f"{tr.anomaly_count} anomalies; rows the collector could not vouch for are left out of "
                 "the figures.", "warning"),
            html.Table([html.Thead(head), html.Tbody(body)], id="anomaly-table",
                       style={"fontSize": "12px", "borderCollapse": "collapse"})])

    def compare(self, a, b, scope="launch"):
        """Overlaid stage spans of traces ``a`` and ``b`` and the per-stage delta table
        (B - A) of span and each interval's p50. ``scope="launch"``: a typical
        launch, the median over the (rank, launch) pairs of each trace (traces of
        different launch counts compare fairly); ``"trace"``: each trace whole."""
        if not a or not b:
            return {"data": [], "layout": {"height": 60}}, [], [], _msg(
                "pick two traces (A before, B after) to compare", "info")
        ia, ib = self.store.get(a), self.store.get(b)
        if ia.trace.spec.stage_names != ib.trace.spec.stage_names:
            note = _msg(f"the traces have different stages ({len(ia.trace.spec.stage_names)} vs "
                        f"{len(ib.trace.spec.stage_names)}); only stages of both are compared", "warning")
        else:
            note = None
        per_launch = scope != "trace"
        reports = []
        for item in (ia, ib):
            r = self.analysis(item, ("report", None, None, per_launch), functools.partial(
                A.stage_report, item.trace, by_launch=per_launch))
            reports.append(median_per_stage(r) if per_launch else r)
        ra, rb = reports
        table = compare_table(ra, rb)
        spans = {}
        for label, r in ((f"A: {a}", ra), (f"B: {b}", rb)):
            spans[label] = {s: (f, e) for s, f, e in zip(r.column("stage").to_pylist(),
                                                         r.column("first_start_us").to_pylist(),
                                                         r.column("last_end_us").to_pylist())
                            if f is not None and e is not None and not (math.isnan(f) or math.isnan(e))}
        order = [s for s in ia.trace.spec.stage_names if s in set(ib.trace.spec.stage_names)]
        cols = [{"name": k, "id": k, "type": "text" if k == "stage" else "numeric"} for k in table[0]] \
            if table else []
        fig = F.stage_span_figure(spans, order)
        fig["layout"]["xaxis"]["title"]["text"] = ("µs from the launch's first start (median over launches)"
                                                   if per_launch else "µs from the trace's first start")
        return fig, cols, table, note

    def export(self, name, ranks, launches, stages):
        """The selection (ranks, launches, stages) as a Chrome trace JSON download
        (``timeline.export.chrome.write_chrome``). A download goes through the page
        as base64, so a selection of more than ``EXPORT_LIMIT`` intervals is refused
        with the command that writes it to a file instead."""
        from timeline.export.chrome import write_chrome

        item = self.store.get(name)
        d = item.data
        ranks, launches, stages_t, _, _ = normalize(d, ranks, launches, stages, None, None)
        keep = np.ones(d.n, dtype=bool)
        for arr, vals in ((d.rank, ranks), (d.launch, launches), (d.stage, stages_t)):
            if vals is not None:
                keep &= np.isin(arr, vals)
        n = int(keep.sum())
        names = None if stages_t is None else [d.stage_names[s] for s in stages_t]
        if n > EXPORT_LIMIT:
            opts = "".join(f" --{k} {','.join(map(str, v))}" for k, v in
                           (("rank", ranks), ("launch", launches), ("stage", names)) if v is not None)
            raise ValueError(f"{n:,} intervals is too large a download (limit {EXPORT_LIMIT:,}); narrow the "
                             f"ranks / launches / stages, or run: timeline export {item.path} --chrome OUT.json{opts}")
        if n == 0:
            raise ValueError("nothing to export: the selection has no intervals")
        stem = Path(name).stem
        return dcc.send_bytes(lambda f: write_chrome(item.trace, f, ranks=ranks, launches=launches, stages=names),
                              f"{stem}.chrome.json")


def coarsen(conc: pa.Table, k: int) -> pa.Table:
    """A concurrency table (``time_ns, stage, ctas``; per stage, bins in time order)
    with every ``k`` consecutive bins of a stage merged: their mean ``ctas`` (the
    bins are of equal width, so the mean of time-weighted means is the
    time-weighted mean) at the first bin's time. Fewer points to send and draw."""
    if k <= 1 or conc.num_rows == 0:
        return conc
    st = conc.column("stage")
    st = st.cast(pa.string()) if pa.types.is_dictionary(st.type) else st
    names = np.asarray(st.to_pylist(), dtype=object)
    t = conc.column("time_ns").to_numpy()
    c = conc.column("ctas").to_numpy().astype(np.float64)
    cut = np.flatnonzero(names[1:] != names[:-1]) + 1
    starts = np.concatenate(([0], cut))
    pos = np.arange(t.size) - np.repeat(starts, np.diff(np.concatenate((starts, [t.size]))))
    group = np.cumsum(np.concatenate(([True], (names[1:] != names[:-1]) | (pos[1:] % k == 0))) ) - 1
    counts = np.bincount(group)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return pa.table({"time_ns": t[firsts], "stage": names[firsts].tolist(),
                     "ctas": np.bincount(group, weights=c) / counts})


def median_per_stage(report: pa.Table) -> pa.Table:
    """A ``stage_report(by_launch=True)`` table reduced to one row per stage (in
    first-seen order): the median over (rank, launch) of every numeric column
    (a stage's typical launch); NaN where a stage has no value."""
    stages = report.column("stage").to_pylist()
    order = list(dict.fromkeys(stages))
    keys = np.array([order.index(s) for s in stages])
    out = {"stage": order}
    for c in report.column_names:
        if c in ("stage", "rank", "launch") or not pa.types.is_floating(report.schema.field(c).type) and \
                not pa.types.is_integer(report.schema.field(c).type):
            continue
        v = np.array([np.nan if x is None else float(x) for x in report.column(c).to_pylist()])
        med = []
        for k in range(len(order)):
            vals = v[keys == k]
            vals = vals[~np.isnan(vals)]
            med.append(float(np.median(vals)) if vals.size else math.nan)
        out[c] = med
    return pa.table(out)


def compare_table(ra, rb) -> list:
    """Per stage present in both stage reports (``by_launch=False``): A and B span,
    their difference and ratio, and each interval's p50 in A, B and B - A."""
    def rows(t):
        return {r["stage"]: r for r in t.to_pylist()}

    a, b = rows(ra), rows(rb)
    p50 = [c for c in ra.column_names if c.endswith(" p50_us") and c in rb.column_names]
    out = []
    for stage in [s for s in a if s in b]:
        x, y = a[stage], b[stage]
        row = {"stage": stage, "A span_us": x["span_us"], "B span_us": y["span_us"]}
        if x["span_us"] is not None and y["span_us"] is not None:
            row["Δ span_us"] = y["span_us"] - x["span_us"]
            row["B/A span"] = (y["span_us"] / x["span_us"]) if x["span_us"] else None
        else:
            row["Δ span_us"] = row["B/A span"] = None
        for c in p50:
            name = c[: -len(" p50_us")]
            row[f"Δ {name} p50_us"] = (y[c] - x[c]) if x[c] is not None and y[c] is not None else None
        for k, v in row.items():
            if isinstance(v, float):
                row[k] = None if math.isnan(v) else round(v, 3)
        out.append(row)
    return out


# -- Dash wiring ------------------------------------------------------------------------------
def page_search(referrer: str | None) -> str | None:
    """The search string (``?trace=...``, or ``""``) of the page whose script asks
    for Dash's layout, from that request's ``Referer`` (the page's address: the
    layout request comes from the page itself, same origin); None without one."""
    if not referrer:
        return None
    query = urllib.parse.urlsplit(referrer).query
    return f"?{query}" if query else ""


def _loopback_host_only():
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


def _malformed(e):
    """Any request a callback could not take (one that names no callback, a body Dash
    cannot parse): one line, status 400, the traceback in the server's log only."""
    from werkzeug.exceptions import HTTPException

    if isinstance(e, HTTPException):
        return e
    log.exception("malformed request to %s", flask.request.path)
    return flask.Response(f"timeline-view: malformed request ({type(e).__name__})\n", 400, mimetype="text/plain")


def build(app_state: App, compress: bool = False, host: str | None = "127.0.0.1") -> dash.Dash:
    """The Dash app: layout and callbacks over ``app_state``. ``compress``: send
    responses compressed (flask-compress; plotly.js and Dash's bundles shrink from
    6.3 MB to 1.8 MB): worth it over a network, not on this machine's loopback,
    where compressing costs more than it saves. ``host``: the address it will be
    bound to; on loopback every request must name a loopback ``Host``."""
    # no assets folder: Dash would otherwise serve (and inject into the page) whatever an
    # ``assets/`` directory beside the working directory holds; the CSS is inline below
    app = dash.Dash("timeline-view", title="timeline-view", update_title=None, serve_locally=True, compress=compress,
                    assets_folder=str(Path(__file__).parent / "no-assets"), assets_ignore=".*")
    # plotly.js (4.8 MB, about a second to evaluate in a cold browser) is what the first paint
    # waits for. dcc.Graph would ask for it only once the layout and its own chunk have
    # loaded; instead it loads from the head, asynchronously, and evaluates while the
    # server builds the layout. dcc.Graph uses ``window.Plotly`` when set (the documented
    # way to bring one's own plotly.js): until the script has run it is a promise that
    # the script's load resolves (dcc.Graph waits on it), then plotly.js itself.
    prefix = app.config.requests_pathname_prefix
    route = f"_timeline-view/plotly-{plotly_version()}.min.js"
    app.server.add_url_rule(f"/{route}", "timeline_view_plotly", _serve_plotly)
    app.index_string = app.index_string.replace("{%css%}", "{%css%}" + PLOTLY_EARLY.format(src=prefix + route)
                                                + f"<style>{CSS}</style>")
    def page_layout():
        # Dash validates the layout once at build time, outside any request
        search = page_search(flask.request.referrer) if flask.has_request_context() else None
        return layout(None if search is None else st.first_view(search))

    app.layout = page_layout
    st = app_state
    if host in LOOPBACK:
        app.server.before_request(_loopback_host_only)
    app.server.register_error_handler(Exception, _malformed)

    app.clientside_callback(
        """function(_) { var g = document.getElementById('gantt');
            var w = g ? Math.max(400, Math.min(3000, g.clientWidth - 210)) : 1000;
            return [Math.round(w), 560]; }""",
        Output("px", "data"), Input("url", "pathname"))

    @app.callback(*(Output(c, p) for c, p in TRACE_OUTPUTS),
                  Input("url", "search"), Input("trace-select", "value"), State("page-search", "data"))
    @guarded(*(_ERROR if out == ("banners", "children") else NO for out in TRACE_OUTPUTS))
    def on_trace(search, picked, page_search):
        by_picker = dash.ctx.triggered_id == "trace-select"
        # the initial call, or dcc.Location reporting the address as it mounts: the
        # layout already shows this address's view (the page reloads on a new address)
        if not by_picker and page_search is not None and (search or "") == page_search:
            raise dash.exceptions.PreventUpdate
        return st.select(search, picked, by_picker)

    # only zooms and pans reach the server: plotly's autosize and other layout events
    # stay in the browser (a late autosize would otherwise cancel a zoom in flight)
    app.clientside_callback(
        """function(rel) { if (!rel) return window.dash_clientside.no_update;
            var zoom = Object.keys(rel).some(k => /^(xaxis2?|yaxis)\\.(range|autorange)/.test(k));
            return zoom ? rel : window.dash_clientside.no_update; }""",
        Output("zoom", "data"), Input("gantt", "relayoutData"))

    @app.callback(
        *(Output(c, p) for c, p in GANTT_OUTPUTS),
        Input("trace-key", "data"), Input("grouping", "value"), Input("ranks", "value"),
        Input("launches", "value"), Input("stages", "value"), Input("phases", "value"),
        Input("ctas", "value"), Input("zoom", "data"), Input("t0", "value"), Input("t1", "value"),
        Input("reset", "n_clicks"), State("px", "data"), State("view-state", "data"),
        prevent_initial_call=True)  # the layout holds the first view; the trace callback's changes fire it
    def on_gantt(key, grouping, ranks, launches, stages, phases, ctas, rel, t0, t1, _reset, px, state):
        trig = dash.ctx.triggered_id
        trigger = {"zoom": "gantt", "t0": "t0", "t1": "t1", "reset": "reset"}.get(trig, "filters")
        return st.on_gantt(key, grouping, ranks, launches, stages, phases, ctas, trigger, rel, t0, t1, px, state)

    @app.callback(Output("details", "children"), Input("gantt", "clickData"), State("trace-key", "data"),
                  State("view-state", "data"), prevent_initial_call=True)
    @guarded(_ERROR)
    def on_click(click, key, state):
        if not key or not key.get("name"):
            return "No trace."
        return st.details(key["name"], click, state)

    def table_out(table_id, cols, rows, prev):
        """A table panel's children and data store, sorted as it was (``prev``)."""
        sort = (prev or {}).get("sort")
        sort = sort if sort and any(c["id"] == sort[0] for c in cols) else None
        return grid(table_id, cols, rows, sort), {"columns": cols, "rows": rows, "sort": sort}

    @app.callback(Output("stage-report", "children"), Output("stage-report-data", "data"),
                  Output("report-msg", "children"),
                  Input("panel-key", "data"), Input("by-launch", "value"), Input("tabs", "value"),
                  State("stage-report-data", "data"))
    @guarded(None, None, _ERROR)
    def on_report(panels, by_launch, tab, prev):
        if tab != "report":
            raise dash.exceptions.PreventUpdate
        if not panels:
            return None, None, None
        cols, rows, msg = st.stage_report(panels[0], panels[1], panels[2], bool(by_launch))
        return (*table_out("stage-report", cols, rows, prev), msg)

    @app.callback(Output("idle-graph", "figure"), Output("idle-table", "children"), Output("idle-table-data", "data"),
                  Output("idle-msg", "children"), Input("panel-key", "data"), Input("tabs", "value"),
                  State("idle-table-data", "data"))
    @guarded(F.idle_figure(None), None, None, _ERROR)
    def on_idle(panels, tab, prev):
        if tab != "idle":
            raise dash.exceptions.PreventUpdate
        if not panels:
            return F.idle_figure(None), None, None, None
        fig, cols, rows, msg = st.idle(panels[0], panels[1], panels[2])
        return (fig, *table_out("idle-table", cols, rows, prev), msg)

    @app.callback(Output("cmp-graph", "figure"), Output("cmp-table", "children"), Output("cmp-table-data", "data"),
                  Output("cmp-msg", "children"), Input("cmp-a", "value"), Input("cmp-b", "value"),
                  Input("cmp-scope", "value"), State("cmp-table-data", "data"))
    @guarded({"data": [], "layout": {}}, None, None, _ERROR)
    def on_compare(a, b, scope, prev):
        fig, cols, rows, msg = st.compare(a, b, scope)
        return (fig, *table_out("cmp-table", cols, rows, prev), msg)

    for table_id in TABLES:  # a click on a column header sorts by it; a second click reverses
        @app.callback(Output(table_id, "children", allow_duplicate=True),
                      Output(f"{table_id}-data", "data", allow_duplicate=True),
                      Input({"type": "sort", "table": table_id, "col": ALL}, "n_clicks"),
                      State(f"{table_id}-data", "data"), prevent_initial_call=True)
        @guarded(NO, NO)  # a malformed sort request leaves the table as it is
        def on_sort(clicks, data, table_id=table_id):
            trig = dash.ctx.triggered_id
            if not data or not trig or not any(clicks) or not 0 <= trig["col"] < len(data["columns"]):
                raise dash.exceptions.PreventUpdate
            key = data["columns"][trig["col"]]["id"]
            sort = data.get("sort")
            data = dict(data, sort=[key, not sort[1] if sort and sort[0] == key else False])
            return grid(table_id, data["columns"], data["rows"], data["sort"]), data

    @app.callback(Output("download", "data"), Output("export-msg", "children"),
                  Input("export-chrome", "n_clicks"), State("trace-key", "data"), State("ranks", "value"),
                  State("launches", "value"), State("stages", "value"), prevent_initial_call=True)
    @guarded(NO, _ERROR)
    def on_export(_n, key, ranks, launches, stages):
        if not key or not key.get("name"):
            return NO, _msg("no trace to export")
        return st.export(key["name"], ranks or None, launches or None, stages), None

    return app


# -- command line -----------------------------------------------------------------------------
def default_trace(trace_dir: Path | None) -> str | None:
    """``DEFAULT_TRACE`` if it is in ``trace_dir``, else the first trace file there."""
    files = scan(trace_dir)
    for p in files:
        if p.name == DEFAULT_TRACE:
            return p.name
    return files[0].name if files else None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="timeline-view",
        description="Dash dashboard of mono-kernel timelines (per-CTA, per-wave Gantt, stage analytics).")
    p.add_argument("traces", nargs="*", metavar="TRACE", help="trace files (.arrow / .parquet) to open")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8050, help="port, 1-65535 (default 8050)")
    p.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR,
                   help=f"directory whose trace files the page may open (default {DEFAULT_TRACE_DIR})")
    p.add_argument("--debug", action="store_true", help="Dash debug mode (dev tools, reloader); never in production")
    return p, p.parse_args(argv)


def prepare(argv=None) -> tuple:
    """Parse the command line and load the first trace, so that every bad input is
    reported here (on the command line, exit status 2) before anything is served.
    Returns ``(App, args, name of the trace shown first)``."""
    parser, args = parse_args(argv)
    trace_dir = args.trace_dir
    if not trace_dir.is_dir():
        if args.trace_dir != DEFAULT_TRACE_DIR or not args.traces:
            parser.error(f"--trace-dir {str(trace_dir)!r} is not a directory")
        trace_dir = None
    for t in args.traces:
        if not Path(t).exists():
            parser.error(f"trace file {t!r} does not exist")
    catalog = Catalog(trace_dir, args.traces)
    first = next(iter(catalog.given), None) or default_trace(trace_dir)
    if first is None:
        parser.error(f"no trace given and none in {str(trace_dir)!r}: name a trace file "
                     "(timeline-view TRACE.arrow) or point --trace-dir at a directory of them")
    state = App(catalog, first)
    for name in list(catalog.given) or [first]:
        try:
            st_item = state.store.get(name)
        except SourceError as e:
            parser.error(str(e))
        if name == first:  # warm the default row layout and concurrency: the first paint only draws
            state.view(st_item, "rank", None, None, None, None)
            state.concurrency_table(st_item, None, None, st_item.data.t_min, st_item.data.t_max + 1,
                                    GANTT_PX[0])
    state.first_view("")  # the page's first view, ready before the first visit
    return state, args, first


def main(argv=None) -> int:
    """Console entry point ``timeline-view``."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    state, args, first = prepare(argv)
    compress = args.host not in LOOPBACK
    if compress and importlib.util.find_spec("flask_compress") is None:
        print(f"timeline-view: note: serving on {args.host} uncompressed (6 MB for a first visit): "
              "pip install flask-compress to compress", file=sys.stderr)
        compress = False
    app = build(state, compress=compress, host=args.host)
    url = f"http://{args.host}:{args.port}/"
    print(f"timeline-view: {first} at {url}" + ("  (debug mode)" if args.debug else ""), flush=True)
    app.run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
