"""The dashboard over a run (``timeline-view RUN``): the overview's aggregates against
the run's launches table, a trace file read as a run giving the same overview and
launches, the launch cache within its memory budget, what a click, a button or a
key opens, the addresses; then in headless Chromium: the overview paints, a click
and the buttons drill down to a launch's Gantt with the panels following, the keys
step through launches, an address opens the launch, selection and window it names."""

from __future__ import annotations

import json
import shlex
import subprocess
import urllib.parse
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pytest

from timeline.run import open_run
from viewer import app as V
from viewer import run_source as VRS
from viewer import run_wiring as VRW
from viewer import wiring as VW
from viewer.launch_cache import LaunchCache, footprint
from viewer.panels import overview as VO
from viewer.sources import Loaded, SourceError
from tools import browser as B

from viewer_runkit import LAYERS, SLOTS, STEPS, make_run
from viewerkit import dashboard_bundle


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    run, trace_file = make_run(root)
    return root, run, trace_file


@pytest.fixture(scope="module")
def state(run_dir):
    root, run, _ = run_dir
    st, _, first = V.prepare([str(run), "--trace-dir", str(root)])
    assert first == run.name
    return st


def by_hand(run) -> dict:
    """Per (step, layer) from the run's launches table, in Python: the slowest rank's
    kernel time, the start skew, anomalies, tasks."""
    out = {}
    for r in open_run(run).launches().to_pylist():
        k = (r["step"], r["layer"])
        o = out.setdefault(k, {"kernel": 0, "starts": [], "anomalies": 0, "tasks": 0})
        o["kernel"] = max(o["kernel"], r["kernel_ns"])
        o["starts"].append(r["start_ns"])
        o["anomalies"] += r["anomalies"]
        o["tasks"] += r["tasks"]
    return out


def test_the_overview_is_the_runs_launches_aggregated(state, run_dir):
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    want = by_hand(run)
    assert ov.steps.tolist() == list(range(STEPS)) and ov.layers.tolist() == list(range(LAYERS))
    assert ov.n == len(SLOTS) and ov.ranks == [0, 1] and ov.unkeyed == 0
    for (s, la), w in want.items():
        assert ov.kernel[la, s] == w["kernel"]
        assert ov.skew[la, s] == max(w["starts"]) - min(w["starts"])
        assert ov.anomalies[la, s] == w["anomalies"]
        assert ov.tasks_of(VRS.Key(s, la)) == w["tasks"]
    order = sorted(want, key=lambda k: want[k]["kernel"])  # nearest-rank percentiles of the slowest rank
    assert ov.typical == VRS.Key(*order[2]) and ov.p99 == VRS.Key(*order[5]) and ov.slowest == VRS.Key(*order[5])
    per = {(r["rank"], r["step"], r["layer"]): r["kernel_ns"] for r in open_run(run).launches().to_pylist()}
    assert all(ov.per_rank[rk, la, s] == per[(rk, s, la)] for rk in (0, 1) for s, la in SLOTS)


def test_a_trace_file_read_as_a_run_gives_the_same_overview_and_launches(state, run_dir):
    _, run, trace_file = run_dir
    ov = state.runs.overview(run.name)
    src = VRS.TraceSource(trace_file.name, trace_file)
    ov2 = VRS.build_overview(src.sql, src.axis)
    assert np.array_equal(ov.kernel, ov2.kernel) and np.array_equal(ov.skew, ov2.skew)
    assert (ov.typical, ov.p99, ov.slowest) == (ov2.typical, ov2.p99, ov2.slowest)
    key = VRS.Key(1, 2)
    a, b = state.store.get(VRS.launch_name(run.name, key)), VRS.one_launch(src.launch(key))
    assert a.trace.tasks.num_rows == b.tasks.num_rows == ov.tasks_of(key)
    assert a.data.n == b.intervals.num_rows and a.trace.launches == b.launches == [0]
    cols = ["rank", "stage_index", "task", "cta", "wave", "start_ns", "end_ns"]
    sort = [(c, "ascending") for c in cols]
    assert a.trace.tasks.select(cols).sort_by(sort).equals(b.tasks.select(cols).sort_by(sort))


