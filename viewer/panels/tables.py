"""The table panels below the Gantt: the stage report, idle time per CTA, the
compare tab (two traces, stage spans overlaid, the B - A table), and sorting any of
them by a column (the state a table keeps in its ``*-data`` store)."""

from __future__ import annotations

import functools
import math

import numpy as np

from timeline.analysis import stages as A
from timeline.analysis import compare as C
from timeline.core import rows
from timeline.analysis.critical import EXACT, critical_path, path_method, path_us
from viewer import charts as CH
from viewer.client import sorted_ints
from viewer.page import grid, msg, table_records


def stage_report(app, name, ranks, launches, by_launch):
    """``(columns, rows, message)`` of the stage report of a selection."""
    item = app.store.get(name)
    ranks, launches = sorted_ints(ranks), sorted_ints(launches)
    if item.data.n == 0:
        return [], [], msg("no intervals: no stage report", "info")
    t = app.analysis(item, ("report", ranks, launches, bool(by_launch)), lambda: A.stage_report(
        item.trace, by_launch=bool(by_launch), ranks=ranks, launches=launches))
    if not by_launch:
        t = t.drop_columns([c for c in ("rank", "launch") if c in t.column_names])
    cols, rows = table_records(t)
    return cols, rows, None


def idle(app, name, ranks, launches):
    """``(figure, columns, rows, message)``: idle time per CTA, the 200 idlest in the table."""
    item = app.store.get(name)
    ranks, launches = sorted_ints(ranks), sorted_ints(launches)
    if item.data.n == 0:
        return CH.idle_figure(None), [], [], None
    t = app.analysis(item, ("idle", ranks, launches), lambda: A.idle_per_cta(
        item.trace, ranks=ranks, launches=launches))
    top = t.take(np.argsort(-np.nan_to_num(rows.numpy(t.column("idle_share"))),
                            kind="stable")[:200])
    cols, records = table_records(top)
    left_out = A.unplaced_rows(t)  # rows without a placement word: no CTA to charge their idle time to
    note = msg(f"{left_out} task rows without a placement word are not in this table (their CTA is unknown; "
               "they are on the Gantt's unplaced rows)", "info") if left_out else None
    return CH.idle_figure(t), cols, records, note


IDLE_GAPS = 200  # the largest gaps the idle tab lists


def gaps(app, name, ranks, launches):
    """``(columns, rows)``: the ``IDLE_GAPS`` largest gaps between a wave's tasks
    (``analysis.idle_gaps``), with the stages before and after each."""
    item = app.store.get(name)
    ranks, launches = sorted_ints(ranks), sorted_ints(launches)
    if item.data.n == 0:
        return [], []
    t = app.analysis(item, ("gaps", ranks, launches), lambda: A.idle_gaps(item.trace, ranks=ranks, launches=launches))
    return table_records(t.take(np.argsort(-rows.numpy(t.column("duration_ns")), kind="stable")[:IDLE_GAPS]))


def critical(app, name, ranks, launches):
    """``(columns, rows, message)``: the critical path (``timeline.analysis.critical``) of one
    (rank, launch): the first of the selected ones, by default the trace's first."""
    item = app.store.get(name)
    tr = item.trace
    if item.data.n == 0:
        return [], [], msg("no intervals: no critical path", "info")
    rank = sorted_ints(ranks)[0] if ranks else tr.ranks[0]
    launch = sorted_ints(launches)[0] if launches else tr.launches[0]
    path = app.analysis(item, ("critical", rank, launch), lambda: critical_path(tr, rank=rank, launch=launch))
    key = tr.launch_keys.get(launch, launch)  # the launch as every command names it
    cols, rows = table_records(path_us(path))
    if path_method(path) == EXACT:
        from timeline.analysis import edges as E

        shares = ", ".join(f"{r['stage']} {r['share']:.0%}" for r in E.path_shares(path).to_pylist()) \
            if path.num_rows else "-"
        return cols, rows, msg(f"rank {rank} · launch {key}: the exact critical path along the task graph's "
                               f"gating edges, from the launch's last end; per stage: {shares}", "info")
    note = msg(f"rank {rank} · launch {key} (the first of the selection): the chain of work, waits and idle "
               "time behind the launch's last end, walked back from it; a heuristic (the stamps say when a "
               "wait ended, not which producer released it; declare the task graph for the exact one)", "info")
    return cols, rows, note


NO_FIGURE = {"data": [], "layout": {"height": 60}}


