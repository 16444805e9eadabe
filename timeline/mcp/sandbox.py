"""The ``sql`` tool's queries run in a worker process (``timeline.mcp.worker``), never
in the server: the server sends one query, waits for it at most the time limit plus
``GRACE`` seconds, and watches the worker's resident memory while it waits (every
``POLL_S``); past either bound the worker is killed, the caller gets one error naming
``query``, and a fresh worker is started at once. Inside, the worker's address space is
capped and DuckDB's memory limit is ``DUCKDB_MB``, so a query usually fails there as
one DuckDB error first; the kill is what holds when nothing else does (a result's
conversion, a function DuckDB does not account). The server's own memory never holds
a query's rows beyond the answer. Messages are frames: 8 bytes of length, then JSON."""

from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

from timeline.mcp.args import ToolError

RSS_LIMIT = 1 << 30  # resident bytes a worker may hold: past it, killed
DUCKDB_MB = 512  # DuckDB's memory limit in the worker (MB)
HEADROOM = 4 << 30  # address space a ready worker may add (threads and allocators reserve far more than they touch)
MAX_THREADS = 8  # DuckDB threads of a worker (each reserves address space and memory)
RECYCLE = 0.75  # a worker holding more than this share of RSS_LIMIT after an answer is replaced
GRACE = 0.5  # seconds past the time limit before the worker is killed (its own interrupt comes first)
OPEN_LIMIT = 300.0  # seconds a worker may take to start and open a source (the server's own code, not the query)
POLL_S = 0.01  # seconds between two looks at the worker's memory
HEADER = struct.Struct("<Q")


