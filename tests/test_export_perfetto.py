"""Perfetto protobuf export, decoded with the ``perfetto`` package's compiled
``perfetto_trace.proto`` (protobuf's own parser, not the exporter's writer) and
checked against the trace's ``intervals`` table: the track tree and its order,
every slice with exact ns, nesting, arguments, interning."""

from __future__ import annotations

import io
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline import Trace
from timeline.ingest import synth
from timeline.export import ExportError, write_perfetto
from timeline.core.rows import SelectionError
from timeline.export.perfetto import DA_INT, Messages

# the perfetto package (a test extra) ships the compiled protos: missing, the tests fail
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb  # noqa: E402
TD = pb.TrackDescriptor
TE = pb.TrackEvent


@pytest.fixture(scope="module")
def trace():
    """SYNTHETIC: 2 ranks x 2 launches x 8 CTAs x 2 waves of the GLM-5 stage list."""
    return synth.synth_trace(synth.glm5_spec(waves=2, world=2, launches=2), grid=8, seed=4)


class Decoded:
    """A written trace decoded by protobuf: interned names, the track tree, and the
    slices per track replayed in timestamp order (stable, as a trace processor sorts)."""

    def __init__(self, data: bytes):
        t = pb.Trace()
        t.ParseFromString(data)
        self.packets = list(t.packet)
        first = self.packets[0]
        assert first.sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        idata = first.interned_data
        self.names = {e.iid: e.name for e in idata.event_names}
        self.cats = {e.iid: e.name for e in idata.event_categories}
        self.arg_names = {e.iid: e.name for e in idata.debug_annotation_names}
        self.tracks = {p.track_descriptor.uuid: p.track_descriptor
                       for p in self.packets if p.HasField("track_descriptor")}
        self.events = [p for p in self.packets if p.HasField("track_event")]
        seq = {p.trusted_packet_sequence_id for p in self.packets}
        assert seq == {first.trusted_packet_sequence_id}
        assert all(p.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE for p in self.events)

    def children(self, uuid):
        kids = [t for t in self.tracks.values() if t.HasField("parent_uuid") and t.parent_uuid == uuid]
        return sorted(kids, key=lambda t: t.sibling_order_rank)

    def slices(self):
        """[(track uuid, name, category, begin ns, end ns, args, depth, parent)] by a
        stack per track; ``parent`` is the index of the enclosing slice (None at depth 0)."""
        order = sorted(range(len(self.events)), key=lambda i: self.events[i].timestamp)  # stable
        stacks = defaultdict(list)
        out = []
        for i in order:
            p = self.events[i]
            e = p.track_event
            stack = stacks[e.track_uuid]
            if e.type == TE.TYPE_SLICE_BEGIN:
                args = {self.arg_names[a.name_iid]: (a.bool_value if a.HasField("bool_value") else a.int_value)
                        for a in e.debug_annotations}
                assert len(e.category_iids) == 1
                out.append([e.track_uuid, self.names[e.name_iid], self.cats[e.category_iids[0]],
                            p.timestamp, None, args, len(stack), stack[-1] if stack else None])
                stack.append(len(out) - 1)
            else:
                assert e.type == TE.TYPE_SLICE_END
                out[stack.pop()][4] = p.timestamp
        assert all(not s for s in stacks.values()), "every begin has its end"
        return [tuple(s) for s in out]


def export(trace, **kw) -> Decoded:
    buf = io.BytesIO()
    n = write_perfetto(trace, buf, **kw)
    d = Decoded(buf.getvalue())
    d.count = n
    return d


@pytest.fixture(scope="module")
def decoded(trace):
    return export(trace)


def where(d: Decoded) -> dict:
    """thread-track uuid -> (rank, launch, cta, wave), read from the track names."""
    out = {}
    root = [t for t in d.tracks.values() if not t.HasField("parent_uuid")]
    assert len(root) == 1
    for proc in d.children(root[0].uuid):
        r, la = (int(x.split()[-1]) for x in proc.name.split(" · ")[:2])
        for th in d.children(proc.uuid):
            if th.name == "stage breakdown":
                continue
            c, w = (int(x.split()[-1]) for x in th.name.split(" · "))
            out[th.uuid] = (r, la, c, w)
    return out


