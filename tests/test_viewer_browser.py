"""The dashboard end to end in headless Chromium (Debian's /usr/bin/chromium and
chromedriver through Selenium; nothing downloads a browser): the default trace
loads with the expected rows, filters and zoom change what is drawn, hover and
click show a task, bad requests give a message and never a traceback or a file
from outside the trace directory, and the console stays free of errors."""

import json
import shutil

import numpy as np
import pytest

from viewer import app as V
from viewer import wiring as VW
from tools import browser as B

from viewerkit import dashboard_bundle, make_trace_dir

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(B.available() is not None, reason=f"no headless browser: {B.available()}")]

BARS = ("var g=document.querySelector('#gantt .js-plotly-plot');"
        "return g.data.filter(t=>t.meta&&t.meta.kind=='bars').map(t=>t.meta.stage);")
ROWS = ("var g=document.querySelector('#gantt .js-plotly-plot'); var rows={};"
        "g._fullData.filter(t=>t.meta&&t.meta.kind=='bars').forEach(t=>{ for(var i=0;i<t.y.length;i++)"
        "{ if(!isNaN(t.y[i])) rows[t.y[i]]=1; } }); return Object.keys(rows).map(Number).sort((a,b)=>a-b);")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The dashboard started as ``make demo`` starts it, ``timeline-view --trace-dir DIR
    --plotly-js BUNDLE`` with no TRACE, DIR holding the test traces and a copy of
    small.arrow under the bundled trace's name."""
    root = tmp_path_factory.mktemp("site")
    d, secret = make_trace_dir(root)
    shutil.copy(d / "small.arrow", d / V.DEFAULT_TRACE)
    # --gl-limit: this module's Gantt tests read the WebGL bars (small.arrow's 31,744 intervals);
    # test_bars_beyond_the_gl_limit_are_one_image covers the default's image
    state, _, first = V.prepare(["--trace-dir", str(d), "--gl-limit", "40000"])
    assert first == V.DEFAULT_TRACE
    with B.serve(VW.build(state, plotly=dashboard_bundle())) as url, B.chromium(1400, 1100) as driver:
        yield {"url": url, "driver": driver, "state": state, "dir": d}


@pytest.fixture
def page(site):
    """The site, and after the test: the browser console held no error."""
    driver = site["driver"]
    driver.get_log("browser")  # drop what earlier tests left
    yield site
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"browser console errors: {errors}"


def meta(driver):
    return json.loads(B.gantt_ready(driver).split("|")[0])


def text_of(driver, element_id):
    return driver.find_element("id", element_id).text


def test_default_trace_loads_with_its_rows(page, tmp_path):
    from PIL import Image

    driver, state = page["driver"], page["state"]
    driver.get(page["url"])
    m = meta(driver)
    d = state.store.get(V.DEFAULT_TRACE).data
    assert m["mode"] == "bars" and m["intervals"] == d.n and m["n_rows"] == 2 * 8 * 2
    assert driver.execute_script(ROWS) == list(range(32))  # one row per rank x CTA x wave, all drawn
    assert set(driver.execute_script(BARS)) == set(d.stage_names)
    assert V.DEFAULT_TRACE in driver.find_element("id", "trace-select").text
    loaded = driver.execute_script("return performance.getEntriesByType('resource').map(e=>e.name)"
                                   ".filter(n=>/plotly[^/]*\\.js/.test(n))")
    assert len(loaded) == 1 and "/_timeline-view/plotly-" in loaded[0]  # plotly.js loaded (and run) once
    from viewer.page import TRACE_TYPES  # ... the dashboard's own bundle, with the trace types it draws
    assert driver.execute_script("return Object.keys(Plotly.PlotSchema.get().traces).sort()") == list(TRACE_TYPES)
    assert "SYNTHETIC" in text_of(driver, "banners")
    ticks = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').layout.yaxis.ticktext")
    assert len(ticks) == 32 and ticks[0] == "r0 L0 · cta 0 w0" and ticks[17] == "r1 L0 · cta 0 w1"
    shot = B.screenshot(driver, tmp_path / "dashboard.png")
    img = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert img.shape[0] > 500 and img.std() > 20  # not blank
    gantt = driver.find_element("id", "gantt").rect
    crop = img[int(gantt["y"]) + 60:int(gantt["y"] + gantt["height"] * 0.6), int(gantt["x"]) + 200:]
    colours = {tuple(c) for c in crop[::7, ::7].astype(int).reshape(-1, 3)}
    assert len(colours) > 20  # the bars are drawn (WebGL), in many stage / phase shades


