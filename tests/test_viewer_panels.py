"""The dashboard's callbacks' logic without a browser (``viewer.panels``,
``viewer.state``, ``viewer.wiring``, ``viewer.page``): what each panel returns for a
request, the first view, sorting, exports, messages instead of tracebacks."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from timeline.ingest import synth
from viewer import app as V
from viewer import client as VC
from viewer import wiring as VW
from viewer import state as VS
from viewer import page as VP
from viewer.panels import trace as VTR
from viewer.panels import gantt as VG
from viewer.panels import tables as VT
from viewer.panels import export as VX
from timeline.analysis import stages as A
from timeline.analysis import compare as C
from viewerkit import bars_of, component_text


# -- the callbacks' logic ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def state(trace_dir):
    d, _ = trace_dir
    st, _, _ = V.prepare(["--trace-dir", str(d), str(d / "small.arrow")])
    return st


@pytest.mark.parametrize("query, message", [
    ("?trace=../outside/secret.arrow", "outside the trace directory"),
    ("?trace=/etc/passwd", "outside the trace directory"),
    ("?trace=corrupt.arrow", "could not be read as a trace"),
    ("?trace=plain.parquet", "not a mono-timeline trace"),
    ("?trace=missing.arrow", "no trace 'missing.arrow'"),
])
def test_page_refuses_bad_traces_with_a_message(state, query, message):
    out = VTR.select(state, query, None, False)
    assert out.key == {"name": None}
    assert message in component_text(out.banners) and "Traceback" not in component_text(out.banners)


def test_page_banners(state):
    small = VTR.select(state, "", None, False)
    assert small.key == {"name": "small.arrow"} and "SYNTHETIC" in component_text(small.banners)
    assert "anomalies" not in component_text(small.banners)
    assert "ranks on one time axis: rank 0: by first stamp (ASSUMED: skew not measured)" in component_text(small.banners)
    bad = VTR.select(state, "?trace=anomalies.arrow", None, False)
    assert "This trace has" in component_text(bad.banners) and "missing_phase" in component_text(bad.banners)
    assert "no_placement" in component_text(bad.anomalies)
    empty_ = VTR.select(state, "?trace=empty.arrow", None, False)
    assert "no intervals" in component_text(empty_.banners)
    fig, _, _, _, status = VG.gantt(state, VG.GanttQuery("empty.arrow"))
    assert status == "nothing to draw" and "no intervals" in json.dumps(fig["layout"]["annotations"])


def test_gantt_zoom_keeps_the_window(state):
    name = "small.arrow"
    d = state.store.get(name).data
    fig, st, t0, t1, _ = VG.gantt(state, VG.GanttQuery(name))
    assert (st.t0, st.t1, st.r0, st.r1) == (d.t_min, d.t_max, 0, 32)
    rel = {"xaxis.range[0]": 10.0, "xaxis.range[1]": 20.0, "yaxis.range[0]": 9.7, "yaxis.range[1]": 3.2}
    fig, st, t0, t1, _ = VG.gantt(state, VG.GanttQuery(name, trigger="gantt", relayout=rel, t0=t0, t1=t1, state=st))
    assert (st.t0, st.t1, st.r0, st.r1, t0, t1) == (10_000, 20_000, 3, 11, 10.0, 20.0)
    assert fig["layout"]["xaxis"]["range"] == [10.0, 20.0]
    rows = {b[2] for b in bars_of(fig)}
    assert rows and rows <= set(range(3, 11))  # rows 3..10 overlap y 3.2..9.7
    # a stage filter keeps the time window and the rows of this grouping
    fig, st2, *_ = VG.gantt(state, VG.GanttQuery(name, stages=[0, 1], t0=t0, t1=t1, state=st))
    assert (st2.t0, st2.t1, st2.r0, st2.r1) == (10_000, 20_000, 3, 11)
    assert {b[0] for b in bars_of(fig)} <= {"qkv_a", "cache"}
    # the time inputs move the window; double-click (autorange) goes back to everything
    _, st3, *_ = VG.gantt(state, VG.GanttQuery(name, trigger="t0", t0=5.0, t1=20.0, state=st))
    assert st3.t0 == 5000
    _, st4, *_ = VG.gantt(state, VG.GanttQuery(name, trigger="gantt", state=st3,
                                                relayout={"xaxis.autorange": True, "yaxis.autorange": True}))
    assert (st4.t0, st4.t1, st4.r0, st4.r1) == (d.t_min, d.t_max, 0, 32)
    # a rank filter starts the rows over
    _, st5, *_ = VG.gantt(state, VG.GanttQuery(name, ranks=[1], state=st))
    assert (st5.r0, st5.r1) == (0, 16) and st5.panels == ["small.arrow", (1,), None]
    r1 = d.rank == 1  # ... and fits the time window to the selection
    assert (st5.t0, st5.t1) == (d.start[r1].min(), d.end[r1].max())


def test_query_string_preselects_the_view(state):
    assert VTR.initial("?trace=a.arrow&ranks=1,7,x&launches=0&grouping=cta", [0, 1], [0]) == ([1], [0], "cta")
    assert VTR.initial("?grouping=sideways", [0], [0]) == (None, None, "rank")
    out = VTR.select(state, "?trace=small.arrow&ranks=1&grouping=stage&compare=anomalies.arrow&tab=compare",
                       None, False)
    # &compare= names A, the baseline; B is the trace open
    assert out.ranks == [1] and (out.grouping, out.compare_a, out.compare_b, out.tab) == (
        "stage", "anomalies.arrow", "small.arrow", "compare")
    out = VTR.select(state, "?trace=small.arrow&compare=../outside/secret.arrow&tab=nope", None, False)
    assert out.compare_a is None and out.tab is VS.NO  # only catalog names, only known tabs


def test_first_view_is_what_the_callbacks_would_draw(state, monkeypatch):
    search = "?trace=small.arrow&ranks=1&grouping=cta"
    first = VW.first_view(state, search)
    props = first["props"]
    assert first["search"] == search and props[("trace-key", "data")] == {"name": "small.arrow"}
    assert props[("ranks", "value")] == [1] and props[("grouping", "value")] == "cta"
    fig, st, t0, t1, status = VG.gantt(state, VG.GanttQuery("small.arrow", grouping="cta", ranks=[1],
                                                                     px=list(VC.GANTT_PX)))
    assert props[("gantt", "figure")]["layout"]["meta"] == fig["layout"]["meta"]
    assert fig["layout"]["meta"]["mode"] == "bars"
    assert props[("view-state", "data")] == st.to_client()
    assert props[("t0", "value")] == t0 and props[("t1", "value")] == t1
    assert props[("panel-key", "data")] == ["small.arrow", (1,), None]
    page = VP.layout(first)  # the layout carries it, and the address it was made for
    assert page["gantt"].figure is props[("gantt", "figure")] and page["page-search"].data == search
    assert page["ranks"].value == [1] and page["trace-select"].value == "small.arrow"
    assert VW.first_view(state, search) is first  # every visit of the address: the same, made once
    monkeypatch.setattr(state, "bar_limit", 10)
    assert VW.first_view(state, search)["props"][("gantt", "figure")]["layout"]["meta"]["mode"] == "raster"
    monkeypatch.undo()
    bad = VW.first_view(state, "?trace=../outside/secret.arrow")["props"]
    assert "outside the trace directory" in component_text(bad[("banners", "children")])
    assert bad[("gantt", "figure")]["data"] == [] and bad[("panel-key", "data")] is None


def test_page_loads_plotly_early_with_the_compile_hint(state):
    client = VW.build(state).server.test_client()
    page = client.get("/").get_data(as_text=True)
    src = "/" + VP.plotly_bundle().route
    assert src.startswith(f"/_timeline-view/plotly-{VP.plotly_version()}-")
    assert f'<script async src="{src}"' in page and "window.Plotly = new Promise" in page
    assert page.index(src) < page.index("dash_renderer")  # from the head, before Dash's bundles
    js = client.get(src)
    assert js.status_code == 200 and js.mimetype == "application/javascript"
    body = js.get_data()
    assert body.startswith(b"//# allFunctionsCalledOnLoad\n") and b"plotly.js v" + VP.plotly_version().encode() in body
    assert "immutable" in js.headers["Cache-Control"]


def _bundle(tmp_path, head: str, name="b.js"):
    path = tmp_path / name
    path.write_text(head + "\nvar Plotly = {};\n")
    return path


def test_page_serves_a_given_plotly_bundle_under_its_own_address(state, tmp_path):
    """A bundle of the dashboard's trace types for this plotly.js goes out instead of
    the package's, compile hint first, at an address that names its content."""
    traces = sorted(VP.TRACE_TYPES + ("pie",))
    head = VP.bundle_header(VP.plotly_version(), traces).decode().rstrip("\n")  # what tools/plotly_bundle.py writes
    one = VP.plotly_bundle(_bundle(tmp_path, head))
    assert one.traces == tuple(traces) and one.version == VP.plotly_version()
    other = VP.plotly_bundle(_bundle(tmp_path, VP.bundle_header(VP.plotly_version(), traces + ["box"]).decode(), "c.js"))
    assert one.route != other.route != VP.plotly_bundle().route
    client = VW.build(state, plotly=one).server.test_client()
    assert f'<script async src="/{one.route}"' in client.get("/").get_data(as_text=True)
    body = client.get("/" + one.route).get_data()
    assert body == VP.COMPILE_HINT + (tmp_path / "b.js").read_bytes()
    assert b"plotly.js v" not in client.get("/" + VP.plotly_bundle().route).get_data()  # the package's: not served


