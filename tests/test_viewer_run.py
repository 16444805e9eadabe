"""The dashboard over a run (``timeline-view RUN``): the overview against the run's
launches table (one kernel time, one pick rule: ``timeline.analysis.launches``'), a
trace file read as a run giving the same overview and launches, launches named by
their key in names and addresses (any capture name), a run without slot headers on
its capture x slot grid, the launch cache within its memory budget, what a click, a
button or a key opens, the verdict beside the overview on the launch shown and the
stable culprits (``timeline.query.explain``'s); then in headless Chromium: the
overview paints, a click and the buttons drill down to a launch's Gantt with the
panels following, the keys step through launches, an address opens the launch,
selection and window it names."""

from __future__ import annotations

import json
import shlex
import subprocess
import urllib.parse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pytest

from timeline.analysis import launches as LA
from timeline.core import launchkey as KY
from timeline.query import explain as QX
from timeline.query import launches as QL
from timeline.query import overview as QO
from timeline.query import source as QS
from timeline.run import open_run
from viewer import app as V
from viewer import run_grid as VRG
from viewer import run_source as VRS
from viewer import run_wiring as VRW
from viewer import wiring as VW
from viewer.launch_cache import LaunchCache, footprint
from viewer import explained as XD
from viewer import model as M
from viewer.panels import overview as VO
from viewer.panels import trace as VTR
from viewer.sources import Loaded, SourceError
from tools import browser as B

from viewer_runkit import LAYERS, SLOTS, STEPS, make_run
from viewerkit import component_text, dashboard_bundle


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
    """Per launch key from the run's launches table, in Python: the kernel time (first
    start to last end over its ranks: one append, one time axis), each rank's own span,
    the start skew, anomalies, tasks."""
    out = {}
    for r in open_run(run).launches().to_pylist():
        o = out.setdefault(f"{r['step']}:{r['layer']}", {"starts": [], "ends": [], "own": {}, "anomalies": 0,
                                                           "tasks": 0})
        o["starts"].append(r["start_ns"])
        o["ends"].append(r["end_ns"])
        o["own"][r["rank"]] = r["kernel_ns"]
        o["anomalies"] += r["anomalies"]
        o["tasks"] += r["tasks"]
    for o in out.values():
        o["kernel"] = max(o["ends"]) - min(o["starts"])
    return out


def nearest_rank(kernel: list, q: float) -> int:
    """The q-quantile launch by nearest rank, ties the later key first (so the top is
    the slowest launch, the first in key order)."""
    order = sorted(range(len(kernel)), key=lambda i: (kernel[i], -i))
    return order[max(int(np.ceil(q * len(kernel))) - 1, 0)]


def test_the_overview_is_the_runs_launches_by_key(state, run_dir):
    """Each cell is a launch named by its key, coloured by the one kernel time
    (``timeline.analysis.launches``: first start to last end over its ranks, not the
    slowest rank's own span), the picks by its nearest-rank rule."""
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    want = by_hand(run)
    keys = [f"{s}:{la}" for s, la in SLOTS]
    assert [str(k) for k in ov.keys()] == keys and ov.ranks == [0, 1] and ov.grid.off == 0
    assert ov.grid.form == VRG.HEADED and ov.grid.xs == [str(s) for s in range(STEPS)]
    assert ov.grid.ys == [str(la) for la in range(LAYERS)]
    z, _, _ = VO.metric_grid(ov, "kernel", None)
    skew, _, _ = VO.metric_grid(ov, "skew", None)
    skews = {r["key"]: r["skew_ns"] for r in LA.launch_times(open_run(run).launches()).to_pylist()}
    for (s, la), key in zip(SLOTS, keys):
        w = want[key]
        assert z[la, s] * 1e3 == pytest.approx(w["kernel"]) and ov.kernel_of(key) == w["kernel"]
        # the skew as launch_times has it (none where the ranks' common axis is an assumption)
        assert np.isnan(skew[la, s]) if skews[key] is None else skew[la, s] * 1e3 == pytest.approx(skews[key])
        assert ov.tasks_of(key) == w["tasks"]
        for rk in (0, 1):
            assert ov.q.per_rank[rk, ov.index(key)] == w["own"][rk]
    assert any(want[k]["kernel"] != max(want[k]["own"].values()) for k in keys)  # not the slowest rank's span
    kernel = [want[k]["kernel"] for k in keys]
    assert str(ov.typical) == keys[nearest_rank(kernel, 0.5)] and str(ov.p99) == keys[nearest_rank(kernel, 0.99)]
    assert str(ov.slowest) == keys[int(np.argmax(kernel))]
    said = QL.stats(QS.open_source(str(run)).times())  # what `timeline launches RUN` says: the same picks
    assert (said["p50_launch"], said["p99_launch"], said["slowest_launch"]) == (
        str(ov.typical), str(ov.p99), str(ov.slowest))


