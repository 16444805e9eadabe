"""The stage reports and per-launch analyses of a trace file or run as documents: a run's
stage summary (per stage p50 / p90 / p99 over its launches), the per-(rank, launch)
stage report, each selected launch's critical path, the p99 launch against the p50
one, what held each wait (edges), and the what-if replay. ``timeline summary`` /
``edges`` / ``whatif`` print them; the MCP server returns them. Every launch by its key;
every number by ``timeline.analysis.launches``' definitions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from timeline.analysis import launches as LA
from timeline.core import rows as R
from timeline.query import launches as QL
from timeline.query.source import QueryError

KEYS = ("step", "layer", "capture", "slot")


def json_rows(table) -> list:
    """Table rows as dicts, NaN as null (JSON has no NaN)."""
    rows = table.to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and v != v:
                r[k] = None
    return rows


def run_summary(src, sel, worst: int = 5) -> dict:
    """A run's (or a trace file's) stage summary over the selected launches: per stage
    p50 / p90 / p99 of its span and of each launch's median interval, from the per-launch
    stage reports (a run's stored ones: no task row read); the ``worst`` slowest
    launches; the kernel figures."""
    from timeline.run import report as RP

    stages = src.stage_rows(sel)
    table = RP.stage_summary(stages.drop_columns(["key"]))
    times = sel.times
    top = LA.slowest(LA.kernel(times), worst)
    return {**src.about(), "report": "run_stage_summary", "launches": times.num_rows,
            "pairs": len(set(zip(stages.column("rank").to_pylist(), stages.column("key").to_pylist()))),
            "rows": json_rows(table), "worst": QL.rows(times.take(R.arrow(np.asarray(top, np.int64)))),
            "kernel_time": QL.stats(times)}


def stage_report(src, sel, union: bool = False) -> dict:
    """A trace file's stage report of the selection: a typical launch (the median of
    every column over its (rank, launch) pairs, times from each launch's own first start;
    ``worst span_us`` and ``launches``) where it holds several, else (or with ``union``)
    the report of the whole scope."""
    from timeline.analysis import compare as C
    from timeline.analysis import stages as A

    trace = src.trace(sel)
    pairs = C.launch_pairs(trace)
    typical = pairs > 1 and not union
    table = C.typical_launch(trace) if typical else A.stage_report(trace)
    return {**src.about(), "report": "typical_launch" if typical else "stage", "by_launch": False, "pairs": pairs,
            "units": {"*_us": "µs from the earliest start of the scope", "share": "fraction"},
            "anomalies": trace.anomaly_summary(), "rows": json_rows(table)}


def by_launch(src, sel) -> dict:
    """One stage report row per (rank, launch, stage) of the selection, the launch by its
    key (a run's from its stored reports)."""
    rows = src.stage_rows(sel)
    front = ["key", "rank", "stage"]
    rows = rows.select(front + [c for c in rows.column_names if c not in front and c not in
                                ("launch", "step", "layer", "capture", "append")])
    rows = rows.rename_columns(["launch"] + rows.column_names[1:])
    return {**src.about(), "report": "stage", "by_launch": True, "rows": json_rows(rows)}


def critical_paths(src, sel, progress=None) -> dict:
    """Each selected launch's critical path (exact along the task graph when there is
    one, else each rank's heuristic path), µs from the path's first start, by key."""
    from timeline.analysis.critical import path_us

    rows = []
    for p in src.map(sel, "critical_path", progress=progress):
        key = p.column("launch")[0].as_py() if p.num_rows else None
        rows += [{"launch": key, **r} for r in json_rows(path_us(p.drop_columns(["launch"])))]
    return {**src.about(), "report": "critical_path", "exact": bool(src.spec().graph), "rows": rows}


def path_tables(src, sel, progress=None) -> list:
    """``[(key, path, shares or None)]``: each selected launch's critical path (the
    analysis' table) and, exact, its stages' shares (what the text shows)."""
    from timeline.analysis import edges as E

    out = []
    for key, p in zip(sel.keys, src.map(sel, "critical_path", progress=progress)):
        out.append((key, p, E.path_shares(p) if "via" in p.column_names and p.num_rows else None))
    return out


def p99(src, sel) -> dict:
    """The p99 launch, its critical path's stage shares and its per-stage delta against
    the p50 launch (both by ``launches``' definitions)."""
    from timeline.analysis import compare as C
    from timeline.analysis import edges as E
    from timeline.analysis.critical import path_us

    times = sel.times
    k = LA.kernel(times)
    at99, at50 = LA.at_quantile(k, 0.99), LA.at_quantile(k, 0.5)
    if at99 is None:
        raise QueryError(f"{src.name} has no timed launch in this selection")
    keys = LA.keys(times)
    pick = sel._replace(times=times.take(R.arrow(np.asarray([at99], np.int64))), keys=[keys[at99]])
    path = src.map(pick, "critical_path")[0]
    rows = src.stage_rows(sel._replace(times=times.take(R.arrow(np.asarray([at50, at99], np.int64))),
                                       keys=[keys[at50], keys[at99]]))
    drop = [c for c in ("step", "layer", "capture", "append") if c in rows.column_names]

    def of(key):
        return rows.filter(pc.equal(rows.column("key"), R.scalar(str(key), pa.string()))).drop_columns(drop + ["key"])

    delta = C.compare_table(C.median_per_stage(of(keys[at50])), C.median_per_stage(of(keys[at99])))
    shares = E.path_shares(path) if path.num_rows and "via" in path.column_names else \
        path_us(path.drop_columns(["launch"]))
    return {**src.about(), "report": "p99_launch", "p99_launch": str(keys[at99]), "p50_launch": str(keys[at50]),
            "p99_kernel_us": QL.us(k[at99]), "p50_kernel_us": QL.us(k[at50]), "launches": times.num_rows,
            "kernel_time": QL.stats(times), "delta": delta, "path_shares": json_rows(shares)}


def edges(src, sel, progress=None) -> dict:
    """Per selected launch and stage: what held each task's wait (its gating edge), the
    median slack of the others, causality violations."""
    tables = src.map(sel, "edges", progress=progress)
    table = pa.concat_tables(tables, promote_options="permissive")
    table = table.drop_columns([c for c in KEYS if c in table.column_names])
    return {**src.about(), "report": "edges", "rows": json_rows(table)}


def edge_list(src, sel):
    """``(edges table of the selection, totals)``: every edge (consumer, producer, kind,
    slack_ns, gating), its launch's key beside its launch number; the selection read as
    one Trace (a run's within its memory budget)."""
    from timeline.analysis import edges as E

    trace = src.trace(sel)
    g = E.edges(trace)
    table = E.edges_table(trace, g)
    if "launch" in table.column_names and table.num_rows:
        keys = trace.launch_keys
        at = table.schema.get_field_index("launch")
        table = table.add_column(at + 1, "launch_key", pa.array(
            [str(keys.get(int(x), x)) for x in table.column("launch").to_pylist()], pa.string()))
    return table, {"edges": g.edge_count, "violations": int(g.violations.size), "missing": g.missing}


def whatif(src, sel, changes, progress=None) -> dict:
    """Each selected launch replayed with ``changes`` (``whatif.parse_change``'s): its
    measured and predicted kernel time; a trace file's whole selection in one replay, its
    stages and the replay's fidelity beside."""
    from timeline.analysis import whatif as W

    stages = fid = None
    if src.kind == "trace":
        trace = src.trace(sel)
        p = W.predict(trace, changes)
        keys = trace.launch_keys

        def keyed(t):
            return t.set_column(0, "launch", pa.array([str(keys[int(x)]) for x in t.column("launch").to_pylist()],
                                                      pa.string()))

        launches, stages, fid = keyed(p.launches), keyed(p.stages), p.fidelity
    else:
        launches = pa.concat_tables(src.map(sel, "whatif", {"changes": changes}, progress=progress),
                                    promote_options="permissive")
        launches = launches.drop_columns([c for c in KEYS if c in launches.column_names])
    return {**src.about(), "report": "whatif", "changes": [c._asdict() for c in changes],
            "fidelity": fid._asdict() if fid else None, "launches": json_rows(launches),
            "stages": json_rows(stages) if stages is not None else None}


__all__ = ["by_launch", "critical_paths", "stage_report", "edge_list", "edges", "json_rows", "p99", "path_tables", "run_summary",
           "whatif"]
