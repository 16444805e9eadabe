"""A Chrome JSON's pieces handled on every core: the pieces are independent once cut,
so where the file is large and the machine has more than one core, this process
only cuts them (``jsonscan.pieces`` with a decoder that checks each piece is whole
events and builds nothing: ``Whole``) and worker processes decode each piece into a
reader's struct and reduce it (``fn``); the results come back in file order.
Elsewhere (one core, a small file, ``TIMELINE_ATTACH_WORKERS=1``) the same ``fn``
runs here on the pieces as ``jsonscan.pieces`` decodes them.

Memory stays bounded: at most ``2 x workers`` pieces are in flight. Workers are
forked (a spawned one would import the caller's main script again; numpy, msgspec
and Arrow keep working in a forked child). A gzipped file is read here (its
pieces cannot be read at an offset)."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from typing import Iterator, NamedTuple

import msgspec

from timeline.attach import jsonscan as J
from timeline.attach.sniff import FrameworkTraceError
from timeline.errors import TimelineError

__all__ = ["PARALLEL_MIN_BYTES", "WORKERS_ENV", "WorkersError", "map_pieces", "workers_for"]

WORKERS_ENV = "TIMELINE_ATTACH_WORKERS"  # worker processes (default: the cores this process may use; 1: none)
PARALLEL_MIN_BYTES = 4 * J.CHUNK_BYTES  # a smaller file is read here: starting workers costs more


class WorkersError(TimelineError):
    """``TIMELINE_ATTACH_WORKERS`` set to something that is not a number of processes."""


def workers_for(path) -> int:
    """How many worker processes read ``path`` (0: none)."""
    try:
        n = int(os.environ.get(WORKERS_ENV, "") or len(os.sched_getaffinity(0)))
    except ValueError:
        raise WorkersError(f"{WORKERS_ENV}={os.environ[WORKERS_ENV]!r} is not a number of processes: set it to "
                           "1 (read in this process) or more (worker processes), or unset it (the cores)") from None
    try:
        big = os.path.getsize(path) >= PARALLEL_MIN_BYTES
    except OSError:
        big = False
    return n if n > 1 and big else 0


def map_pieces(path, kind, fn, args=(), *, chunk_bytes: int = J.CHUNK_BYTES, head: list | None = None,
               tail: list | None = None, workers: int | None = None, shared=None) -> Iterator:
    """``fn(events, shared, *args)`` for each piece of ``path`` in file order, the
    events decoded as ``list[kind]`` (``kind`` a module-level ``msgspec.Struct``,
    ``fn`` a module-level function, ``args`` small: they go to the workers with each
    piece; ``shared``, however large, is handed to the workers once, as they are
    forked); yields the results. ``head`` / ``tail`` as ``jsonscan.pieces``; the
    pieces are ``jsonscan.pieces``' own."""
    n = workers_for(path) if workers is None else workers
    if n > 1 and not _gzipped(path) and "fork" in multiprocessing.get_all_start_methods():
        yield from _parallel(path, kind, fn, args, shared, chunk_bytes, head, tail, n)
        return
    decoder = msgspec.json.Decoder(list[kind])
    for piece in J.pieces(path, chunk_bytes=chunk_bytes, head=head, tail=tail, decoder=decoder):
        yield fn(piece.events, shared, *args)