def test_the_launch_cache_stays_within_its_budget(state, run_dir):
    _, run, _ = run_dir
    one = footprint(state.store.get(VRS.launch_name(run.name, VRS.Key(0, 0))))
    cache = LaunchCache(budget=int(one * 2.5))
    src = state.runs.source(run.name)
    loads = []

    def make(key):
        loads.append(key)
        return Loaded(VRS.launch_name(run.name, key), src.path, src.launch(key))

    for key in [VRS.Key(*s) for s in SLOTS] + [VRS.Key(1, 2), VRS.Key(1, 1)]:
        item = cache.get(VRS.launch_name(run.name, key), lambda k=key: make(k))
        assert item.name in cache.names() and cache.held() <= cache.budget  # the one asked for stays
    assert len(cache.names()) == 2 and loads.count(VRS.Key(1, 2)) == 1  # the last two stayed: no reload
    assert cache.names() == [VRS.launch_name(run.name, VRS.Key(1, 2)), VRS.launch_name(run.name, VRS.Key(1, 1))]


def test_a_launch_past_the_budget_or_absent_is_refused_in_one_line(run_dir):
    root, run, _ = run_dir
    st, _, _ = V.prepare([str(run), "--trace-dir", str(root), "--memory-budget", "16M"])
    st.store.launches.budget = 1 << 20  # one launch needs more than 1 MiB
    with pytest.raises(SourceError, match="larger --memory-budget"):
        st.store.get(VRS.launch_name(run.name, VRS.Key(0, 1)))
    with pytest.raises(SourceError, match="no launch at step 7, layer 0"):
        st.store.get(VRS.launch_name(run.name, VRS.Key(7, 0)))
    with pytest.raises(SourceError, match="step='x' is not an integer"):
        st.store.get(st.requested(f"?run={run.name}&step=x&layer=1"))


def test_clicks_buttons_and_keys_name_the_right_launch(state, run_dir):
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    assert VO.clicked(ov, {"points": [{"x": 1, "y": 2}]}, "kernel", None) == VRS.Key(1, 2)
    assert VO.clicked(ov, {"points": [{"x": 1, "y": 7}]}, "kernel", None) is None  # no such layer
    assert VO.clicked(ov, {"points": "junk"}, "kernel", None) is None
    assert VO.target(ov, "next", VRS.Key(0, 2)) == VRS.Key(1, 0)  # launch order: step, then layer
    assert VO.target(ov, "prev", VRS.Key(1, 0)) == VRS.Key(0, 2)
    assert VO.target(ov, "prev", VRS.Key(0, 0)) == VRS.Key(0, 0)  # clamped at the first
    assert VO.target(ov, "next", None) == ov.typical and VO.target(ov, "p99", None) == ov.p99
    s = VO.search_for(run.name, VRS.Key(1, 2), "?run=x&step=0&layer=0&grouping=cta&ranks=1&t0=5&t1=9")
    q = urllib.parse.parse_qs(s[1:])
    assert q == {"run": [run.name], "step": ["1"], "layer": ["2"], "ranks": ["1"], "grouping": ["cta"]}


def test_a_binned_overview_cell_opens_its_slowest_launch():
    """Past ``MAX_CELLS`` steps, a column holds several steps; its colour and its
    click are those of its slowest launch."""
    n = VRS.MAX_CELLS * 2 + 7
    rng = np.random.default_rng(0)
    kernel = rng.integers(1000, 2000, size=(n, 2))
    table = pa.table({"rank": np.zeros(2 * n, np.int16), "step": np.repeat(np.arange(n), 2),
                      "layer": np.tile([0, 1], n).astype(np.int32), "start_ns": np.zeros(2 * n, np.int64),
                      "kernel_ns": kernel.reshape(-1), "tasks": np.ones(2 * n, np.int64),
                      "anomalies": np.zeros(2 * n, np.int64)})

    def sql(q):
        con = duckdb.connect()
        con.register("launches", table)
        return con.sql(q).to_arrow_table()

    ov = VRS.build_overview(sql)
    f, xs = VO.columns(ov)
    assert f == 3 and xs.size <= VRS.MAX_CELLS
    z = VO.binned(ov.kernel, f)
    assert z[1, 5] == kernel[15:18, 1].max()
    key = VO.clicked(ov, {"points": [{"x": float(xs[5]), "y": 1}]}, "kernel", None)
    assert key == VRS.Key(15 + int(np.argmax(kernel[15:18, 1])), 1)
    fig = VO.figure(ov, "kernel", None, key)
    assert fig["layout"]["shapes"][0]["x0"] < xs[5] < fig["layout"]["shapes"][0]["x1"]


