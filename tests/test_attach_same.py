"""The faster attach (issue 42) reads and writes what the code before it did: the
Kineto reader's tables and the merged Chrome JSON byte for byte, the merged Perfetto
trace packet for packet (``canonical``: each packet's protobuf re-encoded, flow ids
renumbered by first appearance: their values are hashes of their own), on a mid-size file of several pieces (tests/kinetokit.py's bulk trace with odd
shapes: overlapping and out-of-order slices, escapes, a list as a name, instants,
counters, flows without a slice), read in this process and in worker processes, and
on random events cut into small pieces. The reference is tests/attach_baseline, the
code as it was before (frozen). Also: which slices nest (nesting.nest, numpy) is the
stack rule's answer, slice by slice, across pieces."""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attach_baseline
import kinetokit as KK
from timeline import load
from timeline.attach import FrameworkTraceError, attach, read_framework
from timeline.attach import framework_tracks as FT
from timeline.attach import jsonscan as J
from timeline.attach import kineto, nesting
from timeline.attach import pool as AP
from timeline.attach import write as AW

TRACES = Path(__file__).resolve().parents[1] / "traces"
KERNEL = "mono_ffn_kernel"


@contextlib.contextmanager
def old_chunks(chunk: int):
    """The old reader cutting ``chunk`` bytes at a time (its constant and default)."""
    J = attach_baseline.jsonscan
    saved = J.CHUNK_BYTES, J.pieces.__kwdefaults__["chunk_bytes"]
    J.CHUNK_BYTES = J.pieces.__kwdefaults__["chunk_bytes"] = chunk
    try:
        yield
    finally:
        J.CHUNK_BYTES, J.pieces.__kwdefaults__["chunk_bytes"] = saved


def canonical(data: bytes) -> list:
    """A Perfetto trace's packets as a reader sees them: each packet's canonical
    protobuf bytes (varints re-encoded shortest by protobuf's runtime, not this code),
    its flow ids renumbered by first appearance in the file."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    ids, out = {}, []
    for p in pb.Trace.FromString(data).packet:
        if p.HasField("track_event"):
            for field in (p.track_event.flow_ids, p.track_event.terminating_flow_ids):
                new = [ids.setdefault(i, len(ids) + 1) for i in field]
                del field[:]
                field.extend(new)
        out.append(p.SerializeToString(deterministic=True))
    return out


def same_framework(a, b) -> None:
    for f in b._fields:  # the fields the code before had (Framework.tracks is new: tested on its own)
        x, y = getattr(a, f), getattr(b, f)
        assert (x.equals(y) if hasattr(x, "equals") else x == y), f


@pytest.fixture(scope="module")
def demo():
    return load(TRACES / "h200_mono_demo.arrow")


@pytest.fixture(scope="module")
def mid(tmp_path_factory, demo):
    """A ~20 MB Kineto JSON (5 pieces of 4 MB), odd shapes in every block, and its gzip."""
    d = tmp_path_factory.mktemp("same")
    KK.bulk_trace(d / "k.json", 20, demo, odd=True)
    (d / "k.json.gz").write_bytes(gzip.compress((d / "k.json").read_bytes(), 1))
    return d


@pytest.mark.parametrize("workers", [0, 2])
def test_the_reader_reads_what_it_read(mid, workers):
    old = attach_baseline.kineto.read_kineto(mid / "k.json")
    new = kineto.read_kineto(mid / "k.json", workers=workers)
    assert new.events > 90_000 and new.activities.num_rows > 30_000
    same_framework(new, old)
    same_framework(kineto.read_kineto(mid / "k.json.gz", workers=workers), attach_baseline.kineto.read_kineto(mid / "k.json.gz"))


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_merged_outputs_are_the_bytes_they_were(mid, demo, tmp_path, monkeypatch, workers):
    monkeypatch.setenv(AP.WORKERS_ENV, workers)
    monkeypatch.setattr(AP, "PARALLEL_MIN_BYTES", 0)
    att = attach(demo, read_framework(mid / "k.json"), kernel=KERNEL)
    w = AW.write_perfetto(att, tmp_path / "new.pftrace")
    with old_chunks(J.CHUNK_BYTES):  # the same cuts (slices are ordered by start within a piece)
        attach_baseline.write_perfetto(att, tmp_path / "old.pftrace")
    new, old = (tmp_path / "new.pftrace").read_bytes(), (tmp_path / "old.pftrace").read_bytes()
    assert len(new) > 10 << 20 and canonical(new) == canonical(old)
    n = w.skipped["C"]
    assert n > 1000 and w.skipped == {"C": n, "B": n, "X without ts": n}
    assert new.count(b"overlapping") >= 1 and new.count(b"flows without a slice") == 0
    AW.write_chrome(att, tmp_path / "new.json")
    attach_baseline.write_chrome(att, tmp_path / "old.json")
    assert (tmp_path / "new.json").read_bytes() == (tmp_path / "old.json").read_bytes()


def test_pieces_cut_in_workers_are_the_ones_cut_here(tmp_path, monkeypatch):
    """Speculated cuts (wrong where a read ends after a nested object's ``},``: every
    event here has one) come out as jsonscan.pieces' own, in order."""
    evs = [{"ph": "X", "args": {"a": {"b": i}, "c": "x" * (i % 50)}, "ts": i, "name": "e"} for i in range(40_000)]
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    wrong = []
    one = AP._one
    monkeypatch.setattr(AP, "_one", lambda *a: wrong.append(a[1]) or one(*a))
    here = list(AP.map_pieces(path, J.Lean, _extent, chunk_bytes=20_000, workers=0))
    there = list(AP.map_pieces(path, J.Lean, _extent, chunk_bytes=20_000, workers=2))
    assert len(here) > 100 and here == there and len(wrong) > 10
    assert sum(n for n, _, _ in there) == len(evs)


