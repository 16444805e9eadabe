"""Chrome Trace Event Format (JSON) export, streamed to disk.

Layout of the file (Perfetto UI, ``chrome://tracing`` and speedscope read it):

- one process per (rank, launch): ``process_name`` "rank R · launch L" (with
  " · SYNTHETIC" for synthetic data) and ``process_sort_index`` = pid;
- one thread per (CTA, wave): ``thread_name`` "CTA c · wave w" and
  ``thread_sort_index`` = tid, so rows appear in CTA order;
- per task an event named by its stage (``cat`` = stage) spanning its first to
  its last phase, args: stage, task, CTA, wave, placement (XCC/SE/CU on AMD, SM on
  NVIDIA, ``hw_unit``) and ``phase_us`` (each phase interval's duration in µs,
  null where the interval is missing); nested in it an event per phase interval
  named ``start→hint``, ... (``cat`` = "phase"), args: stage, task, ``inherited``
  (an end point was a missing mark, see ``timeline.trace``);
- ``otherData``: kernel, tool version, clock, ``synthetic``.

Events are complete events (``"ph":"X"``, ts + dur) by default, or with
``complete=False`` begin/end pairs (``"B"``/``"E"``, the end written as its own
timestamp). Why both: a viewer computes a complete event's end as ``ts + dur`` in
floating point, which can land one ulp past the next phase's ``ts`` when the two
touch (speedscope then mis-nests the phases; trace_processor truncates
``ts * 1000`` to ns). A B/E pair gives the touching end and begin the same text,
hence the same number in any reader, and nests exactly.

Timestamps are µs written from the integer ns as exact decimals
(``ns // 1000 "." ns % 1000``, three digits), so a trace of any length keeps ns
resolution; no float formatting anywhere.

How it is fast: each chunk of task rows becomes one ``uint8`` matrix with a
fixed-width row per task: the task's event followed by one slot per phase
interval, every numeric field right-aligned in the chunk's widest width and
padded with spaces (JSON whitespace), a missing interval's slot all spaces. The
matrix in row-major order *is* the JSON text of the chunk, written with one
``write``; there is no per-event Python object.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from timeline import schema as S
from timeline.export import _common as C
from timeline.trace import Trace, __version__

SPACE = 32


def _group_table() -> np.ndarray:
    """Rows 0..999: three digits zero-padded; 1000..1999: the same with leading zeros
    as spaces (a number's top group); 2000: three spaces (above a number's top)."""
    t = np.empty((2001, 3), dtype=np.uint8)
    for i in range(1000):
        t[i] = list(f"{i:03d}".encode())
        t[1000 + i] = list(f"{i:3d}".encode())
    t[2000] = SPACE
    return t


_GROUPS = _group_table()
_FRAC = np.array([list(f".{i:03d}".encode()) for i in range(1000)], dtype=np.uint8)  # (1000, 4)
_NULL = np.frombuffer(b"null", np.uint8)


# -- fixed-width text columns -------------------------------------------------
def _fill_digits(out: np.ndarray, a: np.ndarray) -> None:
    """Right-align the decimal digits of non-negative int64 ``a`` in ``out`` ``(n, w)``,
    spaces on the left; ``w`` must hold the widest. Three digits a step."""
    n, w = out.shape
    groups = -(-w // 3)
    buf = out if w == groups * 3 else np.empty((n, groups * 3), dtype=np.uint8)
    for g in range(groups):
        hi = (groups - g) * 3
        rest = a // 1000
        code = a % 1000 + 1000 * (rest == 0)
        if g:
            code[a == 0] = 2000
        buf[:, hi - 3:hi] = _GROUPS[code]
        a = rest
    if buf is not out:
        out[:] = buf[:, groups * 3 - w:]


def _width(a: np.ndarray) -> int:
    return len(str(int(a.max()))) if a.size else 1


def _sign(out: np.ndarray, a: np.ndarray, neg: np.ndarray) -> None:
    """Put ``-`` just left of the digits of ``a`` in the rows where ``neg``."""
    rows = np.flatnonzero(neg)
    nd = np.array([len(str(int(x))) for x in a[rows]], dtype=np.int64)  # only negative rows
    out[rows, out.shape[1] - nd - 1] = ord("-")


def digits(values, *, null=None) -> np.ndarray:
    """Decimal text of int64 ``values`` as a ``(n, w)`` uint8 matrix: right-aligned,
    left-padded with spaces, ``-`` before negative numbers, ``null`` where the
    ``null`` mask is set; ``w`` is the widest entry."""
    v = np.asarray(values, dtype=np.int64)
    neg = v < 0
    a = np.abs(v)
    has_neg, has_null = bool(neg.any()), null is not None and bool(null.any())
    w = _width(a) + has_neg
    if has_null:
        w = max(w, 4)
    out = np.empty((len(v), w), dtype=np.uint8)
    _fill_digits(out, a)
    if has_neg:
        _sign(out, a, neg)
    if has_null:
        out[null] = SPACE
        out[null, w - 4:] = _NULL
    return out


def micros(ns, *, null=None) -> np.ndarray:
    """Exact µs text of int64 ns: ``<ns // 1000>.<ns % 1000 in three digits>`` (sign
    in front), laid out as ``digits`` does; ``null`` where masked."""
    ns = np.asarray(ns, dtype=np.int64)
    neg = ns < 0
    a = np.abs(ns)
    ip = a // 1000
    has_neg, has_null = bool(neg.any()), null is not None and bool(null.any())
    wi = _width(ip) + has_neg
    out = np.empty((len(ns), wi + 4), dtype=np.uint8)
    _fill_digits(out[:, :wi], ip)
    out[:, wi:] = _FRAC[a % 1000]
    if has_neg:
        _sign(out[:, :wi], ip, neg)
    if has_null:
        out[null] = SPACE
        out[null, wi:] = _NULL
    return out


def strings(texts) -> np.ndarray:
    """A lookup table of UTF-8 ``texts`` as a ``(k, w)`` uint8 matrix, each padded
    with trailing spaces to the longest; index it with codes to get a column."""
    enc = [t.encode() for t in texts]
    w = max((len(e) for e in enc), default=0)
    return np.array([list(e.ljust(w, b" ")) for e in enc], dtype=np.uint8).reshape(len(enc), w)


def assemble(n: int, pieces) -> np.ndarray:
    """The ``(n, W)`` uint8 matrix of ``pieces`` side by side: a ``bytes`` piece is
    the same in every row, an array piece is ``(n, w)``. The constant bytes go in
    as one template row broadcast down the matrix, then each array piece is copied
    into its columns."""
    widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in pieces]
    template = np.zeros(sum(widths), dtype=np.uint8)
    at = 0
    for p, w in zip(pieces, widths):
        if isinstance(p, bytes):
            template[at:at + w] = np.frombuffer(p, np.uint8)
        at += w
    out = np.empty((n, len(template)), dtype=np.uint8)
    out[:] = template
    at = 0
    for p, w in zip(pieces, widths):
        if not isinstance(p, bytes):
            out[:, at:at + w] = p
        at += w
    return out


def _json(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


# -- the file ---------------------------------------------------------------------
def _header(trace: Trace) -> bytes:
    sp = trace.spec
    other = {
        "tool": f"mono-timeline {__version__}",
        "kernel": sp.kernel,
        "clock": sp.clock._asdict(),
        "arch": sp.arch,
        "ranks": trace.ranks,
        "phases": list(sp.phases),
        "synthetic": trace.synthetic,
    }
    if trace.synthetic:
        other["note"] = "SYNTHETIC data from timeline.synth: not measured on a GPU"
    return ('{"displayTimeUnit":"ns","otherData":' + json.dumps(other, ensure_ascii=False)
            + ',"traceEvents":[\n').encode()


def _metadata(trace: Trace, num: C.Numbering) -> list:
    """``ph: M`` text naming and ordering every process and thread that has rows, as
    byte blocks, each line starting with its comma (one line per process or thread
    and key: thousands, not millions, so plain string formatting)."""
    pid, tid, rank, launch, cta, wave = C.threads(trace, num)
    lines = []
    for p in np.unique(pid).tolist():
        r, la = (p - 1) // num.launches, (p - 1) % num.launches
        name = _json(C.process_name(r, la, trace.synthetic))
        lines.append(f',{{"ph":"M","pid":{p},"tid":0,"name":"process_name","args":{{"name":{name}}}}}\n'
                     f',{{"ph":"M","pid":{p},"tid":0,"name":"process_sort_index","args":{{"sort_index":{p}}}}}\n')
    for p, t, c, w in zip(pid.tolist(), tid.tolist(), cta.tolist(), wave.tolist()):
        name = _json(C.thread_name(c, w))
        lines.append(f',{{"ph":"M","pid":{p},"tid":{t},"name":"thread_name","args":{{"name":{name}}}}}\n'
                     f',{{"ph":"M","pid":{p},"tid":{t},"name":"thread_sort_index","args":{{"sort_index":{t}}}}}\n')
    return ["".join(lines).encode()]


def _chunk_text(rec: C.Records, num: C.Numbering, stage_names, phases, keys, complete: bool):
    """The JSON text of one chunk as a ``(n, W)`` uint8 matrix, one task record a row
    (the task's event, then a slot per phase interval; with ``complete=False`` each
    event is a ``B`` line and an ``E`` line carrying the same name and args, and the
    task's ``E`` closes the record), and the number of events in it."""
    n = rec.n
    pid = digits(num.pid(rec.rank, rec.launch))
    tid = digits(num.tid(rec.cta, rec.wave))
    task = digits(rec.task)
    si = rec.stage_index.astype(np.int64)

    heads = {}

    def head(ph):  # one pre-assembled block a kind: a few wide copies beat many narrow ones
        if ph not in heads:
            heads[ph] = assemble(n, [f',{{"ph":"{ph}","pid":'.encode(), pid, b',"tid":', tid, b',"ts":'])
        return [heads[ph]]

    stage_task = strings([f'"name":{_json(s)},"cat":{_json(s)},"args":{{"stage":{_json(s)}'
                          for s in stage_names])[si]
    stage_task_args = assemble(n, [strings([_json(s) for s in stage_names])[si], b',"task":', task])
    names = S.interval_names(phases)
    dur = rec.end - rec.start
    dur_text = [micros(dur[:, j], null=~rec.valid[:, j]) for j in range(len(names))]
    body = [b",", stage_task, b',"task":', task, b',"cta":', digits(rec.cta),
            b',"wave":', digits(rec.wave)]
    for k in keys:
        v, null = rec.place[k]
        body += [f',"{k}":'.encode(), digits(v, null=null)]
    body.append(b',"phase_us":{')
    for j, name in enumerate(names):
        body += [(b"," if j else b"") + f"{_json(name)}:".encode(), dur_text[j]]
    body.append(b"}}}\n")
    first = micros(rec.first)
    if complete:
        pieces = head("X") + [first, b',"dur":', micros(rec.last - rec.first)] + body
    else:
        pieces = head("B") + [first] + body
    inherited = strings(["false", "true"])
    slots = []
    for j, name in enumerate(names):
        lo = _width_of(pieces)
        pbody = [f',"name":{_json(name)},"cat":"phase","args":{{"stage":'.encode(), stage_task_args,
                 b',"inherited":', inherited[rec.inherited[:, j].astype(np.int64)], b"}}\n"]
        start = micros(rec.start[:, j])
        if complete:
            pieces += head("X") + [start, b',"dur":', dur_text[j]] + pbody
        else:
            pieces += head("B") + [start] + pbody + head("E") + [micros(rec.end[:, j])] + pbody
        slots.append((lo, _width_of(pieces) - 1))  # the last newline stays
    if not complete:
        pieces += head("E") + [micros(rec.last)] + body
    text = assemble(n, pieces)
    for j, (lo, hi) in enumerate(slots):
        missing = ~rec.valid[:, j]
        if missing.any():
            text[missing, lo:hi] = SPACE  # whitespace keeps the row's width; the event is absent
    return text, (n + int(rec.valid.sum())) * (1 if complete else 2)


def _width_of(pieces) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.shape[1] for p in pieces)


