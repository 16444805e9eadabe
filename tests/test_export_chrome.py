"""Chrome trace JSON export: parsed back with Python's json (exact decimals) and
checked against the trace's ``intervals`` table (the authority on which phase
intervals exist). What the real readers make of it: tests/test_export_readers.py."""

from __future__ import annotations

import io
import json
import re
from collections import Counter, defaultdict
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline import Trace
from timeline.ingest import synth
from timeline.export import ExportError, write_chrome
from timeline.core.rows import SelectionError
from timeline.export.chrome import digits, micros


@pytest.fixture(scope="module")
def trace():
    """SYNTHETIC: 2 ranks x 2 launches x 8 CTAs x 2 waves of the GLM-5 stage list."""
    return synth.synth_trace(synth.glm5_spec(waves=2, world=2, launches=2), grid=8, seed=3)


@pytest.fixture(scope="module")
def long_trace():
    """SYNTHETIC, longer than a second: the second launch starts 1.5 s after the first."""
    return synth.synth_trace(synth.glm5_spec(waves=1, world=1, launches=2), grid=8, seed=5,
                             launch_gap_ns=1.5e9)


@pytest.fixture(scope="module")
def exported(trace):
    """``exported(complete)``: the fixture trace's export, parsed (once per form)."""
    cache = {}

    def get(complete=True):
        if complete not in cache:
            cache[complete] = Parsed(export_text(trace, complete=complete))
        return cache[complete]

    return get


def export_text(trace, **kw) -> str:
    buf = io.BytesIO()
    write_chrome(trace, buf, **kw)
    return buf.getvalue().decode()


def to_ns(v) -> int:
    """Exact ns of a µs value parsed as Decimal."""
    ns = Decimal(v) * 1000
    assert ns == ns.to_integral_value(), f"{v} µs is not a whole number of ns"
    return int(ns)


class Parsed:
    """A Chrome trace parsed with Decimal numbers: events by kind and the names that
    map pid / tid back to (rank, launch) / (CTA, wave)."""

    def __init__(self, text: str):
        self.doc = json.loads(text, parse_float=Decimal)
        ev = self.doc["traceEvents"]
        self.events = ev
        self.meta = [e for e in ev if e["ph"] == "M"]
        self.proc = {}
        self.thread = {}
        self.proc_sort, self.thread_sort = {}, {}
        for e in self.meta:
            if e["name"] == "process_name":
                m = re.fullmatch(r"rank (\d+) · launch (\d+)( · SYNTHETIC)?", e["args"]["name"])
                assert m, e
                self.proc[e["pid"]] = (int(m[1]), int(m[2]))
            elif e["name"] == "thread_name":
                m = re.fullmatch(r"CTA (\d+) · wave (\d+)", e["args"]["name"])
                assert m, e
                self.thread[(e["pid"], e["tid"])] = (int(m[1]), int(m[2]))
            elif e["name"] == "process_sort_index":
                self.proc_sort[e["pid"]] = e["args"]["sort_index"]
            elif e["name"] == "thread_sort_index":
                self.thread_sort[(e["pid"], e["tid"])] = e["args"]["sort_index"]

    def where(self, e):
        r, la = self.proc[e["pid"]]
        c, w = self.thread[(e["pid"], e["tid"])]
        return r, la, c, w

    def ns(self, ts) -> int:
        """Exact ns from the trace origin of a ``ts`` (µs on the export's time base)."""
        return to_ns(ts) - to_ns(self.doc["otherData"]["origin_ts_us"])

    def slices(self):
        """``(tasks, phases)``: complete events, B/E pairs matched per thread by a
        stack, or instants (zero length), as dicts with exact ``start``/``end`` ns
        and the event's fields."""
        tasks, phases = [], []
        stacks = defaultdict(list)
        for e in self.events:
            if e["ph"] == "X":
                s = dict(e, start=self.ns(e["ts"]), end=self.ns(e["ts"]) + to_ns(e["dur"]))
            elif e["ph"] == "i":  # zero length: a task, a phase interval or a run of them
                assert "s" not in e, "a thread-scoped instant (the default scope)"
                t = self.ns(e["ts"])
                if e["cat"] != "phase":
                    tasks.append(dict(e, start=t, end=t))
                    phases += [dict(e, name=n, cat="phase", start=t, end=t, args=dict(e["args"], inherited=inh))
                               for (n, us), inh in zip(e["args"]["phase_us"].items(), e["args"]["inherited"])
                               if us is not None]
                elif "intervals" in e["args"]:
                    phases += [dict(e, name=n, start=t, end=t, args=dict(e["args"], inherited=inh))
                               for n, inh in zip(e["args"]["intervals"], e["args"]["inherited"])]
                else:
                    phases.append(dict(e, start=t, end=t))
                continue
            elif e["ph"] == "B":
                stacks[(e["pid"], e["tid"])].append(e)
                continue
            elif e["ph"] == "E":
                b = stacks[(e["pid"], e["tid"])].pop()
                assert (b["name"], b["args"]) == (e["name"], e["args"]), "an E must close its own B"
                s = dict(b, start=self.ns(b["ts"]), end=self.ns(e["ts"]))
            else:
                continue
            (phases if s["cat"] == "phase" else tasks).append(s)
        assert all(not st_ for st_ in stacks.values()), "every B has its E"
        return tasks, phases