def test_track_tree_is_rank_launch_cta_wave_in_explicit_order(trace, decoded):
    d = decoded
    roots = [t for t in d.tracks.values() if not t.HasField("parent_uuid")]
    assert [t.name for t in roots] == ["glm5_layer_synthetic · SYNTHETIC"]
    assert roots[0].child_ordering == TD.EXPLICIT
    procs = d.children(roots[0].uuid)
    assert [p.name for p in procs] == [f"rank {r} · launch {la} · SYNTHETIC" for r in (0, 1) for la in (0, 1)]
    for p in procs:
        assert p.child_ordering == TD.EXPLICIT
        kids = d.children(p.uuid)
        assert [k.name for k in kids] == ["stage breakdown"] + [f"CTA {c} · wave {w}" for c in range(8)
                                                               for w in range(2)]
        assert len({k.sibling_order_rank for k in kids}) == len(kids)
        assert [s.name for s in d.children(kids[0].uuid)] == list(trace.spec.stage_names)
    assert len(d.tracks) == 1 + 4 + 4 * 16 + 4 * (1 + len(trace.spec.stages))


def test_stage_breakdown_spans_each_stage(trace, decoded):
    """Per (rank, launch) and stage: one slice from the stage's first start to its
    last end, on its own track under "stage breakdown" (the GLM-5 converter's view)."""
    import pyarrow.compute as pc

    d = decoded
    group = {t.uuid: t for t in d.tracks.values() if t.name == "stage breakdown"}
    proc_of = {t.uuid: d.tracks[t.parent_uuid].name for t in group.values()}
    got = {}
    for u, name, cat, b, e, args, depth, _ in d.slices():
        tr = d.tracks[u]
        if tr.HasField("parent_uuid") and tr.parent_uuid in group:
            r, la = (int(x.split()[-1]) for x in proc_of[tr.parent_uuid].split(" · ")[:2])
            got[(r, la, name)] = (b, e)
    t = trace.tasks
    want = {}
    for r in trace.ranks:
        for la in trace.launches:
            for s in trace.spec.stage_names:
                sel = t.filter(pc.and_(pc.and_(pc.equal(t["rank"], r), pc.equal(t["launch"], la)),
                                       pc.equal(pc.cast(t["stage"], "string"), s)))
                if sel.num_rows:
                    want[(r, la, s)] = (pc.min(sel["start_ns"]).as_py(), pc.max(sel["end_ns"]).as_py())
    assert got == want


def test_every_interval_is_a_nested_slice_with_exact_ns(trace, decoded):
    d = decoded
    loc = where(d)
    slices = d.slices()
    phases = Counter((*loc[u], name, b, e, args["inherited"])
                     for u, name, cat, b, e, args, depth, _ in slices if cat == "phase")
    iv = trace.intervals
    cols = ["rank", "launch", "cta", "wave", "phase", "start_ns", "end_ns", "inherited"]
    assert phases == Counter(zip(*(iv.column(x).to_pylist() for x in cols)))
    assert {s[6] for s in slices if s[2] == "phase"} == {1}  # inside a task slice
    assert {s[6] for s in slices if s[2] != "phase"} == {0}
    assert d.count == len(slices)


def test_task_slices_span_their_phases_and_carry_placement(trace, decoded):
    d = decoded
    loc = where(d)
    slices = d.slices()
    t = trace.tasks
    cols = ["rank", "launch", "stage", "task", "wave", "cta", "xcc", "se", "cu", "hw_unit"]
    rows = {r[:5]: r[5:] for r in zip(*(t.column(c).to_pylist() for c in cols))}
    tasks = {i: s for i, s in enumerate(slices) if s[2] != "phase" and s[0] in loc}  # not the breakdown
    assert len(tasks) == len(rows)
    inner = defaultdict(list)
    for s in slices:
        if s[2] == "phase":
            inner[s[7]].append(s)
    for i, (u, name, cat, b, e, args, _, _) in tasks.items():
        r, la, c, w = loc[u]
        assert name == cat
        assert (args["cta"], args["wave"]) == (c, w)
        assert (args["cta"], args["xcc"], args["se"], args["cu"], args["hw_unit"]) == rows[(r, la, name, args["task"], w)]
        ph = inner[i]
        assert [s[1] for s in ph] == ["start→hint", "hint→staged", "staged→compute", "compute→end"]
        assert ph[0][3] == b and ph[-1][4] == e
        assert all(x[4] == y[3] for x, y in zip(ph, ph[1:]))  # each phase ends where the next begins


