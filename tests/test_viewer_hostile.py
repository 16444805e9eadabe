"""The dashboard under hostile requests: every size, count and range a client sends
is clamped or refused with a message, a malformed request is a message and never an
HTTP 500, the Host header is checked on loopback, and nothing the page shows names
a path on the server."""

from __future__ import annotations

import base64
import json
import os

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