def test_addresses_name_run_launch_selection_and_window(state, run_dir):
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    assert state.requested("") == VRS.launch_name(run.name, ov.typical)  # the default run's typical launch
    assert state.requested(f"?run={run.name}&step=1&layer=2") == f"{run.name}/step=1/layer=2"
    picks = [VRS.launch_name(run.name, k) for k in (ov.typical, ov.p99, ov.slowest)]
    assert set(picks) <= set(state.catalog.names())  # the picker's and Compare's lists hold them
    first = VW.first_view(state, f"?run={run.name}&step=1&layer=2&ranks=1&grouping=cta&t0=100&t1=300")
    props = first["props"]
    assert props[("trace-key", "data")] == {"name": f"{run.name}/step=1/layer=2"}
    assert props[("ranks", "value")] == [1] and props[("grouping", "value")] == "cta"
    assert (props[("t0", "value")], props[("t1", "value")]) == (100.0, 300.0)
    st = props[("view-state", "data")]
    link = VRW.view_link(st, {"name": f"{run.name}/step=1/layer=2"}, "idle", "")
    assert urllib.parse.parse_qs(link[1:]) == {"run": [run.name], "step": ["1"], "layer": ["2"], "ranks": ["1"],
                                               "grouping": ["cta"], "t0": ["100.000"], "t1": ["300.000"],
                                               "tab": ["idle"]}


# -- in headless Chromium -----------------------------------------------------------------------------
browser = pytest.mark.skipif(B.available() is not None, reason=f"no headless browser: {B.available()}")
OVERVIEW = "var g=document.querySelector('#ov-graph .js-plotly-plot'); "


@pytest.fixture(scope="module")
def site(state):
    with B.serve(VW.build(state, plotly=dashboard_bundle())) as url, B.chromium(1400, 1100) as driver:
        yield {"url": url, "driver": driver, "state": state}


@pytest.fixture
def page(site):
    driver = site["driver"]
    driver.get_log("browser")
    yield site
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"browser console errors: {errors}"


def shown(driver):
    """The launch the page shows (its trace key) once the Gantt has drawn it."""
    return driver.execute_script("var k=document.getElementById('ov-link'); return k && k.getAttribute('href')")


def wait_launch(driver, name, previous=None):
    """Wait until the Gantt shows launch ``name``; return the Gantt's meta."""
    B.wait_for(driver, "var p=document.getElementById('trace-select'); return p && p.innerText.indexOf("
               f"{json.dumps(name)}) >= 0 || null", 60, f"launch {name}")
    return B.gantt_ready(driver, previous=previous)


def outline(driver):
    return driver.execute_script(OVERVIEW + "return g && JSON.stringify(g.layout.shapes.map(s=>[s.x0,s.x1,s.y0,s.y1]))")


