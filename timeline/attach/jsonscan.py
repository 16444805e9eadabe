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

import json
import operator
from typing import Any, Iterator, NamedTuple

import msgspec
import numpy as np

from timeline.attach.sniff import FrameworkTraceError, open_bytes

__all__ = ["CHUNK_BYTES", "Event", "HEAD_LIMIT", "Lean", "Piece", "args_of", "document", "durations", "framed", "ns_array", "ns_of",
           "open_bytes", "pieces", "skip_comma", "take"]

RAW_NONE = msgspec.Raw(b"null")

CHUNK_BYTES = 4 << 20  # bytes read at a time: bounds memory (a piece and one event); a piece's
# events stay in the caches while each field is read (8 MB: read 4.57 -> 4.18 s, attach -o 9.76 -> 8.59 s a GB)
HEAD_LIMIT = 64 << 20  # the text before traceEvents' array may be at most this long
QUOTE, BACKSLASH = 34, 92
OPEN_OBJ, CLOSE_OBJ, OPEN_ARR, CLOSE_ARR = 123, 125, 91, 93


class Event(msgspec.Struct):
    """The fields of a Chrome trace event the readers look at; ``ts``, ``dur`` and
    ``args`` kept as their raw JSON text (``ns_of`` reads a ``ts`` exactly; ``args``
    is decoded only where a reader needs it), the rest as JSON gives them."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    bp: Any = None
    s: Any = None
    ts: msgspec.Raw = RAW_NONE
    dur: msgspec.Raw = RAW_NONE
    args: msgspec.Raw = RAW_NONE


class Lean(msgspec.Struct, gc=False):
    """``Event`` less the fields only the scanner's callers read (``bp``, ``s``), out of
    the garbage collector's sight: what the Kineto reader and the Perfetto conversion
    decode each piece into (the other fields skipped in C)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    ts: msgspec.Raw = RAW_NONE
    dur: msgspec.Raw = RAW_NONE
    args: msgspec.Raw = RAW_NONE


class Piece(NamedTuple):
    """A run of complete events: ``text`` their JSON (a view of the bytes read;
    ``offset`` where it begins in the decompressed file), ``events`` them decoded
    (``Event``)."""

    text: memoryview
    offset: int
    events: list


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


class _Head(NamedTuple):
    head: bytes  # up to and including the array's '['
    rest: bytes  # what was read after it
    depth: int  # the array's depth (events are objects at depth + 1)


def _find_array(f, name: str, chunk_bytes: int = CHUNK_BYTES) -> _Head:
    """Read until the ``traceEvents`` array opens (or the document is an array),
    ``chunk_bytes`` at a time."""
    buf = b""
    while True:
        more = f.read(chunk_bytes)
        buf += more
        stripped = buf.lstrip()
        if stripped[:1] == b"[":
            at = len(buf) - len(stripped)
            return _Head(buf[:at + 1], buf[at + 1:], 1)
        if stripped and stripped[:1] != b"{":
            raise FrameworkTraceError(f"{name!r} is not JSON (it starts with {stripped[:16]!r}): a PyTorch "
                                      "profiler trace is the JSON prof.export_chrome_trace writes")
        key = buf.find(b'"traceEvents"')
        if key >= 0:  # the brackets before the last "traceEvents" only (not the whole first read)
            a = np.frombuffer(buf, np.uint8)[:buf.rfind(b'"traceEvents"')]
            pos, kind, depth, _ = _brackets(a, 0)
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


_DECODE = msgspec.json.Decoder(list[Event])
CUT_TRIES = 64  # candidate cuts tried per read before reading more


def framed(text) -> bytearray:
    """``text`` (events separated by commas) after a ``[``: a buffer whose prefixes,
    closed by one byte set to ``]``, decode without being copied."""
    buf = bytearray(len(text) + 1)
    buf[0] = OPEN_ARR
    buf[1:] = text
    return buf


def _decode(view, decoder=_DECODE):
    """``view`` (a JSON array of events) decoded by ``decoder`` (a list of structs),
    or None where it is not whole (a cut inside an event or a string: a syntax
    error)."""
    try:
        return decoder.decode(view)
    except msgspec.ValidationError as e:
        raise FrameworkTraceError(f"traceEvents holds an element that is not an event object ({e})") from None
    except msgspec.DecodeError:
        return None


def _whole(buf: bytearray, decoder=_DECODE):
    """The longest prefix of the events in ``buf`` (``framed``) made of whole events
    ending at a ``},``: ``(cut, events)`` (``cut`` counted in the text, after the
    ``[``), or ``(0, None)``. A prefix that decodes as a JSON array of objects is
    whole: a cut inside a string or a nested value leaves an unclosed string or
    bracket, a syntax error. The byte after the ``}`` (a comma or a space) is set to
    ``]`` for the decode and put back."""
    pos = len(buf)
    for _ in range(CUT_TRIES):
        pos = buf.rfind(b"}", 1, pos)
        if pos < 0:
            return 0, None
        if bytes(buf[pos + 1:pos + 64]).lstrip()[:1] == b",":
            saved, buf[pos + 1] = buf[pos + 1], CLOSE_ARR
            try:
                got = _decode(memoryview(buf)[:pos + 2], decoder)
            finally:
                buf[pos + 1] = saved
            if got is not None:
                return pos, got
    return 0, None


