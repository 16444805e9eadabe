"""The run overview's change marks (``viewer.panels.changes``): ``timeline changes``'
change points on the step axis, each labelled with its size and culprit, drifts as a
shaded span; a run's step segment as a Compare-tab source (``viewer.segments``); the
Compare tab on two segments says what ``timeline explain RUN --step .. --baseline RUN
--baseline-step ..`` says. Then in headless Chromium: the marks appear on a SYNTHETIC
run with a change at step 18, after the first paint, and a click on one opens the
Compare tab on the segment after against the one before."""

from __future__ import annotations

import json

import dash

import pytest
from selenium.webdriver.common.action_chains import ActionChains

from timeline.cli import parser as CP
from timeline.query import changes as QCH
from timeline.query import explain as QX
from timeline.query import source as QS
from tools import browser as B
from viewer import app as V
from viewer import run_source as VRS
from viewer import run_wiring as VRW
from viewer import segments as VSG
from viewer import wiring as VW
from viewer.panels import abcompare as VAB
from viewer.panels import changes as VCM
from viewer.panels import overview as VO
from viewer.panels import tables as VT
from viewer.sources import SourceError
from viewerkit import component_text, dashboard_bundle

STEPS, AT = 36, 18  # rank 1's o stage 3 % slower from step 18 (as tests/test_changes.py's run)
OVERVIEW = "var g=document.querySelector('#ov-graph .js-plotly-plot'); "


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    root = tmp_path_factory.mktemp("changesdash")
    assert CP.main(["synth", "-q", "-o", f"{root}/shifted/", "--profile", "glm5", "--ranks", "2", "--launches", "2",
                    "--grid", "64", "--steps", str(STEPS), "--seed", "11", "--change",
                    f"{AT}:1:o:*:compute:+3%"]) == 0
    return root, root / "shifted"


@pytest.fixture(scope="module")
def state(shifted):
    root, run = shifted
    st, _, first = V.prepare([str(run), "--trace-dir", str(root)])
    assert first == run.name
    return st


@pytest.fixture(scope="module")
def doc(shifted):
    return QCH.changes(QS.open_source(str(shifted[1])), source_text="shifted")


def test_marks_are_the_change_points_on_the_step_axis(state, doc):
    """One dashed line before step 18's column, labelled with the change's size (the
    shift as a % of the kernel time with its interval) and its culprit; a ▼ marker on
    that column carrying the two segments (before: 0-17, after: 18-35, its layers)."""
    ov = state.runs.overview("shifted")
    (cp,) = doc["change_points"]
    assert cp["step"] == AT and cp["culprit"]["rank"] == 1 and cp["culprit"]["stage"] == "o"
    m = VCM.marks(ov, doc, "shifted")
    col = ov.grid.xs.index(str(AT))
    (line,) = [s for s in m["shapes"] if s["name"] == "change"]
    assert line["x0"] == line["x1"] == col - 0.5 and (line["y0"], line["y1"]) == (0, 1)
    (note,) = m["annotations"]
    p = cp["shift_pct"]
    assert note["text"] == (f"step {AT}: {p['estimate']:+.2f}% [{p['low']:.2f}, {p['high']:.2f}]<br>"
                            f"{cp['culprit']['says']}") and p["low"] > 0
    assert m["trace"]["x"] == [str(AT)] and m["trace"]["name"] == VCM.NAME
    a, b = m["trace"]["customdata"][0]
    assert (a, b) == ("shifted?steps=0-17&layers=0-1", "shifted?steps=18-35&layers=0-1")
    assert VSG.label(b) == "shifted · steps 18-35 · layers 0-1"
    fig = VCM.apply(VO.figure(ov, "kernel", None, ov.typical, "shifted"), m)
    assert fig["data"][-1] is m["trace"] and line in fig["layout"]["shapes"] and len(fig["layout"]["shapes"]) == 2
    assert VCM.picked({"points": [{"x": "18", "y": "1", "customdata": [a, b]}]}) == (a, b)
    assert VCM.picked({"points": [{"x": "18", "y": "1", "z": 3.0}]}) is None  # a cell: it opens its launch


def test_a_drift_is_a_shaded_span_and_a_grid_without_steps_has_no_marks(state):
    """A drift (a document's ``drifts``) is one shaded span from its start step to the
    last column with its shift; a change point at a step the grid lacks is not drawn."""
    ov = state.runs.overview("shifted")
    doc = {"says": "drift", "change_points": [{"step": 999, "before": {"steps": [0, 998]},
                                                "after": {"steps": [999, 1000]}, "layers": [0]}],
           "drifts": [{"start_step": 10, "shift_pct": {"estimate": 3.5, "low": 3.1, "high": 3.9}}]}
    m = VCM.marks(ov, doc, "shifted")
    (span,) = m["shapes"]
    assert span["type"] == "rect" and span["x0"] == ov.grid.xs.index("10") - 0.5
    assert span["x1"] == len(ov.grid.xs) - 0.5 and m["trace"] is None
    assert m["annotations"][0]["text"] == "drift from step 10: +3.50% [3.10, 3.90]"