def interval_rows(trace) -> Counter:
    iv = trace.intervals
    cols = ["rank", "launch", "cta", "wave", "stage", "task", "phase", "start_ns", "end_ns", "inherited"]
    d = {c: iv.column(c).to_pylist() for c in cols}
    return Counter(zip(*(d[c] for c in cols)))


def phase_rows(p: Parsed, phases) -> Counter:
    return Counter((*p.where(e), e["args"]["stage"], e["args"]["task"], e["name"], e["start"], e["end"],
                    e["args"]["inherited"]) for e in phases)


# -- the file against the tables --------------------------------------------------------
@pytest.mark.parametrize("complete", [True, False])
def test_every_interval_exported_once_with_exact_times(trace, exported, complete):
    p = exported(complete)
    tasks, phases = p.slices()
    assert phase_rows(p, phases) == interval_rows(trace)
    # one task event per (rank, launch, stage, task, wave) row that has an interval
    iv = trace.intervals
    keys = Counter(zip(*(iv.column(c).to_pylist() for c in ("rank", "launch", "stage", "task", "wave"))))
    got = Counter((p.where(e)[0], p.where(e)[1], e["name"], e["args"]["task"], e["args"]["wave"]) for e in tasks)
    assert set(got) == set(keys) and all(v == 1 for v in got.values())


@pytest.mark.parametrize("complete", [True, False])
def test_phase_events_nest_inside_their_task_event(exported, complete):
    p = exported(complete)
    tasks, phases = p.slices()
    span = {(e["pid"], e["tid"], e["name"], e["args"]["task"]): (e["start"], e["end"]) for e in tasks}
    assert len(span) == len(tasks)
    for e in phases:
        lo, hi = span[(e["pid"], e["tid"], e["args"]["stage"], e["args"]["task"])]
        assert lo <= e["start"] <= e["end"] <= hi, e
    # the task spans exactly its first to last interval
    first = defaultdict(lambda: 1 << 62)
    last = defaultdict(lambda: -(1 << 62))
    for e in phases:
        k = (e["pid"], e["tid"], e["args"]["stage"], e["args"]["task"])
        first[k] = min(first[k], e["start"])
        last[k] = max(last[k], e["end"])
    assert {k: (first[k], last[k]) for k in span} == span