@pytest.mark.parametrize("head, message", [
    ("var Plotly = 1;", "is not a bundle built by tools/plotly_bundle.py"),
    ("/* timeline-view plotly.js {v} traces=scatter,bar */", "lacks the trace types heatmap, image, scattergl"),
    ("/* timeline-view plotly.js 0.0.1 traces=bar,heatmap,image,scatter,scattergl */", "is plotly.js 0.0.1, the plotly"),
])
def test_a_bundle_that_cannot_draw_the_figures_is_refused_in_one_line(tmp_path, head, message):
    with pytest.raises(VP.BundleError, match=message) as e:
        VP.plotly_bundle(_bundle(tmp_path, head.format(v=VP.plotly_version())))
    assert "make plotly-bundle" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(VP.BundleError, match="cannot read it"):
        VP.plotly_bundle(tmp_path / "missing.js")
    with pytest.raises(SystemExit):  # the command line says it before serving anything
        V.prepare(["--plotly-js", str(tmp_path / "missing.js"), "traces/h200_mono_demo.arrow"])


def test_every_figure_draws_only_the_trace_types_a_bundle_holds(tmp_path):
    """Gantt (raster and bars, with the critical path), idle, what-if and compare
    figures use ``page.TRACE_TYPES`` only: a served bundle holds no more."""
    from timeline import load
    from timeline.contract import presets

    load("traces/h200_mono_demo.arrow").with_graph(presets.triton_ffn()).filter(launches=[0, 1]).save(tmp_path / "g.arrow")
    state, _, _ = V.prepare(["--trace-dir", str(tmp_path), str(tmp_path / "g.arrow"), "--gl-limit", "40000"])
    figs = [VG.gantt(state, VG.GanttQuery("g.arrow")).figure]  # its 5,632 bars in WebGL (--gl-limit)
    state.gl_limit = 0
    figs.append(VG.gantt(state, VG.GanttQuery("g.arrow")).figure)  # and as an image
    state.bar_limit = 1
    figs.append(VG.gantt(state, VG.GanttQuery("g.arrow")).figure)
    figs += [VT.idle(state, "g.arrow", None, None)[0], VT.whatif(state, "g.arrow", "norm.compute=0.5")[0],
             VT.compare(state, "g.arrow", "g.arrow")[0]]
    types = {t.get("type", "scatter") for f in figs for t in f["data"]}
    assert {"image", "scattergl", "scatter", "heatmap", "bar"} <= types  # every kind was drawn
    assert types <= set(VP.TRACE_TYPES)
    assert [(f["layout"]["meta"]["mode"], f["layout"]["meta"]["drawn"]) for f in figs[:3]] == [
        ("bars", "webgl"), ("bars", "image"), ("raster", "image")]