@pytest.mark.browser
@browser
def test_the_overview_paints_and_a_click_opens_a_launch(page):
    driver, state = page["driver"], page["state"]
    run = state.default_run
    ov = state.runs.overview(run)
    driver.get(page["url"])
    first = wait_launch(driver, VRS.launch_name(run, ov.typical))
    n = driver.execute_script(OVERVIEW + "return g && g.data[0].type=='heatmap' && g._fullData[0].z.length")
    assert n == LAYERS  # one heat-map row per layer, drawn
    assert "kernel time on its slowest rank" in driver.find_element("id", "run-overview").text
    assert "6 launches × 2 ranks" in driver.find_element("id", "ov-summary").text
    assert json.loads(outline(driver)) == [[ov.typical.step - .5, ov.typical.step + .5,
                                            ov.typical.layer - .5, ov.typical.layer + .5]]
    # a click on the cell of step 1, layer 2: its Gantt, the outline, the address, the panels
    target = VRS.Key(1, 2) if ov.typical != VRS.Key(1, 2) else VRS.Key(0, 1)
    driver.execute_script(OVERVIEW + f"g.emit('plotly_click', {{points: [{{x: {target.step}, y: {target.layer}}}]}});")
    meta = json.loads(wait_launch(driver, VRS.launch_name(run, target), first).split("|")[0])
    item = state.store.get(VRS.launch_name(run, target))
    assert meta["intervals"] == item.data.n and meta["n_rows"] == 2 * 8  # two ranks x 8 CTAs
    B.wait_for(driver, "return location.search.indexOf('step=%d&layer=%d') > 0 || null" % target, 30, "the address")
    assert json.loads(outline(driver)) == [[target.step - .5, target.step + .5, target.layer - .5, target.layer + .5]]
    B.wait_for(driver, "return document.querySelector('#stage-report table') ? 1 : null", 60, "the stage report")
    verdict = B.wait_for(driver, "var v=document.getElementById('ov-verdict'); return v && v.innerText", 60,
                         "the explain verdict")  # beside the overview: the p99 launch explained
    assert verdict.startswith(f"step {ov.p99.step} layer {ov.p99.layer} took ")
    assert driver.find_element("id", "ov-progress").text == ""  # the loading note is gone once drawn


@pytest.mark.browser
@browser
def test_buttons_and_keys_step_through_launches(page):
    from selenium.webdriver.common.keys import Keys

    driver, state = page["driver"], page["state"]
    run = state.default_run
    ov = state.runs.overview(run)
    driver.get(page["url"] + f"?run={run}&step=0&layer=1")
    m = wait_launch(driver, f"{run}/step=0/layer=1")
    driver.find_element("tag name", "body").send_keys("n")
    m = wait_launch(driver, f"{run}/step=0/layer=2", m)
    driver.find_element("tag name", "body").send_keys(Keys.ARROW_RIGHT)
    m = wait_launch(driver, f"{run}/step=1/layer=0", m)
    driver.find_element("tag name", "body").send_keys("p")
    m = wait_launch(driver, f"{run}/step=0/layer=2", m)
    driver.find_element("id", "ov-slowest").click()
    m = wait_launch(driver, VRS.launch_name(run, ov.slowest), m)
    driver.back()  # the launch before, by the browser's history
    wait_launch(driver, f"{run}/step=0/layer=2")


@pytest.mark.browser
@browser
def test_an_address_opens_the_launch_selection_and_window_it_names(page):
    driver, state = page["driver"], page["state"]
    run = state.default_run
    driver.get(page["url"] + f"?run={run}&step=1&layer=1&ranks=1&grouping=cta&t0=4300&t1=4500&tab=idle")
    meta = json.loads(wait_launch(driver, f"{run}/step=1/layer=1").split("|")[0])
    assert meta["window_ns"] == [4_300_000, 4_500_000] and meta["n_rows"] == 8  # rank 1's 8 CTAs
    assert meta["mode"] == "bars" and meta["intervals"] > 0
    assert driver.find_element("id", "t0").get_attribute("value") == "4300"
    assert "t0=4300.000" in driver.find_element("id", "ov-link").get_attribute("href")
    B.wait_for(driver, "return document.querySelector('#tabs .tab--selected') && "
               "document.querySelector('#tabs .tab--selected').innerText.indexOf('Idle') >= 0 || null", 30, "idle tab")
    driver.find_element("id", "reset").click()  # "full": the address bar follows the view shown
    B.wait_for(driver, "return location.search.indexOf('t0=4112.') > 0 || null", 30, "the address")


