"""The framework's context strip above the Gantt (``timeline-view TRACE --context
FRAMEWORK``, ``viewer.attached``, ``viewer.panels.strip``) on the bundled real H200
capture under torch.profiler (traces/h200_attach/: the graph demo's steps 0, 4, 8 x 8
layers): each launch's strip holds its own step, the instrumented kernel's event
holds the launch's stamps within the fit's bound on the Gantt's time axis, a zoom on
either moves the other, two ranks' framework traces each give their own rank's strip,
bad --context input is one line and exit status 2, and a page without --context has no
strip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.attach import context as CX
from timeline.core import rows as R
from viewer import app as V
from viewer import wiring as VW
from viewer.ids import STRIP_PROPS
from viewer.panels import gantt as VG
from viewer.panels import strip as VST

TRACES = Path(__file__).resolve().parents[1] / "traces"
D = TRACES / "h200_attach"
HOST = "%d:%g" % tuple(json.loads((D / "host_clock.json").read_text()))
CONTEXT = ["--context", str(D / "graph.pt.trace.json.gz"), "--context-kernel", "mono_ffn_kernel",
           "--context-host-clock", HOST]


@pytest.fixture(scope="module")
def page():
    """The dashboard on graph.arrow with its framework trace attached, as the command line makes it."""
    state, _, first = V.prepare([str(D / "graph.arrow"), *CONTEXT])
    assert first == "graph.arrow" and state.context is not None
    return state


def first_state(state, search: str = "") -> dict:
    return VW.first_view(state, search)["props"][("view-state", "data")]


def stamps(item, launch: int) -> tuple:
    """The launch's first and last stamp (ns) on the Gantt's axis, from its intervals."""
    d = item.data
    m = d.launch == launch
    return int(d.start[m].min()), int(d.end[m].max())


def test_each_launch_strip_is_its_own_step_with_its_kernel_around_its_stamps(page):
    """Every one of the 24 launches: the strip names the launch's own step (the
    capture's slot header step: the profiler's ProfilerStep#N holds its kernel), holds
    that step's marker, one instrumented event, only GPU rows of the launch's device, and
    the launch's stamps lie inside the instrumented event within the fitted bound (726
    ns on this capture, bench/results/attach_h200.txt), on the Gantt's axis."""
    item = page.store.get("graph.arrow")
    att = page.context.att
    bound = att.fits[0].bound_ns
    assert 0 < bound <= 1000
    keys = item.trace.launch_keys
    for launch in item.trace.launches:
        s = page.context.strip(item, 0, launch)
        assert s.step == keys[launch].step and s.launch == str(keys[launch]) and not s.anomaly
        rows = s.rows.to_pylist()
        marks = [int(r["name"].removeprefix("ProfilerStep#")) for r in rows if r["name"].startswith("ProfilerStep#")]
        assert min(marks) == s.step  # the strip begins at the launch's own step marker
        mine = [r for r in rows if r["kind"] == "instrumented"]
        assert len(mine) == 1 and mine[0]["name"] == "mono_ffn_kernel"
        first, last = stamps(item, launch)
        assert mine[0]["start_ns"] - bound <= first and last <= mine[0]["end_ns"] + bound
        assert mine[0]["end_ns"] - mine[0]["start_ns"] < 2 * (last - first)  # its own kernel, not a neighbour's
        assert {r["device"] for r in rows if r["kind"] in CX.GPU_KINDS + ("instrumented",)} == {0}
        assert set(r["kind"] for r in rows) <= set(CX.KINDS)