def send(fd: int, obj) -> None:
    """One frame of ``obj`` (JSON) written whole to ``fd``."""
    data = json.dumps(obj, ensure_ascii=False, default=str).encode()
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``fd`` (blocking), None at end of file."""
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def receive(fd: int):
    """The next frame's object from ``fd`` (blocking), None at end of file."""
    head = _read(fd, HEADER.size)
    if head is None:
        return None
    body = _read(fd, HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


def resident(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Stopped(Exception):
    """The worker was killed or ended; ``why`` says which bound it met."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class Sandbox:
    """One worker answering, and a spare started beside it after a kill (or always, with
    ``spare``: a server), so the call after a kill finds a worker ready: ``query(request, time_limit)`` -> the
    worker's reply, or a ``ToolError`` when it ran past a bound and was killed. The
    time limit covers the whole call from a worker ready to read it: opening the
    source, the query, its rows. ``peak``: the largest resident size seen of any
    worker (bytes)."""

    def __init__(self, rss_limit: int = RSS_LIMIT, duckdb_mb: int = DUCKDB_MB, threads: int | None = None,
                 headroom: int | None = None, spare: bool = False):
        self.rss_limit, self.duckdb_mb, self.threads = rss_limit, duckdb_mb, threads
        self.keep_spare = spare  # a spare always ready (a server), not only after a kill (a one-shot call)
        self.headroom = HEADROOM if headroom is None else headroom
        self.proc = self.spare = None
        self.buf, self.peak = b"", 0
        atexit.register(self.close)

    def _spawn(self) -> subprocess.Popen:
        """A fresh worker process (it loads its modules while the caller goes on)."""
        import timeline

        home = str(Path(timeline.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([home, *filter(None, [os.environ.get("PYTHONPATH")])]),
               "MALLOC_ARENA_MAX": "2"}
        cfg = {"headroom": self.headroom, "recycle": int(self.rss_limit * RECYCLE), "memory_mb": self.duckdb_mb,
               "threads": self.threads or min(os.cpu_count() or 1, MAX_THREADS)}
        return subprocess.Popen([sys.executable, "-m", "timeline.mcp.worker", json.dumps(cfg)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)

    def _next(self, spare: bool) -> None:
        """The spare (if alive) or a fresh worker answers from now; with ``spare`` a new
        spare is started beside it."""
        s, self.spare = self.spare, None
        self.proc = s if s is not None and s.poll() is None else self._spawn()
        self.buf, self.hello = b"", False
        if spare or self.keep_spare:
            self.spare = self._spawn()

    def start(self) -> None:
        """A worker started now, if none is (``query`` starts one when needed)."""
        if self.proc is None or self.proc.poll() is not None:
            self._end(self.proc, True)
            self._next(spare=False)

    def _end(self, p, kill: bool) -> None:
        """Worker ``p`` ended and reaped: killed, or its stdin closed (killed if it lingers)."""
        if p is None:
            return
        try:
            if not kill:
                p.stdin.close()
                p.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            kill = True
        if kill:
            p.kill()
        p.wait()

    def close(self) -> None:
        """Every worker ended."""
        p, s, self.proc, self.spare = self.proc, self.spare, None, None
        self._end(p, False)
        self._end(s, True)  # idle, perhaps still loading: nothing to finish

    def query(self, request: dict, time_limit: float) -> dict:
        """The worker's reply to ``request``: ``{"ok": result}`` or ``{"error", "argument"}``."""
        self.start()
        try:
            if not self.hello:  # a fresh worker's start is the server's, not the query's
                self.hello = bool(self._wait(OPEN_LIMIT).get("hello"))
            end = time.monotonic() + time_limit
            send(self.proc.stdin.fileno(), {**request, "until": time.time() + time_limit})
            first = self._wait(end + GRACE - time.monotonic())
            reply = self._wait(end + GRACE - time.monotonic()) if first.get("ready") else first
        except (Stopped, OSError) as s:  # past a bound, or the worker had ended (a broken pipe)
            self._end(self.proc, True)
            self._next(spare=True)
            raise ToolError(_stopped(getattr(s, "why", "ended"), time_limit, self.rss_limit), "query") from None
        if reply.get("exiting"):  # it holds too much after this query: a fresh one for the next
            self._end(self.proc, False)
            self._next(spare=False)
        return reply

    def _wait(self, seconds: float) -> dict:
        """The worker's next frame within ``seconds``, its memory watched; ``Stopped`` past a bound."""
        fd, pid = self.proc.stdout.fileno(), self.proc.pid
        deadline = time.monotonic() + seconds
        while True:
            frame = self._frame()
            if frame is not None:
                self.peak = max(self.peak, int(frame.get("peak", 0)))
                return frame
            left = deadline - time.monotonic()
            if left <= 0:
                raise Stopped("time")
            ready, _, _ = select.select([fd], [], [], min(POLL_S, left))
            size = resident(pid)
            self.peak = max(self.peak, size)
            if size > self.rss_limit:
                raise Stopped("memory")
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise Stopped(f"ended (exit status {self.proc.wait()})")
                self.buf += chunk

    def _frame(self):
        """A whole frame taken from the buffer, or None."""
        if len(self.buf) < HEADER.size:
            return None
        n = HEADER.unpack(self.buf[:HEADER.size])[0]
        if len(self.buf) < HEADER.size + n:
            return None
        body, self.buf = self.buf[HEADER.size:HEADER.size + n], self.buf[HEADER.size + n:]
        return json.loads(body)


def _stopped(why: str, time_limit: float, rss_limit: int) -> str:
    """The one error line of a query whose worker was stopped."""
    if why == "time":
        return (f"sql: argument 'query' ran past the time limit of {time_limit:g} s and was stopped (its sandbox "
                "process killed): narrow it (WHERE step = ..., a LIMIT, fewer joins)")
    if why == "memory":
        return (f"sql: argument 'query' needed more than {rss_limit / 2**30:.2f} GiB of memory and was stopped (its "
                "sandbox process killed): narrow it (fewer rows, shorter lists and text, a LIMIT)")
    return f"sql: the query's sandbox process {why} (a fresh one is started): narrow the query, or ask again"


__all__ = ["DUCKDB_MB", "GRACE", "HEADROOM", "MAX_THREADS", "RECYCLE", "RSS_LIMIT", "Sandbox", "Stopped", "receive",
           "resident", "send"]