def test_a_trace_file_read_as_a_run_gives_the_same_overview_and_launches(state, run_dir):
    _, run, trace_file = run_dir
    ov = state.runs.overview(run.name)
    view = VRS.RunView(trace_file.name, trace_file)
    ov2 = VRG.overview_of(trace_file.name, view.overview())
    assert [str(k) for k in ov2.keys()] == [str(k) for k in ov.keys()]
    assert np.array_equal(ov.q.kernel, ov2.q.kernel) and ov.grid.xs == ov2.grid.xs and ov.grid.ys == ov2.grid.ys
    assert (ov.typical, ov.p99, ov.slowest) == (ov2.typical, ov2.p99, ov2.slowest)
    key = KY.LaunchKey(1, 2)
    a, b = state.store.get(VRS.launch_name(run.name, key)), view.launch(key)
    assert a.trace.tasks.num_rows == b.tasks.num_rows == ov.tasks_of(key)
    assert [str(k) for k in a.trace.launch_keys.values()] == [str(k) for k in b.launch_keys.values()] == ["1:2"]
    cols = ["rank", "stage_index", "task", "cta", "wave", "start_ns", "end_ns"]
    sort = [(c, "ascending") for c in cols]
    assert a.trace.tasks.select(cols).sort_by(sort).equals(b.tasks.select(cols).sort_by(sort))


def test_the_launch_cache_stays_within_its_budget(state, run_dir):
    _, run, _ = run_dir
    one = footprint(state.store.get(VRS.launch_name(run.name, KY.LaunchKey(0, 0))))
    cache = LaunchCache(budget=int(one * 2.5))
    src = state.runs.source(run.name)
    loads = []

    def make(key):
        loads.append(key)
        return Loaded(VRS.launch_name(run.name, key), src.path, src.launch(key))

    for key in [KY.LaunchKey(*s) for s in SLOTS] + [KY.LaunchKey(1, 2), KY.LaunchKey(1, 1)]:
        item = cache.get(VRS.launch_name(run.name, key), lambda k=key: make(k))
        assert item.name in cache.names() and cache.held() <= cache.budget  # the one asked for stays
    assert len(cache.names()) == 2 and loads.count(KY.LaunchKey(1, 2)) == 1  # the last two stayed: no reload
    assert cache.names() == [VRS.launch_name(run.name, KY.LaunchKey(1, 2)),
                             VRS.launch_name(run.name, KY.LaunchKey(1, 1))]


def test_a_launch_past_the_budget_or_absent_is_refused_in_one_line(run_dir):
    root, run, _ = run_dir
    st, _, _ = V.prepare([str(run), "--trace-dir", str(root), "--memory-budget", "16M"])
    st.store.launches.budget = 1 << 20  # one launch needs more than 1 MiB
    with pytest.raises(SourceError, match="larger --memory-budget"):
        st.store.get(VRS.launch_name(run.name, KY.LaunchKey(0, 1)))
    with pytest.raises(SourceError, match=r"launch 7:0 is not one launch of 'small_run'; its launches: 0:0, 0:1"):
        st.store.get(VRS.launch_name(run.name, KY.LaunchKey(7, 0)))
    with pytest.raises(SourceError, match="step='x' is not an integer"):
        st.store.get(st.requested(f"?run={run.name}&step=x&layer=1"))
    with pytest.raises(SourceError, match="is not one launch key"):
        st.store.get(st.requested(f"?run={run.name}&launch=0-1:1"))


