"""The MCP server's tools about its sources rather than one analysis: ``list_sources``,
``schema`` (the views and their columns, the phase meanings, the limits) and ``sql``
(one read-only SELECT, ``timeline.mcp.sql``), and each source's ``info`` resource. No
``timeline`` command prints these; their ``reproduce`` line is the server's own
one-shot form, ``timeline mcp SOURCES --call TOOL ARGUMENTS``."""

from __future__ import annotations

import json
import shlex
from urllib.parse import quote

from timeline.mcp import sql as MS
from timeline.mcp import texts as MT
from timeline.mcp.args import MAX_SQL, Param
from timeline.mcp.tools import SOURCE, line

MAX_DETAILED = 50  # sources list_sources opens to say what they hold (the rest: name, path, kind)


def info_uri(name: str) -> str:
    return f"timeline://sources/{quote(name, safe='')}/info"


def call_line(ctx, tool: str, a: dict) -> str:
    """``timeline mcp SOURCES --call TOOL 'ARGUMENTS'``: this server's answer again."""
    given = {k: v for k, v in a.items() if v is not None}
    return "timeline " + shlex.join(["mcp", *ctx.argv, "--call", tool, json.dumps(given, sort_keys=True)])


def info(ctx, name: str) -> dict:
    """What a source holds (``timeline.source_info/1``): its kernel, ranks, launches,
    stages, phases, whether it has a task graph, notes; a run's appends and damaged parts."""
    e, src = ctx.sources.get(name)
    spec = src.spec()
    out = {"schema": "timeline.source_info/1", "name": e.name, "path": e.path, **src.about(), "head": src.head(),
           "ranks": src.ranks(), "launches": src.times().num_rows, "stages": src.stage_names(),
           "phases": list(spec.phases), "wait": list(spec.wait or ()), "marks": list(spec.marks or ()),
           "graph": bool(spec.graph), "notes": list(src.notes), "reproduce": line(["launches", e.path])}
    if src.kind == "run":
        run = src.run
        out.update(appends=len(run.records), bytes=sum(p["bytes"] for r in run.records for p in r["parts"]),
                   intervals=run.intervals_total, damaged=[{"part": p, "why": w} for p, w in run.damaged])
    else:
        out.update(intervals=src.loaded.intervals.num_rows, task_rows=src.loaded.tasks.num_rows,
                   anomalies=src.loaded.anomaly_summary())
    return out


def _detail(ctx, name: str) -> dict | None:
    """What ``list_sources`` says of an opened source, or None when it cannot be read
    (then ``Sources.skip`` notes why: one bad file never fails the whole listing)."""
    from timeline.errors import TimelineError

    e = ctx.sources.entries[name]
    try:
        _, src = ctx.sources.get(name)
        return {**src.about(), "launches": src.times().num_rows, "ranks": src.ranks(),
                "reproduce": line(["launches", e.path])}
    except (TimelineError, OSError) as err:
        if name in ctx.sources.entries:  # an OSError: get noted nothing
            ctx.sources.skip(name, " ".join(str(err).split())[:500])
        return None


def t_list_sources(ctx, a):
    ctx.sources.recheck()
    rows = []
    for i, name in enumerate(ctx.sources.names()):
        e = ctx.sources.entries[name]
        row = {"name": e.name, "path": e.path, "kind": e.kind, "info": info_uri(e.name)}
        if i < MAX_DETAILED:
            more = _detail(ctx, name)
            if more is None:
                continue
            row.update(more)
        rows.append(row)
    skipped = [{"name": n, "why": w} for n, w in sorted(ctx.sources.skipped.items())]
    doc = {"schema": "timeline.sources/1", "sources": rows, "skipped": skipped, "root": ctx.sources.root}
    note = "each source's reproduce line prints its launches document (its kind, kernel, synthetic and launches)"
    return doc, call_line(ctx, "list_sources", a), {"columns": [], "rows": [], "sql": None, "truncated": None,
                                                    "note": note}, []


def t_schema(ctx, a):
    from timeline.contract import schema as S
    from timeline.mcp import sandbox as SB

    e, src = ctx.sources.get(a["source"])
    spec = src.spec()
    doc = {"schema": "timeline.schema/1", "source": e.name, "kind": e.kind, "views": MS.describe(ctx.connection(e, src)),
           "launch_key_sql": MS.KEY_SQL[e.kind], "phases": list(spec.phases),
           "intervals": list(S.interval_names(spec.phases)), "wait": list(spec.wait or ()),
           "marks": list(spec.marks or ()), "meanings": MT.phase_meanings(),
           "limits": {"max_rows": ctx.max_rows, "max_bytes": MS.MAX_BYTES, "time_limit_s": ctx.time_limit,
                      "process_bytes": SB.RSS_LIMIT, "duckdb_memory_mb": SB.DUCKDB_MB, "statements": "one SELECT"},
           "notes": ["a run's views: timeline.run.views (docs/RUN.md); a trace file's tables: docs/FORMAT.md section 4, "
                     "each with its launch's printed key (`key`)",
                     f"a row's launch key in SQL: {MS.KEY_SQL[e.kind]}"]}
    return doc, call_line(ctx, "schema", a), {"columns": [], "rows": [], "sql": None, "truncated": None,
                                              "note": "the views' own definitions"}, []


def t_sql(ctx, a):
    e = ctx.sources.entry(a["source"])
    limit = min(a["max_rows"] or ctx.max_rows, ctx.max_rows)
    r = ctx.sql(e, a["query"], limit)
    doc = {"schema": "timeline.sql/1", "source": e.name, "kind": e.kind, "query": a["query"], **r,
           "limits": {"max_rows": limit, "max_bytes": MS.MAX_BYTES, "time_limit_s": ctx.time_limit}}
    return doc, call_line(ctx, "sql", a), {"columns": [], "rows": [], "sql": a["query"], "truncated": None,
                                           "note": "the rows are the evidence"}, []


CATALOG = {
    "list_sources": ("The trace files and runs this server may read: name (what the other tools take), path, kind, "
                     "kernel, synthetic, launches, ranks, and each one's info resource.", (), t_list_sources),
    "schema": ("The views the sql tool reads (tasks, intervals, launches, stages, anomalies) and their columns, the "
               "source's phases and intervals with their meanings, a launch key's SQL, the limits.", (SOURCE,),
               t_schema),
    "sql": ("One read-only DuckDB SELECT over a source's views (tasks, intervals, launches, stages, anomalies; the "
            "schema tool lists their columns): external access off, a row limit and a time limit, the memory budget.",
            (SOURCE, Param("query", "string", "one SELECT (WITH / FROM / DESCRIBE / SUMMARIZE too)", required=True,
                           hi=MAX_SQL),
             Param("max_rows", "integer", "rows to return (at most the server's limit)", lo=1, hi=100_000)), t_sql),
}


__all__ = ["CATALOG", "MAX_DETAILED", "call_line", "info", "info_uri"]