def test_stage_filter_changes_what_is_drawn(page):
    driver = page["driver"]
    driver.get(page["url"])
    before = meta(driver)
    driver.find_element("xpath", "//div[@id='stages']//label[contains(., 'qkv_a')]//input").click()
    after = _wait_changed(driver, before)
    d = page["state"].store.get(V.DEFAULT_TRACE).data
    assert after["intervals"] == before["intervals"] - int((d.stage == 0).sum())
    assert "qkv_a" not in driver.execute_script(BARS)
    driver.find_element("xpath", "//div[@id='phases']//label[contains(., 'start→hint')]//input").click()
    third = _wait_changed(driver, after)
    assert third["intervals"] == int(((d.stage != 0) & (d.phase != 0)).sum())


def _wait_changed(driver, before):
    """The Gantt's meta once it differs from ``before`` (compared as parsed JSON: the
    two languages spell numbers differently)."""
    from selenium.webdriver.support.ui import WebDriverWait

    script = ("var g=document.querySelector('#gantt .js-plotly-plot');"
              "return g&&g.layout&&g.layout.meta ? JSON.stringify(g.layout.meta) : null;")

    def changed(d):
        m = d.execute_script(script)
        return m and json.loads(m) != before and json.loads(m)

    return WebDriverWait(driver, 60, poll_frequency=0.1).until(changed, "the Gantt to change")


def test_hover_and_click_show_the_task(page):
    from selenium.webdriver.common.action_chains import ActionChains

    driver = page["driver"]
    driver.get(page["url"])
    meta(driver)
    pt = B.hover_bar(driver, 0.5)
    hover = B.wait_for(driver, "var h=document.querySelector('#gantt .hoverlayer .hovertext');"
                               "return h ? h.textContent : null;", 20, "the hover label")
    assert pt["stage"] in hover and "task" in hover and "CTA" in hover and "XCC" in hover
    assert "start→hint" in hover and "compute→end" in hover and "µs" in hover
    ActionChains(driver).click().perform()
    details = B.wait_for(driver, "var t=document.getElementById('details-table'); return t ? t.innerText : null;",
                         20, "the pinned task")
    assert pt["stage"] in details and "placement" in details and "start→hint" in details


def test_zoom_turns_the_raster_into_bars(page, monkeypatch):
    driver, state = page["driver"], page["state"]
    monkeypatch.setattr(state, "bar_limit", 3000)
    driver.get(page["url"])
    m = meta(driver)
    assert m["mode"] == "raster"
    img = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').data[0].type")
    assert img == "image"
    assert "aggregated view" in text_of(driver, "gantt-status")
    lo, hi = (v / 1e3 for v in m["window_ns"])
    driver.execute_script(  # what a drag-zoom does: relayout the x and y ranges
        "Plotly.relayout(document.querySelector('#gantt .js-plotly-plot'),"
        "{'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1],"
        " 'yaxis.range[0]': 7.5, 'yaxis.range[1]': -0.5});", lo + (hi - lo) * 0.4, lo + (hi - lo) * 0.5)
    z = _wait_changed(driver, m)
    assert z["mode"] == "bars" and z["rows"] == [0, 8] and 0 < z["intervals"] <= 3000
    assert set(driver.execute_script(ROWS)) <= set(range(8))
    t0 = float(driver.find_element("id", "t0").get_attribute("value"))
    assert t0 == pytest.approx(lo + (hi - lo) * 0.4, abs=1e-3)  # the time inputs follow the zoom
    driver.find_element("id", "reset").click()
    assert _wait_changed(driver, z)["mode"] == "raster"


