"""Figure builders of the dashboard, as plain plotly.js figure dicts.

Dicts rather than ``plotly.graph_objects`` because the Gantt carries up to a few
hundred thousand numbers per update: numpy arrays go out as plotly.js typed arrays
(``{"dtype", "bdata"}``, base64) built here directly, without the validation pass
and list conversion of graph objects. Every builder is a pure function of
``TraceData`` / ``View`` / Arrow tables and a few numbers, so tests can check the
figure it returns without a browser.

The Gantt has two modes, chosen by how many intervals the window holds:

- ``bars``: each interval a WebGL line segment (``scattergl``, one trace per
  stage x interval kind, NaN between segments) in its stage's colour, the producer
  wait (the spec's declared wait interval, ``spec.wait``) lighter, the last one darker; plus one
  invisible marker per interval carrying the hover text of its task;
  Above ``gl_limit`` bars (``App.gl_limit``, ``GL_LIMIT``) the same bars are one
  server-rendered image instead (``raster_trace(..., bands=True)``): every row its own
  band of pixel rows, exact to the pixel column, no hover points (a click still
  pins a task). A browser without a GPU draws WebGL in software: 28 k segments
  took 3 s to paint in headless Chromium, their image 0.15 s;
- ``raster``: one server-rendered PNG (``viewer.raster``) of occupancy by stage,
  ``width x height`` pixels, rows aggregated into pixel rows.
"""

from __future__ import annotations

import base64

import numpy as np
import pyarrow as pa

from timeline.contract import schema as S
from timeline.core import rows
from viewer import model as M
from viewer import raster as VR
from viewer.colours import class_rgb, rgb_hex, stage_colour

BAR_LIMIT = 40_000  # intervals in view above which the Gantt is rasterized
GL_LIMIT = 4_000  # bars in view drawn in WebGL with hover (a real launch: 2,816); beyond, one image
ROWS_PER_PX = 2  # rows per pixel row above which the Gantt is rasterized (bars would overdraw)
HOVER_PER_INTERVAL = 500  # tasks in view up to which every interval gets a hover point
MAX_ROW_TICKS = 48
MAX_SEPARATORS = 96
GANTT_DOMAIN = (0.30, 1.0)
CONC_DOMAIN = (0.0, 0.22)
MARGIN_L, MARGIN_R = 150, 20  # the Gantt's left and right margins (px): the strip above it takes them too,
# so that the two time axes line up to the pixel


def figure_height(gantt_px: int) -> int:
    """Pixel height of the Gantt + concurrency figure whose Gantt plot area is
    ``gantt_px`` high (the page sizes the graph to it)."""
    return int(gantt_px / (GANTT_DOMAIN[1] - GANTT_DOMAIN[0])) + 60


def typed(a: np.ndarray) -> dict:
    """A numpy array as a plotly.js typed array (base64 of its bytes); float64,
    float32, int32, int16, uint8 only."""
    a = np.ascontiguousarray(a)
    code = {"float64": "f8", "float32": "f4", "int32": "i4", "int16": "i2", "uint8": "u1"}[str(a.dtype)]
    out = {"dtype": code, "bdata": base64.b64encode(a.tobytes()).decode("ascii")}
    if a.ndim > 1:
        out["shape"] = ", ".join(str(d) for d in a.shape)
    return out


def _xdtype(t_max_ns: int):
    """float32 µs keep 1 ns resolution below 2**24 ns (16.7 ms); float64 beyond."""
    return np.float32 if t_max_ns < (1 << 24) else np.float64


def _segments(s_us: np.ndarray, e_us: np.ndarray, y: np.ndarray, xdt):
    """x and y of line segments separated by NaN: ``s0 e0 nan s1 e1 nan ...``."""
    n = s_us.size
    x = np.empty(3 * n, dtype=xdt)
    x[0::3], x[1::3], x[2::3] = s_us, e_us, np.nan
    yy = np.empty(3 * n, dtype=np.float32)
    yy[0::3], yy[1::3], yy[2::3] = y, y, np.nan
    return x, yy


def hover_columns(data: M.TraceData) -> list:
    """Names of the hover customdata columns (what ``_hover_data`` puts in each)."""
    place = ["sm", "-", "-"] if data.vendor == "nvidia" else ["xcc", "se", "cu"]
    return ["task", "cta", "wave", "rank", "launch", *place, *data.interval_names]