def test_page_search_from_the_referrer():
    assert VW.page_search("http://127.0.0.1:8050/?trace=a.arrow&launches=3") == "?trace=a.arrow&launches=3"
    assert VW.page_search("http://127.0.0.1:8050/") == ""
    assert VW.page_search(None) is None


def test_table_rows_sort_with_empty_cells_last():
    cols = [{"name": "stage", "id": "stage", "type": "text"}, {"name": "span_us", "id": "span_us",
                                                                "type": "numeric"}]
    rows = [{"stage": "a", "span_us": 2.0}, {"stage": "b", "span_us": None}, {"stage": "c", "span_us": 9.5},
            {"stage": "d", "span_us": 0.5}]
    assert [r["stage"] for r in VP.sort_rows(cols, rows, ["span_us", False])] == ["d", "a", "c", "b"]
    assert [r["stage"] for r in VP.sort_rows(cols, rows, ["span_us", True])] == ["c", "a", "d", "b"]
    assert VP.sort_rows(cols, rows, None) == rows
    table = VP.grid("t", cols, rows, ["span_us", True])
    text = component_text(table)
    assert text.index("9.5") < text.index("2.0") < text.index("0.5") and "span_us ▼" in text
    heads = table.children[0].children[0].children.children
    assert [h.children.id for h in heads] == [{"type": "sort", "table": "t", "col": i} for i in range(2)]