def _extent(events, _shared) -> tuple:
    return len(events), bytes(events[0].ts), bytes(events[-1].ts)


names = st.one_of(st.text(max_size=6), st.lists(st.integers(0, 3), max_size=2), st.integers(0, 9))
event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "M", "s", "f", "C", "B"]), "name": names},
    optional={"cat": st.one_of(st.sampled_from(["cpu_op", "kernel", "ac2g", "gpu_memcpy"]), st.none(), st.integers()),
              "pid": st.sampled_from([1, 2, "p", True, None, 1.5]), "tid": st.sampled_from([1, 7, "t", [1]]),
              "ts": st.integers(0, 200), "dur": st.integers(0, 60), "id": st.sampled_from([1, 2, "a", 2.0]),
              "args": st.dictionaries(st.sampled_from(["name", "labels", "x"]), st.text(max_size=4) | st.integers(),
                                      max_size=2)})


@settings(max_examples=150, deadline=None)
@given(st.lists(event, min_size=1, max_size=80), st.integers(60, 600), st.booleans())
def test_random_events_convert_as_they_did(tmp_path_factory, evs, chunk, indent):
    for e in evs:
        if "ts" in e:
            e["ts"] = e["ts"] // 3 + e["ts"] % 3 * 0.25  # µs (0.25: 250 ns), ties and overlaps likely
        if e["ph"] == "M":
            e["name"] = "process_name" if e["name"] == "" else "thread_name" if e["name"] == 0 else e["name"]
    path = tmp_path_factory.mktemp("r") / "t.json"
    path.write_text(json.dumps({"traceEvents": evs, "baseTimeNanoseconds": 5}, indent=1 if indent else None))
    with old_chunks(chunk):
        try:
            old, old_conv = attach_baseline.perfetto_framework_bytes(path, 0, 7, "")
        except TypeError:  # the code before failed on a list as the pid / tid of an M event: now named as JSON
            old = None
    meta = FT.flows_and_names(path, 0, chunk_bytes=chunk, workers=0)
    gen, out = FT.packets(path, 0, 7, meta, "", chunk_bytes=chunk, workers=0), []
    while True:
        try:
            out.append(next(gen))
        except StopIteration as stop:
            conv = stop.value
            break
    assert old is None or (canonical(b"".join(out)) == canonical(old) and conv == old_conv)


value = st.one_of(st.integers(-2, 9), st.none(), st.booleans(), st.text(max_size=2), st.lists(st.integers(0, 9),
                                                                                         max_size=4))
kept = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "i"]), "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime",
                                                                     "cuda_driver", "user_annotation", "cpu_op"]),
     "name": st.sampled_from(["k", "ProfilerStep#3", "ProfilerStep#x", "ProfilerStep#12"]) | names,
     "ts": st.integers(0, 10**6)},
    optional={"dur": st.integers(0, 500), "pid": value, "tid": value,
              "args": st.fixed_dictionaries({}, optional={"device": value, "stream": value, "correlation": value,
                                                          "grid": value})})


@settings(max_examples=150, deadline=None)
@given(st.lists(kept, min_size=1, max_size=60), st.integers(60, 600))
def test_random_kept_events_read_as_they_did(tmp_path_factory, evs, chunk):
    """The same tables, or the same refusal; read for a Perfetto output too
    (``tracks_for``), the same tables, or a refusal of the same type."""
    for e in evs:
        e["ts"] = e["ts"] / 8  # µs with 3 decimals at most (125 ns steps)
    path = tmp_path_factory.mktemp("k") / "t.json"
    path.write_text(json.dumps({"traceEvents": evs}))

    def outcome(read):
        try:
            return read()
        except Exception as e:  # noqa: BLE001 - the same exception, whatever it is
            return type(e), str(e)

    with old_chunks(chunk):
        old = outcome(lambda: attach_baseline.kineto.read_kineto(path, chunk_bytes=chunk))
    new = outcome(lambda: kineto.read_kineto(path, chunk_bytes=chunk, workers=0))
    one = outcome(lambda: kineto.read_kineto(path, chunk_bytes=chunk, workers=0, tracks_for=0))  # the activities'
    if hasattr(new, "_fields"):  # times taken from the Perfetto conversion's slices: the same tables
        same_framework(one._replace(tracks=None), new)
    else:
        assert not hasattr(one, "_fields") and one[0] is new[0]
    if new[0] is FrameworkTraceError and "not [x, y, z] integers" in new[1]:
        return  # issue 48: a grid that is not three integers is refused (the old reader read it as no grid)
    if isinstance(old, tuple) and not hasattr(old, "_fields"):
        assert new == old
    else:
        same_framework(new, old)


