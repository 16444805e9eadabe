"""The evidence rows a tool's answer rests on: task rows of the source, each ``rank,
launch`` (its key), ``stage, task, cta, phase, ns``, at most ``ROWS`` of them, read by
one SQL query over the source's sandboxed views (``timeline.mcp.sql``) that comes back
with them, so a caller can run it again with the ``sql`` tool. What each tool cites:
a launch's kernel time rests on its first start and last end; a culprit on its task
rows' intervals; a what-if on the changed intervals; a path on its own rows."""

from __future__ import annotations

from timeline.mcp import sql as MS

ROWS = 50  # evidence rows one answer carries
COLUMNS = ("rank", "launch", "stage", "task", "cta", "phase", "ns")


def _lit(v) -> str:
    """A SQL literal of a str or int."""
    return str(int(v)) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"


def launch_where(kind: str, keys) -> str:
    """SQL true for the rows of these launches (``LaunchKey``s or their printed forms):
    a run's by step and layer (its partitions and statistics prune the scan), or
    capture and slot; a trace file's by its ``key`` column."""
    from timeline.core import launchkey as KY

    if not keys:
        return "false"
    if kind == "trace":
        return f"key IN ({', '.join(_lit(str(k)) for k in keys)})"
    parts = []
    for k in keys:
        k = k if isinstance(k, KY.LaunchKey) else KY.parse_keys(str(k))[0]
        if k.headed:
            parts.append(f"(step = {k.step} AND layer = {k.layer})")
        elif k.capture is not None:
            parts.append(f"(capture = {_lit(k.capture)} AND launch = {k.slot})")
        else:
            parts.append(f"(launch = {k.slot})")
    return "(" + " OR ".join(parts) + ")"


def none(why: str) -> dict:
    """No evidence rows, and why."""
    return {"columns": list(COLUMNS), "rows": [], "sql": None, "truncated": None, "note": why}


def query(con, inside, sql_text: str, note: str, rows: int = ROWS) -> dict:
    """The evidence ``sql_text`` selects (``COLUMNS``), bounded."""
    r = MS.run(con, sql_text, inside, max_rows=rows)
    return {"columns": [c["name"] for c in r["columns"]], "rows": r["rows"], "sql": sql_text,
            "truncated": r["truncated"], "note": note}


def extent_sql(kind: str, phases, keys) -> str:
    """Per launch of ``keys``: its task row of the earliest stamp and of the latest (what
    its kernel time is measured between)."""
    cols = ", ".join(f'"{p}_ns"' for p in phases)
    key = MS.KEY_SQL[kind]
    parts = []
    for k in keys:
        w = launch_where(kind, [k])
        parts.append(f"(SELECT rank, {key} AS launch, stage, task, cta, 'first stamp' AS phase, least({cols}) AS ns "
                     f"FROM tasks WHERE {w} ORDER BY ns ASC NULLS LAST LIMIT 1)")
        parts.append(f"(SELECT rank, {key} AS launch, stage, task, cta, 'last stamp' AS phase, greatest({cols}) AS ns "
                     f"FROM tasks WHERE {w} ORDER BY ns DESC NULLS LAST LIMIT 1)")
    return " UNION ALL ".join(parts)


def intervals_sql(kind: str, keys, where: str, order: str = "ns DESC", limit: int = ROWS) -> str:
    """The intervals of ``keys`` (None: every launch) that ``where`` selects, as evidence rows."""
    cond = " AND ".join(x for x in (launch_where(kind, keys) if keys is not None else "", where) if x) or "true"
    return (f"SELECT rank, {MS.KEY_SQL[kind]} AS launch, stage, task, cta, phase, duration_ns AS ns FROM intervals "
            f"WHERE {cond} ORDER BY {order} LIMIT {int(limit)}")


def interval_of(phases, end_phase: str) -> str | None:
    """The interval name (``compute→end``) that ends at ``end_phase``."""
    from timeline.contract import schema as S

    return next((n for n in S.interval_names(phases) if n.endswith("→" + end_phase)), None)


def culprit_sql(kind: str, phases, culprits) -> str | None:
    """The intervals of the culprits' task rows (``explain``'s records: their
    ``evidence.rows`` and ``phase``), the longest first."""
    terms = []
    for c in culprits:
        name = interval_of(phases, c.get("phase") or "")
        for r in (c.get("evidence") or {}).get("rows", []):
            if name is None or r.get("task") is None:
                continue
            terms.append(f"({launch_where(kind, [r['launch']])} AND rank = {int(r['rank'])} AND stage = "
                         f"{_lit(r['stage'])} AND task = {int(r['task'])} AND phase = {_lit(name)})")
    if not terms:
        return None
    return (f"SELECT rank, {MS.KEY_SQL[kind]} AS launch, stage, task, cta, phase, duration_ns AS ns FROM intervals "
            f"WHERE {' OR '.join(terms[:ROWS])} ORDER BY ns DESC LIMIT {ROWS}")


def path_rows(rows: list, limit: int = ROWS) -> dict:
    """A critical path's own rows as evidence (``phase``: the row's kind, wait / work /
    idle; ``ns``: its duration), the longest first."""
    out = sorted(([r.get("rank"), r.get("launch"), r.get("stage"), r.get("task"), r.get("cta"), r.get("kind"),
                   None if r.get("duration_us") is None else round(r["duration_us"] * 1000)] for r in rows),
                 key=lambda r: -(r[6] or 0))
    more = len(out) - limit
    return {"columns": list(COLUMNS), "rows": out[:limit], "sql": None,
            "truncated": f"truncated: {more:,} more rows" if more > 0 else None,
            "note": "the critical path's rows, the longest first (phase: wait, work or idle)"}


__all__ = ["COLUMNS", "ROWS", "culprit_sql", "extent_sql", "interval_of", "intervals_sql", "launch_where", "none",
           "path_rows", "query"]