def test_task_args_hold_placement_and_phase_durations(trace, exported):
    p = exported()
    tasks, phases = p.slices()
    t = trace.tasks
    cols = ["rank", "launch", "stage", "task", "wave", "cta", "xcc", "se", "cu", "hw_unit"]
    rows = {r[:5]: r[5:] for r in zip(*(t.column(c).to_pylist() for c in cols))}
    dur = defaultdict(dict)
    for e in phases:
        dur[(e["pid"], e["tid"], e["args"]["stage"], e["args"]["task"])][e["name"]] = e["end"] - e["start"]
    for e in tasks:
        a = e["args"]
        r, la, c, w = p.where(e)
        assert (a["cta"], a["wave"]) == (c, w)
        assert (a["cta"], a["xcc"], a["se"], a["cu"], a["hw_unit"]) == rows[(r, la, a["stage"], a["task"], a["wave"])]
        assert e["cat"] == e["name"] == a["stage"]
        want = dur[(e["pid"], e["tid"], a["stage"], a["task"])]
        assert {k: to_ns(v) for k, v in a["phase_us"].items() if v is not None} == want


def test_processes_and_threads_named_and_sorted_in_cta_order(trace, exported):
    p = exported()
    assert sorted(p.proc.values()) == [(r, la) for r in trace.ranks for la in trace.launches]
    by_sort = sorted(p.proc, key=p.proc_sort.get)
    assert [p.proc[x] for x in by_sort] == sorted(p.proc.values())
    for pid in p.proc:
        tids = [k for k in p.thread if k[0] == pid]
        ordered = sorted(tids, key=p.thread_sort.get)
        assert [p.thread[k] for k in ordered] == sorted(p.thread[k] for k in tids)
        assert [p.thread[k] for k in ordered] == [(c, w) for c in range(8) for w in range(2)]
    assert all(re.search("SYNTHETIC", e["args"]["name"]) for e in p.meta if e["name"] == "process_name")
    assert p.doc["otherData"]["synthetic"] is True and p.doc["displayTimeUnit"] == "ns"


def test_names_are_exact_for_multi_digit_ids():
    """Thread and process names carry no padding, whatever the widest id."""
    tr = synth.synth_trace(synth.glm5_spec(waves=1, world=1), grid=16, seed=1)
    p = Parsed(export_text(tr))
    names = {e["args"]["name"] for e in p.meta if e["name"] == "thread_name"}
    assert names == {f"CTA {c} · wave 0" for c in range(16)}
    tasks, _ = p.slices()
    assert {e["args"]["cta"] for e in tasks} == set(range(16))


def test_trace_longer_than_a_second_keeps_every_ns_digit(long_trace):
    text = export_text(long_trace, complete=True)
    doc = json.loads(text, parse_float=str)
    raw = doc["traceEvents"]
    p = Parsed(text)
    _, phases = p.slices()
    assert max(e["end"] for e in phases) > 1_500_000_000  # past 1.5 s
    base = to_ns(doc["otherData"]["origin_ts_us"])
    assert base == (1 << 21) * 1000  # the span (1.5 s) rounded up to a power of two µs
    want = Counter()
    iv = long_trace.intervals
    for s, e in zip(iv.column("start_ns").to_pylist(), iv.column("end_ns").to_pylist()):
        t = s + base
        want[(f"{t // 1000}.{t % 1000:03d}", f"{(e - s) // 1000}.{(e - s) % 1000:03d}")] += 1
    got = Counter((e["ts"], e["dur"]) for e in raw if e.get("cat") == "phase")
    assert got == want
    # the exact text matters: 1500000.123 µs survives, a float32 or %g would not
    assert any(len(ts.split(".")[0]) >= 7 for ts, _ in got)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(10**17), 10**17), min_size=1, max_size=40), st.data())
def test_number_text_is_exact(values, data):
    v = np.array(values, dtype=np.int64)
    null = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))))
    d = [bytes(r).decode() for r in digits(v, null=null)]
    m = [bytes(r).decode() for r in micros(v, null=null)]
    assert len({len(x) for x in d}) == 1 and len({len(x) for x in m}) == 1  # fixed width
    for x, ds, ms, nl in zip(values, d, m, null):
        if nl:
            assert ds.strip() == ms.strip() == "null"
            continue
        assert ds.strip() == str(x) and ds == ds.strip().rjust(len(ds))
        sign = "-" if x < 0 else ""
        assert ms.strip() == f"{sign}{abs(x) // 1000}.{abs(x) % 1000:03d}"
        assert Decimal(ms) * 1000 == x