def test_the_strip_keeps_the_profilers_own_spacing(page):
    """The strip's device rows are the profiler's, read here from the JSON itself with
    the standard library: the instrumented event is the matched kernel (its
    correlation id and start; a CUDA graph's kernels share their replay's correlation)
    with the JSON's ``dur``, and the device rows are the JSON's GPU events on device 0
    overlapping the launch's step window, each placed relative to the kernel to the ns:
    a wrong row, step or axis map would move or drop them. Where they sit absolutely is
    the stamps-inside test above."""
    import gzip

    doc = json.loads(gzip.open(D / "graph.pt.trace.json.gz").read())
    ns = lambda v: int(round(float(v) * 1000))  # noqa: E731 - Kineto's µs with 3 decimals
    gpu = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e) for e in doc["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e["args"].get("device") == 0]
    item, att = page.store.get("graph.arrow"), page.context.att
    seen = 0
    for r in att.matches.to_pylist():
        rows = page.context.strip(item, 0, r["launch"]).rows.to_pylist()
        mine = [x for x in rows if x["kind"] == "instrumented"][0]
        k = [(a, b) for a, b, e in gpu if e["args"].get("correlation") == r["correlation"] and a == r["kernel_start_ns"]]
        assert len(k) == 1 and mine["end_ns"] - mine["start_ns"] == k[0][1] - k[0][0]
        lo, hi = CX.launch_window(att, 0, r)
        want = sorted((a - k[0][0], e["name"]) for a, b, e in gpu if b >= lo and a <= hi)
        got = sorted((x["start_ns"] - mine["start_ns"], x["name"]) for x in rows if x["kind"] in CX.GPU_KINDS
                     or x["kind"] == "instrumented")
        assert got == want
        seen += len(got)
    assert seen > 24 * 10  # most launches' steps hold other kernels and copies

def test_the_strip_figure_draws_every_row_in_its_lane(page):
    st0 = first_state(page, "?trace=graph.arrow&launches=8")
    out = VST.on_strip(page, st0, None)
    fig = out.figure
    s = page.context.strip(page.store.get("graph.arrow"), 0, 8)
    kinds = s.rows.column("kind").to_pylist()
    meta = fig["layout"]["meta"]
    assert meta["launch"] == "4:0" and meta["events"] == len(kinds) and meta["lanes"] == ["host ops", "kernels", "copies"]
    assert fig["layout"]["xaxis"]["range"] == [st0["t0"] / 1e3, st0["t1"] / 1e3]  # the Gantt's window
    gantt = VW.first_view(page, "?trace=graph.arrow&launches=8")["props"][("gantt", "figure")]
    assert fig["layout"]["xaxis"]["range"] == gantt["layout"]["xaxis"]["range"]
    assert (fig["layout"]["margin"]["l"], fig["layout"]["margin"]["r"]) == \
           (gantt["layout"]["margin"]["l"], gantt["layout"]["margin"]["r"])  # the axes line up to the pixel
    from viewerkit import untyped

    for t in fig["data"]:
        kind = t["meta"]["kind"]
        if kind in CX.KINDS:
            x = untyped(t["x"])
            assert len(x) == 3 * kinds.count(kind) and t["line"]["color"] == VST.COLOURS[kind]
    assert VST.COLOURS["instrumented"] not in {VST.COLOURS[k] for k in CX.KINDS if k != "instrumented"}
    mine = [t for t in fig["data"] if t["meta"]["kind"] == "instrumented"]
    x = untyped(mine[0]["x"])
    assert meta["instrumented"] == [[pytest.approx(x[0]), pytest.approx(x[1])]]
    hover = [t for t in fig["data"] if t["meta"]["kind"] == "hover"][0]
    assert len(hover["text"]) == len(kinds) and any("this launch's kernel" in h for h in hover["text"])
    assert "ProfilerStep#4" in str(out.title) and out.box == {} and out.drawn == ["graph.arrow", 0, "4:0"]


def test_a_zoom_on_the_gantt_moves_the_strip_and_a_zoom_on_the_strip_moves_the_gantt(page):
    """Gantt -> strip: the Gantt callback's new view state reaches the strip as a Patch of
    its x range, equal to the Gantt's. Strip -> Gantt: the strip's relayoutData (what the
    page's ZOOM_SCRIPT hands the zoom store unchanged) is a zoom the Gantt draws, and the
    strip follows the window drawn. Double-click (autorange) on the strip: both back to
    the launch."""
    st0 = first_state(page)
    first = VST.on_strip(page, st0, None)
    lo, hi = st0["t0"] / 1e3, st0["t1"] / 1e3

    def gantt(rel, state):
        assert all(re.match(VW.ZOOM_KEY[1:-1], k) for k in rel)  # the page's ZOOM_SCRIPT sends it on as it is
        g = VG.on_gantt(page, VG.GanttQuery("graph.arrow", launches=list(state["launches"]), trigger="gantt",
                                            relayout=rel, px=[1000, 560], state=state))
        return g, VST.on_strip(page, g.state, first.drawn)

    g, out = gantt({"xaxis.range[0]": lo - 300.0, "xaxis.range[1]": hi + 50.0}, st0)  # zoom out on the Gantt
    patch = out.figure.to_plotly_json()["operations"]
    assert patch == [{"operation": "Assign", "location": ["layout", "xaxis", "range"],
                      "params": {"value": g.figure["layout"]["xaxis"]["range"]}}]
    assert g.figure["layout"]["xaxis"]["range"] == [pytest.approx(lo - 300.0), pytest.approx(hi + 50.0)]
    assert out.box is VST.NO and out.drawn is VST.NO  # the same strip: only its range moves

    rel = {"xaxis.range[0]": lo - 120.5, "xaxis.range[1]": lo + 10.25}  # a drag-zoom on the strip
    g2, out2 = gantt(rel, g.state)
    assert g2.state["t0"] == int((lo - 120.5) * 1e3) and g2.state["t1"] == int(np.ceil((lo + 10.25) * 1e3))
    assert out2.figure.to_plotly_json()["operations"][0]["params"]["value"] == g2.figure["layout"]["xaxis"]["range"]
    assert g2.state["r0"] == g.state["r0"] and g2.state["r1"] == g.state["r1"]  # a strip zoom keeps the rows

    g3, out3 = gantt({"xaxis.autorange": True}, g2.state)  # double-click on the strip
    assert [g3.state["t0"], g3.state["t1"]] == [st0["t0"], st0["t1"]]
    assert out3.figure.to_plotly_json()["operations"][0]["params"]["value"] == [lo, hi]


def test_another_launch_redraws_the_strip_and_several_launches_say_pick_one(page):
    st0 = first_state(page)
    drawn = VST.on_strip(page, st0, None).drawn
    other = first_state(page, "?trace=graph.arrow&launches=3")
    out = VST.on_strip(page, other, drawn)
    assert isinstance(out.figure, dict) and out.drawn == ["graph.arrow", 0, "0:3"]
    assert out.figure["layout"]["meta"]["launch"] == "0:3"
    every = first_state(page, "?trace=graph.arrow&launches=3,4")
    out = VST.on_strip(page, every, drawn)
    assert out.style == VST.HIDE and out.box == VST.SHOW and "pick one launch" in out.title and out.drawn is None


def test_a_run_of_the_capture_draws_the_same_strip(tmp_path):
    """The capture appended to a run: the run's launch 4:3 (read alone, its own Trace)
    gets the same rows as the trace file's launch 11 (4:3)."""
    from timeline.cli import main

    assert main(["run", "add", "-q", str(tmp_path / "run"), str(D / "graph.arrow")]) == 0
    state, _, _ = V.prepare([str(tmp_path / "run"), *CONTEXT])
    st_ = first_state(state, "?run=run&launch=4:3")
    out = VST.on_strip(state, st_, None)
    assert st_["name"] == "run/launch=4:3" and out.drawn == ["run/launch=4:3", 0, "4:3"]
    file_state, _, _ = V.prepare([str(D / "graph.arrow"), *CONTEXT])
    a = state.context.strip(state.store.get("run/launch=4:3"), 0, 0).rows
    b = file_state.context.strip(file_state.store.get("graph.arrow"), 0, 11).rows
    assert a.equals(b)


def test_a_run_without_slot_headers_draws_the_files_strip(tmp_path):
    """A headerless capture appended to a run (its launches keyed CAPTURE:SLOT) and a
    framework trace of it: the run's launch demo:5 gets the rows the file's launch 5 gets."""
    import kinetokit as KK
    from timeline import load
    from timeline.cli import main

    demo = TRACES / "h200_mono_demo.arrow"
    KK.gpu_trace(KK.torch_trace(tmp_path / "cpu.json", marks=False), tmp_path / "fw.json", load(demo))
    assert main(["run", "add", "-q", str(tmp_path / "run"), str(demo), "--capture", "demo"]) == 0
    ctx = ["--context", str(tmp_path / "fw.json"), "--context-kernel", "mono_ffn_kernel"]
    state, _, _ = V.prepare([str(tmp_path / "run"), *ctx])
    st_ = first_state(state, "?run=run&launch=demo:5")
    assert VST.on_strip(state, st_, None).drawn == ["run/launch=demo:5", 0, "demo:5"]
    file_state, _, _ = V.prepare([str(demo), *ctx])
    a = state.context.strip(state.store.get("run/launch=demo:5"), 0, 0).rows
    b = file_state.context.strip(file_state.store.get("h200_mono_demo.arrow"), 0, 5).rows
    assert a.num_rows > 0 and a.equals(b)


def test_several_ranks_each_get_their_own_frameworks_strip(tmp_path):
    """Two ranks (the bundled TP traces merged into one file), one framework trace each
    (``--context`` in rank order; kernel events in Kineto's schema, rank r's on device r
    at its own offset): the strip of the rank shown is cut from that rank's file, its
    instrumented kernel on that rank's device around that rank's stamps within its fit's
    bound; a page showing both ranks draws the first."""
    import kinetokit as KK
    from timeline import load, merge

    traces = D.parent
    tp = merge([load(traces / "h200_tp2_rank0.arrow"), load(traces / "h200_tp2_rank1.arrow")])
    tp.save(tmp_path / "tp.arrow")
    base = KK.torch_trace(tmp_path / "cpu.json", marks=False)
    for r in (0, 1):
        KK.gpu_trace(base, tmp_path / f"r{r}.json", tp.filter(ranks=[r]), kernel="tp_kernel", device=r,
                     lead_ns=50_000 + 300_000 * r)
    state, _, _ = V.prepare([str(tmp_path / "tp.arrow"), "--context", str(tmp_path / "r0.json"),
                             "--context", str(tmp_path / "r1.json"), "--context-kernel", "tp_kernel"])
    item = state.store.get("tp.arrow")
    key, drawn = str(item.trace.launch_keys[0]), {}
    for r in (0, 1):
        out = VST.on_strip(state, first_state(state, f"?trace=tp.arrow&ranks={r}&launches=0"), None)
        assert out.drawn == ["tp.arrow", r, key] and out.figure["layout"]["meta"]["rank"] == r
        rows = state.context.strip(item, r, 0).rows.to_pylist()
        mine = [x for x in rows if x["kind"] == "instrumented"]
        assert len(mine) == 1 and {x["device"] for x in rows if x["kind"] in CX.GPU_KINDS} <= {r}
        m = (item.data.rank == r) & (item.data.launch == 0)
        first, last = int(item.data.start[m].min()), int(item.data.end[m].max())
        bound = state.context.att.fits[r].bound_ns
        assert mine[0]["device"] == r and mine[0]["start_ns"] - bound <= first and last <= mine[0]["end_ns"] + bound
        drawn[r] = out.figure["layout"]["meta"]["instrumented"]
    assert drawn[0] != drawn[1]
    both = VST.on_strip(state, first_state(state, "?trace=tp.arrow&launches=0"), None)
    assert both.drawn == ["tp.arrow", 0, key]


@pytest.mark.parametrize("args, message", [
    (["{d}/graph.arrow", "--context", "{tmp}/missing.json"], "framework trace '{tmp}/missing.json' does not exist"),
    (["{d}/graph.arrow", "--context", "{tmp}/notes.txt"], "is none of the framework traces attach reads"),
    (["{d}/graph.arrow", "--context", "{d}/plain.arrow"], "is a timeline trace file, not a framework trace"),
    (["{d}/graph.arrow", "--context", "{tmp}/cut.json"], "truncated"),
    # the framework trace of another run: 4 kernels of that name for 24 launches
    (["{d}/graph.arrow", "--context", "{d}/plain.pt.trace.json.gz", "--context-kernel", "mono_ffn_kernel"],
     "24 instrumented launches but 4 kernel events of that name"),
    (["{d}/plain.arrow", "--context", "{d}/graph.pt.trace.json.gz"], "has no kernel named 'triton_mono_ffn'"),
    (["{d}/graph.arrow", "--context", "{d}/graph.pt.trace.json.gz", "--context-kernel", "mono_ffn_kernel"],
     "pair with the profiler's steps at several offsets [0, 1, 2, 3]"),
    (["{d}/graph.arrow", *CONTEXT[:-1], "12:x"], "--context-host-clock '12:x': give NS or NS:U"),
    (["{d}/graph.arrow", "{d}/plain.arrow", *CONTEXT], "name exactly one TRACE or RUN (2 named)"),
    (["{d}/graph.arrow", "--context-kernel", "k"], "qualify --context"),
])
def test_bad_context_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    (tmp_path / "notes.txt").write_text("not a trace\n")
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1')
    args = [a.format(d=D, tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as ex:
        V.prepare(args)
    err = capsys.readouterr().err
    assert ex.value.code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("timeline-view: error: ") and message.format(d=D, tmp=tmp_path) in line
    if "several offsets" in message:  # the attach wing's option names, as the viewer spells them
        assert "--context-step-offset K" in line and "--context-host-clock" in line and " --step-offset" not in line


def test_without_context_there_is_no_strip(trace_dir):
    d, _ = trace_dir
    state, _, _ = V.prepare(["--trace-dir", str(d), str(d / "small.arrow")])
    app = VW.build(state)
    layout = str(app.layout())
    assert state.context is None and "context" not in layout
    assert not any("context" in k for k in app.callback_map)
    with_ctx = VW.build(V.prepare([str(D / "graph.arrow"), *CONTEXT])[0])
    assert any(k.startswith("..context.figure") or "context.figure" in k for k in with_ctx.callback_map)
    assert all(f"{cid}.{prop}" in " ".join(with_ctx.callback_map) for cid, prop in STRIP_PROPS)


def test_a_page_of_another_trace_hides_the_strip(page, trace_dir):
    """The strip belongs to the trace --context was attached to: a page on another
    trace of the directory has none."""
    d, _ = trace_dir
    state, _, _ = V.prepare(["--trace-dir", str(d), str(D / "graph.arrow"), *CONTEXT])
    other = first_state(state, "?trace=small.arrow")
    out = VST.on_strip(state, other, ["graph.arrow", 0, "8:5"])
    assert out.box == VST.HIDE and out.style == VST.HIDE and out.drawn is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CX.KINDS), st.integers(0, 10_000), st.integers(0, 5_000)), max_size=60))