def test_launch_names_read_back_whatever_the_capture_is_called():
    """A launch's name in the page and its address carry its key percent-encoded: any
    run or capture name reads back; a trace file's name is never read as a launch."""
    for run, key in [("r", KY.LaunchKey(4, 3)), ("sub/run", KY.LaunchKey(capture="s5i.arrow", slot=40)),
                     ("r", KY.LaunchKey(capture="a b/c&d=e#f%g,h:i", slot=7)), ("big.arrow", KY.LaunchKey(slot=12))]:
        name = VRS.launch_name(run, key)
        assert VRS.parse_name(name) == (run, key)
        search = VO.search_for(run, key, "")
        q = urllib.parse.parse_qs(search[1:])
        assert q["run"] == [run] and VRS.parse_launch(q["launch"][0]) == key
    assert VRS.parse_name("x/launch=3.arrow") is None and VRS.parse_name("small.arrow") is None
    assert VRS.label(VRS.launch_name("r", KY.LaunchKey(4, 3))) == "r · launch 4:3"


def test_clicks_buttons_and_keys_name_the_right_launch(state, run_dir):
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    assert VO.clicked(ov, {"points": [{"x": "1", "y": "2"}]}, "kernel", None) == KY.LaunchKey(1, 2)
    assert VO.clicked(ov, {"points": [{"x": 1, "y": 2.0}]}, "kernel", None) == KY.LaunchKey(1, 2)
    assert VO.clicked(ov, {"points": [{"x": "1", "y": "7"}]}, "kernel", None) is None  # no such layer
    assert VO.clicked(ov, {"points": "junk"}, "kernel", None) is None
    assert VO.target(ov, "next", KY.LaunchKey(0, 2)) == KY.LaunchKey(1, 0)  # key order: step, then layer
    assert VO.target(ov, "prev", KY.LaunchKey(1, 0)) == KY.LaunchKey(0, 2)
    assert VO.target(ov, "prev", KY.LaunchKey(0, 0)) == KY.LaunchKey(0, 0)  # clamped at the first
    assert VO.target(ov, "next", None) == ov.typical and VO.target(ov, "p99", None) == ov.p99
    s = VO.search_for(run.name, KY.LaunchKey(1, 2), "?run=x&launch=0:0&grouping=cta&ranks=1&t0=5&t1=9")
    q = urllib.parse.parse_qs(s[1:])
    assert q == {"run": [run.name], "launch": ["1:2"], "ranks": ["1"], "grouping": ["cta"]}


class _Rows:
    """A source of per-(rank, launch) rows alone (what the overview reads)."""

    def __init__(self, rows):
        self.rows = rows

    def rank_rows(self, ranks=None):
        return self.rows

    def times(self, ranks=None):
        return LA.launch_times(self.rows)