# -- missing and backward marks -------------------------------------------------------------
def damaged(trace) -> Trace:
    """The trace with marks removed and one run backwards: hint missing on every 7th row
    (inherited), start missing on every 11th (start→hint dropped), staged before hint
    on every 13th (hint→staged dropped), all but start missing on every 17th (no
    interval at all: no task event)."""
    t = trace.tasks
    n = t.num_rows
    i = np.arange(n)

    def null_where(name, mask):
        col = t.column(name)
        return pc.if_else(pa.array(mask), pa.scalar(None, pa.int64()), col)

    cols = {}
    cols["hint_ns"] = null_where("hint_ns", (i % 7 == 0) | (i % 17 == 0))
    cols["start_ns"] = null_where("start_ns", (i % 11 == 0) & (i % 17 != 0))
    staged = t.column("staged_ns").to_numpy(zero_copy_only=False).copy()
    hint = t.column("hint_ns").to_numpy(zero_copy_only=False)
    back = (i % 13 == 0) & (i % 7 != 0) & (i % 17 != 0)
    staged[back] = hint[back] - 50
    cols["staged_ns"] = pa.array(staged, mask=(i % 17 == 0))
    for p in ("compute_ns", "end_ns"):
        cols[p] = null_where(p, i % 17 == 0)
    for name, col in cols.items():
        t = t.set_column(t.schema.get_field_index(name), name, col)
    return Trace(t, trace.specs, synthetic=True)


@pytest.mark.parametrize("complete", [True, False])
def test_missing_marks_follow_the_interval_rule(trace, complete):
    bad = damaged(trace)
    iv = bad.intervals
    assert pc.sum(iv.column("inherited")).as_py() > 0
    assert iv.num_rows < trace.intervals.num_rows
    p = Parsed(export_text(bad, complete=complete))
    tasks, phases = p.slices()
    assert phase_rows(p, phases) == interval_rows(bad)
    nulls = sum(v is None for e in tasks for v in e["args"]["phase_us"].values())
    assert nulls == len(tasks) * 4 - len(phases)


def test_begin_end_pairs_touch_with_identical_text(trace):
    raw = json.loads(export_text(trace, complete=False), parse_float=str)["traceEvents"]
    x = json.loads(export_text(trace, complete=True), parse_float=str)["traceEvents"]
    be = [e for e in raw if e["ph"] in "BE"]
    assert len(be) == 2 * sum(e["ph"] == "X" for e in x)
    # within a task's record: E of one phase and B of the next carry the same ts text
    touching = 0
    for a, b in zip(be, be[1:]):
        if a["ph"] == "E" and b["ph"] == "B" and a.get("cat") == b.get("cat") == "phase" \
                and a["args"]["task"] == b["args"]["task"] and a["tid"] == b["tid"]:
            assert a["ts"] == b["ts"]
            touching += 1
    assert touching == 3 * sum(e["ph"] == "X" and e["cat"] != "phase" for e in x)


# -- selection, targets, progress ---------------------------------------------------------
def test_selection_keeps_ids_and_rejects_unknown_names(trace, exported):
    full = exported()
    sub = Parsed(export_text(trace, ranks=[1], launches=[0], stages=["o", "down"]))
    tasks, phases = sub.slices()
    assert {sub.where(e)[:2] for e in tasks + phases} == {(1, 0)}
    assert {e["name"] for e in tasks} == {"o", "down"}
    assert set(sub.proc.items()) <= set(full.proc.items())
    assert set(sub.thread.items()) <= set(full.thread.items())
    with pytest.raises(SelectionError, match=r"stage \['attn'\] not in this trace.*qkv_a"):
        write_chrome(trace, io.BytesIO(), stages=["attn"])
    with pytest.raises(SelectionError, match=r"rank \[5\] not in this trace.*\[0, 1\]"):
        write_chrome(trace, io.BytesIO(), ranks=[5])
    with pytest.raises(SelectionError, match="must be a list"):
        write_chrome(trace, io.BytesIO(), stages="o")