def test_bad_time_window_says_why(state):
    with pytest.raises(ValueError, match="'from' box holds 'abc', not a number of µs"):
        VG.gantt(state, VG.GanttQuery("small.arrow", trigger="t0", t0="abc"))


def test_autosize_does_not_redraw(state):
    with pytest.raises(Exception) as ex:
        VG.gantt(state, VG.GanttQuery("small.arrow", trigger="gantt", relayout={"autosize": True}))
    assert type(ex.value).__name__ == "PreventUpdate"


def test_click_pins_the_task(state):
    d = state.store.get("small.arrow").data
    _, st, *_ = VG.gantt(state, VG.GanttQuery("small.arrow", grouping="stage"))
    view = state.view(state.store.get("small.arrow"), "stage", None, None, None, None)
    pos = 1234
    i = int(view.order[pos])
    click = {"points": [{"x": (d.start[i] + d.end[i]) / 2e3, "y": int(view.row[pos])}]}
    panel = VG.details(state, "small.arrow", click, st)
    cells = [component_text(tr.children[1]) for tr in panel.children.children]
    ivs = d.task_intervals(int(d.tid[i]))
    assert i in ivs.tolist()
    assert cells[:6] == [d.stage_names[d.stage[i]], str(d.task[i]), str(d.rank[i]), str(d.launch[i]),
                         str(d.cta[i]), str(d.wave[i])]
    assert cells[6].startswith("XCC ")
    assert cells[-4:] == [f"{(d.end[j] - d.start[j]) / 1e3:,.3f} µs" for j in ivs]
    assert component_text(VG.details(state, "small.arrow", None, st)).startswith("Click a bar")


def test_stage_report_idle_and_compare(state):
    cols, rows, msg = VT.stage_report(state, "small.arrow", None, None, False)
    assert msg is None and [r["stage"] for r in rows] == list(synth.glm5_spec().stage_names)
    assert "start→hint p50_us" in [c["id"] for c in cols] and "rank" not in [c["id"] for c in cols]
    fig, cols, rows, msg = VT.idle(state, "small.arrow", None, None)
    assert msg is None and len(rows) == 2 * 8 and fig["data"][0]["type"] == "heatmap"
    trace = state.store.get("small.arrow").trace
    cols, rows = VT.gaps(state, "small.arrow", [1], None)
    want = sorted(A.idle_gaps(trace, ranks=[1]).column("duration_ns").to_pylist(), reverse=True)[:VT.IDLE_GAPS]
    assert [r["duration_ns"] for r in rows] == want and {r["rank"] for r in rows} == {1}
    cols, rows, msg = VT.critical(state, "small.arrow", [1], None)
    path = A.critical_path(trace, rank=1, launch=0)
    assert len(rows) == path.num_rows and "rank 1 · launch 0" in component_text(msg)
    assert [r["kind"] for r in rows] == path.column("kind").to_pylist()
    for scope in ("launch", "trace"):
        fig, cols, rows, msg = VT.compare(state, "small.arrow", "small.arrow", scope)
        assert all(r["Δ span_us"] == 0 for r in rows) and len(fig["data"]) == 2 and len(rows) == 11


