"""Chrome Trace Event Format (JSON) export, streamed to disk.

Layout of the file (Perfetto UI, ``chrome://tracing`` and speedscope read it):

- one process per (rank, launch): ``process_name`` "rank R · launch L" (with
  " · SYNTHETIC" for synthetic data) and ``process_sort_index`` = pid;
- one thread per (CTA, wave): ``thread_name`` "CTA c · wave w" and
  ``thread_sort_index`` = tid, so rows appear in CTA order; rows without a
  placement word on threads "unplaced · lane k" after the CTAs' (args ``cta`` and
  ``wave`` null; ``timeline.core.rows.tracks``);
- per task an event named by its stage (``cat`` = stage) spanning its first to
  its last phase, args: stage, task, CTA, wave, placement (XCC/SE/CU on AMD, SM on
  NVIDIA, ``hw_unit``) and ``phase_us`` (each phase interval's duration in µs,
  null where the interval is missing); nested in it an event per phase interval
  named ``start→hint``, ... (``cat`` = "phase"), args: stage, task, ``inherited``
  (an end point was a missing mark, see ``timeline.core.trace``);
- ``otherData``: kernel, tool version, clock, ``synthetic``, ``origin_ts_us`` (the ts of ns 0).

Events are begin/end pairs (``"B"``/``"E"``) by default, or with ``complete=True``
complete events (``"X"``, ts + dur; smaller, but float-based readers mis-nest them).
Zero-length intervals are instants, one per tick (``_instants``), and the time axis
is shifted so that every ts lies in ``[O, 2 O]`` µs (``time_base``): the two rules
that make Perfetto's trace processor, Chrome DevTools' trace engine and speedscope
all show every span exactly (docs/EXPORTS.md has the measurements).

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

import json
from functools import partial
from typing import NamedTuple

import numpy as np
import pyarrow.compute as pc

from timeline.contract import schema as S
from timeline.export import _common as XC
from timeline.export._sink import open_sink
from timeline.export._text import SPACE, assemble, digits, micros, strings
from timeline.core.trace import Trace, __version__


def _json(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


# -- the file ---------------------------------------------------------------------
def _header(trace: Trace, base_ns: int) -> bytes:
    sp = trace.spec
    other = {
        "origin_ts_us": (micros(np.array([base_ns])).tobytes().decode().strip()),
        "tool": f"mono-timeline {__version__}",
        "kernel": sp.kernel,
        "clock": sp.clock._asdict(),
        "arch": sp.arch,
        "ranks": trace.ranks,
        "phases": list(sp.phases),
        "synthetic": trace.synthetic,
    }
    if trace.synthetic:
        other["note"] = "SYNTHETIC data from timeline.ingest.synth: not measured on a GPU"
    return ('{"displayTimeUnit":"ns","otherData":' + json.dumps(other, ensure_ascii=False)
            + ',"traceEvents":[\n').encode()


MAX_BASE_US = 1 << 41  # above, two ns one apart can parse to one double near 2 x base


def time_base(trace: Trace) -> int:
    """``base_ns``: the export writes ns value t as ``ts = (t + base_ns) / 1000`` µs,
    every ``ts`` of the trace in ``[O, 2 O]`` µs with ``O`` a power of two at least the
    trace's span. Readers parse ``ts`` to doubles; in ``[O, 2 O]`` the difference of
    two is exact (Sterbenz's lemma) and distinct ns stay distinct doubles, so a
    reader's ``begin + (end - begin)`` is ``end`` bit for bit and touching or nested
    events compare as their ns do. ns 0 of the trace is at ``otherData.origin_ts_us``."""
    lo, hi = 0, 0
    for p in trace.phases + trace.marks:
        mm = pc.min_max(trace.tasks.column(f"{p}_ns")).as_py()
        if mm["min"] is not None:
            lo, hi = min(lo, mm["min"]), max(hi, mm["max"])
    span_us = max(-(-(hi - lo) // 1000), 1)
    base_us = 1 << (span_us - 1).bit_length()
    if base_us > MAX_BASE_US:
        raise XC.ExportError(f"the trace spans {span_us} µs; a Chrome JSON export keeps every ns exact "
                            f"up to {MAX_BASE_US} µs: export a selection (launches=[...])")
    return base_us * 1000 - lo


def _metadata(trace: Trace, num: XC.Numbering, embed: XC.Embed | None = None) -> list:
    """``ph: M`` text naming and ordering every process and thread that has rows, as
    byte blocks, each line starting with its comma: processes (a few) by string
    formatting, threads (tens of thousands) assembled as fixed-width rows with their
    names from a table of the distinct (CTA, wave) names."""
    pid, tid, rank, launch, cta, wave, lane = XC.threads(trace, num)
    lines = []
    for p in np.unique(pid).tolist():
        r, la = num.of_pid(p)
        name = _json((embed or XC.Embed()).name(trace, r, la))
        lines.append(f',{{"ph":"M","pid":{p},"tid":0,"name":"process_name","args":{{"name":{name}}}}}\n'
                     f',{{"ph":"M","pid":{p},"tid":0,"name":"process_sort_index","args":{{"sort_index":{p}}}}}\n'
                     .encode())
    if len(tid):
        names, first, inverse = np.unique(tid, return_index=True, return_inverse=True)  # one name a thread id
        table = strings([_json(XC.thread_name(int(cta[i]), int(wave[i]), int(lane[i]))) for i in first.tolist()])
        pt = [b',{"ph":"M","pid":', digits(pid), b',"tid":', digits(tid)]
        threads = assemble(len(tid), pt + [b',"name":"thread_name","args":{"name":', table[inverse.reshape(-1)],
                                           b'}}\n'] + pt + [b',"name":"thread_sort_index","args":{"sort_index":',
                                                            digits(tid), b'}}\n'])
        lines.append(threads.tobytes())
    return [b"".join(lines)]


class _Lines:
    """What every event line of a chunk shares: its ``"ph"`` head with pid, tid and
    ``"ts":`` (one pre-assembled block a kind: a few wide copies beat many narrow
    ones), and ns written as µs on the export's axis (``ts``)."""

    def __init__(self, rec: XC.Records, num: XC.Numbering, base_ns: int):
        self.n, self.base_ns = rec.n, base_ns
        self.pid, self.tid = digits(num.pid(rec.rank, rec.launch)), digits(num.tid(rec.cta, rec.wave, rec.lane))
        self._heads = {}

    def head(self, ph) -> list:
        if ph not in self._heads:  # an instant's scope "s" defaults to the thread: the same width as a B line
            self._heads[ph] = assemble(self.n, [f',{{"ph":"{ph}","pid":'.encode(), self.pid, b',"tid":', self.tid,
                                                b',"ts":'])
        return [self._heads[ph]]

    def ts(self, ns):
        return micros(ns + self.base_ns)


INHERITED = strings(["false", "true"])


def _task_body(rec: XC.Records, stage_names, names, keys, dur_text) -> list:
    """The task event's pieces after its time: name, category, args (stage, task, CTA,
    wave, placement, each interval's ``phase_us``)."""
    si = rec.stage_index.astype(np.int64)
    stage_task = strings([f'"name":{_json(s)},"cat":{_json(s)},"args":{{"stage":{_json(s)}'
                          for s in stage_names])[si]
    unplaced = rec.lane >= 0  # no placement word: CTA and wave null (timeline.core.rows.tracks)
    body = [b",", stage_task, b',"task":', digits(rec.task), b',"cta":', digits(rec.cta, null=unplaced),
            b',"wave":', digits(rec.wave, null=unplaced)]
    for k in keys:
        v, null = rec.place[k]
        body += [f',"{k}":'.encode(), digits(v, null=null)]
    body.append(b',"phase_us":{')
    for j, name in enumerate(names):
        body += [(b"," if j else b"") + f"{_json(name)}:".encode(), dur_text[j]]
    body.append(b"}}}\n")
    return body


def _chunk_text(rec: XC.Records, num: XC.Numbering, stage_names, phases, keys, complete: bool, base_ns: int,
                marks=()):
    """The JSON text of one chunk as a ``(n, W)`` uint8 matrix, one task record a row
    (the task's event, then a slot per phase interval; with ``complete=False`` each
    event is a ``B`` line and an ``E`` line carrying the same name and args, and the
    task's ``E`` closes the record), and the number of events in it. A phase of zero
    length is an instant (``"ph":"i"``) in its slot, a task of zero length one
    instant for the whole record (see ``_instants``)."""
    lines = _Lines(rec, num, base_ns)
    si = rec.stage_index.astype(np.int64)
    stage_task_args = assemble(rec.n, [strings([_json(s) for s in stage_names])[si], b',"task":', digits(rec.task)])
    names = S.interval_names(phases)
    dur_text = [micros(rec.end[:, j] - rec.start[:, j], null=~rec.valid[:, j]) for j in range(len(names))]
    body = _task_body(rec, stage_names, names, keys, dur_text)
    first = lines.ts(rec.first)
    if complete:
        pieces = lines.head("X") + [first, b',"dur":', micros(rec.last - rec.first)] + body
    else:
        pieces = lines.head("B") + [first] + body
    slots = []
    for j, name in enumerate(names):
        lo = _width_of(pieces)
        pbody = [f',"name":{_json(name)},"cat":"phase","args":{{"stage":'.encode(), stage_task_args,
                 b',"inherited":', INHERITED[rec.inherited[:, j].astype(np.int64)], b"}}\n"]
        start = lines.ts(rec.start[:, j])
        if complete:
            pieces += lines.head("X") + [start, b',"dur":', dur_text[j]] + pbody
        else:
            pieces += lines.head("B") + [start] + pbody + lines.head("E") + [lines.ts(rec.end[:, j])] + pbody
        slots.append((lo, _width_of(pieces) - 1))  # the last newline stays
    if not complete:
        pieces += lines.head("E") + [lines.ts(rec.last)] + body
    record_end = _width_of(pieces)  # the task's record ends here; its marks follow
    text = _with_marks(lines, rec, pieces, marks, stage_task_args)
    run_instant = partial(_run_instant, lines, rec, phases, names, stage_task_args)
    events = _instants(text, rec, slots, record_end, _task_instant(lines, rec, first, body, names), run_instant)
    per_span = 1 if complete else 2
    return text, per_span * (events.spans) + events.instants + int(rec.marked.sum())


def _with_marks(lines: _Lines, rec: XC.Records, pieces: list, marks, stage_task_args) -> np.ndarray:
    """The chunk's text: ``pieces`` and then one instant per mark at its own time (any
    order, any row), spaces where the mark was not written."""
    mark_slots = []
    for k, name in enumerate(marks):
        lo = _width_of(pieces)
        pieces = pieces + lines.head("i") + [lines.ts(rec.marks[:, k]), f',"name":{_json(name)},"cat":"mark",'
                                             f'"args":{{"stage":'.encode(), stage_task_args, b"}}\n"]
        mark_slots.append((lo, _width_of(pieces)))
    text = assemble(rec.n, pieces)
    for k, (lo, hi) in enumerate(mark_slots):
        unmarked = ~rec.marked[:, k]
        if unmarked.any():
            text[unmarked, lo:hi] = SPACE
    return text


def _run_instant(lines: _Lines, rec: XC.Records, phases, names, stage_task_args, j0, j1) -> list:
    """The instant of zero-length intervals j0..j1 (phases j0..j1+1 in one tick)."""
    name = f',"name":{_json("→".join(phases[j0:j1 + 2]))},"cat":"phase","args":{{"stage":'.encode()
    line = lines.head("i") + [lines.ts(rec.start[:, j0]), name, stage_task_args]
    if j0 == j1:
        return line + [b',"inherited":', INHERITED[rec.inherited[:, j0].astype(np.int64)], b"}}\n"]
    line.append(f',"intervals":{json.dumps(list(names[j0:j1 + 1]), ensure_ascii=False)},"inherited":['.encode())
    for j in range(j0, j1 + 1):
        line += [b"," if j > j0 else b"", INHERITED[rec.inherited[:, j].astype(np.int64)]]
    return line + [b"]}}\n"]


def _task_instant(lines: _Lines, rec: XC.Records, first, body, names) -> list:
    """A zero-length task's one instant: its event's args, ``inherited`` per interval
    (null where the interval is missing)."""
    line = lines.head("i") + [first] + body[:-1] + [b'},"inherited":[']
    for j in range(len(names)):
        line += [b"," if j else b"", strings(["false", "true", "null"])[
            np.where(rec.valid[:, j], rec.inherited[:, j], 2).astype(np.int64)]]
    line.append(b"]}}\n")
    return line


def _flow_events(trace: Trace, num: XC.Numbering, base_ns: int) -> tuple:
    """The critical path's hand-offs (``_common.flows``) as flow events: an ``s`` on
    the producer's thread where its results were ready, an ``f`` (``bp: e``, bound to
    the enclosing slice) on the consumer's at the end of its wait. (text, events)."""
    lines = []
    for k, fl in enumerate(XC.flows(trace)):
        for ph, (rank, launch, cta, wave), ns in (("s", fl.src, fl.src_ns), ("f", fl.dst, fl.dst_ns)):
            t = ns + base_ns
            bind = ',"bp":"e"' if ph == "f" else ""
            lines.append(f',{{"ph":"{ph}","id":{k + 1},"pid":{int(num.pid(rank, launch))},'
                         f'"tid":{int(num.tid(cta, wave))},"ts":{t // 1000}.{t % 1000:03d},"name":"hand-off",'
                         f'"cat":"flow"{bind},"args":{{"kind":"{fl.kind}"}}}}\n')
    return "".join(lines).encode(), len(lines)


class _Count(NamedTuple):
    """Events of a chunk by kind: spans (an ``X``, or a ``B``/``E`` pair) and instants."""

    spans: int
    instants: int


def _instants(text: np.ndarray, rec: XC.Records, slots, record_end, task_instant, run_instant) -> _Count:
    """Rewrite ``text`` in place where an event has no length. A missing interval's
    slot becomes spaces. A run of consecutive zero-length intervals (their phases
    stamped in one tick) becomes one instant in its first slot, named by the run
    (``staged→compute→end``, args ``intervals``), the rest of the run spaces. A
    zero-length task becomes one instant (``phase_us`` and ``inherited`` list its
    intervals), all of its record after it spaces (up to ``record_end``, where
    its marks begin). ``slots``: each interval's column range.

    Why: readers cannot tell where a zero-length span sits among events that begin
    or end at the same time, and the trace processor nests an instant inside an
    earlier one at the same time (tests/test_export_readers.py measures both); one
    instant a tick is placed exactly there, and left out by readers that draw spans
    only. Returns the events left in the chunk."""
    zero_task = rec.last == rec.first
    zero = rec.valid & (rec.end == rec.start) & ~zero_task[:, None]
    J = zero.shape[1]
    cont = np.zeros_like(zero)
    cont[:, 1:] = zero[:, 1:] & zero[:, :-1]  # continues the run of the interval before it
    run_end = np.tile(np.arange(J), (len(zero), 1))
    for j in range(J - 2, -1, -1):
        run_end[:, j] = np.where(cont[:, j + 1], run_end[:, j + 1], j)
    for j, (lo, hi) in enumerate(slots):
        gone = ~rec.valid[:, j] | zero_task | cont[:, j]
        if gone.any():
            text[gone, lo:hi] = SPACE  # whitespace keeps the row's width; the event is absent
    for j, (lo, hi) in enumerate(slots):  # a run's instant may reach into the run's blank slots
        starts = zero[:, j] & ~cont[:, j]
        for j1 in np.unique(run_end[starts, j]).tolist():
            rows = np.flatnonzero(starts & (run_end[:, j] == j1))
            _overwrite(text, rows, lo, slots[j1][1], run_instant(j, j1))
    rows = np.flatnonzero(zero_task)
    _overwrite(text, rows, 0, record_end - 1, task_instant)
    runs = int((zero & ~cont).sum())
    spans = int((~zero_task).sum()) + int((rec.valid & ~zero & ~zero_task[:, None]).sum())
    return _Count(spans, runs + int(zero_task.sum()))


def _overwrite(text: np.ndarray, rows: np.ndarray, lo: int, hi: int, pieces) -> None:
    """Put the line ``pieces`` (taken at ``rows``) at columns ``lo..`` of those rows,
    spaces after it up to ``hi``."""
    if not rows.size:
        return
    line = assemble(len(rows), [p if isinstance(p, bytes) else p[rows] for p in pieces])
    w = line.shape[1]
    assert w <= hi - lo, "an instant is no wider than the event it replaces"
    text[rows, lo:lo + w] = line
    text[rows, lo + w:hi] = SPACE


def _width_of(pieces) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.shape[1] for p in pieces)