def _last(buf: bytearray, name: str, offset: int, decoder=_DECODE):
    """At the end of the file: where the events' array closes (its ``]``, counted
    in the text of ``buf``, ``framed``), and its events."""
    pos = len(buf)
    for _ in range(CUT_TRIES):
        pos = buf.rfind(b"]", 1, pos)
        if pos < 0:
            break
        got = _decode(memoryview(buf)[:pos + 1], decoder)
        if got is not None:
            return pos - 1, got
    whole, _ = _whole(buf, decoder)  # where the last whole event ends, to say where the file was cut
    last = f", its last whole event ending at byte {offset + whole:,}" if whole else ""
    raise FrameworkTraceError(f"{name!r} ends inside its traceEvents array (after byte {offset + len(buf) - 1:,}"
                              f"{last}): the file is truncated or damaged; export it again")


def pieces(path, *, chunk_bytes: int = CHUNK_BYTES, tail: list | None = None, head: list | None = None,
           decoder=_DECODE) -> Iterator[Piece]:
    """The file's events, a ``Piece`` at a time, in file order, decoded by ``decoder``
    (``list[Event]``; a reader that needs fewer fields gives a ``msgspec`` decoder of
    a list of a smaller struct: fields it lacks are skipped in C, the cuts are the
    same). ``head`` / ``tail`` (lists, when given) receive the text before the events'
    array (its ``[`` included), and the text from its closing ``]`` to the end and
    that ``]``'s offset. A ``FrameworkTraceError`` for a file that is not a Chrome
    trace or ends inside an event. Each piece's text is a view of the bytes read
    (nothing is copied but what is left after a piece's last event)."""
    name = str(path)
    with open_bytes(path) as f:
        h = _find_array(f, name, chunk_bytes)  # a read error: open_bytes' one-line refusal
        if head is not None:
            head.append(h.head)
        buf, offset = framed(h.rest), len(h.head)
        while True:
            more = f.read(chunk_bytes)
            if not more:
                end, evs = _last(buf, name, offset, decoder)
                if evs:
                    yield Piece(memoryview(buf)[1:end + 1], offset, evs)
                if tail is not None:
                    tail += [bytes(buf[end + 1:]), offset + end]  # the tail's text, and where the array's "]" sits
                return
            buf += more
            cut, evs = _whole(buf, decoder)
            if evs is None:
                continue  # no whole event yet: read more
            yield Piece(memoryview(buf)[1:cut + 1], offset, evs)
            lead = skip_comma(buf, cut + 1)
            buf, offset = framed(memoryview(buf)[cut + 1 + lead:]), offset + cut + lead


def skip_comma(buf, at: int) -> int:
    """How many bytes from ``at`` are whitespace and then one comma (what separates
    a piece's last event from the next piece)."""
    rest = bytes(buf[at:at + 4096])
    lead = len(rest) - len(rest.lstrip())
    while lead == len(rest) and at + lead < len(buf):  # a long run of whitespace
        rest = bytes(buf[at + lead:at + lead + 4096])
        lead += len(rest) - len(rest.lstrip())
    if bytes(buf[at + lead:at + lead + 1]) == b",":
        lead += 1
    return lead


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


_ARGS = msgspec.json.Decoder()


POW10 = 10 ** np.arange(19, dtype=np.int64)  # 10**0 .. 10**18: the weight of a digit in ns
INT_DIGITS = 15  # digits before the dot read at once (µs < 10**15: ns < 10**18 fit int64)


def ns_array(raws, what: str = "ts", *, null=None) -> np.ndarray:
    """``ns_of`` of many raw numbers at once (int64), with no per-number Python step
    for the forms ``123`` and ``123.456``: the texts joined into one byte array and
    read as a matrix a length (``_plain_ns``); any other form (a sign, an exponent,
    more than ``INT_DIGITS`` whole digits) through ``ns_of`` one by one.
    ``null``: the value of a missing number (None: refused)."""
    n = len(raws)
    if not n:
        return np.zeros(0, np.int64)
    lens = np.fromiter(map(len, raws), np.int64, n)
    if not lens.all():
        return np.array([ns_of(r, what) for r in raws], np.int64)
    buf = np.frombuffer(b"".join(raws), np.uint8)
    out, plain = _plain_ns(buf, np.cumsum(lens) - lens, lens)
    for i in np.flatnonzero(~plain).tolist():
        r = bytes(raws[i])
        v = null if (null is not None and r == b"null") else ns_of(r, what)
        if not -2**63 <= v < 2**63:
            raise FrameworkTraceError(f"{what} {r[:30]!r} is past the ns a trace can hold (2**63)")
        out[i] = v
    return out