def test_a_zoom_draws_the_figure_once(page):
    """A zoom goes to the server straight from plotly's relayout event (``ZOOM_HOOK``):
    the page plots once, the server's new figure. Before, dcc.Graph copied the new axis
    into its ``figure`` prop and re-plotted the old figure first, on the main thread
    before the zoom's request left (bench/results/viewer_run.txt). A layout event that
    is no zoom (the drag mode) still goes to dcc.Graph, which re-plots with it, and
    asks the server nothing."""
    driver = page["driver"]
    driver.get(page["url"])
    m = meta(driver)
    B.wait_for(driver, "return document.querySelector('#gantt .js-plotly-plot')._timelineZoom", 20, "the zoom hook")
    driver.execute_script("window._reacts = 0; var r = Plotly.react;"
                          "Plotly.react = function() { window._reacts += 1; return r.apply(this, arguments); };")
    lo, hi = (v / 1e3 for v in m["window_ns"])
    driver.execute_script("Plotly.relayout(document.querySelector('#gantt .js-plotly-plot'),"
                          "{'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});",
                          lo + (hi - lo) * 0.2, lo + (hi - lo) * 0.6)
    z = _wait_changed(driver, m)
    assert z["window_ns"][0] == pytest.approx((lo + (hi - lo) * 0.2) * 1e3, abs=2)
    B.next_frames(driver)
    assert driver.execute_script("return window._reacts") == 1
    requests = ("return performance.getEntriesByType('resource')"
                ".filter(e => /_dash-update-component/.test(e.name)).length")
    before = driver.execute_script(requests)
    driver.execute_script("Plotly.relayout(document.querySelector('#gantt .js-plotly-plot'), {dragmode: 'pan'})")
    B.wait_for(driver, "return window._reacts >= 2", 20, "dcc.Graph's handler")  # it copies the mode into its figure
    B.next_frames(driver)
    assert driver.execute_script("return window._reacts") == 2
    assert driver.execute_script(requests) == before
    assert meta(driver) == z


def test_the_page_notes_its_first_paint(page):
    """``watch_ready`` notes in the page the frame after the Gantt is drawn
    (bench/viewer_run.py's first paint): after the page was asked for, and no later
    than the WebDriver saw the figure and two frames painted; before the figure, no
    note. ``unwatch`` removes the script for the later pages."""
    import time

    driver = page["driver"]
    ready = "var g=document.querySelector('#gantt .js-plotly-plot'); return g && g.layout && g.layout.meta;"
    ident = B.watch_ready(driver, ready)
    try:
        t_wall, t = time.time(), time.perf_counter()
        driver.get(page["url"])
        assert B.ready_after(driver, t_wall) is None or driver.execute_script(ready)
        B.wait_for(driver, ready, 60, "the Gantt")
        B.next_frames(driver)
        polled = time.perf_counter() - t
        B.wait_for(driver, "return window._readyAt;", 20, "the note")
        assert 0 < B.ready_after(driver, t_wall) <= polled
    finally:
        B.unwatch(driver, ident)
    driver.get(page["url"])
    meta(driver)
    assert driver.execute_script("return window._readyAt === undefined")


