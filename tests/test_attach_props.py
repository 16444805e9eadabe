"""Property tests of attach's readers and fit: the streaming scanner gives json's
events for any chunk size and spacing, µs text converts to exact ns, random bytes
and cut files are one FrameworkTraceError (never another exception), and the fit's
bound holds the true offset for any launches inside their kernels."""

from __future__ import annotations

import gzip
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.attach import FrameworkTraceError, read_framework
from timeline.attach import align as AL
from timeline.attach import jsonscan as J

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
event = st.fixed_dictionaries({"ph": st.sampled_from(["X", "i", "M"]), "name": names,
                               "ts": st.integers(0, 10**13), "args": st.dictionaries(names, st.integers() | names,
                                                                                      max_size=3)})


@settings(max_examples=60, deadline=None)
@given(st.lists(event, max_size=30), st.integers(8, 400), st.booleans(), st.booleans())
def test_scanner_yields_the_events_json_reads(tmp_path_factory, evs, chunk, indent, gz):
    doc = {"schemaVersion": 1, "traceEvents": evs, "baseTimeNanoseconds": 17}
    text = json.dumps(doc, indent=1 if indent else None).encode()
    path = tmp_path_factory.mktemp("p") / "t.json"
    path.write_bytes(gzip.compress(text) if gz else text)
    head, tail, got = [], [], []
    for piece in J.pieces(path, chunk_bytes=chunk, head=head, tail=tail):
        got += piece.events
    assert [e.name for e in got] == [e["name"] for e in evs] and len(got) == len(evs)
    assert [J.ns_of(e.ts) for e in got] == [e["ts"] * 1000 for e in evs]
    assert [J.args_of(e.args) for e in got] == [e["args"] for e in evs]
    assert J.document(head[0], tail[0], "t")["baseTimeNanoseconds"] == 17


@given(st.integers(0, 10**17))
def test_microseconds_text_is_exact_ns(ns):
    assert J.ns_of(f"{ns // 1000}.{ns % 1000:03d}") == ns
    assert J.ns_of(ns // 1000) == ns // 1000 * 1000


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_one_refusal(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("b") / "x.json"
    path.write_bytes(data)
    try:
        read_framework(path)
    except FrameworkTraceError as e:
        assert "\n" not in str(e)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 400))
def test_cut_kineto_files_are_refused(tmp_path_factory, cut):
    evs = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": f"{i}.000", "dur": 1,
            "args": {"device": 0, "stream": 7, "correlation": i, "grid": [1, 1, 1]}} for i in range(8)]
    text = json.dumps({"traceEvents": evs, "traceName": "x"}).encode()
    path = tmp_path_factory.mktemp("c") / "x.json"
    path.write_bytes(text[:max(len(text) - cut, 1)])
    try:
        fw = read_framework(path)
        assert fw.activities.num_rows == 8  # only a cut into the trailing keys can still read all events
    except FrameworkTraceError:
        pass


@settings(max_examples=80, deadline=None)
@given(st.integers(-10**18, 10**18), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5),
                                                        st.integers(0, 5_000), st.integers(0, 5_000)),
                                               min_size=1, max_size=40))
def test_the_true_offset_lies_within_the_bound(offset, launches):
    t = 1_700_000_000_000_000_000
    a = np.array([t + 2_000_000 * i + x for i, (x, _, _, _) in enumerate(launches)], np.int64)
    b = a + np.array([w for _, w, _, _ in launches], np.int64)
    s = a + offset - np.array([h for _, _, h, _ in launches], np.int64)
    e = b + offset + np.array([q for _, _, _, q in launches], np.int64)
    f = AL.fit(a, b, s, e, drift=False)
    assert f.inlier.all() and abs(f.offset_ns - offset) <= f.bound_ns + 1
    assert (f.outside_ns <= f.bound_ns + 1).all()


csv_cell = st.one_of(st.integers(-5, 10**12).map(str), st.text("0123456789abc.-", max_size=6))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(csv_cell, csv_cell, csv_cell, csv_cell), min_size=1, max_size=8))
def test_rocprof_csv_with_bad_cells_is_refused_or_read(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("r") / "k.csv"
    lines = ["Kind,Agent_Id,Queue_Id,Kernel_Name,Correlation_Id,Start_Timestamp,End_Timestamp"]
    lines += [f"KERNEL_DISPATCH,{a},1,k,{b},{c},{d}" for a, b, c, d in rows]
    path.write_text("\n".join(lines) + "\n")
    try:
        fw = read_framework(path)
    except FrameworkTraceError as e:
        assert "\n" not in str(e)
        return
    assert fw.activities.num_rows == len(rows)


@settings(max_examples=30, deadline=None)
@given(st.floats(-50, 50), st.integers(0, 10**15), st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 3_000)),
                                                          min_size=8, max_size=40))
def test_a_drift_over_a_long_span_is_fitted_and_bounded(ppm, offset, slack):
    """Launches over 10 s with the device clock drifting ``ppm`` against the framework's:
    the fitted map puts every launch inside its kernel within the bound, and the true
    map's stamps lie within the bound of the fitted one's."""
    n = len(slack)
    t0 = 1_700_000_000_000_000_000
    a = t0 + np.linspace(0, 10_000_000_000, n).astype(np.int64)
    b = a + 100_000
    ref = int(np.median(a))

    def true(x):
        return x + offset + np.round((x - ref) * ppm * 1e-6).astype(np.int64)

    s = true(a) - np.array([h for h, _ in slack], np.int64)
    e = true(b) + np.array([q for _, q in slack], np.int64)
    f = AL.fit(a, b, s, e)
    assert f.drift_fitted and f.inlier.all()
    assert (f.outside_ns <= f.bound_ns + 1).all()
    assert np.abs(f.map(a) - true(a)).max() <= f.bound_ns + 2


