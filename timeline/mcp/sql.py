"""Read-only DuckDB over one source, for a caller who is not trusted: the views a run has
(``timeline.run.views``: ``tasks``, ``intervals``, ``launches``, ``stages``,
``anomalies``, over the committed parts only) or a trace file's tables registered as
the same names, in a connection whose external access is off and whose configuration
is locked before the caller's first query. The run's views read their Parquet parts by
path, which external access off forbids; DuckDB's ``allowed_paths`` names exactly those
part files (no other file, no folder), so the views read them and nothing else can be
opened: no ``read_csv`` / ``read_text`` of another path, no ``COPY``, ``ATTACH``,
``INSTALL`` / ``LOAD``, no spilling to disk. Only one statement, a SELECT, runs; it
streams, at most ``max_rows`` rows and ``max_bytes`` of JSON kept, each cell bounded
before it is converted (``timeline.mcp.rows``; the rest counted: "truncated: N more
rows"), interrupted at ``time_limit`` seconds. The ``sql`` tool runs it in a worker
process (``timeline.mcp.sandbox``) with a lower memory limit; the evidence queries the
server writes itself run here, within the run's memory budget. A DuckDB error comes
back as one line, any path in it outside the source replaced."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pyarrow as pa

from timeline.mcp.args import ToolError

ROW_LIMIT = 1000  # rows a result keeps by default
TIME_LIMIT_S = 10.0  # seconds a query may run
MAX_BYTES = 1 << 20  # JSON bytes of one result's rows
VIEWS = ("tasks", "intervals", "launches", "stages", "anomalies")
KEY_MACRO = ("CREATE MACRO launch_key(step, layer, capture, launch) AS CASE WHEN step IS NOT NULL AND layer IS NOT "
             "NULL THEN CAST(step AS VARCHAR) || ':' || CAST(layer AS VARCHAR) WHEN capture IS NOT NULL THEN capture "
             "|| ':' || CAST(launch AS VARCHAR) ELSE CAST(launch AS VARCHAR) END")
KEY_SQL = {"run": "launch_key(step, layer, capture, launch)", "trace": "key"}  # a row's launch key, in SQL


def _keyed(table: pa.Table, keys: dict) -> pa.Table:
    """A trace table with its launches' printed keys as a ``key`` column."""
    names = {int(la): str(k) for la, k in keys.items()}
    return table.append_column("key", pa.array([names.get(la, str(la)) for la in table.column("launch").to_pylist()],
                                                pa.string()))


def _trace_tables(src) -> dict:
    """A trace file's tables as the views' names, each with its ``key``."""
    from timeline.query.source import key_column

    t = src.loaded
    keys = t.launch_keys
    launches = src.rank_rows()
    stages = src.stage_rows(src.select())
    return {"tasks": _keyed(t.tasks, keys), "intervals": _keyed(t.intervals, keys),
            "anomalies": t.anomalies.append_column("key", pa.array(
                [None if la is None else str(keys.get(int(la), la)) for la in t.anomalies.column("launch").to_pylist()],
                pa.string())),
            "launches": launches.append_column("key", key_column(launches)), "stages": stages}


def _run_files(run) -> list:
    """The part files a run's views read (as the views name them, and resolved)."""
    out = []
    for table in ("tasks", "launches", "stages", "anomalies"):
        for _, e in run.parts(table):
            p = run.path / e["path"]
            out += [str(p), str(p.resolve())]
    return out


def _quoted(paths) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def connect(src, threads: int | None = None, memory_mb: int | None = None):
    """The sandboxed connection of ``src`` (a ``timeline.query.source.Source``): its
    views, the ``launch_key`` macro, external access off, the configuration locked;
    ``memory_mb`` DuckDB's memory limit (default: the run's memory budget)."""
    import duckdb

    from timeline.run import layout as RL

    if src.kind == "run":
        from timeline.run import views as RV

        con = RV.connect(src.run, threads=threads)
        files = _run_files(src.run)
    else:
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        con.execute(f"SET memory_limit = '{max(RL.memory_budget() // (1 << 20), 64)}MB'")
        for name, table in _trace_tables(src).items():
            con.register(name, table)
        files = []
    con.execute(KEY_MACRO)
    if memory_mb:
        con.execute(f"SET memory_limit = '{int(memory_mb)}MB'")
    for setting in ("python_enable_replacements = false", "autoinstall_known_extensions = false",
                    "autoload_known_extensions = false", "temp_directory = ''", "secret_directory = ''",
                    "extension_directory = ''", "home_directory = ''",
                    f"allowed_paths = {_quoted(files)}", "enable_external_access = false",
                    "lock_configuration = true"):
        con.execute(f"SET {setting}")
    return con


_PATH = re.compile(r"""(?:(?<=["'`])|(?<![\w.]))(?:~|\.\.|[A-Za-z]:)?[/\\][^\s"'`,;()\]]*""")


