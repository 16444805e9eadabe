"""The dashboard's Explain tab in headless Chromium (as tests/test_viewer_browser.py
drives it): on a SYNTHETIC trace with one injected delay it shows the verdict naming
the injected task, and a click on the culprit pins that task and draws its chain over
the Gantt; the browser console stays free of errors."""

from __future__ import annotations

import pytest

from timeline.ingest import synth_graph as SG
from tools import browser as B
from viewer import app as V
from viewer import wiring as VW

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(B.available() is not None, reason=f"no headless browser: {B.available()}")]

CHAIN = ("var g=document.querySelector('#gantt .js-plotly-plot');"
         "var p=g.data.filter(t=>t.meta&&t.meta.kind=='culprit-chain');"
         "return p.length ? JSON.stringify(p[p.length-1].meta) : null;")


def test_the_explain_tab_names_the_culprit_and_pins_its_chain(tmp_path):
    import json

    d = tmp_path / "traces"
    d.mkdir()
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=4)
    SG.graph_trace(spec, seed=3, inject=[SG.parse_injection("1:norm:5:compute:+20000@2")]).save(d / "inj.arrow")
    state, _, _ = V.prepare(["--trace-dir", str(d), str(d / "inj.arrow")])
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
        assert len(buttons) >= 2 and meta["culprit"] == 0
        buttons = driver.find_elements("css selector", "#explain-culprits button.culprit")  # drawn anew
        buttons[1].click()  # another culprit: its chain replaces the first one's
        B.wait_for(driver, CHAIN.replace("return p.length", "return p.some(t=>t.meta.culprit==1) && p.length"), 30,
                   "the second culprit's chain")
        n = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').data"
                                  ".filter(t=>t.meta&&t.meta.kind=='culprit-chain').length;")
        assert n == 1, f"{n} culprit chains on the Gantt after two clicks"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
