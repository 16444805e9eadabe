"""A Chrome trace JSON file (Kineto's ``.pt.trace.json``, plain or gzipped) read as a
stream of its events, never whole: a 1 GB trace is read in ``CHUNK_BYTES`` pieces.

How the events are found without parsing the document: per piece, numpy finds the
quotes (a quote after an odd run of backslashes is escaped), the brackets outside
strings (a bracket between an odd and an even quote is inside a string) and their
depth (a running sum of +1 / -1); an event is an object one level inside the
``traceEvents`` array (or inside a top-level array: the JSON Array Format). A piece
is cut after its last complete event, so the next one starts outside any string at
the array's depth: the state carried between pieces is only the bytes after that
cut. Only the events a caller asks for are handed to ``json.loads`` (a piece's
events at once, ``parse_float=str`` so that a ``ts`` keeps every digit).

What is not an event is kept whole: the text before the array (``head``, up to
``HEAD_LIMIT`` bytes) and after it (``tail``); ``document`` parses the two into the
top-level keys (``baseTimeNanoseconds``, ``distributedInfo``, ...)."""

from __future__ import annotations

import gzip
import json
from typing import Iterator, NamedTuple

import numpy as np

from timeline.attach.sniff import FrameworkTraceError

__all__ = ["CHUNK_BYTES", "HEAD_LIMIT", "Piece", "document", "events", "ns_of", "open_bytes", "pieces"]

CHUNK_BYTES = 8 << 20  # bytes read at a time: bounds memory (a piece and one event)
HEAD_LIMIT = 64 << 20  # the text before traceEvents' array may be at most this long
QUOTE, BACKSLASH = 34, 92
OPEN_OBJ, CLOSE_OBJ, OPEN_ARR, CLOSE_ARR = 123, 125, 91, 93


def open_bytes(path):
    """The file's bytes as a stream: gunzipped when it starts with gzip's magic."""
    f = open(path, "rb")
    if f.read(2) == b"\x1f\x8b":
        f.close()
        return gzip.open(path, "rb")
    f.seek(0)
    return f


class Piece(NamedTuple):
    """A run of complete events: ``text[starts[i]:ends[i]]`` is event i (its braces
    included); ``offset`` is where ``text`` begins in the (decompressed) file."""

    text: bytes
    starts: np.ndarray
    ends: np.ndarray
    offset: int


def _real_quotes(a: np.ndarray) -> np.ndarray:
    """Positions of the quotes of ``a`` that open or close strings (not ``\\"``)."""
    q = np.flatnonzero(a == QUOTE)
    if not q.size:
        return q
    maybe = q[(q > 0) & (a[np.maximum(q - 1, 0)] == BACKSLASH)]
    if not maybe.size:
        return q
    escaped = []
    for p in maybe.tolist():  # rare: count the run of backslashes before the quote
        k = p - 1
        while k >= 0 and a[k] == BACKSLASH:
            k -= 1
        if (p - 1 - k) % 2:
            escaped.append(p)
    return np.setdiff1d(q, np.array(escaped, np.int64), assume_unique=True) if escaped else q


def _brackets(a: np.ndarray, depth0: int):
    """(positions, byte, depth after) of the brackets of ``a`` outside strings, ``a``
    starting outside a string at ``depth0``; and whether ``a`` ends inside a string."""
    q = _real_quotes(a)
    b = np.flatnonzero((a == OPEN_OBJ) | (a == CLOSE_OBJ) | (a == OPEN_ARR) | (a == CLOSE_ARR))
    b = b[(np.searchsorted(q, b) & 1) == 0]
    kind = a[b]
    step = np.where((kind == OPEN_OBJ) | (kind == OPEN_ARR), 1, -1)
    return b, kind, depth0 + np.cumsum(step), bool(q.size & 1)


def _where(name: str, at: int) -> str:
    return f"{name!r} at byte {at:,}"


class _Head(NamedTuple):
    head: bytes  # up to and including the array's '['
    rest: bytes  # what was read after it
    depth: int  # the array's depth (events are objects at depth + 1)


def _find_array(f, name: str) -> _Head:
    """Read until the ``traceEvents`` array opens (or the document is an array)."""
    buf = b""
    while True:
        more = f.read(CHUNK_BYTES)
        buf += more
        stripped = buf.lstrip()
        if stripped[:1] == b"[":
            at = len(buf) - len(stripped)
            return _Head(buf[:at + 1], buf[at + 1:], 1)
        if stripped and stripped[:1] != b"{":
            raise FrameworkTraceError(f"{name!r} is not JSON (it starts with {stripped[:16]!r}): a PyTorch "
                                      "profiler trace is the JSON prof.export_chrome_trace writes")
        a = np.frombuffer(buf, np.uint8)
        pos, kind, depth, _ = _brackets(a, 0)
        key = buf.find(b'"traceEvents"')
        while key >= 0:
            before = np.searchsorted(pos, key)
            d = int(depth[before - 1]) if before else 0
            after = buf[key + len(b'"traceEvents"'):].lstrip()
            if d == 1 and after[:1] == b":" and after[1:].lstrip()[:1] == b"[":
                at = buf.index(b"[", key)
                return _Head(buf[:at + 1], buf[at + 1:], 2)
            key = buf.find(b'"traceEvents"', key + 1)
        if not more or len(buf) > HEAD_LIMIT:
            keys = _top_keys(buf)
            raise FrameworkTraceError(f"{name!r} is a JSON document without a traceEvents array"
                                      f"{' (its keys: ' + ', '.join(keys[:8]) + ')' if keys else ''}: not a "
                                      "Chrome / PyTorch profiler trace; give the file prof.export_chrome_trace wrote")