def scrub(message: str, inside) -> str:
    """``message`` with every path in it that is not at or below one of ``inside``
    (resolved paths) replaced: an error line never names what lies outside."""
    tops = [Path(p) for p in inside]

    def one(m):
        text = m.group(0)
        try:
            p = Path(text).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            return "<a path outside the source>"
        return text if any(p == t or t in p.parents for t in tops) else "<a path outside the source>"

    return _PATH.sub(one, message)


def statement(con, query: str, inside) -> str:
    """The one SELECT of ``query``, or a ``ToolError`` naming ``query``."""
    import duckdb

    if not query.strip():
        raise ToolError("sql: argument 'query' is empty: give one SELECT", "query")
    try:
        stmts = con.extract_statements(query)
    except duckdb.Error as e:
        raise ToolError(f"sql: argument 'query': {scrub(str(e).splitlines()[0], inside)}", "query") from None
    if len(stmts) != 1:
        raise ToolError(f"sql: argument 'query' holds {len(stmts)} statements: give one SELECT", "query")
    kind = stmts[0].type
    if kind != duckdb.StatementType.SELECT:
        raise ToolError(f"sql: argument 'query' is no SELECT but {kind.name}: only one read-only SELECT runs here "
                        "(WITH ... SELECT, FROM ..., DESCRIBE, SHOW, SUMMARIZE and VALUES are SELECTs)", "query")
    return query


def run(con, query: str, inside, *, max_rows: int = ROW_LIMIT, time_limit: float = TIME_LIMIT_S,
        max_bytes: int = MAX_BYTES, stated: float | None = None) -> dict:
    """``query`` (checked: one SELECT) on ``con``: ``columns``, ``rows`` (lists, at most
    ``max_rows`` and ``max_bytes`` of JSON, each cell bounded before it is converted:
    ``timeline.mcp.rows``), ``truncated`` ("truncated: N more rows", or None),
    ``elapsed_s``; DuckDB interrupted at ``time_limit`` s (a ``ToolError`` when nothing
    came back by then; ``stated``: the limit its messages name, when the call's whole
    limit was longer than what was left of it)."""
    import duckdb

    from timeline.mcp import rows as MR

    q = statement(con, query, inside)
    timer = threading.Timer(time_limit, con.interrupt)
    t0 = time.perf_counter()
    taken, stopped, reader = MR.Taken(), False, None
    timer.start()
    try:
        reader = con.sql(q).to_arrow_reader(1024)
        columns = [{"name": f.name, "type": str(f.type)} for f in reader.schema]
        MR.take(reader, max_rows, max_bytes, taken)
    except (duckdb.InterruptException, pa.ArrowException, OSError) as e:
        if "INTERRUPT" not in str(e).upper() and not isinstance(e, duckdb.InterruptException):
            if isinstance(e, MemoryError) and "Out of Memory Error" not in str(e):
                raise  # Arrow's own allocation failed: the caller says so
            raise ToolError(f"sql: argument 'query' refused by DuckDB: {scrub(_first(e), inside)}", "query") from None
        stopped = True
        if not taken.rows:
            raise ToolError(f"sql: argument 'query' ran past the time limit of {stated or time_limit:g} s and was "
                            "stopped: "
                            "narrow it (WHERE step = ..., a LIMIT, fewer joins)", "query") from None
    except duckdb.Error as e:
        raise ToolError(f"sql: argument 'query' refused by DuckDB: {scrub(_first(e), inside)}", "query") from None
    finally:
        timer.cancel()
        if reader is not None:
            reader.close()
    return {"columns": columns, "rows": taken.rows, "row_count": None if stopped else len(taken.rows) + taken.more,
            "truncated": _truncated(taken, stopped, stated or time_limit, max_bytes),
            "elapsed_s": round(time.perf_counter() - t0, 3)}


def _first(e: BaseException) -> str:
    """An error's first line (DuckDB's errors through Arrow's stream arrive as ``OSError``)."""
    return (str(e).splitlines() or [type(e).__name__])[0]


def _truncated(taken, stopped: bool, time_limit: float, max_bytes: int) -> str | None:
    """What a result lost: "truncated: N more rows", and why when it was not the row limit."""
    if stopped:
        return f"truncated: at least {taken.more:,} more rows (counting stopped at the {time_limit:g} s time limit)"
    if not taken.more:
        return None
    why = f" (past the answer's budget of {max_bytes:,} JSON bytes)" if taken.why == "bytes" else ""
    return f"truncated: {taken.more:,} more rows{why}"


def describe(con) -> dict:
    """``{view: [{name, type}]}`` of the views every source has."""
    out = {}
    for v in VIEWS:
        out[v] = [{"name": r[0], "type": r[1]} for r in con.execute(f"DESCRIBE {v}").fetchall()]
    return out


__all__ = ["KEY_SQL", "MAX_BYTES", "ROW_LIMIT", "TIME_LIMIT_S", "VIEWS", "connect", "describe", "run", "scrub",
           "statement"]