def test_lane_rows_keep_kinds_in_their_lane_and_stack_overlaps(events):
    """Each event on a row of its kind's lane, lanes in ``LANES`` order without sharing a
    row; two events of one row overlap by less than ``SHARE_NS`` (their spans cut short
    by it do not overlap) unless their lane ran out of rows (``MAX_SUBROWS``)."""
    kinds = [k for k, _, _ in events]
    s = np.array([a for _, a, _ in events], np.int64)
    e = s + np.array([b for _, _, b in events], np.int64)
    row, ticks = VST.lane_rows(kinds, s, e)
    lane_of = {k: i for i, (_, ks) in enumerate(VST.LANES) for k in ks}
    lanes = [lane_of[k] for k in kinds]
    starts = [at for at, _ in ticks]
    assert [t for _, t in ticks] == [VST.LANES[i][0] for i in sorted(set(lanes))]
    for i in range(len(kinds)):
        j = sorted(set(lanes)).index(lanes[i])
        assert starts[j] <= row[i] < (starts[j + 1] if j + 1 < len(starts) else row.max() + 1)
        assert row[i] - starts[j] < VST.MAX_SUBROWS
    clipped = np.maximum(e - VST.SHARE_NS, s)
    for i in range(len(kinds)):
        for j in range(i + 1, len(kinds)):
            full = row[i] - starts[sorted(set(lanes)).index(lanes[i])] == VST.MAX_SUBROWS - 1
            if row[i] == row[j] and not full:  # touching is not overlapping
                assert max(s[i], s[j]) >= min(clipped[i], clipped[j]), (i, j)