def test_export_chrome_json_of_the_selection(state):
    tasks = state.store.get("small.arrow").trace.tasks.to_pandas()
    sent = VX.export(state, "small.arrow", [1], None, [0])
    assert sent["filename"] == "small.chrome.json"
    doc = json.loads(base64.b64decode(sent["content"]))
    events = [e for e in doc["traceEvents"] if e.get("ph") in ("B", "i")]
    task_events = [e for e in events if e["cat"] != "phase"]
    want = tasks[(tasks["rank"] == 1) & (tasks["stage"] == "qkv_a")]
    assert {e["cat"] for e in task_events} == {"qkv_a"} and len(task_events) == len(want)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names and all("rank 1" in n for n in names)


def test_a_failing_callback_shows_a_message_not_a_traceback():
    @VS.guarded(VS.NO, VS.ERROR)
    def on_something(x):
        raise KeyError("boom")

    out = on_something(1)
    assert out[0] is VS.NO and component_text(out[1]) == "on something: KeyError: 'boom'"


def test_concurrency_note_when_there_is_nothing_to_bin(state):
    item = state.store.get("empty.arrow")
    assert VG.concurrency_table(state, item, None, None, 0, 100, 50) == (None, "")


def test_export_refuses_a_huge_or_empty_selection(state, monkeypatch):
    monkeypatch.setattr(VX, "EXPORT_LIMIT", 100)
    with pytest.raises(ValueError, match=r"too large a download.*timeline export .*small.arrow --chrome OUT.json "
                                         r"--rank 1 --stage qkv_a"):
        VX.export(state, "small.arrow", [1], None, [0])
    with pytest.raises(ValueError, match="nothing to export"):
        VX.export(state, "small.arrow", None, None, [])


def test_a_multi_launch_trace_opens_on_its_median_launch(tmp_path):
    """The first view of 5 launches is one of them (the median span), filling the plot,
    with a note that says so; a linked view that names launches keeps them."""
    trace = synth.synth_trace(synth.glm5_spec(launches=5), grid=8, seed=4)
    trace.save(tmp_path / "five.arrow")
    state, _, _ = V.prepare([str(tmp_path / "five.arrow")])
    want = C.median_launch(trace)
    spans = {}
    for la in trace.launches:
        t = trace.filter(launches=[la]).tasks
        spans[la] = max(t.column("end_ns").to_pylist()) - min(t.column("start_ns").to_pylist())
    assert sorted(spans, key=spans.get)[2] == want  # the median of 5
    out = VTR.select(state, "", None, False)
    assert out.launches == [want] and "median span" in component_text(out.banners)
    drawn = VG.gantt(state, VG.GanttQuery("five.arrow", grouping=out.grouping, ranks=out.ranks,
                                                launches=out.launches))
    t = trace.filter(launches=[want]).tasks
    assert (drawn.state.t0, drawn.state.t1) == (min(t.column("start_ns").to_pylist()),
                                                max(t.column("end_ns").to_pylist()))
    assert VTR.select(state, "?launches=0,1", None, False).launches == [0, 1]