def test_a_segment_reads_as_explain_reads_its_steps():
    """A segment name reads back; a malformed one is one ``SourceError`` line."""
    name = VSG.name("r/x", (4, 9), [0, 2, 3])
    assert name == "r/x?steps=4-9&layers=0,2-3" and VSG.split(name) == ("r/x", (4, 9), [0, 2, 3])
    assert VSG.split(VSG.name("r", (5, 5))) == ("r", (5, 5), None)
    for bad in ("r?steps=9-4", "r?steps=a-b", "?steps=1-2", "r?steps=1-2&layers=0-99999"):
        with pytest.raises(SourceError, match="not a run's segment"):
            VSG.split(bad)


def test_the_compare_tab_on_two_segments_says_what_explain_says(state, doc, shifted):
    """The Compare tab's answer on B = the steps after, A = the steps before is
    ``timeline explain RUN --step 18-35 --layer 0-1 --baseline RUN --baseline-step
    0-17 --baseline-layer 0-1``'s (the change point's ``reproduce`` line): its verdict
    and its shift, the change point's shift; each side drawn on a launch of its steps."""
    (cp,) = doc["change_points"]
    m = VCM.marks(state.runs.overview("shifted"), doc, "shifted")
    a, b = m["points"][0]["a"], m["points"][0]["b"]
    verdict, _, title_b, _, title_a = VAB.compare_ab(state, a, b)
    run = str(shifted[1])
    src = QS.open_source(run)
    want = QX.explain(src, QS.Selection(steps=list(range(AT, STEPS)), layers=[0, 1]),
                      QX.Ask(baseline=run, baseline_sel=QS.Selection(steps=list(range(AT)), layers=[0, 1])))
    text = component_text(verdict)
    assert want["verdict"].replace(run, "shifted") in text and "B is slower than A" in text
    shift = want["baseline"]["shift"]
    assert shift["estimate_us"] == pytest.approx(cp["shift"]["estimate_us"])
    assert VAB.shift_text(shift) in text and "--step 18-35" in cp["reproduce"]
    key_b = VRS.parse_launch(title_b.split(" · launch ")[1].split(" ")[0])
    key_a = VRS.parse_launch(title_a.split(" · typical launch ")[1].split(";")[0])
    assert title_b.startswith("B: shifted · steps 18-35 · layers 0-1") and key_b.step >= AT
    assert title_a.startswith("A: shifted · steps 0-17 · layers 0-1") and key_a.step < AT
    rows = VT.compare(state, a, b)[2]
    assert {r["stage"] for r in rows} >= {"o"}  # the stage spans of the two segments' typical launches


def test_the_marks_callback_waits_for_the_launch_shown_and_runs_once(state):
    """``on_marks`` answers once the panels follow a launch of the run, and not again
    for the run it has marks of; the first paint has none yet; another metric keeps them."""
    ov = state.runs.overview("shifted")
    shown = [VRS.launch_name("shifted", ov.typical), None, None]
    with pytest.raises(dash.exceptions.PreventUpdate):
        VRW.on_marks(state, "shifted", None, None, None)
    section = VRW.section(state, "")  # the first paint: no marks yet, the slot says they are coming
    assert not section["ov-graph"].figure["layout"].get("annotations")
    assert section["ov-changes-says"].children == VRW.CHANGES_SLOT
    m, patch, note = VRW.on_marks(state, "shifted", shown, None, {"name": shown[0]})
    assert m["run"] == "shifted" and note.startswith("change points (timeline changes shifted): from step 18")
    assert m["points"][0]["step"] == AT and len(m["shapes"]) == 1
    with pytest.raises(dash.exceptions.PreventUpdate):
        VRW.on_marks(state, "shifted", shown, m, {"name": shown[0]})
    fig = VRW.on_figure(state, "skew", None, {"name": shown[0]}, None, m)[0]  # another metric keeps the marks
    assert fig["data"][-1]["name"] == VCM.NAME and fig["layout"]["annotations"] == m["annotations"]
    assert VRW.on_figure(state, "skew", None, {"name": shown[0]}, None, {**m, "run": "other"})[0]["data"][-1][
        "name"] != VCM.NAME  # marks of another run are not drawn on this one