def test_paths_binary_and_text_files_get_the_same_text(trace, tmp_path):
    path = tmp_path / "t.json"
    n = write_chrome(trace, path)
    text = io.StringIO()
    assert write_chrome(trace, text) == n
    assert path.read_text() == text.getvalue() == export_text(trace)
    assert len(json.loads(path.read_text())["traceEvents"]) == n
    with pytest.raises(ExportError, match="does not exist"):
        write_chrome(trace, tmp_path / "no" / "t.json")
    with pytest.raises(ExportError, match="is a directory"):
        write_chrome(trace, tmp_path)


def test_a_failing_write_is_one_export_error_and_no_thread_is_left(trace):
    import threading

    before = threading.active_count()
    with pytest.raises(ExportError, match=r"cannot write '/dev/full': No space left on device; free space"):
        write_chrome(trace, "/dev/full", chunk_rows=500)  # every write fails: ENOSPC, in the writer thread
    assert threading.active_count() == before


def test_progress_counts_task_rows_to_the_total(trace):
    calls = []
    write_chrome(trace, io.BytesIO(), progress=lambda d, t: calls.append((d, t)), chunk_rows=1000)
    assert len(calls) == -(-trace.tasks.num_rows // 1000)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert calls[-1] == (trace.tasks.num_rows, trace.tasks.num_rows)


def test_chunking_does_not_change_the_events(trace, exported):
    a = Parsed(export_text(trace, chunk_rows=777, complete=True))
    b = exported()
    key = lambda e: json.dumps(e, sort_keys=True, default=str)  # noqa: E731
    assert sorted(map(key, a.events)) == sorted(map(key, b.events))


def test_empty_trace_is_valid_json(trace):
    empty = Trace(trace.tasks.slice(0, 0), trace.specs)
    doc = json.loads(export_text(empty))
    assert doc["traceEvents"] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=5, max_size=5), min_size=1, max_size=12),
       st.booleans())
def test_any_tick_pattern_exports_every_interval_once(steps, complete):
    """Tasks on one CTA whose phases advance by 0..4 ticks (0 = a mark in the same
    tick, many zero-length intervals, runs of them, zero-length tasks; a step of 4
    means "unwritten"): every interval of the intervals table is in the file once,
    at its exact ns, inside its task's span."""
    from bufkit import empty, put
    from timeline import Spec, collect

    sp = Spec("p", [("s", len(steps))])
    buf = empty(sp)
    t = 1000
    for task, step in enumerate(steps):
        ticks = []
        for d in step:
            t += d % 4
            ticks.append(0 if d == 4 and ticks else t)
        put(buf, sp, stage="s", task=task, ticks=ticks)
        t += 1
    trace = collect(buf, sp)
    p = Parsed(export_text(trace, complete=complete))
    tasks, phases = p.slices()
    assert phase_rows(p, phases) == interval_rows(trace)
    span = {e["args"]["task"]: (e["start"], e["end"]) for e in tasks}
    assert len(span) == len(tasks)
    for e in phases:
        lo, hi = span[e["args"]["task"]]
        assert lo <= e["start"] <= e["end"] <= hi


def test_a_writer_that_breaks_is_raised_and_nothing_hangs(trace, tmp_path, monkeypatch):
    """A bug in the writer thread (not an OSError) surfaces in the caller as it is, and
    the export does not wait forever on a queue nobody drains."""
    from timeline.export import _sink

    class Broken:
        def write(self, b):
            raise TypeError("a broken file object")

        def close(self):
            pass

    monkeypatch.setattr(_sink, "open", lambda path, mode: Broken(), raising=False)
    with pytest.raises(TypeError, match="a broken file object"):
        write_chrome(trace, tmp_path / "t.json", chunk_rows=50)