def _gzipped(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


class _Job(NamedTuple):
    start: int  # where the piece begins in the file
    cut: int  # where it ends (the speculated cut)
    read_end: int  # the bytes jsonscan.pieces would have read by then
    result: object  # the worker's AsyncResult


def _parallel(path, kind, fn, args, shared, chunk_bytes: int, head, tail, n: int) -> Iterator:
    """The pieces cut here without decoding them: each cut is the one
    ``jsonscan.pieces`` takes when its first candidate (the last ``}`` followed by a
    comma in the bytes read) closes whole events, which the worker checks as it
    decodes; where it does not, the piece is cut here as ``jsonscan.pieces`` cuts it
    and the speculation goes on from there."""
    name = str(path)
    size = os.path.getsize(path)
    decoder = msgspec.json.Decoder(list[kind])
    with open(path, "rb") as f, multiprocessing.get_context("fork").Pool(n, _share, (shared,)) as pool:
        h = J._find_array(f, name, chunk_bytes)
        if head is not None:
            head.append(h.head)
        fd = f.fileno()
        start, read_end = len(h.head), len(h.head) + len(h.rest)
        pending = deque()
        while True:
            if read_end >= size and not pending:
                yield from _final(fd, start, size, decoder, fn, (shared, *args), name, tail)
                return
            if read_end < size and len(pending) < 2 * n:
                read_end = min(read_end + chunk_bytes, size)
                cut = _candidate(fd, start, read_end)
                if cut is not None:
                    pending.append(_Job(start, cut, read_end, pool.apply_async(_run, (path, kind, fn, start, cut, args))))
                    start = _after(fd, cut, read_end)
                continue
            job = pending.popleft()
            got = job.result.get()
            if type(got) is not NotWhole:
                yield got
                continue
            pending.clear()  # cut from a wrong start: planned again below
            cut, events, read_end = _one(fd, job.start, job.read_end, size, chunk_bytes, decoder, name)
            if events is None:  # the file ends first: jsonscan.pieces reads to its end, then closes the array
                start, read_end = job.start, size
                continue
            yield fn(events, shared, *args)
            start = _after(fd, cut, read_end)


class NotWhole(NamedTuple):
    """A worker's answer for a piece that does not end after a whole event."""

    start: int


TAIL_READ = 1 << 16  # bytes read at a time, backwards from a read's end, to find its cut


def _candidate(fd: int, start: int, read_end: int):
    """``jsonscan._whole``'s first candidate cut in the file's bytes [start, read_end):
    after the last ``}`` that a comma follows (within 64 bytes), among the last
    ``CUT_TRIES`` ``}``; None where there is none. Read backwards from the end, a
    block at a time (not the whole piece)."""
    tries, hi, after = J.CUT_TRIES, read_end, b""
    while hi > start:
        lo = max(start, hi - TAIL_READ)
        block = os.pread(fd, hi - lo, lo)
        buf, pos = block + after, len(block)
        while True:
            pos = buf.rfind(b"}", 0, pos)
            if pos < 0:
                break
            if buf[pos + 1:pos + 64].lstrip()[:1] == b",":
                return lo + pos + 1
            tries -= 1
            if not tries:
                return None
        hi, after = lo, block[:64]
    return None


def _after(fd: int, cut: int, read_end: int) -> int:
    """Where the next piece starts: past the whitespace and the comma after ``cut``,
    within the bytes read (as ``jsonscan.pieces`` steps over them)."""
    return cut + J.skip_comma(os.pread(fd, read_end - cut, cut), 0)


def _one(fd: int, start: int, read_end: int, size: int, chunk_bytes: int, decoder, name: str) -> tuple:
    """One piece cut here exactly as ``jsonscan.pieces`` cuts it from ``start`` with
    [start, read_end) read: (cut, its events, the bytes read), or (None, None, size)
    where no piece ends before the file does."""
    while True:
        buf = os.pread(fd, read_end - start, start)
        cut, events = J._whole(J.framed(buf), decoder)
        if events is not None:
            return start + cut, events, read_end
        if read_end >= size:
            return None, None, size
        read_end = min(read_end + chunk_bytes, size)


def _final(fd: int, start: int, size: int, decoder, fn, args, name: str, tail) -> Iterator:
    """The last piece: up to where the events' array closes (``jsonscan._last``)."""
    buf = os.pread(fd, size - start, start)
    end, events = J._last(J.framed(buf), name, start, decoder)
    if events:
        yield fn(events, *args)
    if tail is not None:
        tail += [buf[end:], start + end]


_DECODERS: dict = {}
_SHARED = [None]  # map_pieces' shared value, in a worker


def _share(value) -> None:
    _SHARED[0] = value


def _run(path, kind, fn, start: int, cut: int, args):
    """In a worker: the file's bytes [start, cut) decoded as ``list[kind]``, then
    ``fn``; ``NotWhole`` where they are not whole events (a wrong speculated cut)."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(list[kind])
    buf = bytearray(cut - start + 2)  # the events between [ and ], read in place
    buf[0], buf[-1] = ord("["), ord("]")
    with open(path, "rb") as f:
        if os.preadv(f.fileno(), [memoryview(buf)[1:-1]], start) != cut - start:
            raise FrameworkTraceError(f"{str(path)!r} changed while it was read (at byte {start:,}): read it again")
    try:
        events = decoder.decode(buf)
    except msgspec.ValidationError as e:
        raise FrameworkTraceError(f"traceEvents holds an element that is not an event object ({e})") from None
    except msgspec.DecodeError:
        return NotWhole(start)
    return fn(events, _SHARED[0], *args)