def test_bars_beyond_the_gl_limit_are_one_image(page, monkeypatch):
    """Past ``--gl-limit`` the exact bars are one server image (no WebGL): a band per row
    in the stages' colours, the status line says how to get hover text, a click on a
    bar still pins its task."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver, state = page["driver"], page["state"]
    monkeypatch.setattr(state, "gl_limit", 1000)
    driver.get(page["url"])
    m = meta(driver)
    d = state.store.get(V.DEFAULT_TRACE).data
    assert m["mode"] == "bars" and m["drawn"] == "image" and m["intervals"] == d.n
    kinds = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').data"
                                  ".map(t=>[t.type, t.meta && t.meta.kind]);")
    assert ["image", "bars-image"] in kinds and not any(t == "scattergl" for t, _ in kinds)
    assert "drawn as an image" in text_of(driver, "gantt-status") and "1,000" in text_of(driver, "gantt-status")
    pt = driver.execute_script(  # the middle of row 0, halfway along the window
        "var g=document.querySelector('#gantt .js-plotly-plot'), L=g._fullLayout, r=g.getBoundingClientRect();"
        "return {x: r.left + L._size.l + L._size.w / 2, y: r.top + L.yaxis._offset + L.yaxis.l2p(0)};")
    ActionChains(driver).move_to_location(int(pt["x"]), int(pt["y"])).click().perform()
    details = B.wait_for(driver, "var t=document.getElementById('details-table'); return t ? t.innerText : null;",
                         20, "the pinned task")
    assert "placement" in details and "start→hint" in details


@pytest.mark.parametrize("query, message", [
    ("?trace=../outside/secret.arrow", "outside the trace directory"),
    ("?trace=%2E%2E/outside/secret.arrow", "outside the trace directory"),
    ("?trace=corrupt.arrow", "could not be read as a trace"),
    ("?trace=plain.parquet", "not a mono-timeline trace"),
])
def test_bad_requests_show_a_message(page, query, message):
    driver = page["driver"]
    driver.get(page["url"] + query)
    banner = B.wait_for(driver, "var b=document.getElementById('banners'); return b && b.innerText || null;",
                        30, "the error banner")
    assert message in banner and "Traceback" not in driver.page_source
    assert "SECRET_KERNEL" not in driver.page_source


def test_anomalies_and_empty_traces_say_so(page):
    driver = page["driver"]
    driver.get(page["url"] + "?trace=anomalies.arrow")
    banner = B.wait_for(driver, "var b=document.getElementById('banners'); var t=b&&b.innerText;"
                                "return t && t.includes('anomalies') ? t : null;", 30, "the anomaly banner")
    assert "missing_phase" in banner and "no_placement" in banner
    driver.find_element("id", "tab-anomalies").click()
    table = B.wait_for(driver, "var t=document.getElementById('anomaly-table'); return t ? t.innerText : null;",
                       20, "the anomaly table")
    assert "missing_phase" in table and "placement word is 0" in table
    driver.get(page["url"] + "?trace=empty.arrow")
    banner = B.wait_for(driver, "var b=document.getElementById('banners'); var t=b&&b.innerText;"
                                "return t && t.includes('no intervals') ? t : null;", 30, "the empty-trace banner")
    assert "no intervals" in banner


def test_a_row_without_a_placement_word_is_on_its_own_unplaced_row(page):
    """anomalies.arrow has one record whose placement word is 0: it is drawn on a row
    of its own, labelled, after the CTAs' (was: a row labelled "cta -1 w-1"), and its
    hover says it has no placement word."""
    driver, state = page["driver"], page["state"]
    driver.get(page["url"] + "?trace=anomalies.arrow")
    m = meta(driver)
    d = state.store.get("anomalies.arrow").data
    assert m["n_rows"] == 8 + 1 and driver.execute_script(ROWS) == list(range(9))  # 8 CTAs, one unplaced row
    ticks = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').layout.yaxis.ticktext")
    assert ticks[-1] == "r0 L0 · unplaced · lane 0" and all("cta -1" not in t for t in ticks)
    hover = driver.execute_script("var g=document.querySelector('#gantt .js-plotly-plot');"
                                  "return g.data.filter(t=>t.meta&&t.meta.kind=='hover').map(t=>t.hovertemplate);")
    assert sum("unplaced: no placement word" in h for h in hover) == 1 and int((d.cta < 0).any())


def test_panels_idle_and_compare(page):
    driver = page["driver"]
    driver.get(page["url"])
    meta(driver)
    rows = B.wait_for(driver, "return document.querySelectorAll('#stage-report tbody tr').length > 5 ? "
                              "document.querySelector('#stage-report').innerText : null;", 30, "the stage report")
    assert "qkv_a" in rows and "span_us" in rows
    driver.find_element("id", "tab-idle").click()
    kind = B.wait_for(driver, "var g=document.querySelector('#idle-graph .js-plotly-plot');"
                              "return g && g.data && g.data.length ? g.data[0].type : null;", 30, "the idle chart")
    assert kind == "heatmap"
    gaps = B.wait_for(driver, "var r = document.querySelectorAll('#gap-table tbody tr');"
                              "return r.length ? document.querySelector('#gap-table').innerText : null;", 30,
                      "the largest idle gaps")
    assert "duration_ns" in gaps and "stage_before" in gaps
    driver.find_element("id", "tab-critical").click()
    path = B.wait_for(driver, "var r = document.querySelectorAll('#critical-table tbody tr');"
                              "return r.length ? document.querySelector('#tab-critical').parentElement.parentElement"
                              ".innerText : null;", 30, "the critical path")
    assert "work" in path and "duration_us" in path and "rank 0 · launch 0" in path


def test_linked_view_is_drawn_from_the_layout(page):
    driver, state = page["driver"], page["state"]
    driver.get(page["url"] + "?ranks=1&grouping=cta")
    m = meta(driver)
    d = state.store.get(V.DEFAULT_TRACE).data
    assert m["n_rows"] == 8 * 2 and m["intervals"] == int((d.rank == 1).sum())  # rank 1's CTA x wave rows
    assert set(driver.execute_script(ROWS)) == set(range(16))
    assert "rank 1" in text_of(driver, "ranks")
    # the first view came with the layout; the filters still redraw it
    driver.find_element("xpath", "//div[@id='stages']//label[contains(., 'qkv_a')]//input").click()
    after = _wait_changed(driver, m)
    assert after["intervals"] == int(((d.rank == 1) & (d.stage != 0)).sum())


SPAN_COLUMN = ("var t=document.querySelector('#stage-report table'); if(!t) return null;"
               "var i=[...t.tHead.rows[0].cells].findIndex(c=>c.innerText.startsWith('span_us'));"
               "var v=[...t.tBodies[0].rows].map(r=>r.cells[i].innerText);")


def _span_column(driver, other_than=None):
    """The stage report's span_us column once it is drawn (and differs from ``other_than``)."""
    prev = json.dumps(json.dumps(other_than, separators=(",", ":")))  # JSON.stringify's spelling
    return B.wait_for(driver, SPAN_COLUMN + f"return JSON.stringify(v)!=={prev} ? v : null;", 30,
                      "the stage report's span_us column")


