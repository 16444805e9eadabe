"""The dashboard under hostile requests: every size, count and range a client sends
is clamped or refused with a message, a malformed request is a message and never an
HTTP 500, the Host header is checked on loopback, and nothing the page shows names
a path on the server."""

from __future__ import annotations

import base64
import json
import os
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from viewerkit import component_text, make_trace_dir
from viewer import app as V
from viewer import client as VC
from viewer import wiring as VW
from viewer import state as VS
from viewer.panels import trace as VTR
from viewer.panels import gantt as VG
from viewer.ids import TRACE_PROPS
from viewer.sources import Catalog, SourceError, scan


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(App, trace dir, Flask test client)`` over a trace directory holding a link
    that leads outside it."""
    root = tmp_path_factory.mktemp("hostile")
    d, secret = make_trace_dir(root)
    os.symlink(secret, d / "link.arrow")
    st_, _, _ = V.prepare(["--trace-dir", str(d), str(d / "small.arrow")])
    return st_, d, VW.build(st_, host="127.0.0.1").server.test_client()


def gantt(app, px=None, **kw):
    return VG.on_gantt(app, VG.GanttQuery("small.arrow", px=px, **kw))


def test_plot_size_is_clamped(served, monkeypatch):
    state, _, _ = served
    monkeypatch.setattr(state, "bar_limit", 0)  # every view a raster: its image is as wide as the plot
    fig = gantt(state, px=[6000, 4000]).figure
    png = base64.b64decode([t for t in fig["data"] if t.get("type") == "image"][0]["source"].split(",")[1])
    w, h = VC.PX_LIMITS[0][1], VC.PX_LIMITS[1][1]
    assert int.from_bytes(png[16:20], "big") == w  # the PNG's IHDR width: drawn at the clamp, not 6000
    assert VC.clamp_px([6000, 4000]) == (w, h) and VC.clamp_px([1, -5]) == (VC.PX_LIMITS[0][0], VC.PX_LIMITS[1][0])
    assert VC.clamp_px("garbage") == VC.GANTT_PX and VC.clamp_px([float("nan"), 3]) == VC.GANTT_PX
    assert VC.clamp_px([1e300, 1e300]) == (w, h)


@pytest.mark.parametrize("kw, message", [
    (dict(ranks=list(range(VC.MAX_LIST + 1))), "at most 4096 values"),
    (dict(stages=["x"]), "not an integer"),
    (dict(ctas="0-7"), "must be a list"),
    (dict(trigger="t0", t0="1e400"), "not a number of µs"),
    (dict(trigger="t1", t1="nan"), "not a number of µs"),
    (dict(trigger="gantt", relayout={"xaxis.range[0]": "-inf", "xaxis.range[1]": 3}), "zoom is not a time"),
    (dict(trigger="gantt", relayout={"yaxis.range": [1e308, 2]}), "row zoom is not a time"),
])
def test_out_of_range_requests_are_messages(served, kw, message):
    state, _, _ = served
    out = gantt(state, **kw)
    assert out.figure is VS.NO  # the figure stays as it was
    assert message in component_text(out.status) and "Traceback" not in component_text(out.status)


def test_a_forged_view_state_is_ignored(served):
    state, _, _ = served
    good = gantt(state)
    forged = {"name": "small.arrow", "fkey": good.state["fkey"], "t0": 10 ** 30, "r0": -5, "r1": 10 ** 9}
    assert VC.ViewState.from_client(forged) is None
    out = gantt(state, state=forged)
    assert out.state["t0"] == good.state["t0"] and out.state["r1"] == good.state["r1"]
    bad = {"name": "small.arrow", "fkey": good.state["fkey"], "r0": -5, "r1": 10 ** 9}
    out = gantt(state, state=bad)
    assert out.state["r0"] == 0 and out.state["r1"] == good.state["r1"]  # rows clamped to the layout
    assert VC.ViewState.from_client(["not", "a", "dict"]) is None and VC.ViewState.from_client({"ranks": "0"}) is None


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                       max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(JSONISH, min_size=12, max_size=12))
def test_any_gantt_request_is_a_figure_or_a_message(served, values):
    """Whatever a client puts in the Gantt callback's inputs: a figure, a message, or
    Dash's "nothing to update" (a relayout that is no zoom); no other exception."""
    import dash

    state, _, _ = served
    try:
        out = VG.on_gantt(state, VG.GanttQuery("small.arrow", *values[:6],
                                               "gantt" if isinstance(values[6], dict) else "filters", *values[6:11]))
    except dash.exceptions.PreventUpdate:
        return
    assert isinstance(out, tuple) and len(out) == 6


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(search=st.text(max_size=60), picked=JSONISH)
def test_any_address_or_pick_is_a_page_or_a_message(served, search, picked):
    state, d, _ = served
    out = VTR.select(state, search, picked, isinstance(picked, str))
    assert len(out) == len(TRACE_PROPS)
    assert str(d) not in json.dumps(out, default=str)  # no server path in anything sent


