"""The ``sql`` tool's sandbox process, ``python -m timeline.mcp.worker CONFIG``: started
and watched by ``timeline.mcp.sandbox``, it answers one query at a time on the
sandboxed DuckDB connection of the source it names (``timeline.mcp.sql.connect``,
made once per source and again when the source changed), its rows bounded as they are
converted (``timeline.mcp.rows``). Its address space is capped (``RLIMIT_AS``: what it
had when ready plus the config's ``headroom``), so an allocation past it fails inside
DuckDB or Arrow as one error, and DuckDB's own memory limit is lower still. After an
answer that left it holding more than ``recycle`` bytes it says so and exits (the
server starts a fresh one). Messages on its stdin / a private copy of its stdout:
``timeline.mcp.sandbox.send`` frames (length, JSON)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def rss() -> tuple:
    """``(resident bytes, peak resident bytes)`` of this process (VmRSS, VmHWM)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                k, _, v = ln.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def cap_address_space(headroom: int) -> None:
    """``RLIMIT_AS`` set to this process's address space now plus ``headroom`` bytes."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + headroom, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (OSError, ValueError):  # no /proc, or a hard limit already lower: the server's watch still holds
        pass


class Opened:
    """The sources this worker has opened: ``path`` -> ``(stamp, connection)``."""

    def __init__(self, cfg: dict):
        self.cfg, self.held = cfg, {}

    def connection(self, path: str, stamp):
        """The sandboxed connection of the source at ``path``, made again when ``stamp`` changed."""
        from timeline.mcp import sql as MS
        from timeline.query.source import open_source

        held = self.held.get(path)
        if held is None or held[0] != stamp:
            self.held.pop(path, None)
            src = open_source(path)
            self.held[path] = (stamp, MS.connect(src, threads=self.cfg.get("threads"),
                                                 memory_mb=self.cfg.get("memory_mb")))
        return self.held[path][1]


def answer(opened: Opened, req: dict, out_fd: int) -> dict:
    """One request answered: ``{"ok": result}`` or ``{"error", "argument"}``; ``ready``
    sent once the source is open (the query's time limit starts there)."""
    from timeline.errors import TimelineError
    from timeline.mcp import sql as MS
    from timeline.mcp.args import ToolError
    from timeline.mcp.sandbox import send

    try:
        con = opened.connection(req["path"], req["stamp"])
    except TimelineError as e:
        return {"error": f"argument 'source': cannot be read: {' '.join(str(e).split())}", "argument": "source"}
    send(out_fd, {"ready": True})
    left = float(req["until"]) - time.time()
    if left <= 0:
        return {"error": f"sql: the time limit of {req['time_limit']:g} s was spent opening the source: ask again "
                "(it stays open) or raise --sql-seconds", "argument": "query"}
    try:
        return {"ok": MS.run(con, req["query"], req["inside"], max_rows=req["max_rows"], time_limit=left,
                             max_bytes=req["max_bytes"], stated=req["time_limit"])}
    except ToolError as e:
        return {"error": str(e), "argument": e.argument}
    except MemoryError as e:
        return {"error": f"sql: argument 'query' needed more memory than the sandbox holds ({type(e).__name__}) and "
                "was stopped: narrow it (fewer rows, shorter lists and text, a LIMIT)", "argument": "query"}


def main(argv) -> int:
    """Serve requests until stdin closes (or the process holds more than ``recycle``)."""
    from timeline.mcp.sandbox import receive, send

    cfg = json.loads(argv[0])
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to the server's log, never into the protocol
    import duckdb  # noqa: F401  (loaded before the cap: what every query needs)
    import pyarrow.compute  # noqa: F401

    from timeline.mcp import sql  # noqa: F401
    from timeline.query import source  # noqa: F401

    cap_address_space(int(cfg["headroom"]))
    opened = Opened(cfg)
    send(out_fd, {"hello": True})
    while True:
        req = receive(0)
        if req is None:
            return 0
        try:
            reply = answer(opened, req, out_fd)
        except Exception as e:  # a bug: its traceback to the server's log, one line back
            traceback.print_exc(file=sys.stderr)
            reply = {"error": f"sql: internal error ({type(e).__name__}): {(str(e).splitlines() or [''])[0]}",
                     "argument": None}
        now, peak = rss()
        reply.update(rss=now, peak=peak, exiting=now > int(cfg["recycle"]))
        send(out_fd, reply)
        if reply["exiting"]:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
