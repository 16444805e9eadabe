"""DuckDB (embedded, nothing to start) over a run: views ``tasks`` (the stored columns,
the Hive partition columns rank and step, capture, append and every ``<phase>_ns``
derived in SQL by the same exact formula as ``timeline.trace.retime``), ``intervals``
(one row per consecutive phase pair, the intervals table's inherit rule), ``launches``,
``stages`` and ``anomalies``. The views name the committed, undamaged parts only (a file
list, never a glob), so a part of an unfinished append is never read."""

from __future__ import annotations

import pyarrow as pa

from timeline.contract import schema as S
from timeline.run import layout as RL
from timeline.run import write as RW

NS_PER_S = 1_000_000_000


def _ns(tick: str, whole: bool) -> str:
    """SQL of a tick column's ns: ``floor((tick - origin) * 1e9 / hz) + offset``, exact in
    int64 like ``schema.ticks_to_ns``; NULL where the tick is 0 (unwritten). ``whole``:
    every clock of the run ticks a whole number of ns (1 GHz, 100 MHz), where that
    floor is ``(tick - origin) * ns_per_tick``: one multiply a value, not two
    divisions (the whole-run scans of ``bench/mcp.py`` took 2x as long)."""
    d = f"(nullif(t.{tick}, 0) - c.origin)"
    if whole:
        return f"{d} * c.ns_per_tick + c.offset"
    return f"({d} // c.hz) * {NS_PER_S} + (({d} % c.hz) * {NS_PER_S}) // c.hz + c.offset"