def test_a_binned_overview_cell_opens_its_slowest_launch():
    """Past ``MAX_CELLS`` steps, a column holds several steps; its colour and its
    click are those of its slowest launch."""
    n = VRG.MAX_CELLS * 2 + 7
    rng = np.random.default_rng(0)
    kernel = rng.integers(1000, 2000, size=(n, 2))
    m = 2 * n
    rows = pa.table({"rank": np.zeros(m, np.int16), "step": np.repeat(np.arange(n), 2),
                     "layer": np.tile([0, 1], n).astype(np.int32), "capture": pa.nulls(m, pa.string()),
                     "launch": np.zeros(m, np.int32), "start_ns": np.zeros(m, np.int64),
                     "end_ns": kernel.reshape(-1), "kernel_ns": kernel.reshape(-1), "tasks": np.ones(m, np.int64),
                     "anomalies": np.zeros(m, np.int64)})
    ov = VRG.overview_of("r", QO.overview(_Rows(rows)))
    f = VRG.columns(ov)
    labels = VRG.column_labels(ov, f)
    assert f == 3 and len(labels) <= VRG.MAX_CELLS and labels[5] == "15–17"
    z = VRG.binned(VO.metric_grid(ov, "kernel", None)[0], f)
    assert z[1, 5] * 1e3 == pytest.approx(kernel[15:18, 1].max())
    key = VO.clicked(ov, {"points": [{"x": labels[5], "y": "1"}]}, "kernel", None)
    assert key == KY.LaunchKey(15 + int(np.argmax(kernel[15:18, 1])), 1)
    fig = VO.figure(ov, "kernel", None, key)
    assert fig["layout"]["shapes"][0]["x0"] < 5 < fig["layout"]["shapes"][0]["x1"]
    assert fig["layout"]["meta"]["binned"] and "steps %{x}" in fig["data"][0]["hovertemplate"]


def test_the_heat_maps_axes_carry_the_steps_themselves(tmp_path):
    """A run sampled every 4th step has three columns named 0, 4 and 8 (categories,
    not a numeric axis that ticks -2 ... 10), a row per layer named by it."""
    from viewer_runkit import GRAPH_SLOTS, graph_pair

    _, b = graph_pair(tmp_path)
    st, _, first = V.prepare([str(b), "--trace-dir", str(tmp_path)])
    ov = st.runs.overview(first)
    fig = VO.figure(ov, "kernel", None, ov.typical, first)
    x, y = fig["layout"]["xaxis"], fig["layout"]["yaxis"]
    assert x["type"] == y["type"] == "category"
    assert x["categoryarray"] == fig["data"][0]["x"] == ["0", "4", "8"] and y["categoryarray"] == ["0", "1"]
    assert len(GRAPH_SLOTS) == ov.n == 6


def test_with_overview_the_picker_and_the_overview_name_a_launch_alike(run_dir):
    """``timeline-view --overview FILE`` of a file whose launches carry slot headers:
    the picker names a launch ``FILE · launch 1:2``, the overview's cell of it hovers
    ``launch 1:2``, its Gantt rows ``r0 1:2``: the one key."""
    root, _, trace_file = run_dir
    st, _, first = V.prepare(["--overview", str(trace_file), "--trace-dir", str(root)])
    ov = st.runs.overview(first)
    name = st.requested(f"?run={first}&launch=1:2")
    out = VTR.select(st, f"?run={first}&launch=1:2", None, False)
    assert out.key == {"name": name} and {"label": f"{first} · launch 1:2", "value": name} in out.trace_options
    fig = VO.figure(ov, "kernel", None, ov.typical, first)
    col, row = ov.cell(KY.LaunchKey(1, 2))
    hover = fig["data"][0]["hovertemplate"].replace("%{x}", fig["data"][0]["x"][col]).replace(
        "%{y}", fig["data"][0]["y"][row])
    assert hover.startswith("launch 1:2 (step 1 · layer 2)")
    item = st.store.get(name)
    assert M.group_label(item.data, st.view(item, "rank", None, None, None, None), 0) == "r0 1:2"
    assert out.launch_options == [{"label": "launch 1:2", "value": item.trace.launches[0]}]