def _open(path_or_file):
    """(binary writer, close-when-done) for a path or an open file (text or binary)."""
    if hasattr(path_or_file, "write"):
        f = path_or_file
        if isinstance(f, io.TextIOBase):
            return _TextSink(f), False
        return f, False
    path = Path(path_or_file)
    if path.is_dir():
        raise C.ExportError(f"{str(path)!r} is a directory; give a file name such as trace.json")
    if not path.parent.exists():
        raise C.ExportError(f"cannot write {str(path)!r}: directory {str(path.parent)!r} does not exist")
    return open(path, "wb"), True


class _TextSink:
    """Bytes in, text out: lets a text file (``sys.stdout``, ``io.StringIO``) take the export."""

    def __init__(self, f):
        self.f = f

    def write(self, b):
        self.f.write(bytes(b).decode())


def write_chrome(trace: Trace, path_or_file, *, ranks=None, launches=None, stages=None,
                 progress=None, complete: bool = True, chunk_rows: int = C.CHUNK_ROWS) -> int:
    """Write ``trace`` as Chrome Trace Event Format JSON to a path or an open file
    (binary or text) and return the number of events written (metadata included).

    ``ranks`` / ``launches`` / ``stages`` (lists; None = all) select rows; an unknown
    value raises ``ExportError``. ``progress(done, total)``, if given, is called after
    each chunk with task rows done and total. ``complete``: ``"X"`` events (True) or
    ``"B"``/``"E"`` pairs (False; exact nesting in float-based viewers, see the
    module docstring). Events go out per track in time order. Memory stays bounded
    by ``chunk_rows`` task rows (plus the trace itself): the text is streamed chunk
    by chunk."""
    num = C.numbering(trace)  # from the whole trace: ids stable under selection
    sub = C.select(trace, ranks=ranks, launches=launches, stages=stages)
    stage_names = sub.spec.stage_names
    keys = C.placement_keys(sub)
    f, close = _open(path_or_file)
    try:
        f.write(_header(sub))
        events, done, total = 0, 0, sub.tasks.num_rows
        for block in _metadata(sub, num):
            if block:
                f.write(block if events else block[1:])  # every event line starts with its comma
                events += block.count(b"\n")
        for rec in C.records(sub, chunk_rows):
            if rec.n:
                text, k = _chunk_text(rec, num, stage_names, sub.phases, keys, complete)
                flat = memoryview(text.reshape(-1))
                f.write(flat if events else flat[1:])  # every event line starts with its comma
                events += k
            done += rec.rows
            if progress is not None:
                progress(done, total)
        f.write(b"\n]}\n")
    finally:
        if close:
            f.close()
    return events