def _hover_data(data: M.TraceData, idx: np.ndarray) -> np.ndarray:
    """customdata (float32, one row per hover point): task, CTA, wave, rank, launch,
    placement (3 numbers), then every interval duration (µs) of the point's task."""
    tid = data.tid[idx]
    place = ((data.sm[idx], np.full(idx.size, -1), np.full(idx.size, -1)) if data.vendor == "nvidia"
             else (data.xcc[idx], data.se[idx], data.cu[idx]))
    cols = [data.task[idx], data.cta[idx], data.wave[idx], data.rank[idx], data.launch[idx], *place]
    cd = np.empty((idx.size, len(cols) + len(data.interval_names)), dtype=np.float32)
    for j, c in enumerate(cols):
        cd[:, j] = c
    cd[:, len(cols):] = data.task_dur[tid]
    return cd


def _hovertemplate(data: M.TraceData, stage: str, unplaced: bool = False, launch: str | None = None) -> str:
    """The hover text of a stage's points; ``unplaced``: of tasks without a placement
    word; ``launch``: the points' launch key (None: the launch number of each point)."""
    where = ("SM %{customdata[5]}" if data.vendor == "nvidia"
             else "XCC %{customdata[5]} SE %{customdata[6]} CU %{customdata[7]}")
    said = "%{customdata[4]}" if launch is None else launch.replace("%{", "% {")  # never a template field
    lines = [f"<b>{stage}</b> task %{{customdata[0]}}", f"rank %{{customdata[3]}} · launch {said} · "
             + (f"{rows.UNPLACED}: no placement word" if unplaced else "CTA %{customdata[1]} · wave %{customdata[2]}")]
    lines += [] if unplaced else [where]
    lines += [f"{name}: %{{customdata[{8 + j}]:.3f}} µs" for j, name in enumerate(data.interval_names)]
    return "<br>".join(lines) + "<extra></extra>"


def bar_traces(data: M.TraceData, view: M.View, pos: np.ndarray, row_px: float,
               hover_per_task: bool | None = None) -> list:
    """The ``bars`` mode traces for sorted positions ``pos`` of ``view``: one
    scattergl segment trace per class present (name ``stage · interval``), then one
    invisible hover-marker trace per stage present, whose points carry the hover
    text of their task (``_hover_data``). ``row_px``: the pixel height of a row,
    which sets the line width (a bar fills 80 % of its row).

    Hover points sit at the middle of every interval while few tasks are in view
    (``HOVER_PER_INTERVAL`` or fewer: a wide bar answers along its whole length),
    else at the middle of every task (a quarter of the payload)."""
    idx = view.order[pos]
    y = view.row[pos]
    cls = view.cls[pos]
    n_i = max(len(data.interval_names), 1)
    rgb = class_rgb(len(data.stage_names), n_i, data.wait_index)
    xdt = _xdtype(data.t_max)
    s_us = data.start[idx] / 1e3
    e_us = data.end[idx] / 1e3
    width = float(np.clip(row_px * 0.8, 1.0, 40.0))
    traces = []
    by = np.argsort(cls, kind="stable")
    cuts = np.flatnonzero(np.diff(cls[by])) + 1
    for part in np.split(by, cuts) if by.size else []:
        c = int(cls[part[0]])
        s, p = divmod(c, n_i)
        x, yy = _segments(s_us[part], e_us[part], y[part], xdt)
        traces.append({
            "type": "scattergl", "mode": "lines", "x": typed(x), "y": typed(yy),
            "line": {"color": rgb_hex(rgb[c]), "width": width},
            "name": f"{data.stage_names[s]} · {data.interval_names[p] if data.interval_names else ''}",
            "legendgroup": data.stage_names[s], "showlegend": False, "hoverinfo": "skip",
            "connectgaps": False, "xaxis": "x", "yaxis": "y",
            "meta": {"kind": "bars", "stage": data.stage_names[s], "interval": int(p)},
        })
    tid = data.tid[idx]
    if hover_per_task is None:
        hover_per_task = np.unique(tid).size > HOVER_PER_INTERVAL
    traces += _hover_traces(data, idx, y, (s_us, e_us), xdt, width, hover_per_task)
    return traces + mark_traces(data, tid, y, width)