def test_table_headers_sort_the_rows(page):
    driver = page["driver"]
    driver.get(page["url"])
    meta(driver)
    before = _span_column(driver)
    spans = [float(v) for v in before]
    assert spans != sorted(spans)  # pipeline order, so that sorting shows
    header = "//div[@id='stage-report']//th/button[starts-with(., 'span_us')]"
    driver.find_element("xpath", header).click()
    up = _span_column(driver, before)
    assert [float(v) for v in up] == sorted(spans)
    driver.find_element("xpath", header).click()
    assert [float(v) for v in _span_column(driver, up)] == sorted(spans, reverse=True)


def test_a_trace_with_a_task_graph_shows_its_critical_path_and_what_if(tmp_path):
    """In Chromium: the Gantt of a trace with its task graph carries the critical-path
    line; the What if tab predicts from what is typed in its box. Served with the
    plotly package's own plotly.js (what ``timeline-view`` serves without ``--plotly-js``)."""
    from timeline import load
    from timeline.contract import presets

    d = tmp_path / "traces"
    d.mkdir()
    load("traces/h200_mono_demo.arrow").with_graph(presets.triton_ffn()).filter(launches=[0, 1]).save(d / "g.arrow")
    state, _, _ = V.prepare(["--trace-dir", str(d), str(d / "g.arrow")])
    with B.serve(VW.build(state)) as url, B.chromium(1400, 1100) as driver:
        driver.get(url)
        meta(driver)
        segments = B.wait_for(driver, "var g=document.querySelector('#gantt .js-plotly-plot');"
                                      "var p=g.data.filter(t=>t.meta&&t.meta.kind=='critical-path');"
                                      "return p.length ? p[0].meta.segments : null;", 30, "the critical path")
        assert segments > 5
        driver.find_element("id", "tab-whatif").click()
        box = driver.find_element("id", "whatif-scales")
        for _ in range(3):  # a loaded machine can reorder typed keys in a React input: type until it reads right
            box.clear()
            box.send_keys("norm.compute=0.5")
            if box.get_attribute("value") == "norm.compute=0.5":
                break
        assert box.get_attribute("value") == "norm.compute=0.5"
        box.send_keys("\n")
        rows = B.wait_for(driver, "var r=document.querySelectorAll('#whatif-table tbody tr');"
                                  "return r.length ? document.querySelector('#whatif-table').innerText : null;", 30,
                          "the what-if table")
        assert "predicted_us" in rows and "saving_us" in rows
        bars = B.wait_for(driver, "var g=document.querySelector('#whatif-graph .js-plotly-plot');"
                                  "return g && g.data && g.data.length ? g.data.map(t=>t.name) : null;", 30,
                          "the what-if side-by-side figure")
        assert bars == ["measured", "predicted (norm.compute=0.5)"]
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


