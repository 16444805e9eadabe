"""The dashboard's Explain and Compare tabs: each asks ``timeline.query.explain`` (the
one home: the page shows its words), on the launch shown, the slowest or the p99
launch, against the trace's or run's own typical launch or against another trace or
run (A/B); never a command-line hint, never a server path. In headless Chromium (as
tests/test_viewer_browser.py drives it): on a SYNTHETIC trace with one injected
delay the tab names the injected task and a click on the culprit pins it and draws
its chain over the Gantt; on a run B with a regression against a trace file A, the
Compare tab's A/B verdict names it and draws its chain on both Gantts."""

from __future__ import annotations

import json

import pytest

from timeline.ingest import synth_graph as SG
from timeline.query import explain as QX
from timeline.query import source as QS
from tools import browser as B
from viewer import app as V
from viewer import explained as XD
from viewer import run_source as VRS
from viewer import wiring as VW
from viewer.panels import abcompare as VAB
from viewer.panels import explain as XP
from viewerkit import component_text
from viewer_runkit import INJECTED, graph_pair

needs_browser = pytest.mark.skipif(B.available() is not None, reason=f"no headless browser: {B.available()}")

CHAIN = ("var g=document.querySelector('#gantt .js-plotly-plot');"
         "var p=g.data.filter(t=>t.meta&&t.meta.kind=='culprit-chain');"
         "return p.length ? JSON.stringify(p[p.length-1].meta) : null;")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """A trace directory: ``inj.arrow`` (4 launches, rank 1's norm task 5 +20 µs in
    launch 2), ``two.arrow`` (2 launches: too few for a typical one), ``graph_a.arrow``
    and the run ``graph_b_run`` (``viewer_runkit.graph_pair``)."""
    d = tmp_path_factory.mktemp("explain") / "traces"
    d.mkdir()
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=4)
    SG.graph_trace(spec, seed=3, inject=[SG.parse_injection("1:norm:5:compute:+20000@2")]).save(d / "inj.arrow")
    SG.graph_trace(SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=2), seed=5).save(d / "two.arrow")
    graph_pair(d)
    return d


@pytest.fixture(scope="module")
def state(traces):
    st, _, _ = V.prepare(["--trace-dir", str(traces), str(traces / "inj.arrow")])
    return st


def verdict_of(out) -> str:
    return component_text(out[0][1])


def test_the_explain_tab_says_what_timeline_query_explain_says(state, traces):
    src = QS.open_source(str(traces / "inj.arrow"))
    key = {"name": "inj.arrow"}
    out = XP.on_explain(state, key, "explain", ["inj.arrow", None, None], "slowest", None)
    want = QX.explain(src, QS.Selection(), QX.Ask())
    assert verdict_of(out) == want["verdict"] and want["verdict"].startswith("launch 2 took")
    assert "culprit: rank 1 norm task 5" in want["verdict"]
    assert out[2][0] == {"rank": 1, "stage": "norm", "task": 5, "key": "2", "culprit": 0}
    out = XP.on_explain(state, key, "explain", ["inj.arrow", None, (1,)], "shown", None)  # the launch shown
    assert verdict_of(out) == QX.explain(src, QS.Selection(), QX.Ask(launches=[VRS.parse_launch("1")]))["verdict"]
    assert verdict_of(out).startswith("launch 1 took")
    out = XP.on_explain(state, key, "explain", ["inj.arrow", None, None], "p99", None)
    assert verdict_of(out) == QX.explain(src, QS.Selection(), QX.Ask(p99=True))["verdict"]


def test_too_few_launches_ask_for_another_source_in_the_page_not_a_flag(state, traces):
    """Two launches: no typical one of its own; the page says to pick a source to
    explain against (never "give --baseline"), and against another trace it answers
    A/B."""
    out = XP.on_explain(state, {"name": "two.arrow"}, "explain", ["two.arrow", None, None], "slowest", None)
    text = component_text(out[0])
    assert "too few for a typical launch of its own" in text and "pick a trace or run" in text
    assert "--" not in text and "timeline " not in text
    out = XP.on_explain(state, {"name": "two.arrow"}, "explain", ["two.arrow", None, None], "slowest", "inj.arrow")
    text = component_text(out[0])
    assert "against A = inj.arrow" in text and "A's typical" in text and str(traces) not in text