def _post(client, output, inputs, state=()):
    """One callback request as Dash's renderer sends it."""
    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in output.strip(".").split("...")]
    body = {"output": output, "outputs": outputs, "inputs": list(inputs), "state": list(state),
            "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs]}
    return client.post("/_dash-update-component", json=body)


def test_malformed_requests_over_http_are_answered_not_500(served):
    _, d, client = served
    outs = "...".join(f"{c}.{p}" for c, p in TRACE_PROPS)
    r = _post(client, f"..{outs}..", [{"id": "url", "property": "search", "value": "?trace=%ZZ&ranks=[[["},
                                      {"id": "trace-select", "property": "value", "value": {"x": 1}}],
              [{"id": "page-search", "property": "data", "value": None}])
    assert r.status_code in (200, 204), r.get_data(as_text=True)[:300]
    assert str(d) not in r.get_data(as_text=True)
    px = {"id": "px", "property": "data", "value": [10 ** 9, "x"]}
    r = _post(client, "..gantt.figure...view-state.data...t0.value...t1.value...gantt-status.children..."
              "panel-key.data..", [
                  {"id": "trace-key", "property": "data", "value": {"name": "small.arrow"}},
                  {"id": "grouping", "property": "value", "value": ["nope"]},
                  {"id": "ranks", "property": "value", "value": "all"},
                  {"id": "launches", "property": "value", "value": None},
                  {"id": "stages", "property": "value", "value": None},
                  {"id": "phases", "property": "value", "value": None},
                  {"id": "ctas", "property": "value", "value": None},
                  {"id": "zoom", "property": "data", "value": None},
                  {"id": "t0", "property": "value", "value": None},
                  {"id": "t1", "property": "value", "value": None},
                  {"id": "reset", "property": "n_clicks", "value": None}],
              [px, {"id": "view-state", "property": "data", "value": "forged"}])
    assert r.status_code == 200, r.get_data(as_text=True)[:300]
    assert "must be a list" in r.get_data(as_text=True)
    r = _post(client, "..no-such.output..", [{"id": "url", "property": "search", "value": 1}])
    assert r.status_code == 400 and r.get_data(as_text=True).count("\n") <= 1  # one line, no traceback
    assert "malformed request" in r.get_data(as_text=True)


def test_host_header_is_checked_on_loopback(served):
    _, _, client = served
    assert client.get("/", headers={"Host": "127.0.0.1:8050"}).status_code == 200
    assert client.get("/", headers={"Host": "localhost:8050"}).status_code == 200
    assert client.get("/", headers={"Host": "[::1]:8050"}).status_code == 200
    r = client.get("/", headers={"Host": "evil.example:8050"})
    assert r.status_code == 403 and "this machine only" in r.get_data(as_text=True)
    state, _, _ = served
    lan = VW.build(state, host="0.0.0.0").server.test_client()  # bound to a network: any Host
    assert lan.get("/", headers={"Host": "box.lan:8050"}).status_code == 200


def test_the_picker_lists_no_link_leading_outside(served):
    state, d, _ = served
    assert "link.arrow" not in [p.name for p in scan(d)]
    assert "link.arrow" not in state.catalog.names()
    with pytest.raises(SourceError, match="leads outside the trace directory") as e:
        Catalog(d).resolve("link.arrow")
    assert str(d) not in str(e.value)


@pytest.mark.parametrize("name", ["corrupt.arrow", "plain.parquet", "missing.arrow", "../outside/secret.arrow",
                                  "/etc/passwd", "link.arrow"])
def test_refusals_name_no_server_path(served, name):
    state, d, _ = served
    out = VTR.select(state, f"?trace={name}", None, False)
    text = component_text(out.banners)
    assert text and str(d) not in text and str(d.parent) not in text


def test_ports_out_of_range_are_command_line_errors(capsys):
    for port in ("0", "65536", "-1", "http"):
        with pytest.raises(SystemExit) as e:
            V.parse_args(["--port", port])
        assert e.value.code == 2
        assert "port" in capsys.readouterr().err


# -- the run overview (timeline-view RUN) ------------------------------------------------------------
@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    """``(RunApp, trace dir, Flask test client)``: a run directory inside the trace
    directory, another outside it, a symlink inside leading to that one."""
    from viewer_runkit import make_run

    root = tmp_path_factory.mktemp("hostile_run")
    d = root / "traces"
    d.mkdir()
    run, _ = make_run(d)
    outside, _ = make_run(root, "outside_run")
    os.symlink(outside, d / "link_run")
    st_, _, _ = V.prepare([str(run), "--trace-dir", str(d), "--memory-budget", "64M"])
    return st_, d, VW.build(st_, host="127.0.0.1").server.test_client()


@pytest.mark.parametrize("name, why", [
    ("../outside_run", "outside the trace directory"), ("link_run", "leads outside the trace directory"),
    ("/etc", "outside the trace directory"), ("no_such_run", "no trace 'no_such_run'"),
    ("a\x00b", "NUL byte"), ("small_run&step=99999999999999999999", "out of range"), ("small_run&step=1e3", "not an integer")])
def test_a_run_outside_the_trace_directory_is_refused_naming_no_path(served_run, name, why):
    state, d, _ = served_run
    search = "?" + urllib.parse.urlencode({"run": name}) if "&" not in name else f"?run={name}&layer=0"
    out = VTR.select(state, search, None, False)
    text = component_text(out.banners)
    assert why in text and str(d) not in text and str(d.parent) not in text
    assert out.key == {"name": None}  # nothing opened


def test_a_run_page_checks_the_host_too(served_run):
    _, _, client = served_run
    assert client.get("/?run=small_run&step=1&layer=1", headers={"Host": "127.0.0.1:8050"}).status_code == 200
    assert client.get("/?run=small_run", headers={"Host": "evil.example:8050"}).status_code == 403


OPEN_OUT = "..url.search...ov-progress.children.."
OPEN_INPUTS = ("ov-graph.clickData", "ov-slowest.n_clicks", "ov-typical.n_clicks", "ov-p99.n_clicks",
               "ov-prev.n_clicks", "ov-next.n_clicks")
OPEN_STATE = ("ov-run.data", "trace-key.data", "url.search", "ov-metric.value", "ov-rank.value")


def _props(names, values):
    return [dict(zip(("id", "property"), n.rsplit(".", 1)), value=v) for n, v in zip(names, values)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(JSONISH, min_size=11, max_size=11), which=st.integers(0, 5))
def test_any_overview_request_is_an_address_or_nothing(served_run, values, which):
    """Whatever a client sends the overview's open callback (a click, a button, any
    run name, trace key, address, metric or rank): an address of a launch of the run,
    a message, or nothing (204); never a 500, never a path, never a run outside."""
    state, d, client = served_run
    inputs = _props(OPEN_INPUTS, values[:6])
    body = {"output": OPEN_OUT, "outputs": [{"id": "url", "property": "search"},
                                            {"id": "ov-progress", "property": "children"}],
            "inputs": inputs, "state": _props(OPEN_STATE, values[6:]),
            "changedPropIds": [OPEN_INPUTS[which]]}
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code in (200, 204), r.get_data(as_text=True)[:200]
    text = r.get_data(as_text=True)
    assert str(d) not in text and str(d.parent) not in text


def test_overview_clicks_and_buttons_over_http_open_launches_of_the_run_only(served_run):
    state, d, client = served_run
    ov = state.runs.overview("small_run")
    shown = next(k for k in ov.keys() if k not in (ov.slowest, (1, 2)))

    def open_(changed, run="small_run", click=None):
        body = {"output": OPEN_OUT, "outputs": [{"id": "url", "property": "search"},
                                                {"id": "ov-progress", "property": "children"}],
                "inputs": _props(OPEN_INPUTS, [click, 1, 1, 1, 1, 1]),
                "state": _props(OPEN_STATE, [run, {"name": f"small_run/launch={shown}"}, "", "kernel", 0]),
                "changedPropIds": [changed]}
        return client.post("/_dash-update-component", json=body)

    r = open_("ov-graph.clickData", click={"points": [{"x": 1, "y": 2}]})
    assert r.status_code == 204  # an unbinned overview's click is opened by the browser (run_wiring.CLICK_SCRIPT)
    r = open_("ov-next.n_clicks")
    assert "loading launch" in r.get_json()["response"]["ov-progress"]["children"]  # the note while it loads
    assert r.get_json()["response"]["url"]["search"].startswith(f"?run=small_run&launch={ov.neighbour(shown, 1)}")
    r = open_("ov-slowest.n_clicks")
    assert f"launch={ov.slowest}" in r.get_json()["response"]["url"]["search"]
    for run in ("../outside_run", "link_run", "/etc"):
        r = open_("ov-next.n_clicks", run=run)
        text = r.get_data(as_text=True)
        assert r.status_code == 200 and "url" not in r.get_json()["response"]  # a message, no address
        assert "outside the trace directory" in text and str(d) not in text


def test_many_launch_requests_stay_within_the_memory_budget(served_run):
    """A client asking for every launch in turn: the server holds at most the budget
    (plus the one launch asked for last)."""
    state, _, _ = served_run
    from viewer.launch_cache import footprint

    one = footprint(state.store.get("small_run/launch=0:0"))
    from viewer.run_source import BYTES_PER_TASK

    tasks = state.runs.overview("small_run").tasks_of("0:0")
    state.store.launches.budget = max(int(one * 1.5), tasks * BYTES_PER_TASK)  # one fits, two do not
    assert 2 * one > state.store.launches.budget
    for s in range(2):
        for la in range(3):
            out = VTR.select(state, f"?run=small_run&launch={s}:{la}", None, False)
            assert out.key == {"name": f"small_run/launch={s}:{la}"}
            assert state.store.launches.held() <= state.store.launches.budget
    assert len(state.store.launches.names()) == 1


KEYISH = st.sampled_from(["0:1", "1:2", "7:0", "0-1:1", "1:2,0:1", "x:1", "s5i.arrow:40", ":", "", "0", "%2F:3",
                          "a\x00b:1", "1:" + "9" * 30]) | st.text(max_size=24)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=st.sampled_from(["small_run", "../outside_run", "link_run", "", "small_run/launch=1:1"]) | st.text(max_size=20),
       step=st.none() | st.text(max_size=24) | st.integers().map(str),
       layer=st.none() | st.text(max_size=12) | st.integers().map(str), launch=st.none() | KEYISH)