class Stack:
    """The stack rule, one slice at a time (what framework_tracks did before)."""

    def __init__(self):
        self.ends, self.last = {}, {}

    def bad(self, ts, end, track) -> list:
        out = []
        for i, (t, e, k) in enumerate(zip(ts.tolist(), end.tolist(), track.tolist())):
            st_ = self.ends.setdefault(k, [])
            while st_ and st_[-1] <= t:
                st_.pop()
            if (st_ and e > st_[-1]) or t < self.last.get(k, t):
                out.append(i)
                continue
            st_.append(e)
            self.last[k] = t
        return out


slices = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.sampled_from([0, 0, 1, 2, 5, 9, 30])),
                  max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(slices, min_size=1, max_size=4))
def test_nesting_is_the_stack_rule_across_pieces(pieces):
    """Checked here, or with each piece's tracks that nest alone found where it was
    decoded (``nesting.laminar``): the stack rule's rows, across pieces."""
    ref, mine, given_ = Stack(), nesting.Carried.new(), nesting.Carried.new()
    for rows in pieces:
        if not rows:
            continue
        track, ts, dur = (np.array(c, np.int64) for c in zip(*rows))
        end = ts + dur
        order = np.lexsort((-dur, ts))
        ts, end, track = ts[order], end[order], track[order]
        want = ref.bad(ts, end, track)
        assert nesting.nest(ts, end, track, mine).tolist() == want
        assert nesting.nest(ts, end, track, given_, nesting.laminar(ts, end, track)).tolist() == want
        assert mine.ends == ref.ends and mine.last == ref.last and given_ == mine


@pytest.mark.parametrize("workers", [0, 2])
def test_the_perfetto_output_read_in_one_pass_is_the_same_bytes(mid, demo, tmp_path, monkeypatch, workers):
    """A framework read with ``tracks_for`` (the CLI's read when ``-o`` is given) gathers
    the tracks' names and flows and prepares the slices in the read's own decode: the
    Perfetto output runs neither of its own passes (patched to fail) and is the same
    bytes, on a rank moved onto another's axis too (its slices serialized again with
    the shift); the spill folders are gone once the output is written and the read
    is let go."""
    monkeypatch.setenv(AP.WORKERS_ENV, str(workers or 1))
    monkeypatch.setattr(AP, "PARALLEL_MIN_BYTES", 0)
    fw = read_framework(mid / "k.json", tracks_for=0)
    assert fw.tracks[0] == 0
    att = attach(demo, fw, kernel=KERNEL)
    AW.write_perfetto(att, tmp_path / "two.pftrace")
    monkeypatch.setattr(FT, "flows_and_names", lambda *a, **k: pytest.fail("a second decode pass"))
    monkeypatch.setattr(FT, "packets", lambda *a, **k: pytest.fail("a decode pass of the output's own"))
    one = read_framework(mid / "k.json", tracks_for=0)
    AW.write_perfetto(attach(demo, one, kernel=KERNEL), tmp_path / "one.pftrace")
    monkeypatch.undo()
    two_pass = attach(demo, read_framework(mid / "k.json"), kernel=KERNEL)
    for att_, out in ((attach(demo, one, kernel=KERNEL), "shifted_one"), (two_pass, "shifted_two")):  # a rank moved
        AW.write_perfetto(att_._replace(axes={0: att_.axes[0]._replace(shift_ns=123_456_789)}), tmp_path / out)
    assert (tmp_path / "shifted_one").read_bytes() == (tmp_path / "shifted_two").read_bytes()
    assert (tmp_path / "shifted_one").read_bytes() != (tmp_path / "one.pftrace").read_bytes()
    folder = Path(one.tracks[3].path)
    assert folder.is_dir() and not list(tmp_path.glob(".*.spill"))
    del one
    gc.collect()
    assert not folder.exists()
    AW.write_perfetto(attach(demo, read_framework(mid / "k.json"), kernel=KERNEL), tmp_path / "old.pftrace")
    assert (tmp_path / "one.pftrace").read_bytes() == (tmp_path / "old.pftrace").read_bytes()
    assert (tmp_path / "two.pftrace").read_bytes() == (tmp_path / "old.pftrace").read_bytes()
    moved = read_framework(mid / "k.json", tracks_for=3)  # gathered for another rank: the first pass runs
    assert moved.tracks[0] == 3 and moved.activities.equals(fw.activities)