def test_an_address_names_the_two_segments(state):
    """``&compare=A&compare_b=B&tab=compare`` with A and B step segments of a run the
    page may open preselects them (the link to a change's comparison); a segment of a
    run it may not open, or one that does not read, is dropped."""
    from viewer.panels import trace as VTR

    ov = state.runs.overview("shifted")
    a, b = VSG.name("shifted", (0, 17), [0, 1]), VSG.name("shifted", (18, 35), [0, 1])
    search = VO.search_for("shifted", ov.typical, "", {"tab": "compare", "compare": a, "compare_b": b}, keep=())
    out = VTR.select(state, search, None, False)
    assert (out.compare_a, out.compare_b, out.tab) == (a, b, "compare")
    assert {"label": "shifted · steps 18-35 · layers 0-1", "value": b} in out.compare_b_options
    for bad in ("elsewhere?steps=0-17", "shifted?steps=x"):
        out = VTR.select(state, search.replace("compare_b=", "compare_b=" + bad.replace("?", "%3F") + "&x="), None,
                         False)
        assert out.compare_b == "shifted" and not any(o["value"] == bad for o in out.compare_b_options)


browser = pytest.mark.skipif(B.available() is not None, reason=f"no headless browser: {B.available()}")


@pytest.mark.browser
@browser
def test_the_marks_appear_and_a_click_opens_the_compare_tab_on_the_segments(state):
    """In Chromium: the overview paints, then the change mark appears at step 18 with
    its size; a click on its ▼ opens the Compare tab on B = steps 18-35 against
    A = steps 0-17, whose verdict says B is slower with the shift's interval."""
    ov = state.runs.overview("shifted")
    with B.serve(VW.build(state, plotly=dashboard_bundle())) as url, B.chromium(1400, 1100) as driver:
        driver.get(url)
        B.gantt_ready(driver)
        marks = B.wait_for(driver, OVERVIEW + "if (!g || !g.layout.annotations) return null; var a = "
                           "g.layout.annotations.filter(x => x.name === 'change'); return a.length ? "
                           "JSON.stringify([a.map(x => x.text), g.layout.shapes.filter(s => s.name === 'change')"
                           ".map(s => s.x0)]) : null", 60, "the change marks")
        texts, xs = json.loads(marks)
        assert len(texts) == 1 and texts[0].startswith(f"step {AT}: +") and "rank 1 o" in texts[0]
        assert xs == [ov.grid.xs.index(str(AT)) - 0.5]
        assert "from step 18" in driver.find_element("id", "ov-changes-says").text
        point = B.wait_for(driver, "var t=[...document.querySelectorAll('#ov-graph .scatterlayer .trace')].pop(); "
                                   "return t && t.querySelector('.point')", 30, "the change marker")
        ActionChains(driver).move_to_element(point).click().perform()
        B.wait_for(driver, "var s=document.querySelector('#tabs .tab--selected'); "
                           "return s && s.innerText.indexOf('Compare') >= 0 || null", 30, "the Compare tab")
        verdict = B.wait_for(driver, "var v=document.getElementById('cmp-shift'); return v && v.innerText", 90,
                             "the A/B verdict")
        assert "B - A = +" in verdict and ": significant" in verdict
        assert "B is slower than A" in driver.find_element("id", "cmp-verdict-text").text
        title_b = driver.find_element("id", "cmp-gantt-b-title").text
        title_a = driver.find_element("id", "cmp-gantt-a-title").text
        assert title_b.startswith("B: shifted · steps 18-35 · layers 0-1") and "A: shifted · steps 0-17" in title_a
        dropdowns = driver.find_element("id", "cmp-b").text + " | " + driver.find_element("id", "cmp-a").text
        assert "shifted · steps 18-35" in dropdowns and "shifted · steps 0-17" in dropdowns
        link = B.wait_for(driver, "var k=document.getElementById('ov-link'); var h=k && k.getAttribute('href'); "
                                  "return h && h.indexOf('compare_b=') > 0 ? h : null", 30, "the link to this view")
        assert driver.execute_script("return location.search") == link  # the address bar names it
        driver.get(url + link)  # the link opens the Compare tab on the same segments
        B.wait_for(driver, "var t=document.getElementById('cmp-gantt-a-title'); "
                           "return t && t.innerText.indexOf('A: shifted · steps 0-17') == 0 || null", 90, "A again")
        assert driver.find_element("id", "cmp-gantt-b-title").text.startswith("B: shifted · steps 18-35")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


def test_a_run_without_steps_has_no_marks_and_no_error(tmp_path):
    """A run whose launches carry no slot headers (capture x slot) has no steps to
    search: no marks, an empty line, never a message in red."""
    from timeline.run import append
    from viewer_runkit import headerless, small_trace

    run = tmp_path / "bare_run"
    append(run, headerless(small_trace()))
    st, _, first = V.prepare([str(run), "--trace-dir", str(tmp_path)])
    ov = st.runs.overview(first)
    shown = [VRS.launch_name(first, ov.typical), None, None]
    m, fig, note = VRW.on_marks(st, first, shown, None, {"name": shown[0]})
    assert (m["shapes"], m["trace"], note) == ([], None, "") and fig is dash.no_update