def _clocks(run) -> pa.Table:
    """One row per (append, rank): the origin tick, offset ns and tick rate of its axis, and
    its ns a tick where that is whole (else 0)."""
    rows = {"append": [], "rank": [], "origin": [], "offset": [], "hz": []}
    for rec in run.records:
        for d in rec["specs"]:
            sp = S.Spec.from_dict(d)
            rows["append"].append(rec["append"])
            rows["rank"].append(sp.rank)
            rows["origin"].append(int(rec["origins"].get(str(sp.rank), 0)))
            rows["offset"].append(int(rec["offsets"].get(str(sp.rank), 0)))
            rows["hz"].append(S.table_clock(sp).hz)
    rows["ns_per_tick"] = [NS_PER_S // hz if NS_PER_S % hz == 0 else 0 for hz in rows["hz"]]
    return pa.table({"append": pa.array(rows["append"], pa.string()), "rank": pa.array(rows["rank"], pa.int16()),
                     **{k: pa.array(rows[k], pa.int64()) for k in ("origin", "offset", "hz", "ns_per_tick")}})


def _files(run, table: str) -> tuple:
    """``(paths, {path: record})`` of ``table``'s committed parts, each checksum-checked."""
    paths, owner = [], {}
    for rec, e in run.parts(table):
        if run.verified(e):
            p = str(run.path / e["path"])
            paths.append(p)
            owner[p] = rec
    return paths, owner


def _list(paths) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _tasks_view(con, run) -> None:
    phases, marks = run.phases, run.marks
    paths, owner = _files(run, "tasks")
    if not paths:
        empty = S.tasks_schema(phases, marks).append(pa.field("capture", pa.string())).append(pa.field("append", pa.string()))
        con.register("_empty_tasks", pa.table({f.name: pa.array([], f.type) for f in empty}))
        con.execute("CREATE VIEW tasks AS SELECT * FROM _empty_tasks")
        return
    files = pa.table({"filename": paths, "append": [owner[p]["append"] for p in paths],
                      "capture": [owner[p]["capture"] for p in paths]})
    con.register("_files", files)
    clocks = _clocks(run)
    con.register("_clocks", clocks)
    whole = 0 not in clocks.column("ns_per_tick").to_pylist()
    ns = ", ".join(f"{_ns(f'{p}_tick', whole)} AS \"{p}_ns\"" for p in (*phases, *marks))
    keep = ", ".join(f't."{c}"' for c in RW.stored_task_columns(phases, marks))
    con.execute(
        f"CREATE VIEW tasks AS SELECT CAST(t.rank AS SMALLINT) AS rank, t.step, {keep}, {ns}, f.capture, f.append "
        f"FROM read_parquet({_list(paths)}, hive_partitioning=true, filename=true, "
        "hive_types={'rank': SMALLINT, 'step': BIGINT}) t "
        "JOIN _files f ON t.filename = f.filename JOIN _clocks c ON c.append = f.append AND c.rank = t.rank")


def _intervals_view(con, phases) -> None:
    """One SELECT per consecutive phase pair, UNION ALL: start and end with a missing
    phase inheriting the previous one's time (``rows.phase_intervals``)."""
    names = S.interval_names(phases)
    if not names:
        con.execute("CREATE VIEW intervals AS SELECT NULL LIMIT 0")
        return
    quoted = ['"' + p + '_ns"' for p in phases]
    ff = ["coalesce(" + ", ".join(reversed(quoted[:k + 1])) + ")" for k in range(len(phases))]
    base = "rank, step, layer, capture, append, launch, stage, stage_index, task, cta, wave, hw_unit, xcc, se, cu, sm"
    selects = []
    for j, name in enumerate(names):
        a, b = phases[j], phases[j + 1]
        selects.append(
            f"SELECT {base}, '{name}' AS phase, CAST({j} AS SMALLINT) AS phase_index, {ff[j]} AS start_ns, "
            f"{ff[j + 1]} AS end_ns, {ff[j + 1]} - {ff[j]} AS duration_ns, "
            f"NOT (\"{a}_ns\" IS NOT NULL AND \"{b}_ns\" IS NOT NULL) AS inherited "
            f"FROM tasks WHERE {ff[j]} IS NOT NULL AND {ff[j + 1]} >= {ff[j]}")
    con.execute("CREATE VIEW intervals AS " + " UNION ALL ".join(selects))


def _small_view(con, run, table: str) -> None:
    paths, _ = _files(run, table)
    if paths:
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_list(paths)}, union_by_name=true)")
        return
    empty = RL.empty_launches() if table == "launches" else (
        S.ANOMALIES_SCHEMA if table == "anomalies" else pa.schema([("rank", pa.int16()), ("launch", pa.int32()),
                                                                  ("stage", pa.string())]))
    if isinstance(empty, pa.Schema):
        empty = pa.table({f.name: pa.array([], f.type) for f in empty})
    con.register(f"_empty_{table}", empty)
    con.execute(f"CREATE VIEW {table} AS SELECT * FROM _empty_{table}")


def connect(run, *, threads: int | None = None):
    """A DuckDB connection with the run's views, its memory limit the budget (DuckDB
    spills past it rather than grow)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # it draws on stdout: a command's output is its report
    con.execute(f"SET memory_limit = '{max(RL.memory_budget() // (1 << 20), 64)}MB'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    _tasks_view(con, run)
    _intervals_view(con, run.phases)
    for table in ("launches", "stages", "anomalies"):
        _small_view(con, run, table)
    return con


def fetch(con, query: str, budget: int) -> pa.Table:
    """The query's result as an Arrow table, streamed in batches; past ``budget`` bytes it
    stops with the one memory-budget error line (``layout.over_budget``). A query DuckDB
    refuses is a ``RunError`` with DuckDB's first line."""
    import duckdb

    try:
        reader = con.sql(query).to_arrow_reader(1 << 16)
        batches, size = [], 0
        for b in reader:
            size += b.nbytes
            if size > budget:
                raise RL.over_budget("this query", size, budget)
            batches.append(b)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.Error as e:
        raise RL.RunError(f"query refused by DuckDB: {str(e).splitlines()[0]}") from None


__all__ = ["connect", "fetch"]