def test_more_events_than_the_limit_keep_the_longest_and_the_instrumented(page, monkeypatch):
    item = page.store.get("graph.arrow")
    s = page.context.strip(item, 0, 21)
    monkeypatch.setattr(VST, "STRIP_LIMIT", 10)
    fig = VST.strip_figure(s, 0, 1)
    meta = fig["layout"]["meta"]
    assert meta["events"] == 10 and meta["left_out"] == s.rows.num_rows - 10 and len(meta["instrumented"]) == 1
    from viewerkit import untyped

    drawn = []
    for t in fig["data"]:
        if t["meta"]["kind"] in CX.KINDS and t["meta"]["kind"] != "instrumented":
            x = np.asarray(untyped(t["x"]), np.float64)
            drawn += np.round((x[1::3] - x[0::3]) * 1e3).astype(np.int64).tolist()
    others = s.rows.filter(np.asarray(s.rows.column("kind").to_pylist()) != "instrumented")
    dur = R.column(others, "end_ns") - R.column(others, "start_ns")
    assert sorted(drawn) == sorted(dur.tolist())[-9:]  # the 9 longest others beside it
    assert "of the shortest events left out" in str(VST.title(s, meta["left_out"]))


def test_an_anomaly_and_a_launch_without_step_are_said_above_the_strip(page):
    """The line above the strip: a launch whose stamps fall outside its kernel event says
    so with the distance (never moved: the rows are the same), one without a step
    marker says what window it shows."""
    s = page.context.strip(page.store.get("graph.arrow"), 0, 8)
    said = str(VST.title(s._replace(anomaly=True, outside_ns=49_216)))
    assert "ANOMALY" in said and "49,216 ns outside its kernel event" in said
    assert "ANOMALY" not in str(VST.title(s))
    assert "no step marker: its kernel ± 0.2 ms" in str(VST.title(s._replace(step=None)))
    assert f"clock fit ± {s.bound_ns:,.0f} ns" in str(VST.title(s))


@pytest.mark.parametrize("cat, name, kind", [
    ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
    ("kernel", "rcclGenericKernel", "collective"),
    ("kernel", "mono_ffn_kernel", "kernel"),
    ("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", "memcpy"),
    ("gpu_memset", "Memset (Device)", "memset"),
    ("cuda_runtime", "cudaGraphLaunch", "launch"),
    ("cuda_driver", "cuLaunchKernel", "launch"),
    ("cpu_op", "aten::mm", "host_op"),
    ("user_annotation", "ProfilerStep#4", "host_op"),
    ("python_function", "model.py(12): forward", "host_op"),
    ("ac2g", "flow", None),
])
def test_each_kineto_category_goes_to_its_lane(cat, name, kind):
    """A Kineto event's kind (its strip lane) from its ``cat``; NCCL / RCCL kernels are
    collectives; categories the strip does not draw are none."""
    assert CX._kind(cat, name) == kind
    if kind is not None:
        assert any(kind in ks for _, ks in VST.LANES)