def test_a_run_launch_is_explained_against_the_run_and_against_another_source(traces):
    """On a run's page the tab explains the launch shown: against the run's typical
    launch, or against a trace file A (A/B: B's launch against A's typical), the culprit
    the injected task, and the Compare tab's A/B verdict names it with its chain drawn
    on both Gantts."""
    a, b = traces / "graph_a.arrow", traces / "graph_b_run"
    st, _, first = V.prepare([str(b), "--trace-dir", str(traces)])
    ov = st.runs.overview(first)
    name = VRS.launch_name(first, ov.typical)
    src = QS.open_source(str(b))
    out = XP.on_explain(st, {"name": name}, "explain", [name, None, None], "shown", None)
    assert verdict_of(out) == QX.explain(src, QS.Selection(), QX.Ask(launches=[ov.typical]))["verdict"]
    out = XP.on_explain(st, {"name": name}, "explain", [name, None, None], "shown", a.name)
    want = QX.explain(src, QS.Selection(), QX.Ask(launches=[ov.typical], baseline=str(a)))
    assert verdict_of(out) == want["verdict"] and "culprit: rank 1 norm task 5" in want["verdict"]
    assert str(traces) not in json.dumps(out, default=str)
    verdict, fig_b, title_b, fig_a, title_a = VAB.compare_ab(st, a.name, first)
    assert "rank 1 norm task 5" in component_text(verdict) and INJECTED.startswith("1:norm:5")
    chains = [[t for t in f["data"] if (t.get("meta") or {}).get("kind") == "culprit-chain"] for f in (fig_b, fig_a)]
    assert all(c and c[0]["meta"]["segments"] >= 1 for c in chains), title_b
    assert title_b.startswith(f"B: {first} · launch ") and title_a.startswith(f"A: {a.name} · typical launch ")
    doc = XD.document(st, first, QX.Ask(baseline=a.name))
    assert doc["verdict"] == QX.explain(src, QS.Selection(), QX.Ask(baseline=str(a)))["verdict"]
    assert str(traces) not in json.dumps(doc)  # every path replaced by the name it was asked by
    assert "pick A" in component_text(VAB.compare_ab(st, None, first)[0])


@pytest.mark.browser
@needs_browser
def test_the_explain_tab_names_the_culprit_and_pins_its_chain(traces):
    state, _, _ = V.prepare(["--trace-dir", str(traces), str(traces / "inj.arrow")])
    with B.serve(VW.build(state)) as url, B.chromium(1400, 1100) as driver:
        driver.get(url)
        B.gantt_ready(driver)
        driver.find_element("id", "tab-explain").click()
        verdict = B.wait_for(driver, "var v=document.getElementById('explain-verdict-text');"
                                     "return v ? v.innerText : null;", 60, "the explain verdict")
        assert verdict.startswith("launch 2 took") and "culprit: rank 1 norm task 5" in verdict
        buttons = driver.find_elements("css selector", "#explain-culprits button.culprit")
        assert buttons and buttons[0].text.startswith("★ rank 1 norm task 5")
        buttons[0].click()
        meta = json.loads(B.wait_for(driver, CHAIN, 30, "the culprit's chain on the Gantt"))
        assert meta["segments"] >= 2 and meta["tasks"] >= 2  # the culprit and what it held, to the launch's end
        pinned = B.wait_for(driver, "var t=document.getElementById('details-table');"
                                    "return t ? t.innerText : null;", 30, "the pinned task")
        assert "norm" in pinned and "rank\t1" in pinned and "launch\t2" in pinned and "task\t5" in pinned
        assert meta["culprit"] == 0
        driver.find_elements("css selector", "#explain-culprits button.culprit")[0].click()  # again: still one chain
        B.wait_for(driver, CHAIN, 30, "the chain")
        n = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').data"
                                  ".filter(t=>t.meta&&t.meta.kind=='culprit-chain').length;")
        assert n == 1, f"{n} culprit chains on the Gantt after two clicks"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