def _top_keys(buf: bytes) -> list:
    try:
        d = json.loads(buf)
        return list(d) if isinstance(d, dict) else []
    except (ValueError, UnicodeDecodeError):
        return []


def pieces(path, *, chunk_bytes: int = CHUNK_BYTES, tail: list | None = None, head: list | None = None
           ) -> Iterator[Piece]:
    """The file's events, a ``Piece`` at a time, in file order. ``head`` / ``tail``
    (lists, when given) receive the text before the events' array (its ``[``
    included) and from its closing ``]`` to the end. A ``FrameworkTraceError`` for
    a file that is not a Chrome trace or ends inside an event."""
    name = str(path)
    with open_bytes(path) as f:
        try:
            h = _find_array(f, name)
        except (OSError, EOFError) as e:
            raise FrameworkTraceError(f"{name!r} cannot be read: {e} (a damaged gzip file?)") from None
        if head is not None:
            head.append(h.head)
        buf, offset, depth = h.rest, len(h.head), h.depth
        done = False
        while not done:
            try:
                more = f.read(chunk_bytes) if len(buf) < chunk_bytes else b""
            except (OSError, EOFError) as e:
                raise FrameworkTraceError(f"{name!r} cannot be read past byte {offset + len(buf):,}: {e} "
                                          "(a truncated or damaged gzip file?)") from None
            buf += more
            a = np.frombuffer(buf, np.uint8)
            pos, kind, d, in_string = _brackets(a, depth)
            closed = np.flatnonzero((kind == CLOSE_ARR) & (d == depth - 1))
            if closed.size:  # the array ends here: events before it, the rest is the tail
                end = int(pos[closed[0]])
                keep = np.arange(len(pos)) < closed[0]
                pos, kind, d = pos[keep], kind[keep], d[keep]
                done = True
            opens = pos[(kind == OPEN_OBJ) & (d == depth + 1)]
            shut = pos[(kind == CLOSE_OBJ) & (d == depth)] + 1
            bad = pos[((d <= depth) & ~((kind == CLOSE_OBJ) & (d == depth))) | ((kind == OPEN_ARR) & (d == depth + 1))]
            if bad.size:
                raise FrameworkTraceError(f"{name!r}: traceEvents holds something other than event objects near "
                                          f"byte {offset + int(bad[0]):,}; a Chrome trace's events are {{...}} objects")
            n = len(shut)
            if n:
                yield Piece(buf, opens[:n], shut, offset)
            if done:
                if tail is not None:
                    tail.append(buf[end:] + f.read())
                return
            cut = int(shut[-1]) if n else 0
            if not more and not closed.size:
                raise FrameworkTraceError(f"{name!r} ends inside its traceEvents array (byte {offset + len(buf):,}): "
                                          "the file is truncated; re-export it")
            buf, offset = buf[cut:], offset + cut
            if in_string and not more:
                raise FrameworkTraceError(f"{name!r} ends inside a string: the file is truncated")


def events(piece: Piece, keep=None) -> list:
    """The piece's events as dicts (``json.loads``, floats as their text), those
    whose index ``keep`` (a bool mask) selects or all."""
    if keep is not None:
        idx = np.flatnonzero(keep)
        if not idx.size:
            return []
        if idx.size < len(piece.starts):
            text = b",".join(piece.text[s:e] for s, e in zip(piece.starts[idx].tolist(), piece.ends[idx].tolist()))
            return _loads(b"[" + text + b"]", piece.offset + int(piece.starts[idx[0]]))
    lo, hi = int(piece.starts[0]), int(piece.ends[-1])
    return _loads(b"[" + piece.text[lo:hi] + b"]", piece.offset + lo)


def _loads(text: bytes, at: int) -> list:
    try:
        return json.loads(text, parse_float=str)
    except (ValueError, UnicodeDecodeError) as e:
        raise FrameworkTraceError(f"an event near byte {at:,} is not valid JSON ({e}); the trace is damaged") from None


def document(head: bytes, tail: bytes, name: str) -> dict:
    """The top-level keys of the document but its events (``{}`` for an array)."""
    try:
        d = json.loads(head + tail, parse_float=str)
    except (ValueError, UnicodeDecodeError) as e:
        raise FrameworkTraceError(f"{name!r}: the text around traceEvents is not valid JSON ({e})") from None
    if isinstance(d, list):
        return {}
    d.pop("traceEvents", None)
    return d


def ns_of(value, what: str = "ts") -> int:
    """µs as Chrome JSON writes them (an int, or a decimal's text kept by
    ``parse_float=str``) to integer ns, exactly: ``"12.3456"`` is 12345 ns (digits past
    the ns dropped, as Kineto's own ns never have them)."""
    if isinstance(value, bool) or value is None:
        raise FrameworkTraceError(f"{what} is {value!r}, not a number of µs")
    if isinstance(value, int):
        return value * 1000
    text = str(value)
    if "e" in text or "E" in text:
        from decimal import Decimal, InvalidOperation

        try:
            return int(Decimal(text) * 1000)
        except InvalidOperation:
            raise FrameworkTraceError(f"{what} {text!r} is not a number of µs") from None
    whole, _, frac = text.partition(".")
    try:
        sign = -1 if whole.startswith("-") else 1
        return int(whole) * 1000 + sign * int((frac + "000")[:3])
    except ValueError:
        raise FrameworkTraceError(f"{what} {text!r} is not a number of µs") from None