def test_addresses_name_run_launch_selection_and_window(state, run_dir):
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    assert state.requested("") == VRS.launch_name(run.name, ov.typical)  # the default run's typical launch
    assert state.requested(f"?run={run.name}&launch=1:2") == f"{run.name}/launch=1:2"
    assert state.requested(f"?run={run.name}&step=1&layer=2") == f"{run.name}/launch=1:2"  # an older address
    picks = [VRS.launch_name(run.name, k) for k in (ov.typical, ov.p99, ov.slowest)]
    assert set(picks) <= set(state.catalog.names())  # the picker lists them
    first = VW.first_view(state, f"?run={run.name}&launch=1:2&ranks=1&grouping=cta&t0=100&t1=300")
    props = first["props"]
    assert props[("trace-key", "data")] == {"name": f"{run.name}/launch=1:2"}
    assert props[("ranks", "value")] == [1] and props[("grouping", "value")] == "cta"
    assert (props[("t0", "value")], props[("t1", "value")]) == (100.0, 300.0)
    assert props[("explain-which", "value")] == "shown" and props[("cmp-b", "value")] == run.name
    st = props[("view-state", "data")]
    link = VRW.view_link(st, {"name": f"{run.name}/launch=1:2"}, "idle", "")
    assert urllib.parse.parse_qs(link[1:]) == {"run": [run.name], "launch": ["1:2"], "ranks": ["1"],
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
    """Wait until the Gantt shows launch ``name`` (the picker shows its label,
    ``RUN · launch KEY``); return the Gantt's meta."""
    B.wait_for(driver, "var p=document.getElementById('trace-select'); return p && p.innerText.indexOf("
               f"{json.dumps(VRS.label(name))}) >= 0 || null", 60, f"launch {name}")
    return B.gantt_ready(driver, previous=previous)


def outline(driver):
    return driver.execute_script(OVERVIEW + "return g && JSON.stringify(g.layout.shapes.map(s=>[s.x0,s.x1,s.y0,s.y1]))")


def click_cell(driver, x, y):
    """A click on the overview's cell of column ``x`` and row ``y`` (their names)."""
    driver.execute_script(OVERVIEW + f"g.emit('plotly_click', {{points: [{{x: {json.dumps(str(x))}, "
                                     f"y: {json.dumps(str(y))}}}]}});")


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
    ticks = driver.execute_script("return [...document.querySelectorAll('#ov-graph .xtick text')].map(t=>t.textContent)")
    assert ticks == [str(s) for s in range(STEPS)]  # the steps themselves
    assert "first CTA start to its last CTA end over its ranks" in driver.find_element("id", "run-overview").text
    assert "6 launches × 2 ranks" in driver.find_element("id", "ov-summary").text
    assert json.loads(outline(driver)) == [[ov.typical.step - .5, ov.typical.step + .5,
                                            ov.typical.layer - .5, ov.typical.layer + .5]]
    # a click on the cell of step 1, layer 2: its Gantt, the outline, the address, the panels
    target = KY.LaunchKey(1, 2) if ov.typical != KY.LaunchKey(1, 2) else KY.LaunchKey(0, 1)
    click_cell(driver, target.step, target.layer)
    meta = json.loads(wait_launch(driver, VRS.launch_name(run, target), first).split("|")[0])
    item = state.store.get(VRS.launch_name(run, target))
    assert meta["intervals"] == item.data.n and meta["n_rows"] == 2 * 8  # two ranks x 8 CTAs
    B.wait_for(driver, "return location.search.indexOf('launch=%d:%d') > 0 || null" % target[:2], 30, "the address")
    assert json.loads(outline(driver)) == [[target.step - .5, target.step + .5, target.layer - .5, target.layer + .5]]
    ticks = driver.execute_script("return document.querySelector('#gantt .js-plotly-plot').layout.yaxis.ticktext")
    assert ticks[0].startswith(f"r0 {target.step}:{target.layer}")  # the Gantt's rows name the launch's key
    B.wait_for(driver, "return document.querySelector('#stage-report table') ? 1 : null", 60, "the stage report")
    verdict = B.wait_for(driver, "var v=document.getElementById('ov-verdict'); return v && v.innerText.indexOf("
                                 f"'launch {target} ') == 0 ? v.innerText : null", 60,
                         "the explain verdict on the launch shown")  # beside the overview: the launch shown
    assert verdict.startswith(f"launch {target} took ")
    across = B.wait_for(driver, "var v=document.getElementById('ov-across-says'); return v && v.innerText", 60,
                        "the stable culprits")
    assert across.startswith("over ") and "slow launches" in across
    assert driver.find_element("id", "ov-progress").text == ""  # the loading note is gone once drawn


@pytest.mark.browser
@browser
def test_buttons_and_keys_step_through_launches(page):
    from selenium.webdriver.common.keys import Keys

    driver, state = page["driver"], page["state"]
    run = state.default_run
    ov = state.runs.overview(run)
    driver.get(page["url"] + f"?run={run}&launch=0:1")
    m = wait_launch(driver, f"{run}/launch=0:1")
    driver.find_element("tag name", "body").send_keys("n")
    m = wait_launch(driver, f"{run}/launch=0:2", m)
    driver.find_element("tag name", "body").send_keys(Keys.ARROW_RIGHT)
    m = wait_launch(driver, f"{run}/launch=1:0", m)
    driver.find_element("tag name", "body").send_keys("p")
    m = wait_launch(driver, f"{run}/launch=0:2", m)
    driver.find_element("id", "ov-slowest").click()
    m = wait_launch(driver, VRS.launch_name(run, ov.slowest), m)
    driver.back()  # the launch before, by the browser's history
    wait_launch(driver, f"{run}/launch=0:2")


@pytest.mark.browser
@browser
def test_an_address_opens_the_launch_selection_and_window_it_names(page):
    driver, state = page["driver"], page["state"]
    run = state.default_run
    driver.get(page["url"] + f"?run={run}&launch=1:1&ranks=1&grouping=cta&t0=4300&t1=4500&tab=idle")
    meta = json.loads(wait_launch(driver, f"{run}/launch=1:1").split("|")[0])
    assert meta["window_ns"] == [4_300_000, 4_500_000] and meta["n_rows"] == 8  # rank 1's 8 CTAs
    assert meta["mode"] == "bars" and meta["intervals"] > 0
    assert driver.find_element("id", "t0").get_attribute("value") == "4300"
    assert "t0=4300.000" in driver.find_element("id", "ov-link").get_attribute("href")
    B.wait_for(driver, "return document.querySelector('#tabs .tab--selected') && "
               "document.querySelector('#tabs .tab--selected').innerText.indexOf('Idle') >= 0 || null", 30, "idle tab")
    driver.find_element("id", "reset").click()  # "full": the address bar follows the view shown
    B.wait_for(driver, "return location.search.indexOf('t0=4112.') > 0 || null", 30, "the address")


def test_a_trace_without_headers_and_a_run_of_it_open_on_their_launches(tmp_path):
    """The bundled real trace (16 launches, no launch-slot headers): with --overview its
    launches are the cells of one row (x: launch numbers, named as the picker names
    them), each coloured by its span; appended twice to a run, the run opens on a
    capture x slot grid, its typical launch's Gantt with every panel as for a headed
    run (the side verdict on the launch shown)."""
    from timeline.run import append
    from timeline.core.trace import load

    demo = Path(__file__).resolve().parent.parent / "traces" / V.DEFAULT_TRACE
    st, _, first = V.prepare(["--overview", str(demo), "--trace-dir", str(demo.parent)])
    ov = st.runs.overview(first)
    tr = load(demo)
    assert ov.grid.form == VRG.NUMBERED and ov.grid.xs == [str(la) for la in tr.launches] and ov.grid.ys == [first]
    z = VO.metric_grid(ov, "kernel", None)[0]
    t = tr.tasks
    for la in tr.launches:
        rows = t.filter(pa.compute.equal(t.column("launch"), la))
        span = pa.compute.max(rows.column("end_ns")).as_py() - pa.compute.min(rows.column("start_ns")).as_py()
        assert z[0, tr.launches.index(la)] * 1e3 == pytest.approx(span)
    assert st.requested("") == VRS.launch_name(first, ov.typical)
    run = tmp_path / "demo_run"
    append(run, tr)
    append(run, tr, as_capture=True)  # the same capture again, on purpose: a capture of its own
    st, _, first = V.prepare([str(run), "--trace-dir", str(tmp_path)])
    ov = st.runs.overview(first)
    caps = sorted({k.capture for k in ov.keys()})
    assert ov.grid.form == VRG.CAPTURED and ov.grid.ys == caps and len(caps) == 2 and ov.grid.off == 0
    assert ov.grid.xs == [str(la) for la in range(16)] and ov.n == 32
    out = VTR.select(st, "", None, False)
    assert out.key == {"name": VRS.launch_name(first, ov.typical)} and ov.typical.capture in caps
    assert f"launch {ov.typical}" in out.info and out.launch_options[0]["label"] == f"launch {ov.typical}"
    fig = VO.figure(ov, "kernel", None, ov.typical, first)
    assert fig["layout"]["yaxis"]["categoryarray"] == caps and fig["data"][0]["hovertemplate"].startswith(
        "launch %{y}:%{x}")
    other = ov.neighbour(ov.typical, 1)
    verdict = VRW.on_verdict(st, first, [VRS.launch_name(first, other), None, None])
    assert verdict[1].children.startswith(f"launch {other} took ")
    item = st.store.get(VRS.launch_name(first, other))
    assert M.group_label(item.data, st.view(item, "rank", None, None, None, None), 0) == f"r0 {other}"


def test_the_side_verdict_is_on_the_launch_shown_as_explain_has_it(state, run_dir):
    """The verdict beside the overview is ``timeline.query.explain``'s on the launch
    shown (each launch opened its own), against the run's typical launch; the stable
    culprits beside it are its ``across`` over the run's slow launches, with the p99
    verdict: the same words as ``timeline explain RUN --launch K``."""
    _, run, _ = run_dir
    ov = state.runs.overview(run.name)
    src = QS.open_source(str(run))
    for key in (ov.typical, ov.slowest, KY.LaunchKey(1, 1)):
        out = VRW.on_verdict(state, run.name, [VRS.launch_name(run.name, key), None, None])
        want = QX.explain(src, QS.Selection(), QX.Ask(launches=[key]))["verdict"]
        assert out[1].children == want and want.startswith(f"launch {key} took ")
    assert VRW.on_verdict(state, run.name, [VRS.launch_name(run.name, ov.typical), None, None])[1].children != \
        VRW.on_verdict(state, run.name, [VRS.launch_name(run.name, ov.slowest), None, None])[1].children
    across = VRW.on_across(state, run.name, [VRS.launch_name(run.name, ov.typical), None, None])
    doc = QX.explain(src, QS.Selection(), QX.Ask(p99=True, across=XD.ACROSS))
    text = component_text(across)
    assert doc["verdict"] in text and doc["across"]["says"] in text
    assert "--baseline" not in text and str(run.parent) not in text


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
                          "?run=rank1_run&launch=0:1")
    wait_launch(driver, "rank1_run/launch=0:1", m)
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
    assert first == "h100_graph_run" and ov.n == 48 and len(ov.grid.ys) == 16 and ov.ranks == [0]
    target = next(k for k in reversed(ov.keys()) if k != ov.typical)
    with B.serve(VW.build(st, plotly=dashboard_bundle())) as url, B.chromium(1400, 1100) as driver:
        driver.get(url)
        m = wait_launch(driver, VRS.launch_name(first, ov.typical))
        n = driver.execute_script(OVERVIEW + "return g && g.data[0].type=='heatmap' && g._fullData[0].z.length")
        assert n == 16  # a heat-map row per layer
        assert "48 launches" in driver.find_element("id", "ov-summary").text
        click_cell(driver, target.step, target.layer)
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
    q = VG.GanttQuery(f"{run.name}/launch=1:2", "rank", None, None, None, None, None, px=[900, 560])
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