number = st.one_of(  # JSON's numbers (what a decoded event's raw ts / dur can be) and null
    st.builds(lambda w, f: f"{w}.{f}", st.integers(0, 10**16), st.text("0123456789", min_size=1, max_size=7)),
    st.integers(0, 10**19).map(str), st.from_regex(r"\A-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,4})?([eE][+-]?[0-9])?\Z"),
    st.just("null"))


@settings(max_examples=300, deadline=None)
@given(st.lists(number, min_size=1, max_size=40), st.booleans(), st.sampled_from([None, 0]))
def test_ns_array_is_ns_of_on_each_number(texts, one_width, null):
    """``jsonscan.ns_array`` (numbers read as a byte matrix a length, a matrix product a
    dot position) gives each number's ``ns_of`` (``null`` where a number is null), or
    the refusal ``ns_of`` gives for the first number it refuses."""
    if one_width:  # every number one length: the matrix is the joined bytes themselves
        texts = [t for t in texts if len(t) == len(texts[0])]
    raws = [t.encode() for t in texts]
    want = []
    for r in raws:
        try:
            v = null if (null is not None and r == b"null") else J.ns_of(r)
            if not -2**63 <= v < 2**63:
                raise FrameworkTraceError("past the ns a trace can hold")
            want.append(v)
        except FrameworkTraceError as e:
            want.append(e)
            break
    try:
        got = J.ns_array(raws, null=null).tolist()
    except FrameworkTraceError as e:
        assert isinstance(want[-1], FrameworkTraceError), (texts, e)
        return
    assert got == want, texts


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 30), st.data())
def test_rows_serialized_through_arrow_are_the_messages_bytes(n, data):
    """``export._rows.serialize_rows`` is ``Messages.serialize``, byte for byte, on
    messages of varints, constants, texts of any length and fields some rows lack."""
    from timeline.export import perfetto as PF
    from timeline.export._rows import serialize_rows

    def mask():
        return np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))

    def texts():
        return [t.encode() for t in data.draw(st.lists(st.text(max_size=20), min_size=n, max_size=n))]

    ints = np.array(data.draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)), np.int64)
    a, b = texts(), texts()
    inner = PF.Messages(n).raw(PF.field_bytes(10, b"args")).blob(6, b"".join(a), [len(t) for t in a], mask())
    m = (PF.Messages(n).varint(8, ints).raw(PF.field_varint(10, 2), mask()).blob(23, b"".join(b), [len(t) for t in b])
         .message(4, inner, mask()).varint(11, ints // 3, mask()))
    rec = PF.packets(m)
    assert serialize_rows(rec) == rec.serialize()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 25), st.data())
def test_rows_patched_from_their_bytes_are_the_columns_serialized(n, data):
    """``framework_packets.patched``: a piece's packets with some rows' flows and
    tracks changed, or every row's times shifted, rebuilt from their own bytes (no
    text), are the bytes ``serialize`` gives for the changed columns; unchanged
    columns give the bytes themselves; ``name_of`` reads a row's name back."""
    from timeline.attach import framework_packets as FP
    from timeline.attach import framework_slices as FS

    def draw(strategy):
        return data.draw(st.lists(strategy, min_size=n, max_size=n))

    def texts(size):
        return FS.Texts.of(draw(st.text(max_size=size)))

    ts = np.array(draw(st.integers(0, 2**40)), np.int64)
    end = ts + np.array(draw(st.integers(0, 2**20)), np.int64)
    tracks = [FS.thread_track(0, 1, t) for t in range(3)]
    track = np.array(draw(st.sampled_from(tracks)), np.int64)
    ids = st.integers(0, 2**64 - 1)

    def flows():
        return np.array(draw(ids), np.uint64), np.array(draw(st.booleans()))

    old = (ts, end, track, *flows(), *flows())
    name, cat, args = texts(8), texts(4), texts(150)  # args of 100+ bytes: a flow can widen a length's varint
    has_cat, has_args = np.array(draw(st.booleans())), np.array(draw(st.booleans()))
    data_, layout = FP.serialize(FS.Slices(ts, end, track, name, cat, has_cat, args, has_args, *old[3:]))
    assert FP.patched(data_, layout, old, old) is data_
    row = data.draw(st.integers(0, n - 1))  # a slice's name read back from its packet (a track of its own's key)
    at = int(name.lens[:row].sum())
    assert FP.name_of(data_, layout, row) == name.data[at:at + int(name.lens[row])].decode()
    some = np.array(draw(st.booleans()))
    shift = data.draw(st.sampled_from([0, 0, 7, 2**50]))
    new = [ts + shift, end + shift, np.where(some, np.array(draw(st.sampled_from(tracks)), np.int64), track)]
    for i, h in (flows(), flows()):
        new += [np.where(some, i, old[len(new)]), np.where(some, h, old[len(new) + 1])]
    want, _ = FP.serialize(FS.Slices(*new[:3], name, cat, has_cat, args, has_args, *new[3:]))
    assert bytes(FP.patched(data_, layout, old, tuple(new))) == bytes(want)
