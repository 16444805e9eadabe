"""One MCP tool call, whatever carries it (the SDK's server, ``timeline mcp --call``, a
test): the tool looked up, its arguments checked, its answer made, bounded and
enveloped. Every outcome is a JSON object: the answer (the document, ``reproduce``,
``evidence``, ``cannot_establish``, ``truncated``); an answer the data cannot support
(an ``AnalysisError`` naming no option: ``cannot_establish`` with the reason, no
document); or one
structured error (``error``: ``tool``, ``argument``, ``message``, ``type``) for bad
input, never a traceback (an unexpected exception's traceback goes to stderr, the
server's log, and the caller gets its one line)."""

from __future__ import annotations

import re
import sys
import threading
import traceback
from pathlib import Path

from timeline.errors import TimelineError
from timeline.mcp import evidence as EV
from timeline.mcp import paths as MP
from timeline.mcp import sql as MS
from timeline.mcp.args import ToolError, check
from timeline.mcp.catalog import CATALOG
from timeline.mcp.tools import TOOLS, bounded

DOC_ROWS = 500  # rows of one list of a tool's document (the rest counted: "truncated: N more rows")
ANSWER_BYTES = 4 << 20  # JSON bytes of one answer: its lists cut further until it fits
ALL = {  # every tool: {name: (description, params, function)}; a module of tools adds its dict here
    **CATALOG,
    **TOOLS,
}
ADDED = ("reproduce", "evidence", "cannot_establish", "truncated")  # what the envelope adds to a command's document


def argument_of(message: str) -> str | None:
    """The tool argument a ``timeline`` error line is about: its first ``--option``
    (``--launch`` -> ``launch``), None when it names none."""
    m = re.search(r"--([a-z][a-z-]*)", message)
    return m.group(1).replace("-", "_") if m else None