def whatif(app, name, scales):
    """``(figure, columns, rows, message)``: for ``scales`` (``"norm.compute=0.5,
    up=1.2"``; ``+NS`` adds) the measured and predicted stage spans side by side as
    the compare view draws them (median over launches), per launch the measured and
    predicted kernel time, and the replay's fidelity (``timeline.analysis.whatif``)."""
    from timeline.analysis import whatif as W

    item = app.store.get(name)
    if not item.trace.spec.graph:
        return NO_FIGURE, [], [], msg("the what-if replay needs the trace's task graph: timeline set-graph TRACE "
                                      "--preset NAME -o OUT", "info")
    parts = [p.strip() for p in str(scales or "").split(",") if p.strip()]
    if not parts:
        return NO_FIGURE, [], [], msg("type changes, e.g. norm.compute=0.5, up=1.2 (a factor) or "
                                      "norm.compute=+1000 (ns added to every task)", "info")
    changes = [W.parse_change(p.replace("=+", "="), add=True) if "=+" in p else W.parse_change(p) for p in parts]
    pred = app.analysis(item, ("whatif", tuple(changes)), lambda: W.predict(item.trace, changes))
    cols, rows = table_records(pred.launches)
    f = pred.fidelity
    fig = CH.stage_span_figure(_median_spans(pred.stages, ", ".join(parts)), list(item.trace.spec.stage_names))
    fig["layout"]["xaxis"]["title"]["text"] = "µs from the launch's first start (median over launches)"
    return fig, cols, rows, msg(f"predicted by replaying the recorded schedule over the task graph; the unchanged "
                                f"replay reproduces every task's end within {f.task_end_ns:g} ns and every "
                                f"launch's within {f.kernel_end_ns:g} ns", "info")


def _median_spans(stages, label: str) -> dict:
    """``stage_span_figure``'s input from a prediction's per-launch stage rows: per
    stage the median over launches of first start and last end, measured and predicted."""
    out = {"measured": {}, f"predicted ({label})": {}}
    rows = stages.to_pylist()
    for stage in dict.fromkeys(r["stage"] for r in rows):
        mine = [r for r in rows if r["stage"] == stage]
        for key, kind in zip(out, ("measured", "predicted")):
            out[key][stage] = (float(np.median([r[f"{kind}_first_us"] for r in mine])),
                               float(np.median([r[f"{kind}_last_us"] for r in mine])))
    return out


def segment_launch(app, name: str) -> str:
    """What the stage spans compare of a source: a run's step segment (``viewer.segments``)
    by its typical launch, any other name as it is."""
    from viewer import explained as XD
    from viewer import run_source as VRS
    from viewer import segments as VSG

    return VRS.launch_name(XD.whole(name), XD.typical_of(app, name)) if VSG.is_segment(name) else name


def compare(app, a, b, scope="launch"):
    """``(figure, columns, rows, message)``: the stage spans of traces ``a`` and ``b``
    overlaid and the per-stage delta table (``timeline.analysis.compare``). ``scope="launch"``:
    a typical launch of each (traces of different launch counts compare fairly);
    ``"trace"``: each trace whole."""
    if not a or not b:
        return {"data": [], "layout": {"height": 60}}, [], [], msg(
            "pick two traces (A before, B after) to compare", "info")
    ia, ib = app.store.get(segment_launch(app, a)), app.store.get(segment_launch(app, b))
    sa, sb = ia.trace.spec.stage_names, ib.trace.spec.stage_names
    note = None if sa == sb else msg(f"the traces have different stages ({len(sa)} vs {len(sb)}); only "
                                     "stages of both are compared", "warning")
    per_launch = scope != "trace"
    ra, rb = (C.typical(app.analysis(item, ("report", None, None, per_launch), functools.partial(
        A.stage_report, item.trace, by_launch=per_launch)), per_launch) for item in (ia, ib))
    table = C.compare_table(ra, rb)
    spans = {}
    for label, r in ((f"A: {a}", ra), (f"B: {b}", rb)):
        spans[label] = {s: (f, e) for s, f, e in zip(r.column("stage").to_pylist(),
                                                     r.column("first_start_us").to_pylist(),
                                                     r.column("last_end_us").to_pylist())
                        if f is not None and e is not None and not (math.isnan(f) or math.isnan(e))}
    cols = [{"name": k, "id": k, "type": "text" if k == "stage" else "numeric"} for k in table[0]] if table else []
    fig = CH.stage_span_figure(spans, [s for s in sa if s in set(sb)])
    fig["layout"]["xaxis"]["title"]["text"] = ("µs from the launch's first start (median over launches)"
                                               if per_launch else "µs from the trace's first start")
    return fig, cols, table, note


def table_out(table_id, cols, rows, prev):
    """A table panel's children and data store, sorted as it was (``prev``)."""
    sort = (prev or {}).get("sort")
    sort = sort if sort and any(c["id"] == sort[0] for c in cols) else None
    return grid(table_id, cols, rows, sort), {"columns": cols, "rows": rows, "sort": sort}


def resort(table_id, data, col):
    """The table after a click on column ``col``'s header: sorted by it, ascending, or
    reversed on a second click; None where the click names no column."""
    if not data or not isinstance(col, int) or not 0 <= col < len(data["columns"]):
        return None
    key = data["columns"][col]["id"]
    sort = data.get("sort")
    data = dict(data, sort=[key, not sort[1] if sort and sort[0] == key else False])
    return grid(table_id, data["columns"], data["rows"], data["sort"]), data