def _hover_traces(data: M.TraceData, idx: np.ndarray, y: np.ndarray, span_us, xdt, width: float,
                  per_task: bool) -> list:
    """One invisible marker trace per stage present, its points carrying their
    task's hover text: at the middle of every interval in view, or with ``per_task``
    at the middle of every task's intervals in view. ``span_us``: the intervals'
    (start, end) µs."""
    s_us, e_us = span_us
    if per_task:
        tid = data.tid[idx]
        order = np.argsort(tid, kind="stable")
        first = np.flatnonzero(np.concatenate(([True], tid[order][1:] != tid[order][:-1])))
        lo = np.minimum.reduceat(s_us[order], first)
        hi = np.maximum.reduceat(e_us[order], first)
        h_idx, h_y, h_x = idx[order][first], y[order][first], (lo + hi) / 2
    else:
        h_idx, h_y, h_x = idx, y, (s_us + e_us) / 2
    key = data.stage[h_idx].astype(np.int64) * 2 + (data.lane[h_idx] >= 0)  # stage, then unplaced
    if data.keyed:  # a trace per launch too: its hover names the launch by its key
        key = key + np.searchsorted(data.launches, data.launch[h_idx]).astype(np.int64) * (2 * len(data.stage_names))
    by = np.argsort(key, kind="stable")
    cuts = np.flatnonzero(np.diff(key[by])) + 1
    traces = []
    for part in np.split(by, cuts) if by.size else []:
        _, rest = divmod(int(key[part[0]]), 2 * len(data.stage_names))
        s, unplaced = divmod(rest, 2)
        launch = data.launch_text(data.launch[h_idx[part[0]]]) if data.keyed else None
        traces.append({
            "type": "scattergl", "mode": "markers", "x": typed(h_x[part].astype(xdt)),
            "y": typed(h_y[part].astype(np.float32)),
            "marker": {"size": max(4.0, width), "color": "rgba(0,0,0,0)"},
            "customdata": typed(_hover_data(data, h_idx[part])),
            "hovertemplate": _hovertemplate(data, data.stage_names[s], bool(unplaced), launch),
            "hoverlabel": {"bgcolor": stage_colour(s)},
            "name": data.stage_names[s], "legendgroup": data.stage_names[s], "showlegend": False,
            "xaxis": "x", "yaxis": "y",
            "meta": {"kind": "hover", "stage": data.stage_names[s], "per": "task" if per_task else "interval"},
        })
    return traces


def mark_traces(data: M.TraceData, tid: np.ndarray, y: np.ndarray, width: float) -> list:
    """The tasks' marks (``spec.marks``: times of their own, in no order) as tick
    markers on their task's row, one trace per mark name, the name in the hover."""
    if not data.mark_names or not tid.size:
        return []
    u, first = np.unique(tid, return_index=True)
    rows = y[first]
    out = []
    for k, name in enumerate(data.mark_names):
        ns = data.task_marks[u, k]
        ok = ns != S.NS_MISSING
        if not ok.any():
            continue
        out.append({
            "type": "scattergl", "mode": "markers", "x": typed((ns[ok] / 1e3).astype(_xdtype(data.t_max))),
            "y": typed(rows[ok].astype(np.float32)),
            "marker": {"symbol": "line-ns-open", "size": max(6.0, width * 1.2), "color": "#222",
                       "line": {"width": 1.5, "color": "#222"}},
            "name": f"mark {name}", "showlegend": False, "hovertemplate": f"{name} %{{x:.3f}} µs<extra></extra>",
            "xaxis": "x", "yaxis": "y", "meta": {"kind": "mark", "mark": name},
        })
    return out