AB_CHAINS = ("var f=document.querySelector('#cmp-gantt-%s .js-plotly-plot');"
             "return f && f.data ? f.data.filter(t=>t.meta&&t.meta.kind=='culprit-chain').length : null;")


@pytest.mark.browser
@needs_browser
def test_the_compare_tab_explains_b_against_a_on_both_gantts(traces):
    """A run B open, the Compare tab, A picked from the trace directory: the A/B
    verdict names B's injected task, both Gantts (B's launch, A's typical) draw its
    chain; the Explain tab, against A, names it too and a click draws its chain on the
    page's Gantt."""
    a, b = traces / "graph_a.arrow", traces / "graph_b_run"
    st, _, first = V.prepare([str(b), "--trace-dir", str(traces)])
    with B.serve(VW.build(st)) as url, B.chromium(1400, 1400) as driver:
        driver.get(url + "?tab=compare")
        B.gantt_ready(driver)
        driver.find_element("id", "tab-compare").click()
        B.wait_for(driver, "var v=document.getElementById('cmp-verdict'); return v && v.innerText.indexOf('pick A') "
                           ">= 0 || null", 60, "the A/B prompt")
        b_value = driver.execute_script("var d=document.getElementById('cmp-b'); return d && d.innerText;")
        assert first in b_value  # B: the run open
        driver.execute_script("window.dash_clientside.set_props('cmp-a', {value: arguments[0]});", a.name)
        verdict = B.wait_for(driver, "var v=document.getElementById('cmp-verdict-text'); return v && v.innerText",
                             90, "the A/B verdict")
        assert verdict.startswith("B is slower than A: B - A = +") and "culprit: rank 1 norm task 5" in verdict
        shift = driver.find_element("id", "cmp-shift").text  # the interval beside the difference, n a side
        assert "B - A = +" in shift and "] (95%, " in shift and "launches, by " in shift and "significant" in shift
        assert B.wait_for(driver, AB_CHAINS % "b", 60, "B's chains") >= 1
        assert B.wait_for(driver, AB_CHAINS % "a", 60, "A's chains") >= 1
        title = driver.find_element("id", "cmp-gantt-a-title").text
        assert title.startswith(f"A: {a.name} · typical launch ")
        driver.find_element("id", "tab-explain").click()
        driver.execute_script("window.dash_clientside.set_props('explain-against', {value: arguments[0]});", a.name)
        verdict = B.wait_for(driver, "var v=document.getElementById('explain-verdict-text');"
                                     "return v && v.innerText.indexOf(\"A's typical\") > 0 ? v.innerText : null;",
                             60, "the Explain tab's A/B verdict")
        assert "culprit: rank 1 norm task 5" in verdict
        buttons = driver.find_elements("css selector", "#explain-culprits button.culprit")
        assert len(buttons) >= 2 and buttons[0].text.startswith("★ rank 1 norm task 5")
        buttons[0].click()
        meta = json.loads(B.wait_for(driver, CHAIN, 30, "the culprit's chain on the Gantt"))
        assert meta["segments"] >= 2 and meta["culprit"] == 0
        driver.find_elements("css selector", "#explain-culprits button.culprit")[1].click()  # another culprit
        B.wait_for(driver, CHAIN.replace("return p.length", "return p.some(t=>t.meta.culprit==1) && p.length"), 30,
                   "the second culprit's chain")
        n = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').data"
                                  ".filter(t=>t.meta&&t.meta.kind=='culprit-chain').length;")
        assert n == 1, f"{n} culprit chains on the Gantt after two clicks: the second replaces the first"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