def test_critical_path_and_what_if_panels_with_a_task_graph(tmp_path):
    """A trace with its task graph: the Critical path tab shows the exact path, the
    What if tab the replay's prediction beside its fidelity; without a graph both
    say what is missing."""
    from timeline.analysis import edges as E
    from timeline import load
    from timeline.contract import presets
    from timeline.analysis import whatif as W

    real = load("traces/h200_mono_demo.arrow")
    real.with_graph(presets.triton_ffn()).filter(launches=[0, 1]).save(tmp_path / "g.arrow")
    real.filter(launches=[0, 1]).save(tmp_path / "plain.arrow")
    state, _, _ = V.prepare(["--trace-dir", str(tmp_path), str(tmp_path / "g.arrow")])
    cols, rows, note = VT.critical(state, "g.arrow", None, [1])
    path = E.exact_path(state.store.get("g.arrow").trace, launch=1, rank=0)
    assert "exact critical path" in component_text(note) and len(rows) == path.num_rows
    assert [r["via"] for r in rows] == path.column("via").to_pylist()
    fig, cols, rows, note = VT.whatif(state, "g.arrow", "norm.compute=0.5, up=1.0")
    pred = W.predict(state.store.get("g.arrow").trace, ["norm.compute=0.5"])
    want = pred.launches.to_pylist()
    assert [r["predicted_us"] for r in rows] == [round(w["predicted_us"], 3) for w in want]
    assert all(r["saving_us"] > 0 for r in rows) and "within 0 ns" in component_text(note)
    # side by side as the compare view draws them: measured behind, predicted in front, median over launches
    measured, predicted = fig["data"]
    assert measured["name"] == "measured" and predicted["name"] == "predicted (norm.compute=0.5, up=1.0)"
    assert measured["y"] == predicted["y"] == ["up", "norm", "down"]
    st = [r for r in pred.stages.to_pylist() if r["stage"] == "norm"]
    assert measured["base"][1] == pytest.approx(np.median([r["measured_first_us"] for r in st]))
    assert predicted["x"][1] == pytest.approx(np.median([r["predicted_last_us"] for r in st])
                                              - np.median([r["predicted_first_us"] for r in st]))
    assert predicted["x"][1] < measured["x"][1]  # norm's compute halved: its span shrinks
    added = VT.whatif(state, "g.arrow", "norm.compute=+1000")[2]
    assert all(r["saving_us"] < 0 for r in added)
    assert "type changes" in component_text(VT.whatif(state, "g.arrow", "")[3])
    with pytest.raises(Exception, match="unknown stage"):
        VT.whatif(state, "g.arrow", "nope=2")
    assert "needs the trace's task graph" in component_text(VT.whatif(state, "plain.arrow", "norm=2")[3])
    assert "heuristic" in component_text(VT.critical(state, "plain.arrow", None, None)[2])


def test_the_gantt_draws_the_exact_critical_path(tmp_path):
    """With a task graph the Gantt carries the critical path of the launches shown:
    a segment for each task on it and one for each hand-off between rows."""
    from timeline.analysis import edges as E
    from timeline import load
    from timeline.contract import presets

    trace = load("traces/h200_mono_demo.arrow").with_graph(presets.triton_ffn()).filter(launches=[0, 1])
    trace.save(tmp_path / "g.arrow")
    state, _, _ = V.prepare([str(tmp_path / "g.arrow")])
    drawn = VG.gantt(state, VG.GanttQuery("g.arrow", launches=[1]))
    path, = [t for t in drawn.figure["data"] if t.get("meta", {}).get("kind") == "critical-path"]
    g = E.edges(state.store.get("g.arrow").trace)
    chain = E.chain(g, 1)
    handoffs = sum(1 for s in chain if s.handoff)
    assert path["meta"]["segments"] == len(chain) + handoffs
    ends = [x for x in path["x"] if x is not None]
    assert max(ends) == pytest.approx(g.tasks.end[g.tasks.launch == 1].max() / 1e3)
    plain = VG.gantt(state, VG.GanttQuery("g.arrow", grouping="stage", launches=[1]))
    assert not [t for t in plain.figure["data"] if t.get("meta", {}).get("kind") == "critical-path"]


def test_the_top_bar_says_a_trace_is_hybrid():
    from pathlib import Path

    traces = Path(__file__).resolve().parent.parent / "traces"
    st, _, name = V.prepare(["--trace-dir", str(traces), str(traces / "h200_mono_hybrid.arrow")])
    assert "globaltimer + clock64 (hybrid)" in st.info(st.store.get(name))
    st2, _, name2 = V.prepare(["--trace-dir", str(traces), str(traces / "h200_mono_demo.arrow")])
    assert "(hybrid)" not in st2.info(st2.store.get(name2))