def test_missing_marks_and_negative_times(trace):
    """Marks removed (hint on every 7th row: inherited; start on every 11th: first
    interval dropped) and every time shifted 1 ms before the origin: slices follow
    the intervals table, shifted so the earliest is at 0."""
    t = trace.tasks
    i = np.arange(t.num_rows)
    for name, mask in (("hint_ns", i % 7 == 0), ("start_ns", i % 11 == 0)):
        col = pc.if_else(pa.array(mask), pa.scalar(None, pa.int64()), t.column(name))
        t = t.set_column(t.schema.get_field_index(name), name, col)
    for p in trace.phases:
        name = f"{p}_ns"
        t = t.set_column(t.schema.get_field_index(name), name, pc.subtract(t.column(name), 1_000_000))
    bad = Trace(t, trace.specs, synthetic=True)
    iv = bad.intervals
    lo = min(pc.min(bad.tasks.column(f"{p}_ns")).as_py() for p in bad.phases)
    assert lo < 0
    d = export(bad)
    loc = where(d)
    got = Counter((*loc[u], name, b + lo, e + lo, a["inherited"]) for u, name, cat, b, e, a, _, _ in d.slices()
                  if cat == "phase")
    cols = ["rank", "launch", "cta", "wave", "phase", "start_ns", "end_ns", "inherited"]
    assert got == Counter(zip(*(iv.column(x).to_pylist() for x in cols)))
    assert sum(k[-1] for k in got.elements()) > 0
    assert min(p.timestamp for p in d.events) == 0


def test_selection_and_errors(trace, tmp_path):
    d = export(trace, ranks=[0], stages=["router", "gating"])
    loc = where(d)
    slices = [s for s in d.slices() if s[0] in loc]  # the CTA tracks (the breakdown has its own test)
    assert {loc[s[0]][0] for s in slices} == {0}
    assert {s[1] for s in slices if s[2] != "phase"} == {"router", "gating"}
    with pytest.raises(SelectionError, match=r"stage \['rooter'\] not in this trace"):
        write_perfetto(trace, io.BytesIO(), stages=["rooter"])
    with pytest.raises(ExportError, match="existing directory"):
        write_perfetto(trace, tmp_path / "missing" / "t.pftrace")
    with pytest.raises(ExportError, match="this export is binary: open the file with mode 'wb'"):
        write_perfetto(trace, io.StringIO())
    with pytest.raises(ExportError, match="cannot write '/dev/full': No space left on device"):
        write_perfetto(trace, "/dev/full")
    path = tmp_path / "t.pftrace"
    calls = []
    n = write_perfetto(trace, path, progress=lambda a, b: calls.append((a, b)), chunk_rows=3000)
    assert Decoded(path.read_bytes()).slices().__len__() == n
    assert calls[-1] == (trace.tasks.num_rows, trace.tasks.num_rows) and len(calls) == -(-trace.tasks.num_rows // 3000)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=30))
def test_vectorized_varints_decode_as_protobuf_int64(values):
    """Messages' varint columns (any int64, negatives as 10-byte two's complement),
    each row framed as a DebugAnnotation.array_values entry (field 12): the rows
    together are one DebugAnnotation that protobuf's parser reads back."""
    rows = Messages(len(values)).varint(DA_INT, np.array(values, dtype=np.int64))
    data = Messages(len(values)).message(12, rows).serialize()
    got = pb.DebugAnnotation.FromString(data)
    assert [a.int_value for a in got.array_values] == values