def _plain_ns(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple:
    """(ns, plain) of the numbers ``buf[starts[i]:starts[i] + lens[i]]`` that are of
    the forms ``123`` / ``123.456`` with at most ``INT_DIGITS`` whole digits (``plain``;
    the others' ns undefined): the numbers of one length as one byte matrix, and those
    of one dot position as one matrix product with their digits' weights in ns
    (``POW10``, digits past the ns dropped). A handful of lengths and dot positions
    in a Kineto trace: no Python step per number."""
    n = len(lens)
    out, plain = np.zeros(n, np.int64), np.zeros(n, bool)
    for width in [int(lens[0])] if lens.min() == lens.max() else np.unique(lens).tolist():
        rows = np.flatnonzero(lens == width)
        m = buf.reshape(n, width) if len(rows) == n else buf[starts[rows, None] + np.arange(width)]
        dot = m == 46
        ones = np.ones(width, np.float32)  # per-row counts as matrix products (exact below 2**24)
        ndot = dot.astype(np.float32) @ ones
        at = np.where(ndot > 0, dot.argmax(1), width)  # each number's dot (its end where none)
        ok = (ndot <= 1) & (at <= INT_DIGITS)
        other = ~((m - 48 < 10) | dot)
        if other.any():
            ok &= (other.astype(np.float32) @ ones) == 0
        plain[rows] = ok
        j = np.arange(width)
        one = ok.all() and at.min() == at.max()  # the usual case: one dot position
        for a in [int(at[0])] if one else np.unique(at[ok]).tolist():
            sel = slice(None) if one else np.flatnonzero(ok & (at == a))
            place = a - j + 2 + (j > a)  # the power of ten of each digit in ns
            weight = np.where((place >= 0) & (j != a), POW10[np.clip(place, 0, 18)], 0)
            out[rows[sel]] = (m[sel].astype(np.int64) - 48) @ weight
    return out, plain


def durations(events: list, name: str, raws=None) -> np.ndarray:
    """The ``dur`` of ``events`` (``X`` events) in ns (0 where absent); a negative one
    refused naming its event and the file (the one rule for every ``dur`` read: a
    slice never ends before it starts, nor is one silently made 0 long). ``raws``:
    their ``dur`` texts, where the caller gathered them already."""
    dur = ns_array([e.dur for e in events] if raws is None else raws, f"{name!r}: a dur", null=0)
    if (dur < 0).any():
        e = events[int(np.argmax(dur < 0))]
        ts = bytes(e.ts)[:24].decode(errors="replace")
        raise FrameworkTraceError(f"{name!r}: the {e.cat} event {str(e.name)[:60]!r} at ts {ts} µs has dur "
                                  f"{bytes(e.dur)[:24].decode(errors='replace')} µs: a length cannot be negative; "
                                  "correct it (its end minus its start) or export the trace again")
    return dur


def args_of(raw) -> dict:
    """An event's ``args`` (raw JSON text) as a dict ({} where absent or not an object)."""
    try:
        d = _ARGS.decode(raw)
    except msgspec.DecodeError:
        return {}
    return d if isinstance(d, dict) else {}


def ns_of(value, what: str = "ts") -> int:
    """µs as Chrome JSON writes them (the raw text of a number, an int, or a decimal's
    text) to integer ns, exactly: ``12.3456`` is 12345 ns (digits past the ns dropped,
    as Kineto's own ns never have them)."""
    if isinstance(value, msgspec.Raw):
        value = bytes(value)
    if isinstance(value, (bytes, bytearray)):
        if value.isdigit():
            return int(value) * 1000
        whole, dot, frac = value.partition(b".")
        if dot and frac.isdigit() and (whole.isdigit() or (whole[:1] == b"-" and whole[1:].isdigit())):
            sign = -1 if whole[:1] == b"-" else 1
            return int(whole) * 1000 + sign * int((frac + b"000")[:3])
        if value == b"null":
            raise FrameworkTraceError(f"{what} is missing")
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise FrameworkTraceError(f"{what} {value[:30]!r} is not a number of µs") from None
        if not value[:1].isdigit() and value[:1] != "-":
            raise FrameworkTraceError(f"{what} is {value[:30]!r}, not a number of µs")
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


def take(items: list, mask: np.ndarray) -> list:
    """The items where ``mask`` holds, picked in C (``operator.itemgetter``)."""
    idx = np.flatnonzero(mask).tolist()
    if len(idx) < 2:
        return [items[i] for i in idx]
    return list(operator.itemgetter(*idx)(items))
