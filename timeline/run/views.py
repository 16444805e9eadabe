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


def _ns(ticks: str, whole: bool) -> str:
    """SQL of the ns of ``ticks`` (an expression over ``_task_rows``, NULL where no stamp):
    ``floor((tick - origin) * 1e9 / hz) + offset``, exact in int64 like
    ``schema.ticks_to_ns``. ``whole``: every clock of the run ticks a whole number of ns
    (1 GHz, 100 MHz), where that floor is ``(tick - origin) * ns_per_tick``: one multiply
    a value, not two divisions (the whole-run scans of ``bench/mcp.py`` took 2x as long)."""
    d = f"(({ticks}) - _origin)"
    if whole:
        return f"({d} * _ns_per_tick + _offset)"
    return f"(({d} // _hz) * {NS_PER_S} + (({d} % _hz) * {NS_PER_S}) // _hz + _offset)"


def _stamped(col: str) -> str:
    """A tick column with 0 (unwritten) as NULL."""
    return f'nullif("{col}", 0)'


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


def _task_rows_view(con, run) -> bool:
    """View ``_task_rows``: the committed parts' stored task columns, the partition
    columns, ``capture`` / ``append`` and each row's clock (``_origin``, ``_offset``,
    ``_hz``, ``_ns_per_tick``); ``tasks`` and ``intervals`` derive their ns from it.
    True where every clock ticks whole ns (``_ns``)."""
    phases, marks = run.phases, run.marks
    paths, owner = _files(run, "tasks")
    clocks = _clocks(run)
    whole = 0 not in clocks.column("ns_per_tick").to_pylist()
    clock_cols = "c.origin AS _origin, c.offset AS _offset, c.hz AS _hz, c.ns_per_tick AS _ns_per_tick"
    if not paths:
        empty = S.tasks_schema(phases, marks).append(pa.field("capture", pa.string())).append(pa.field("append", pa.string()))
        for name in ("_origin", "_offset", "_hz", "_ns_per_tick"):
            empty = empty.append(pa.field(name, pa.int64()))
        con.register("_empty_tasks", pa.table({f.name: pa.array([], f.type) for f in empty}))
        con.execute("CREATE VIEW _task_rows AS SELECT * FROM _empty_tasks")
        return whole
    named = run.named  # appends read as captures of their own: no step or layer (captures.rekeyed)
    files = pa.table({"filename": paths, "append": [owner[p]["append"] for p in paths],
                      "capture": [named.get(owner[p]["append"], owner[p]["capture"]) for p in paths],
                      "keyed": [owner[p]["append"] not in named for p in paths]})
    con.register("_files", files)
    con.register("_clocks", clocks)
    # plain columns where no append is read as a capture of its own: a CASE on the Hive
    # partition column ``step`` stops DuckDB skipping the partitions a WHERE on it excludes
    step, layer = ("CASE WHEN f.keyed THEN t.step END", "CASE WHEN f.keyed THEN t.layer END") if named \
        else ("t.step", "t.layer")
    keep = ", ".join(f't."{c}"' if c != "layer" else f"{layer} AS layer" for c in RW.stored_task_columns(phases, marks))
    con.execute(
        f"CREATE VIEW _task_rows AS SELECT CAST(t.rank AS SMALLINT) AS rank, {step} AS step, "
        f"{keep}, f.capture, f.append, "
        f"{clock_cols} FROM read_parquet({_list(paths)}, hive_partitioning=true, filename=true, "
        "hive_types={'rank': SMALLINT, 'step': BIGINT}) t "
        "JOIN _files f ON t.filename = f.filename JOIN _clocks c ON c.append = f.append AND c.rank = t.rank")
    return whole


def _tasks_view(con, run, whole: bool) -> None:
    """View ``tasks``: ``_task_rows`` with every ``<phase>_ns`` / ``<mark>_ns`` derived."""
    phases, marks = run.phases, run.marks
    keep = ", ".join(f'"{c}"' for c in RW.stored_task_columns(phases, marks))
    ns = ", ".join(f"{_ns(_stamped(f'{p}_tick'), whole)} AS \"{p}_ns\"" for p in (*phases, *marks))
    con.execute(f"CREATE VIEW tasks AS SELECT rank, step, {keep}, {ns}, capture, append FROM _task_rows")


def _intervals_view(con, phases, whole: bool) -> None:
    """One SELECT per consecutive phase pair, UNION ALL: start and end with a missing
    phase inheriting the previous one's time (``rows.phase_intervals``). The inheriting
    is done on ticks and converted once (ns of the first stamp = the first stamp's ns);
    with whole-ns clocks the ``end >= start`` filter compares ticks too (ns rise with
    ticks there), so it runs before the rows meet their clocks."""
    names = S.interval_names(phases)
    if not names:
        con.execute("CREATE VIEW intervals AS SELECT NULL LIMIT 0")
        return
    stamped = [_stamped(f"{p}_tick") for p in phases]
    ff = ["coalesce(" + ", ".join(reversed(stamped[:k + 1])) + ")" for k in range(len(phases))]
    base = "rank, step, layer, capture, append, launch, stage, stage_index, task, cta, wave, hw_unit, xcc, se, cu, sm"
    selects = []
    for j, name in enumerate(names):
        a, b = phases[j], phases[j + 1]
        s, e = _ns(ff[j], whole), _ns(ff[j + 1], whole)
        rising = f"{ff[j + 1]} >= {ff[j]}" if whole else f"{e} >= {s}"
        selects.append(
            f"SELECT {base}, '{name}' AS phase, CAST({j} AS SMALLINT) AS phase_index, {s} AS start_ns, "
            f"{e} AS end_ns, {e} - {s} AS duration_ns, "
            f"NOT (\"{a}_tick\" <> 0 AND \"{b}_tick\" <> 0) AS inherited "
            f"FROM _task_rows WHERE {ff[j]} IS NOT NULL AND {rising}")
    con.execute("CREATE VIEW intervals AS " + " UNION ALL ".join(selects))


def _small_view(con, run, table: str) -> None:
    """View ``table`` (launches, stages, anomalies) of the committed parts, the rows of the
    appends the run reads as captures of their own keyed so (``Run.named``)."""
    paths, _ = _files(run, table)
    named = run.named
    if paths and named:
        con.register("_named", pa.table({"append": list(named), "name": list(named.values())}))
        con.execute(f"CREATE VIEW {table} AS SELECT t.* REPLACE (CASE WHEN n.name IS NULL THEN t.step END AS step, "
                    "CASE WHEN n.name IS NULL THEN t.layer END AS layer, coalesce(n.name, t.capture) AS capture) "
                    f"FROM read_parquet({_list(paths)}, union_by_name=true) t LEFT JOIN _named n ON t.append = n.append")
        return
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
    whole = _task_rows_view(con, run)
    _tasks_view(con, run, whole)
    _intervals_view(con, run.phases, whole)
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