def test_the_framework_context_strip_is_above_the_gantt_and_zoom_linked(tmp_path):
    """In Chromium, the bundled H200 capture with its torch.profiler trace attached
    (``--context``, docs/ATTACH.md): the strip of the opened launch's step is drawn above
    the Gantt, its plot area's left and right edges on the Gantt's (one time axis), the
    instrumented kernel in its own red; a zoom on the Gantt moves the strip's range, a
    zoom on the strip moves the Gantt's window; the console stays free of errors."""
    from PIL import Image

    d = "traces/h200_attach"
    host = "%d:%g" % tuple(json.loads(open(f"{d}/host_clock.json").read()))
    state, _, _ = V.prepare([f"{d}/graph.arrow", "--context", f"{d}/graph.pt.trace.json.gz",
                             "--context-kernel", "mono_ffn_kernel", "--context-host-clock", host])
    strip_meta = ("var g=document.querySelector('#context .js-plotly-plot');"
                  "return g && g.layout && g.layout.meta && g.layout.meta.kind=='context' ? g.layout.meta : null;")
    strip_range = "return document.querySelector('#context .js-plotly-plot')._fullLayout.xaxis.range;"
    with B.serve(VW.build(state, plotly=dashboard_bundle())) as url, B.chromium(1400, 1100) as driver:
        driver.get(url + "?trace=graph.arrow&launches=8")
        m = meta(driver)
        s = B.wait_for(driver, strip_meta, 30, "the context strip")
        assert s["launch"] == "4:0" and s["lanes"] == ["host ops", "kernels", "copies"] and s["events"] > 50
        assert "ProfilerStep#4" in text_of(driver, "context-title")
        edges = ("var out={}; ['context','gantt'].forEach(function(id){ var g=document.querySelector('#'+id+' "
                 ".js-plotly-plot'), r=g.getBoundingClientRect(), L=g._fullLayout;"
                 "out[id]={top:r.top, bottom:r.bottom, left:r.left+L._size.l, right:r.left+L._size.l+L._size.w}; });"
                 "return out;")
        box = driver.execute_script(edges)
        assert box["context"]["bottom"] <= box["gantt"]["top"]  # above the Gantt
        assert box["context"]["left"] == box["gantt"]["left"] and box["context"]["right"] == box["gantt"]["right"]
        lo, hi = (v / 1e3 for v in m["window_ns"])
        assert driver.execute_script(strip_range) == [pytest.approx(lo), pytest.approx(hi)]
        # the instrumented kernel drawn in its own red inside the strip (it spans the launch's window)
        shot = np.asarray(Image.open(B.screenshot(driver, tmp_path / "strip.png")).convert("RGB"), dtype=np.int64)
        r = box["context"]
        crop = shot[int(r["top"]):int(r["bottom"]), int(r["left"]):int(r["right"])]
        red = np.all(np.abs(crop - [0xe1, 0x57, 0x59]) <= 4, axis=-1)
        assert red.sum() > 0.3 * (r["right"] - r["left"]) * 5
        # zoom out on the Gantt: the strip follows
        driver.execute_script("Plotly.relayout(document.querySelector('#gantt .js-plotly-plot'),"
                              "{'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});", lo - 700, hi + 30)
        B.wait_for(driver, f"var r={strip_range[7:-1]}; return Math.abs(r[0]-({lo - 700}))<1e-3"
                           f" && Math.abs(r[1]-({hi + 30}))<1e-3;", 30, "the strip to follow the Gantt")
        # zoom on the strip: the Gantt follows (its window, its time boxes), the strip keeps the range
        before = meta(driver)
        driver.execute_script("Plotly.relayout(document.querySelector('#context .js-plotly-plot'),"
                              "{'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});", lo - 500, lo + 20)
        z = _wait_changed(driver, before)
        assert z["window_ns"][0] == pytest.approx((lo - 500) * 1e3, abs=2)
        assert z["window_ns"][1] == pytest.approx((lo + 20) * 1e3, abs=2)
        assert float(driver.find_element("id", "t0").get_attribute("value")) == pytest.approx(lo - 500, abs=1e-3)
        B.next_frames(driver)
        assert driver.execute_script(strip_range) == [pytest.approx(lo - 500, abs=1e-3), pytest.approx(lo + 20, abs=1e-3)]
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