def test_a_real_trace_reads_as_a_run_and_a_run_without_headers_says_why(tmp_path, capsys):
    """The bundled real trace (16 launches, no launch-slot headers): with --overview its
    launches are the cells (x = launch index), each the span of its rows; appended to a
    run it cannot be drawn by step x layer, and the command line says why in one line."""
    from timeline.run import append
    from timeline.core.trace import load

    demo = Path(__file__).resolve().parent.parent / "traces" / V.DEFAULT_TRACE
    st, _, first = V.prepare(["--overview", str(demo), "--trace-dir", str(demo.parent)])
    ov = st.runs.overview(first)
    tr = load(demo)
    assert ov.axis == "launch" and ov.steps.tolist() == tr.launches and ov.layers.tolist() == [0]
    t = tr.tasks
    for la in tr.launches:
        rows = t.filter(pa.compute.equal(t.column("launch"), la))
        span = pa.compute.max(rows.column("end_ns")).as_py() - pa.compute.min(rows.column("start_ns")).as_py()
        assert ov.kernel[0, tr.launches.index(la)] == span
    assert st.requested("") == VRS.launch_name(first, ov.typical)
    append(tmp_path / "demo_run", tr)
    with pytest.raises(SystemExit) as e:
        V.prepare([str(tmp_path / "demo_run"), "--trace-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "16 rank launches without one" in err and str(tmp_path) not in err


def test_the_explain_verdict_names_the_p99_launch(state, run_dir):
    """The verdict beside the overview is ``timeline explain``'s on the p99 launch,
    against the launches nearest the median (of the slowest rank's kernel time)."""
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    doc = state.runs.verdict(run.name)
    kernel = ov.launches.column("kernel_ns")[ov.index(ov.p99)].as_py()
    assert doc["verdict"].startswith(f"step {ov.p99.step} layer {ov.p99.layer} took {kernel / 1e3:.2f} µs")
    assert "5 launches nearest the run's median" in doc["typical"]["from"]
    assert state.runs.verdict(run.name) is doc  # made once per run


@pytest.mark.browser
@browser
def test_another_run_in_the_page_refreshes_the_rank_dropdown(page, run_dir):
    """A page on the two-rank run switched in place (a new address, no reload) to a run
    of rank 1 only: the overview's rank dropdown offers that run's ranks, its value one
    of them (it kept the first run's rank 0 before)."""
    from timeline.run import append
    from viewer_runkit import small_trace

    root, run, _ = run_dir
    other = root / "rank1_run"
    if not other.exists():
        append(other, small_trace(seed=5).filter(ranks=[1]))
    driver = page["driver"]
    driver.get(page["url"])
    m = wait_launch(driver, VRS.launch_name(run.name, page["state"].runs.overview(run.name).typical))
    rank_text = "var r=document.getElementById('ov-rank'); return r && r.innerText;"
    assert driver.execute_script(rank_text).strip() == "rank 0"
    driver.execute_script("window.dash_clientside.set_props('url', {search: arguments[0]});",
                          "?run=rank1_run&step=0&layer=1")
    wait_launch(driver, "rank1_run/step=0/layer=1", m)
    B.wait_for(driver, "var r=document.getElementById('ov-rank'); return r && r.innerText.trim() == 'rank 1' || null",
               30, "the rank dropdown of the new run")
    driver.find_element("css selector", "#ov-rank").click()  # open it: its options are the new run's ranks
    menu = B.wait_for(driver, "var o=[...document.querySelectorAll('[role=option]')].map(e=>e.innerText.trim())"
                              ".filter(t=>/^rank \\d+$/.test(t)); return o.length ? o : null;", 10, "the rank options")
    assert menu == ["rank 1"]


REPO = Path(__file__).resolve().parent.parent


def make_command(target: str) -> list:
    """The arguments ``make TARGET`` gives ``timeline-view`` (``make -n``: printed, not run)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    line = [x for x in out.splitlines() if "bin/timeline-view " in x][-1]
    return shlex.split(line.split("bin/timeline-view ", 1)[1].split("$(")[0])


def test_make_demo_still_opens_the_bundled_trace_file():
    args = make_command("demo")
    assert args[0] == f"traces/{V.DEFAULT_TRACE}"
    st, _, first = V.prepare([str(REPO / args[0]), "--trace-dir", str(REPO / "traces")])
    assert first == V.DEFAULT_TRACE and st.default_run is None  # a trace's page, not a run's


@pytest.mark.browser
@browser
def test_make_demo_run_opens_the_bundled_h100_run():
    """``make demo-run``: the real H100 run (3 sampled steps x 16 layers, one rank) opens
    on its overview with the typical launch's Gantt; a click on another cell drills down."""
    args = make_command("demo-run")
    assert args[0] == "traces/h100_graph_run"
    st, _, first = V.prepare([str(REPO / args[0]), "--trace-dir", str(REPO / "traces")])
    ov = st.runs.overview(first)
    assert first == "h100_graph_run" and ov.n == 48 and len(ov.layers) == 16 and ov.ranks == [0]
    target = next(k for k in reversed(ov.keys()) if k != ov.typical)
    with B.serve(VW.build(st, plotly=dashboard_bundle())) as url, B.chromium(1400, 1100) as driver:
        driver.get(url)
        m = wait_launch(driver, VRS.launch_name(first, ov.typical))
        n = driver.execute_script(OVERVIEW + "return g && g.data[0].type=='heatmap' && g._fullData[0].z.length")
        assert n == 16  # a heat-map row per layer
        assert "48 launches" in driver.find_element("id", "ov-summary").text
        driver.execute_script(OVERVIEW + f"g.emit('plotly_click', {{points: [{{x: {target.step}, y: {target.layer}}}]}});")
        meta = json.loads(wait_launch(driver, VRS.launch_name(first, target), m).split("|")[0])
        item = st.store.get(VRS.launch_name(first, target))
        assert meta["intervals"] == item.data.n > 0 and meta["mode"] == "bars"
        assert set(item.data.stage_names) == {"up", "norm", "down"}
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


def test_a_launch_opened_is_drawn_ahead_and_the_same(state, run_dir):
    """The trace callback draws the Gantt that opens a launch ahead (``draw_ahead``):
    the Gantt callback's query takes that figure, once, and it is the figure drawn
    directly; a query that continues a view (a zoom, the same launch's window) never
    takes one."""
    import dataclasses

    import plotly.utils

    from viewer.panels import gantt as VG

    _, run, _ = run_dir
    q = VG.GanttQuery(f"{run.name}/step=1/layer=2", "rank", None, None, None, None, None, px=[900, 560])
    VG.draw_ahead(state, q)
    key = VG.opening_key(q)
    drawn = state.ahead[key].result(timeout=60)
    again = VG._gantt(state, q)

    def as_json(fig):
        return json.dumps(fig, cls=plotly.utils.PlotlyJSONEncoder)

    assert as_json(drawn.figure) == as_json(again.figure) and drawn.state == again.state
    assert VG.gantt(state, q) is drawn and key not in state.ahead  # taken once
    assert VG.gantt(state, q) is not drawn  # then drawn again
    assert VG.opening_key(dataclasses.replace(q, trigger="gantt")) is None
    assert VG.opening_key(dataclasses.replace(q, state=drawn.state.to_client())) is None
    other = dataclasses.replace(drawn.state, name="x").to_client()  # another launch's view: opening
    assert VG.opening_key(dataclasses.replace(q, state=other)) == key


WATCH_REQUESTS = """window._seen = [];
var f0 = window.fetch; window.fetch = function(u, o) {
  var m = /"output":"([^"]{0,60})/.exec(o && o.body ? String(o.body) : '');
  if (m) window._seen.push([performance.now(), m[1]]); return f0.apply(this, arguments); };
(function poll() { var g = document.querySelector('#gantt .js-plotly-plot');
  if (g && g._fullLayout && g.layout && g.layout.meta) window._ganttAt = performance.now();
  else requestAnimationFrame(poll); })();"""


@pytest.mark.browser
@browser
def test_the_panels_are_asked_for_after_the_first_paint(page):
    """The first paint waits for nothing but the overview and the Gantt: the panels'
    requests (stage report, explain verdict, compare) leave once the Gantt is drawn,
    and then fill in."""
    driver = page["driver"]
    sid = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_REQUESTS})["identifier"]
    try:
        driver.get(page["url"])
        B.wait_for(driver, "return document.querySelector('#stage-report table') ? 1 : null", 60, "the stage report")
        B.wait_for(driver, "var v=document.getElementById('ov-verdict'); return v && v.innerText", 60, "the verdict")
        at, seen = driver.execute_script("return [window._ganttAt, window._seen];")
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": sid})
    panels = [(t, out) for t, out in seen if any(k in out for k in ("stage-report", "ov-explain", "cmp-graph"))]
    assert at and {k for k in ("stage-report", "ov-explain", "cmp-graph") if any(k in o for _, o in panels)} == {
        "stage-report", "ov-explain", "cmp-graph"}
    assert all(t >= at for t, _ in panels), (at, panels)