def test_any_run_address_is_a_launch_or_a_message(served_run, run, step, layer, launch):
    """Any ``?run=&launch=`` address (or an older ``&step=&layer=`` one): that launch
    of the run inside the trace directory, or a message naming no server path; never
    an exception."""
    from timeline.core import launchkey as KY
    from viewer import run_source as VRS

    state, d, _ = served_run
    search = "?" + urllib.parse.urlencode({k: v for k, v in (("run", run), ("step", step), ("layer", layer),
                                                            ("launch", launch)) if v is not None})
    out = VTR.select(state, search, None, False)
    text = json.dumps(out, default=str)
    assert str(d) not in text and str(d.parent) not in text
    name = out.key["name"]
    if name is not None:  # the launch the address names (none: the typical; no run: the default)
        q = urllib.parse.parse_qs(search[1:])
        if q.get("launch"):
            want = VRS.parse_launch(q["launch"][0])
        elif q.get("step") or q.get("layer"):
            want = KY.LaunchKey(int(q.get("step", ["0"])[0]), int(q.get("layer", ["0"])[0]))
        else:
            want = state.runs.typical("small_run")
        assert q.get("run", ["small_run"]) == ["small_run"] and name == VRS.launch_name("small_run", want)


def test_a_capture_named_oddly_is_addressed_safely(tmp_path):
    """A run without slot headers whose capture's name holds ``&``, ``=``, ``#``, ``%``,
    ``/``, ``,``, ``:`` and spaces: every launch opens by its address (the key
    percent-encoded), the page shows it by its key, and a name that would lead out of
    the trace directory is still refused."""
    from timeline.run import append
    from viewer import run_source as VRS
    from viewer.panels import overview as VO
    from viewer_runkit import headerless, small_trace

    d = tmp_path / "traces"
    d.mkdir()
    odd = "cap &x=1#frag%41/../b,c:d e"
    append(d / "odd_run", headerless(small_trace().filter(ranks=[0])), capture=odd)
    state, _, first = V.prepare([str(d / "odd_run"), "--trace-dir", str(d)])
    ov = state.runs.overview(first)
    assert {k.capture for k in ov.keys()} == {odd} and ov.grid.ys == [odd]
    for key in ov.keys():
        search = VO.search_for(first, key, "")
        out = VTR.select(state, search, None, False)
        assert out.key == {"name": VRS.launch_name(first, key)} and f"launch {key}" in out.info
    out = VTR.select(state, "?run=odd_run&launch=" + urllib.parse.quote(f"{odd}:99"), None, False)
    assert out.key == {"name": None} and "is not one launch of 'odd_run'" in component_text(out.banners)
    out = VTR.select(state, "?run=" + urllib.parse.quote("../odd_run") + "&launch=0", None, False)
    assert out.key == {"name": None} and "outside the trace directory" in component_text(out.banners)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.sampled_from(["small_run", "small_run.arrow", "../outside_run", "link_run", "/etc", "small_run/launch=0:0"])
       | JSONISH, b=st.sampled_from(["small_run", "small_run.arrow", "../outside_run/x.arrow"]) | JSONISH,
       which=JSONISH, panels=JSONISH)
def test_any_explain_or_compare_request_is_an_answer_or_a_message(served_run, a, b, which, panels):
    """Whatever a client names as A and B in the Compare tab, or as the Explain tab's
    launch choice and source to explain against: an answer or a message, never an
    exception, never a server path, never a source outside the trace directory."""
    import dash

    from viewer.panels import abcompare as VAB
    from viewer.panels import explain as XP

    state, d, _ = served_run
    outs = []
    for call in (lambda: VAB.on_ab(state, a, b, "compare", None),
                 lambda: XP.on_explain(state, {"name": "small_run/launch=0:1"}, "explain", panels, which, a)):
        try:
            outs.append(call())
        except dash.exceptions.PreventUpdate:
            pass
    text = json.dumps(outs, default=str)
    assert str(d) not in text and str(d.parent) not in text and "Traceback" not in text
    assert "SECRET" not in text