class Context:
    """What every call shares: ``sources`` (``timeline.mcp.sources.Sources``), the SQL
    limits, the rows a document keeps, and ``argv`` (the server's sources as its command
    line gave them: what ``--call`` reproduce lines repeat). Calls are served one at a
    time (``lock``)."""

    def __init__(self, sources, *, argv=(), max_rows: int = MS.ROW_LIMIT, time_limit: float = MS.TIME_LIMIT_S,
                 doc_rows: int = DOC_ROWS):
        self.sources, self.argv = sources, list(argv)
        self.max_rows, self.time_limit, self.doc_rows = max_rows, time_limit, doc_rows
        self.lock = threading.Lock()
        self.sandbox = None  # the sql tool's worker (timeline.mcp.sandbox), started by the first query
        self.places = MP.places(sources)

    def warm(self) -> None:
        """The sql tool's worker started now (the server's start, not the first query, pays its start)."""
        from timeline.mcp.sandbox import Sandbox

        if self.sandbox is None:
            self.sandbox = Sandbox(spare=True)
            self.sandbox.start()

    def sql(self, e, query: str, max_rows: int) -> dict:
        """``query`` on source ``e`` in the sandbox's worker (``timeline.mcp.sandbox``):
        its result, or its refusal as a ``ToolError`` naming ``query``."""
        from timeline.mcp.sandbox import Sandbox

        if self.sandbox is None:
            self.sandbox = Sandbox()
        reply = self.sandbox.query({"path": e.path, "stamp": self.sources.stamp(e), "query": query,
                                    "inside": [str(p) for p in self.inside(e)], "max_rows": max_rows,
                                    "max_bytes": MS.MAX_BYTES, "time_limit": self.time_limit}, self.time_limit)
        if "error" in reply:
            raise ToolError(reply["error"], reply.get("argument"))
        return reply["ok"]

    def close(self) -> None:
        """The sandbox's worker ended."""
        if self.sandbox is not None:
            self.sandbox.close()

    def inside(self, e) -> list:
        """The resolved paths a source's messages may name."""
        return [Path(e.path).resolve()]

    def connection(self, e, src):
        """The source's sandboxed DuckDB connection (``timeline.mcp.sql.connect``), made once."""
        cache = self.sources.cache(e.name)
        if "con" not in cache:
            cache["con"] = MS.connect(src)
        return cache["con"]

    def evidence(self, e, src, sql_text: str, note: str) -> dict:
        """``evidence.query`` on the source's connection; what stops it said, not raised."""
        try:
            return EV.query(self.connection(e, src), self.inside(e), sql_text, note)
        except ToolError as err:
            return EV.none(f"evidence not read: {err}")

    def scrub(self, message: str) -> str:
        """``message`` with any path outside every source replaced, and the server's own
        absolute paths by the names its command line gave (``timeline.mcp.paths``)."""
        tops = [Path(e.path).resolve() for e in self.sources.entries.values()]
        if self.sources.root:
            tops.append(Path(self.sources.root).resolve())
        return MP.public(MS.scrub(message, tops), self.places)

    def call(self, name, arguments) -> tuple:
        """``(result, is_error)`` of tool ``name`` with ``arguments`` (decoded JSON)."""
        with self.lock:
            try:
                return MP.public_doc(self._call(name, arguments), self.places), False
            except ToolError as e:
                return self.error(name, e.argument, str(e), e), True
            except TimelineError as e:
                from timeline.analysis import AnalysisError

                if isinstance(e, AnalysisError) and argument_of(str(e)) is None:  # the data, not an option
                    return {"tool": name, "cannot_establish": [self.scrub(str(e))], "reproduce": None,
                            "evidence": EV.none("no answer to rest on"), "truncated": None}, False
                return self.error(name, argument_of(str(e)), str(e), e), True
            except (OSError, MemoryError, RecursionError) as e:
                return self.error(name, None, f"{type(e).__name__}: {e}", e), True
            except Exception as e:  # a bug: its traceback to the log, one line to the caller
                traceback.print_exc(file=sys.stderr)
                first = (str(e).splitlines() or [""])[0]
                return self.error(name, None, f"internal error ({type(e).__name__}): {first}", e), True

    def _call(self, name, arguments) -> dict:
        if not isinstance(name, str) or name not in ALL:
            raise ToolError(f"unknown tool {str(name)[:80]!r}; the tools: {sorted(ALL)}", None)
        _, params, fn = ALL[name]
        doc, repro, ev, cannot = fn(self, check(name, params, arguments))
        out = {**doc, "reproduce": repro, "evidence": ev,
               "cannot_establish": list(dict.fromkeys([*doc.get("cannot_establish", []), *cannot]))}
        if name == "sql":  # its rows are bounded by its own limits, and said so
            return out
        return _fitted(out, self.doc_rows)

    def error(self, tool, argument, message: str, e: BaseException) -> dict:
        return {"error": {"tool": tool if isinstance(tool, str) else None, "argument": argument,
                          "message": self.scrub(" ".join(message.split()))[:2000], "type": type(e).__name__}}

    def resource(self, uri: str) -> str:
        """The text of resource ``uri`` (``timeline.mcp.server`` lists them)."""
        import json

        from timeline.mcp import catalog as CT
        from timeline.mcp import texts as MT

        if uri in MT.RESOURCES:
            return MT.RESOURCES[uri][2]()
        for name in self.sources.names():
            if uri == CT.info_uri(name):
                with self.lock:
                    return json.dumps(CT.info(self, name), ensure_ascii=False, indent=1, default=str)
        raise ToolError(f"no resource {uri[:200]!r}: resources/list lists them", "uri")


def _fitted(out: dict, rows: int) -> dict:
    """``out`` with its lists cut to ``rows`` (``tools.bounded``), and shorter still
    until its JSON holds at most ``ANSWER_BYTES``: a ``ToolError`` when even one row
    of each does not fit."""
    import json

    while True:
        doc = bounded(dict(out), rows)
        if len(json.dumps(doc, ensure_ascii=False, default=str).encode()) <= ANSWER_BYTES:
            return doc
        if rows <= 1:
            raise ToolError(f"the answer holds more than {ANSWER_BYTES:,} JSON bytes even cut to one row per list: "
                            "narrow the selection (launch, step, layer, rank)", "launch")
        rows //= 4


__all__ = ["ADDED", "ALL", "ANSWER_BYTES", "Context", "DOC_ROWS", "argument_of"]