def write_chrome(trace: Trace, path_or_file, *, ranks=None, launches=None, stages=None,
                 progress=None, complete: bool = False, chunk_rows: int = XC.CHUNK_ROWS,
                 embed: XC.Embed | None = None) -> int:
    """Write ``trace`` as Chrome Trace Event Format JSON to a path or an open file
    (binary or text) and return the number of events written (metadata included).

    ``ranks`` / ``launches`` / ``stages`` (lists; None = all) select rows; an unknown
    value raises ``ExportError``. ``progress(done, total)``, if given, is called after
    each chunk with task rows done and total. ``complete``: ``"B"``/``"E"`` pairs
    (False, the default: exact in every reader tested) or ``"X"`` events (True;
    smaller, mis-nested by float-based readers, see the module docstring). Events go out per track in time order. Memory stays bounded
    by ``chunk_rows`` task rows (plus the trace itself): the text is streamed chunk
    by chunk. ``embed`` (``_common.Embed``): write only the events, each line starting
    with a comma, for another trace's ``traceEvents`` (``timeline.attach``)."""
    num = XC.numbering(trace)  # from the whole trace: ids stable under selection
    if embed is not None:
        num = num._replace(pid_offset=embed.pid_offset)
    sub = XC.select(trace, ranks=ranks, launches=launches, stages=stages)
    base_ns = time_base(sub) if embed is None else embed.base_ns
    stage_names = sub.spec.stage_names
    keys = XC.placement_keys(sub)
    f = open_sink(path_or_file, "trace.json")
    try:
        if embed is None:
            f.write(_header(sub, base_ns))
        events, done, total = 0, 0, sub.tasks.num_rows
        lead = embed is not None  # the caller's events came first: keep every line's comma
        for block in _metadata(sub, num, embed):
            if block:
                f.write(block if events or lead else block[1:])  # every event line starts with its comma
                events += block.count(b"\n")
        for rec in XC.records(sub, chunk_rows):
            if rec.n:
                text, k = _chunk_text(rec, num, stage_names, sub.phases, keys, complete, base_ns, sub.marks)
                flat = memoryview(text.reshape(-1))
                f.write(flat if events or lead else flat[1:])  # every event line starts with its comma
                events += k
            done += rec.rows
            if progress is not None:
                progress(done, total)
        flow_text, k = _flow_events(sub, num, base_ns)
        f.write(flow_text if events or lead else flow_text[1:])
        events += k
        if embed is None:
            f.write(b"\n]}\n")
    finally:
        f.close()
    return events
