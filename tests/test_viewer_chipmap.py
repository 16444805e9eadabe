"""The Chip tab (``viewer.panels.chipmap``) on the bundled H200 trace: the map holds a
row per SM in placement order and its cells agree with ``timeline chip``'s figures;
the tail sentence is ``timeline chip``'s; a click on a unit sets the Gantt's launch and
CTA range to that unit's CTAs. Then in headless Chromium: the tab paints its 128 rows
and the tail sentence, and a click on a unit's row narrows the Gantt to its CTA."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains

from timeline.cli import parser as CP
from tools import browser as B
from viewer import app as V
from viewer import wiring as VW
from viewer.panels import chipmap as VCP
from viewerkit import dashboard_bundle

TRACES = Path(__file__).resolve().parents[1] / "traces"
H200 = TRACES / "h200_mono_demo.arrow"


@pytest.fixture(scope="module")
def state():
    st, _, first = V.prepare(["--trace-dir", str(TRACES)])
    assert first == H200.name
    return st


def test_the_map_is_a_row_per_sm_in_placement_order_with_the_chip_command_s_tail(state, capsys):
    fig, says, link = VCP.chip_view(state, H200.name, None, [3])
    hm = fig["data"][0]
    assert link["launch"] == 3 and len(link["ctas"]) == 128 and hm["type"] == "heatmap"
    assert len(hm["y"]) == 128 and len(hm["z"]) == 128 and len(hm["z"][0]) == 100
    nums = [int(u.removeprefix("sm")) for u in hm["y"]]
    assert nums == sorted(nums)  # placement order, numeric (sm9 before sm10)
    capsys.readouterr()
    assert CP.main(["chip", str(H200), "--launch", "3", "--across", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tail = doc["launches"][0]["ranks"][0]["tail"]["says"]
    assert says[1].children == tail and tail.startswith("the last ") and "of 128 SMs" in tail
    lv = doc["launches"][0]["ranks"][0]["levels"][0]
    assert f"the busiest ({lv['busiest']}) {lv['max_over_mean']:.3f}×" in says[0].children
    z = np.array(hm["z"])
    assert set(np.unique(z)) <= {0, 1, 2} and (z == 2).mean() > 0.5  # mostly busy, some waiting


def test_a_click_on_a_unit_sets_the_gantt_launch_and_its_ctas(state):
    _, _, link = VCP.chip_view(state, H200.name, None, [3])
    launches, ctas, said = VCP.on_unit({"points": [{"y": "sm5", "x": 1.0}]}, link)
    tr = state.store.get(H200.name).trace
    t = tr.tasks.to_pandas()
    on5 = t[(t.launch == 3) & (t.sm == 5)]
    assert launches == [3] and ctas == [int(on5.cta.min()), int(on5.cta.max())] and "sm5" in said
    assert VCP.picked({"points": [{"y": "sm999"}]}, link) is None and VCP.picked(None, link) is None


browser = pytest.mark.skipif(B.available() is not None, reason=f"no headless browser: {B.available()}")
CHIP = "var g=document.querySelector('#chip-graph .js-plotly-plot'); "


@pytest.mark.browser
@browser
def test_the_chip_tab_paints_and_a_click_on_a_unit_links_to_the_gantt(state):
    """In Chromium: the Chip tab paints 128 unit rows and the tail sentence; a click on
    a unit's row sets the Gantt's launch and CTA range to that unit's CTAs; a link with
    ``tab=chip`` opens the tab on the launch it names."""
    with B.serve(VW.build(state, plotly=dashboard_bundle())) as url, B.chromium(1400, 2600) as driver:  # map in view
        driver.get(url)
        first = B.gantt_ready(driver)
        driver.find_element("id", "tab-chip").click()
        rows = B.wait_for(driver, CHIP + "return g && g.data && g.data.length && g.data[0].y.length", 90, "the map")
        assert rows == 128
        tail = driver.find_element("id", "chip-tail").text
        assert tail.startswith("the last ") and "of 128 SMs" in tail
        assert "imbalance sm: the busiest" in driver.find_element("id", "chip-imbalance").text
        launch = int(driver.find_element("id", "chip-imbalance").text.split(",")[0].removeprefix("launch "))
        drag = driver.find_element("css selector", "#chip-graph .nsewdrag")  # the map's middle row
        ActionChains(driver).move_to_element(drag).pause(0.3).click().perform()
        said = B.wait_for(driver, "var t=document.getElementById('chip-linked'); "
                                  "return t && t.innerText.indexOf(' ran CTAs ') > 0 && t.innerText", 30, "the link")
        unit, lo = said.split()[2], int(said.split()[-1].split("-")[0])
        k = driver.execute_script(CHIP + "return g.data[0].y.indexOf(arguments[0])", unit)
        assert 50 < k < 78  # the row under the mouse: the middle of the 128
        tr = state.store.get(H200.name).trace.tasks.to_pandas()
        assert lo == int(tr[(tr.launch == launch) & (tr.sm == int(unit.removeprefix("sm")))].cta.min())
        B.gantt_ready(driver, 60, first)
        ticks = B.wait_for(driver, "var g=document.querySelector('#gantt .js-plotly-plot'); var t=g.layout.yaxis"
                                   ".ticktext; var r=new RegExp('L%d .*cta %d( |$)'); "
                                   "return t && t.length && t.every(x => r.test(x)) ? t : null" % (launch, lo), 60,
                           "the Gantt on the unit's CTA")
        assert 0 < len(ticks) < 10  # the unit's CTA's waves, no other row
        driver.get(url + "?launches=3&tab=chip")  # a link opens the tab on its launch
        B.wait_for(driver, "var t=document.getElementById('chip-imbalance'); "
                           "return t && t.innerText.indexOf('launch 3,') == 0 || null", 90, "the tab on launch 3")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