def raster_trace(data: M.TraceData, view: M.View, pos: np.ndarray, r0: int, r1: int,
                 t0_ns: int, t1_ns: int, width: int, height: int, bands: bool = False) -> dict:
    """The ``raster`` mode trace: an image trace of ``width`` columns over
    ``[t0_ns, t1_ns]`` and ``min(height, rows)`` pixel rows over rows ``[r0, r1)``
    (each pixel row aggregates ``rows / pixel rows`` Gantt rows). ``bands``: the
    ``bars`` drawn as an image, one Gantt row per band of pixel rows
    (``raster.bands``) while the plot has a pixel row for every row (beyond, rows
    share pixel rows as in the raster: the browser would drop rows, not blend them)."""
    n_rows = max(r1 - r0, 1)
    h = int(min(height, n_rows))
    w = int(max(width, 1))
    row = view.row[pos].astype(np.int64)
    prow = ((row - r0) * h) // n_rows
    rows_per_px = np.bincount((np.arange(r0, r1) - r0) * h // n_rows, minlength=h).astype(np.float64)
    idx = view.order[pos]
    palette = class_rgb(len(data.stage_names), max(len(data.interval_names), 1), data.wait_index)
    cov = VR.coverage(data.start[idx].astype(np.float64), data.end[idx].astype(np.float64), prow,
                     view.cls[pos], palette, float(t0_ns), float(t1_ns), w, h)
    img = VR.shade(cov, rows_per_px)
    if bands and n_rows < height:
        img = VR.bands(img, int(height))
        h = img.shape[0]
    png = VR.png_bytes(img)
    dx = (t1_ns - t0_ns) / 1e3 / w
    dy = n_rows / h
    return {
        "type": "image", "source": "data:image/png;base64," + base64.b64encode(png).decode("ascii"),
        "x0": t0_ns / 1e3 + dx / 2, "dx": dx, "y0": r0 - 0.5 + dy / 2, "dy": dy,
        "hoverinfo": "x+y", "xaxis": "x", "yaxis": "y", "name": "occupancy",
        "meta": {"kind": "bars-image" if bands else "raster", "width": w, "height": h, "intervals": int(pos.size)},
    }


def path_trace(segments) -> list:
    """The critical path drawn over the Gantt: ``segments`` of ``((x0 µs, y0 row),
    (x1 µs, y1 row))``, a task's stretch on its row or a hand-off from one row to
    another, as one translucent black line trace (NaN-separated)."""
    if not segments:
        return []
    x, y = [], []
    for (x0, y0), (x1, y1) in segments:
        x += [x0, x1, None]
        y += [y0, y1, None]
    return [{"type": "scatter", "mode": "lines", "x": x, "y": y, "name": "critical path", "showlegend": True,
             "line": {"color": "rgba(0,0,0,0.55)", "width": 4}, "hoverinfo": "skip", "xaxis": "x", "yaxis": "y",
             "meta": {"kind": "critical-path", "segments": len(segments)}}]


def legend_traces(data: M.TraceData, stages) -> list:
    """One legend entry per shown stage (empty SVG traces, so that a raster view
    starts no WebGL context; the data traces stay out of the legend so the legend
    reads as the stage colour key in both modes)."""
    return [{"type": "scatter", "mode": "markers", "x": [None], "y": [None], "name": data.stage_names[s],
             "marker": {"color": stage_colour(s), "size": 10, "symbol": "square"},
             "legendgroup": data.stage_names[s], "showlegend": True, "hoverinfo": "skip",
             "xaxis": "x", "yaxis": "y", "meta": {"kind": "legend"}} for s in stages]


def row_ticks(data: M.TraceData, view: M.View, r0: int, r1: int):
    """The Gantt's y axis for rows ``[r0, r1)``: ``(tick rows, tick labels,
    separators)``. Few rows in view: a tick per row (``r0 L1 · cta 5 w2``).
    Otherwise a tick at each group start (rank, launch and the grouping's unit;
    thinned to ``MAX_ROW_TICKS``) and, while there are few groups, evenly spaced
    ``cta N wW`` ticks between them. Separators: ``(row, major)`` at every change
    of rank or launch (major) and, while few, of the grouping's unit."""
    r0, r1 = max(r0, 0), min(r1, view.n_rows)
    if r1 <= r0:
        return [], [], []
    g = view.group_id[r0:r1]
    minor = (np.flatnonzero(np.diff(g)) + 1 + r0).tolist()
    rl = view.rows["rank"][r0:r1].astype(np.int64) * (1 << 32) + view.rows["launch"][r0:r1]
    major = set((np.flatnonzero(np.diff(rl)) + 1 + r0).tolist())
    seps = [(b, b in major) for b in minor if b in major or len(minor) <= MAX_ROW_TICKS // 2]
    if r1 - r0 <= MAX_ROW_TICKS:
        vals = list(range(r0, r1))
        return vals, [M.row_label(data, view, r) for r in vals], seps
    starts = [r0] + minor
    if len(starts) > MAX_ROW_TICKS // 2:
        step = -(-len(starts) // MAX_ROW_TICKS)
        vals = starts[::step]
        return vals, [M.group_label(data, view, r) for r in vals], seps
    ticks = {r: M.group_label(data, view, r) for r in starts}
    every = max(1, -(-(r1 - r0) // (MAX_ROW_TICKS // 2)))
    near = max(1, every // 2)
    for r in range(r0, r1, every):
        if all(abs(r - s) >= near for s in starts):
            ticks[r] = M.cta_label(data, view, r)
    vals = sorted(ticks)
    return vals, [ticks[r] for r in vals], seps


def concurrency_traces(table: pa.Table | None, data: M.TraceData, stages) -> list:
    """Stacked step areas of CTAs inside each shown stage over time, from the
    ``concurrency`` analysis table (``time_ns, stage, ctas``), on the lower axes.

    Stacked on the server (each stage's line is the running sum in stage order,
    filled down to the previous one) so that a stage's line keeps only the bins
    where its value or the sum changes: a step line needs no more, and narrow
    zooms send a few points instead of a full row of bins per stage."""
    if table is None or table.num_rows == 0:
        return []
    t_ns = rows.numpy(table.column("time_ns"))
    st = table.column("stage")
    if pa.types.is_dictionary(st.type):
        st = st.cast(pa.string())
    st = np.asarray(st.to_pylist(), dtype=object)
    c = rows.numpy(table.column("ctas")).astype(np.float64)
    times = np.unique(t_ns)
    col = np.searchsorted(times, t_ns)
    own = np.zeros((len(stages), times.size))
    for k, s in enumerate(stages):
        m = st == data.stage_names[s]
        own[k, col[m]] = c[m]
    cum = np.cumsum(own, axis=0)
    x = (times / 1e3).astype(_xdtype(data.t_max))
    out = []
    for k, s in enumerate(stages):
        if not own[k].any():
            continue
        keep = np.ones(times.size, dtype=bool)
        keep[1:-1] = (cum[k, 1:-1] != cum[k, :-2]) | (own[k, 1:-1] != own[k, :-2])
        name = data.stage_names[s]
        out.append({
            "type": "scatter", "mode": "lines", "x": typed(x[keep]), "y": typed(cum[k, keep].astype(np.float32)),
            "customdata": typed(own[k, keep].astype(np.float32)),
            "fill": "tonexty" if out else "tozeroy", "line": {"width": 0.5, "shape": "hv", "color": stage_colour(s)},
            "fillcolor": stage_colour(s), "name": name, "legendgroup": name, "showlegend": False,
            "hovertemplate": f"{name}: %{{customdata:.1f}} CTAs<extra></extra>",
            "xaxis": "x2", "yaxis": "y2", "meta": {"kind": "concurrency", "stage": name},
        })
    return out


def _notes(note: str, concurrency_note: str) -> list:
    """The figure's annotations: ``note`` across the Gantt, ``concurrency_note``
    across the concurrency chart (none for an empty text)."""
    out = []
    if note:
        out.append({"text": note, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                    "showarrow": False, "font": {"size": 16, "color": "#666"}})
    if concurrency_note:
        out.append({"text": concurrency_note, "xref": "x2 domain", "yref": "y2 domain", "x": 0.5, "y": 0.5,
                    "showarrow": False, "font": {"color": "#888"}})
    return out


def _separators(bounds) -> list:
    """Horizontal lines between row groups (``row_ticks``' bounds), darker between
    major groups; at most ``MAX_SEPARATORS``."""
    return [{"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": b - 0.5,
             "y1": b - 0.5, "line": {"color": "#444" if major else "#bbb", "width": 1.2 if major else 0.6}}
            for b, major in bounds[:MAX_SEPARATORS]]


def gantt_figure(data: M.TraceData, view: M.View, *, r0: int, r1: int, t0_ns: int, t1_ns: int,
                 class_ok=None, stages=None, width_px: int = 1200, height_px: int = 560,
                 bar_limit: int = BAR_LIMIT, gl_limit: int | None = None, concurrency: pa.Table | None = None,
                 concurrency_note: str = "", title: str = "", note: str = "") -> tuple:
    """The Gantt (rows ``[r0, r1)`` x ``[t0_ns, t1_ns]``) above the stage
    concurrency chart on a shared time axis: exact bars while the window holds at
    most ``bar_limit`` intervals in at most ``ROWS_PER_PX`` rows per pixel row of
    ``height_px``, else the raster; bars beyond ``gl_limit`` (None: no limit) as one
    image. Returns ``(figure dict, info)``; ``info`` holds ``mode``
    (``bars``/``raster``/``empty``), ``drawn`` (``webgl``/``image``/``none``),
    ``intervals`` and ``rows`` in view."""
    stages = list(range(len(data.stage_names))) if stages is None else list(stages)
    r0, r1 = max(int(r0), 0), min(int(r1), view.n_rows)
    pos = M.window(view, r0, r1, t0_ns, t1_ns, data.t_min, class_ok)
    n_rows = max(r1 - r0, 0)
    if pos.size == 0:
        mode, drawn, traces = "empty", "none", []
    elif pos.size <= bar_limit and n_rows <= ROWS_PER_PX * height_px:
        mode = "bars"
        if gl_limit is None or pos.size <= gl_limit:
            drawn, traces = "webgl", bar_traces(data, view, pos, height_px / max(n_rows, 1))
        else:
            drawn = "image"
            traces = [raster_trace(data, view, pos, r0, r1, t0_ns, t1_ns, width_px, height_px, bands=True)]
            traces += mark_traces(data, data.tid[view.order[pos]], view.row[pos], 1.0)
    else:
        mode, drawn = "raster", "image"
        traces = [raster_trace(data, view, pos, r0, r1, t0_ns, t1_ns, width_px, height_px)]
    traces = traces + concurrency_traces(concurrency, data, stages) + legend_traces(data, stages)
    vals, text, bounds = row_ticks(data, view, r0, r1)
    shapes = _separators(bounds)
    x_range = [t0_ns / 1e3, t1_ns / 1e3]
    annotations = _notes(note, concurrency_note)
    layout = {
        "template": {"layout": {"font": {"family": "Inter, Helvetica, Arial, sans-serif", "size": 12}}},
        "title": {"text": title, "x": 0.01, "font": {"size": 14}} if title else None,
        "height": figure_height(height_px),
        "margin": {"l": MARGIN_L, "r": MARGIN_R, "t": 40 if title else 20, "b": 40},
        "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff",
        "hovermode": "closest", "hoverdistance": 30, "dragmode": "zoom",
        "showlegend": True, "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0,
                                       "itemclick": False, "itemdoubleclick": False},
        "xaxis": {"domain": [0, 1], "anchor": "y", "range": x_range, "matches": "x2", "showticklabels": False,
                  "showgrid": True, "gridcolor": "#eee", "zeroline": False, "showspikes": True,
                  "spikemode": "across", "spikethickness": 1},
        "yaxis": {"domain": list(GANTT_DOMAIN), "range": [r1 - 0.5, r0 - 0.5] if n_rows else [0.5, -0.5],
                  "tickmode": "array", "tickvals": vals, "ticktext": text, "showgrid": False,
                  "zeroline": False, "automargin": False, "tickfont": {"size": 10},
                  "scaleanchor": False},  # an image trace would otherwise lock the aspect ratio
        "xaxis2": {"domain": [0, 1], "anchor": "y2", "range": x_range,
                   "title": {"text": "time (µs from trace origin)"}, "showgrid": True, "gridcolor": "#eee",
                   "zeroline": False},
        "yaxis2": {"domain": list(CONC_DOMAIN), "title": {"text": "CTAs in stage"}, "fixedrange": True,
                   "rangemode": "tozero", "showgrid": True, "gridcolor": "#eee"},
        "shapes": shapes, "annotations": annotations,
        "meta": {"mode": mode, "drawn": drawn, "intervals": int(pos.size), "rows": [r0, r1], "n_rows": view.n_rows,
                 "window_ns": [int(t0_ns), int(t1_ns)]},
    }
    if drawn == "image":
        layout["yaxis"]["autorange"] = False
    info = {"mode": mode, "intervals": int(pos.size), "rows": n_rows}
    return {"data": traces, "layout": layout}, info
