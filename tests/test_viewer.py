"""The dashboard without a browser: row layout and window search, the raster, the
figure builders (on a hand-built trace whose every bar is known), the trace
sources' refusals, the command line's bad-input messages and the callbacks' logic."""

import base64
import json
import os
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bufkit import empty, put
from timeline import Spec, collect, synth
from viewer import app as V
from viewer import client as VC
from viewer import wiring as VW
from viewer import state as VS
from viewer import page as VP
from viewer.panels import trace as VTR
from viewer.panels import gantt as VG
from viewer.panels import tables as VT
from viewer.panels import export as VX
from timeline import compare as TC
from timeline import analysis as A
from viewer import figures as F
from viewer import model as M
from viewer import raster as R
from viewer.sources import Catalog, SourceError


# -- traces ------------------------------------------------------------------------------------
def tiny_trace():
    """Three tasks on two CTAs, ticks of 10 ns from origin tick 100 (ns = 10 * (tick - 100)):
    a/0 on CTA 0, a/1 on CTA 1 (XCC 1), b/0 on CTA 0."""
    spec = Spec("tiny", [("a", 2), ("b", 1)], arch="gfx942")
    buf = empty(spec)
    put(buf, spec, stage="a", task=0, ticks=[100, 110, 120, 150, 160], cta=0)
    put(buf, spec, stage="a", task=1, ticks=[100, 130, 140, 170, 175], cta=1, xcc=1)
    put(buf, spec, stage="b", task=0, ticks=[200, 205, 210, 240, 250], cta=0)
    return collect(buf, spec)


TINY_BARS = {  # (stage, interval index, row, start ns, end ns)
    ("a", 0, 0, 0, 100), ("a", 1, 0, 100, 200), ("a", 2, 0, 200, 500), ("a", 3, 0, 500, 600),
    ("a", 0, 1, 0, 300), ("a", 1, 1, 300, 400), ("a", 2, 1, 400, 700), ("a", 3, 1, 700, 750),
    ("b", 0, 0, 1000, 1050), ("b", 1, 0, 1050, 1100), ("b", 2, 0, 1100, 1400), ("b", 3, 0, 1400, 1500),
}


def make_trace_dir(root):
    """A trace directory as the browser tests and the CLI tests use it, plus a trace
    outside it: ``small.arrow`` (synthetic: 2 ranks, 8 CTAs, 2 waves), ``anomalies.arrow``
    (a stamp dropped, a placement word lost), ``empty.arrow`` (no rows), ``corrupt.arrow``
    (random bytes), ``plain.parquet`` (a table that is not a trace) and
    ``../outside/secret.arrow``."""
    d = root / "traces"
    d.mkdir()
    small = synth.synth_trace(synth.glm5_spec(waves=2, world=2), grid=8, seed=1)
    small.save(d / "small.arrow")
    spec = synth.glm5_spec(waves=1)
    (sp, buf), = synth.synth_buffers(spec, grid=8, seed=2)
    lay = sp.layout
    buf = buf.copy()
    buf[3 * lay.cols + 2] = 0  # a record's hint stamp lost: missing_phase
    buf[5 * lay.cols + 0] = 0  # a placement word lost: no_placement
    collect(buf, sp, synthetic=True).save(d / "anomalies.arrow")
    small.filter(ranks=[99]).save(d / "empty.arrow")
    (d / "corrupt.arrow").write_bytes(b"ARROW1" + os.urandom(4000))
    pq.write_table(pa.table({"x": [1, 2, 3]}), d / "plain.parquet")
    out = root / "outside"
    out.mkdir()
    secret = synth.synth_trace(Spec("SECRET_KERNEL", [("s", 4)]), grid=4)
    secret.save(out / "secret.arrow")
    return d, out / "secret.arrow"


@pytest.fixture(scope="module")
def tiny():
    return M.TraceData(tiny_trace())


@pytest.fixture(scope="module")
def mid():
    """A synthetic trace big enough for both Gantt modes: 2 ranks x 2 launches x 32
    CTAs x 2 waves."""
    return M.TraceData(synth.synth_trace(synth.glm5_spec(waves=2, world=2, launches=2), grid=32, seed=3))


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return make_trace_dir(tmp_path_factory.mktemp("viewer"))


# -- decoding what the figures send ---------------------------------------------------------------
def untyped(v):
    """A plotly.js typed array (or list) back to numpy."""
    if isinstance(v, dict):
        dt = {"f8": np.float64, "f4": np.float32, "i4": np.int32, "i2": np.int16, "u1": np.uint8}[v["dtype"]]
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=dt)
        if "shape" in v:
            a = a.reshape([int(x) for x in v["shape"].split(",")])
        return a
    return np.asarray(v, dtype=float)


def bars_of(fig):
    """Every segment of the figure's bar traces as (stage, interval, row, start ns, end ns)."""
    out = set()
    for t in fig["data"]:
        if t.get("meta", {}).get("kind") != "bars":
            continue
        x, y = untyped(t["x"]).astype(np.float64), untyped(t["y"])
        assert np.isnan(x[2::3]).all() and np.isnan(y[2::3]).all(), "segments are NaN-separated"
        assert (y[0::3] == y[1::3]).all(), "a bar is horizontal"
        for s, e, r in zip(x[0::3], x[1::3], y[0::3]):
            out.add((t["meta"]["stage"], t["meta"]["interval"], int(r), int(round(s * 1e3)), int(round(e * 1e3))))
    return out


def png_pixels(data: bytes) -> np.ndarray:
    """Decode the PNGs ``raster.png_bytes`` writes (RGB 8-bit, Sub filter)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    pos, idat = 8, b""
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 1).all()
    return (np.cumsum(raw[:, 1:].reshape(h, w, 3).astype(np.int64), axis=1) % 256).astype(np.uint8)


# -- the data model ------------------------------------------------------------------------------
def test_rows_of_each_grouping(tiny, mid):
    v = M.build_view(tiny, "rank")
    assert v.n_rows == 2 and v.rows["cta"].tolist() == [0, 1]
    # placement: rows in hardware-unit order; every row's intervals share its CTA and unit
    p = M.build_view(mid, "placement")
    hw = mid.hw_unit[p.order]
    assert (np.diff(p.rows["group"][p.group_id == 0]) >= 0).all()
    assert all((hw[a:b] == hw[a]).all() and (mid.cta[p.order[a:b]] == mid.cta[p.order[a]]).all()
               for a, b in zip(p.row_start[:-1], p.row_start[1:]))
    # stage: one row per (rank, launch, stage, CTA, wave) that ran the stage
    s = M.build_view(mid, "stage")
    st = mid.stage[s.order]
    assert all((st[a:b] == st[a]).all() for a, b in zip(s.row_start[:-1], s.row_start[1:]))
    key = set(zip(mid.rank.tolist(), mid.launch.tolist(), mid.stage.tolist(), mid.cta.tolist(), mid.wave.tolist()))
    assert s.n_rows == len(key)
    # cta: launches share a row, one per (rank, CTA, wave), in time order
    c = M.build_view(mid, "cta")
    assert c.n_rows == len(set(zip(mid.rank.tolist(), mid.cta.tolist(), mid.wave.tolist())))
    launches = mid.launch[c.order]
    assert all(set(launches[a:b].tolist()) == {0, 1} for a, b in zip(c.row_start[:-1], c.row_start[1:]))
    assert M.row_label(mid, c, 0) == "r0 · cta 0 w0"
    # inside a row, intervals are sorted by start
    starts = mid.start[s.order]
    same_row = s.row[1:] == s.row[:-1]
    assert (starts[1:][same_row] >= starts[:-1][same_row]).all()


def test_row_filters(mid):
    v = M.build_view(mid, "rank", ranks=[1], launches=[0], ctas=(4, 9))
    assert set(v.rows["rank"].tolist()) == {1} and set(v.rows["launch"].tolist()) == {0}
    assert v.rows["cta"].min() == 4 and v.rows["cta"].max() == 9 and v.n_rows == 6 * 2
    with pytest.raises(M.ViewError, match="unknown row grouping"):
        M.build_view(mid, "sideways")


def test_row_time_order_is_lexsort():
    rng = np.random.default_rng(5)
    for code_hi, rel_hi in ((50, 1000), (1 << 40, 1 << 30)):  # packed into one key; too wide: lexsort
        code = rng.integers(0, code_hi, 5000)
        rel = rng.integers(0, rel_hi, 5000)
        rel[::7] = rel[0]  # ties: the order must stay stable, as lexsort's
        code[::7] = code[0]
        assert np.array_equal(M._row_time_order(code, rel), np.lexsort((rel, code)))
    assert M._row_time_order(np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0


def test_window_matches_a_scan(mid):
    v = M.build_view(mid, "rank")
    rng = np.random.default_rng(0)
    cls = M.class_mask(mid, stages=[0, 2, 5], phases=[0, 3])
    row_of = v.row
    s, e = mid.start[v.order], mid.end[v.order]
    for _ in range(40):
        r0, r1 = sorted(rng.integers(0, v.n_rows + 1, 2))
        t0, t1 = sorted(rng.integers(mid.t_min - 1000, mid.t_max + 1000, 2))
        for ok in (None, cls):
            got = M.window(v, r0, r1, t0, t1, mid.t_min, ok)
            want = (row_of >= r0) & (row_of < r1) & (s <= t1) & (e >= t0)
            if ok is not None:
                want &= ok[v.cls]
            assert got.tolist() == np.flatnonzero(want).tolist()


def test_tasks_and_their_durations(tiny):
    assert tiny.n == 12 and tiny.n_tasks == 3
    for t in range(3):
        ivs = tiny.task_intervals(t)
        assert tiny.phase[ivs].tolist() == [0, 1, 2, 3]
        assert np.allclose(tiny.task_dur[t], (tiny.end[ivs] - tiny.start[ivs]) / 1e3)


# -- the raster ------------------------------------------------------------------------------------
def brute_coverage(s, e, prow, t0, t1, w, h):
    out = np.zeros((h, w))
    edges = np.linspace(t0, t1, w + 1)
    for a, b, r in zip(s, e, prow):
        out[r] += np.clip(np.minimum(b, edges[1:]) - np.maximum(a, edges[:-1]), 0, None) / (edges[1] - edges[0])
    return out


def test_coverage_is_exact_overlap():
    rng = np.random.default_rng(1)
    n, w, h = 300, 37, 5
    s = rng.uniform(-50, 1000, n)
    e = s + rng.exponential(60, n)
    prow = rng.integers(0, h, n)
    cls = rng.integers(0, 3, n)
    pal = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    cov = R.coverage(s, e, prow, cls, pal, 0.0, 900.0, w, h)
    assert np.allclose(cov[0], brute_coverage(s, e, prow, 0.0, 900.0, w, h))
    for c in range(3):  # the colour channels are the coverage of that colour's intervals
        m = cls == c
        assert np.allclose(cov[1 + c], brute_coverage(s[m], e[m], prow[m], 0.0, 900.0, w, h))


def test_shade_and_png_round_trip():
    cov = np.zeros((4, 2, 3))
    cov[:, 0, 0] = [1.0, 1.0, 0.0, 0.0]  # one row fully busy in red
    cov[:, 1, 2] = [0.5, 0.0, 0.5, 0.0]  # half busy in green, 2 rows per pixel
    img = R.shade(cov, np.array([1.0, 2.0]))
    assert img[0, 0].tolist() == [255, 0, 0]
    assert img[0, 1].tolist() == [255, 255, 255]  # idle is white
    g = img[1, 2]
    assert g[1] == 255 and 0 < g[0] < 255 and g[0] == g[2]  # green, faded by occupancy 1/4
    assert (png_pixels(R.png_bytes(img)) == img).all()


# -- figure builders ------------------------------------------------------------------------------
def test_bars_of_a_known_trace(tiny):
    v = M.build_view(tiny, "rank")
    fig, info = F.gantt_figure(tiny, v, r0=0, r1=2, t0_ns=0, t1_ns=tiny.t_max)
    assert info == {"mode": "bars", "intervals": 12, "rows": 2}
    assert bars_of(fig) == TINY_BARS
    # hover points: one per interval at its middle (few tasks in view), carrying its task's durations
    hov = [t for t in fig["data"] if t.get("meta", {}).get("kind") == "hover"]
    assert sorted(t["meta"]["stage"] for t in hov) == ["a", "b"]
    a = next(t for t in hov if t["meta"]["stage"] == "a")
    cd = untyped(a["customdata"])
    x = untyped(a["x"])
    assert cd.shape == (8, 8 + 4)
    cols = F.hover_columns(tiny)
    row = [i for i in range(8) if cd[i, cols.index("cta")] == 1 and x[i] < 0.2][0]  # a/1's start→hint
    assert x[row] == pytest.approx(0.15)
    assert cd[row, cols.index("task")] == 1 and cd[row, cols.index("xcc")] == 1
    assert cd[row, 8:].tolist() == pytest.approx([0.3, 0.1, 0.3, 0.05])
    assert "start→hint" in a["hovertemplate"] and "CTA" in a["hovertemplate"]
    # y axis: one tick per row when few rows are in view
    assert fig["layout"]["yaxis"]["tickvals"] == [0, 1]
    assert fig["layout"]["yaxis"]["ticktext"] == ["r0 L0 · cta 0", "r0 L0 · cta 1"]  # one wave: no "w0"


def test_window_stage_and_phase_filters_change_the_bars(tiny):
    v = M.build_view(tiny, "rank")
    fig, _ = F.gantt_figure(tiny, v, r0=0, r1=2, t0_ns=0, t1_ns=tiny.t_max,
                            class_ok=M.class_mask(tiny, stages=[1]), stages=[1])
    assert bars_of(fig) == {b for b in TINY_BARS if b[0] == "b"}
    assert [t["name"] for t in fig["data"] if t["meta"]["kind"] == "legend"] == ["b"]
    fig, _ = F.gantt_figure(tiny, v, r0=0, r1=2, t0_ns=0, t1_ns=tiny.t_max,
                            class_ok=M.class_mask(tiny, phases=[0]))
    assert bars_of(fig) == {b for b in TINY_BARS if b[1] == 0}
    fig, _ = F.gantt_figure(tiny, v, r0=1, r1=2, t0_ns=650, t1_ns=900)  # rows and time window
    assert bars_of(fig) == {("a", 2, 1, 400, 700), ("a", 3, 1, 700, 750)}
    assert fig["layout"]["xaxis"]["range"] == [0.65, 0.9]
    assert fig["layout"]["yaxis"]["range"] == [1.5, 0.5]


def test_phase_colours_make_waiting_lighter():
    rgb = F.class_rgb(2, 4)
    for s in range(2):
        wait, work = rgb[s * 4], rgb[s * 4 + 2]
        assert wait.sum() > work.sum()  # the producer wait is lighter than compute
    assert not np.allclose(rgb[0], rgb[4])  # stages differ


def test_raster_mode_above_the_bar_limit(mid):
    v = M.build_view(mid, "rank")
    fig, info = F.gantt_figure(mid, v, r0=0, r1=v.n_rows, t0_ns=mid.t_min, t1_ns=mid.t_max,
                               width_px=300, height_px=100, bar_limit=1000)
    assert info["mode"] == "raster" and info["intervals"] == mid.n
    img = fig["data"][0]
    assert img["type"] == "image" and img["meta"]["height"] == 100 and img["meta"]["width"] == 300
    pix = png_pixels(base64.b64decode(img["source"].split(",", 1)[1]))
    assert pix.shape == (100, 300, 3) and pix.std() > 10
    assert img["dy"] == pytest.approx(v.n_rows / 100)
    assert not any(t["type"] == "scattergl" for t in fig["data"])  # no WebGL for an image
    # few intervals but more rows than the plot has pixel rows: still the raster
    fig, info = F.gantt_figure(mid, v, r0=0, r1=v.n_rows, t0_ns=mid.t_min, t1_ns=mid.t_min + 500,
                               height_px=100, bar_limit=1000)
    assert 0 < info["intervals"] <= 1000 and info["mode"] == "raster"
    # zoomed in to few intervals: exact bars again
    fig, info = F.gantt_figure(mid, v, r0=0, r1=4, t0_ns=mid.t_min, t1_ns=mid.t_max, bar_limit=1000)
    assert info["mode"] == "bars" and len(bars_of(fig)) == info["intervals"]
    # many rows in view: ticks at group starts (rank, launch), separators between groups
    fig, _ = F.gantt_figure(mid, v, r0=0, r1=v.n_rows, t0_ns=0, t1_ns=mid.t_max, bar_limit=1000)
    ya = fig["layout"]["yaxis"]
    groups = {v: t for v, t in zip(ya["tickvals"], ya["ticktext"]) if not t.startswith("cta")}
    assert groups == {0: "r0 L0", 64: "r0 L1", 128: "r1 L0", 192: "r1 L1"}
    between = [v for v, t in zip(ya["tickvals"], ya["ticktext"]) if t.startswith("cta")]
    assert 10 < len(between) <= F.MAX_ROW_TICKS // 2
    assert all(t == M.row_label(mid, v, r).split(" · ", 1)[1] for r, t in zip(ya["tickvals"], ya["ticktext"])
               if t.startswith("cta"))
    assert [s["y0"] for s in fig["layout"]["shapes"]] == [63.5, 127.5, 191.5]


def test_hover_per_task_when_many_tasks(tiny, mid):
    v = M.build_view(tiny, "rank")
    pos = M.window(v, 0, 2, 0, tiny.t_max, tiny.t_min)
    hov = [t for t in F.bar_traces(tiny, v, pos, 10.0, hover_per_task=True) if t["meta"]["kind"] == "hover"]
    x = np.sort(np.concatenate([untyped(t["x"]) for t in hov]).astype(np.float64))
    assert x == pytest.approx([0.3, 0.375, 1.25])  # the middle of each task: a/0 0..600, a/1 0..750, b/0 1000..1500 ns
    v = M.build_view(mid, "rank")
    fig, info = F.gantt_figure(mid, v, r0=0, r1=v.n_rows, t0_ns=mid.t_min, t1_ns=mid.t_max,
                               bar_limit=10 ** 9)
    hov = [t for t in fig["data"] if t["meta"]["kind"] == "hover"]
    assert {t["meta"]["per"] for t in hov} == {"task"}
    assert sum(untyped(t["x"]).size for t in hov) == mid.n_tasks
    text = json.dumps(fig)  # plain JSON: typed arrays are base64 strings, no numpy left
    assert info["mode"] == "bars" and len(text) < 60 * info["intervals"]


# -- sources ------------------------------------------------------------------------------------------
def test_catalog_refuses_files_outside_the_trace_dir(trace_dir, tmp_path):
    d, secret = trace_dir
    cat = Catalog(d)
    assert cat.resolve("small.arrow") == (d / "small.arrow").resolve()
    link = d / "link.arrow"
    if not link.exists():
        link.symlink_to(secret)
    try:
        for bad, why in [("../outside/secret.arrow", "outside the trace directory"),
                         (str(secret), "outside the trace directory"),
                         ("link.arrow", "leads outside"),
                         ("nope.arrow", "no trace 'nope.arrow'"),
                         ("", "no trace name")]:
            with pytest.raises(SourceError, match=why):
                cat.resolve(bad)
        assert "secret.arrow" not in cat.names()
    finally:
        link.unlink()
    assert Catalog(d, [secret]).resolve("secret.arrow") == secret.resolve()  # named on the command line


# -- command line --------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["missing.arrow"], "trace file 'missing.arrow' does not exist"),
    (["{d}/corrupt.arrow"], "could not be read as a trace"),
    (["{d}/plain.parquet"], "not a mono-timeline trace"),
    (["--trace-dir", "{d}/nowhere"], "is not a directory"),
    (["--trace-dir", "{empty}"], "no trace given and none in"),
])
def test_cli_bad_input(trace_dir, tmp_path, capsys, args, message):
    d, _ = trace_dir
    args = [a.format(d=d, empty=tmp_path) for a in args]
    with pytest.raises(SystemExit) as ex:
        V.prepare(args)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_defaults(trace_dir, tmp_path, monkeypatch):
    d, _ = trace_dir
    _, args = V.parse_args([])
    assert args.host == "127.0.0.1" and args.port == 8050 and not args.debug
    assert args.trace_dir == V.DEFAULT_TRACE_DIR
    assert V.default_trace(d) == "anomalies.arrow"  # first trace file while the bundled one is absent
    (tmp_path / V.DEFAULT_TRACE).write_bytes((d / "small.arrow").read_bytes())
    (tmp_path / "aaa.arrow").write_bytes((d / "small.arrow").read_bytes())
    assert V.default_trace(tmp_path) == V.DEFAULT_TRACE
    state, _, first = V.prepare(["--trace-dir", str(tmp_path)])
    assert first == V.DEFAULT_TRACE and state.requested("") == V.DEFAULT_TRACE


def test_main_serves_on_localhost_without_debug(trace_dir, monkeypatch, capsys):
    d, _ = trace_dir
    seen = {}
    monkeypatch.setattr("dash.Dash.run", lambda self, **kw: seen.update(kw))
    assert V.main([str(d / "small.arrow"), "--port", "8123"]) == 0
    assert seen == {"host": "127.0.0.1", "port": 8123, "debug": False}
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out


def test_main_compresses_beyond_loopback(trace_dir, monkeypatch, capsys):
    import importlib.util

    d, _ = trace_dir
    seen = {}
    monkeypatch.setattr("dash.Dash.run", lambda self, **kw: seen.update(kw, compress=self.config.compress))
    assert V.main([str(d / "small.arrow"), "--port", "8123"]) == 0
    assert seen["compress"] is False  # loopback: compressing costs more than it saves
    assert V.main([str(d / "small.arrow"), "--port", "8123", "--host", "0.0.0.0"]) == 0
    if importlib.util.find_spec("flask_compress") is None:
        assert seen["compress"] is False and "pip install flask-compress" in capsys.readouterr().err
    else:
        assert seen["compress"] is True


# -- the callbacks' logic ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def state(trace_dir):
    d, _ = trace_dir
    st, _, _ = V.prepare(["--trace-dir", str(d), str(d / "small.arrow")])
    return st


def _text(component) -> str:
    """All text inside a Dash component tree."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(_text(c) for c in component)
    return _text(getattr(component, "children", None))


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
    assert message in _text(out.banners) and "Traceback" not in _text(out.banners)


def test_page_banners(state):
    small = VTR.select(state, "", None, False)
    assert small.key == {"name": "small.arrow"} and "SYNTHETIC" in _text(small.banners)
    assert "anomalies" not in _text(small.banners)
    bad = VTR.select(state, "?trace=anomalies.arrow", None, False)
    assert "This trace has" in _text(bad.banners) and "missing_phase" in _text(bad.banners)
    assert "no_placement" in _text(bad.anomalies)
    empty_ = VTR.select(state, "?trace=empty.arrow", None, False)
    assert "no intervals" in _text(empty_.banners)
    fig, _, _, _, status = VG.gantt(state, "empty.arrow", "rank", None, None, None, None, None, "filters",
                                       None, None, None, None, None)
    assert status == "nothing to draw" and "no intervals" in json.dumps(fig["layout"]["annotations"])


def test_gantt_zoom_keeps_the_window(state):
    name = "small.arrow"
    d = state.store.get(name).data
    fig, st, t0, t1, _ = VG.gantt(state, name, "rank", None, None, None, None, None, "filters", None, None, None,
                                     None, None)
    assert (st.t0, st.t1, st.r0, st.r1) == (d.t_min, d.t_max, 0, 32)
    rel = {"xaxis.range[0]": 10.0, "xaxis.range[1]": 20.0, "yaxis.range[0]": 9.7, "yaxis.range[1]": 3.2}
    fig, st, t0, t1, _ = VG.gantt(state, name, "rank", None, None, None, None, None, "gantt", rel, t0, t1, None, st)
    assert (st.t0, st.t1, st.r0, st.r1, t0, t1) == (10_000, 20_000, 3, 11, 10.0, 20.0)
    assert fig["layout"]["xaxis"]["range"] == [10.0, 20.0]
    rows = {b[2] for b in bars_of(fig)}
    assert rows and rows <= set(range(3, 11))  # rows 3..10 overlap y 3.2..9.7
    # a stage filter keeps the time window and the rows of this grouping
    fig, st2, *_ = VG.gantt(state, name, "rank", None, None, [0, 1], None, None, "filters", None, t0, t1, None, st)
    assert (st2.t0, st2.t1, st2.r0, st2.r1) == (10_000, 20_000, 3, 11)
    assert {b[0] for b in bars_of(fig)} <= {"qkv_a", "cache"}
    # the time inputs move the window; double-click (autorange) goes back to everything
    _, st3, *_ = VG.gantt(state, name, "rank", None, None, None, None, None, "t0", None, 5.0, 20.0, None, st)
    assert st3.t0 == 5000
    _, st4, *_ = VG.gantt(state, name, "rank", None, None, None, None, None, "gantt",
                             {"xaxis.autorange": True, "yaxis.autorange": True}, None, None, None, st3)
    assert (st4.t0, st4.t1, st4.r0, st4.r1) == (d.t_min, d.t_max, 0, 32)
    # a rank filter starts the rows over
    _, st5, *_ = VG.gantt(state, name, "rank", [1], None, None, None, None, "filters", None, None, None, None, st)
    assert (st5.r0, st5.r1) == (0, 16) and st5.panels == ["small.arrow", (1,), None]
    r1 = d.rank == 1  # ... and fits the time window to the selection
    assert (st5.t0, st5.t1) == (d.start[r1].min(), d.end[r1].max())


def test_query_string_preselects_the_view(state):
    assert VTR.initial("?trace=a.arrow&ranks=1,7,x&launches=0&grouping=cta", [0, 1], [0]) == ([1], [0], "cta")
    assert VTR.initial("?grouping=sideways", [0], [0]) == (None, None, "rank")
    out = VTR.select(state, "?trace=small.arrow&ranks=1&grouping=stage&compare=anomalies.arrow&tab=compare",
                       None, False)
    assert out.ranks == [1] and (out.grouping, out.compare_b, out.tab) == ("stage", "anomalies.arrow", "compare")
    out = VTR.select(state, "?trace=small.arrow&compare=../outside/secret.arrow&tab=nope", None, False)
    assert out.compare_b is None and out.tab is VS.NO  # only catalog names, only known tabs


def test_first_view_is_what_the_callbacks_would_draw(state):
    search = "?trace=small.arrow&ranks=1&grouping=cta"
    first = VW.first_view(state, search)
    props = first["props"]
    assert first["search"] == search and props[("trace-key", "data")] == {"name": "small.arrow"}
    assert props[("ranks", "value")] == [1] and props[("grouping", "value")] == "cta"
    fig, st, t0, t1, status = VG.gantt(state, "small.arrow", "cta", [1], None, None, None, None, "filters", None,
                                          None, None, list(VC.GANTT_PX), None)
    assert props[("gantt", "figure")]["layout"]["meta"] == fig["layout"]["meta"]
    assert fig["layout"]["meta"]["mode"] == "bars"
    assert props[("view-state", "data")] == st.to_client() and props[("t0", "value")] == t0 and props[("t1", "value")] == t1
    assert props[("panel-key", "data")] == ["small.arrow", (1,), None]
    page = VP.layout(first)  # the layout carries it, and the address it was made for
    assert page["gantt"].figure is props[("gantt", "figure")] and page["page-search"].data == search
    assert page["ranks"].value == [1] and page["trace-select"].value == "small.arrow"
    assert VW.first_view(state, search) is first  # every visit of the address: the same, made once
    state.bar_limit = 10
    try:
        assert VW.first_view(state, search)["props"][("gantt", "figure")]["layout"]["meta"]["mode"] == "raster"
    finally:
        state.bar_limit = F.BAR_LIMIT
    bad = VW.first_view(state, "?trace=../outside/secret.arrow")["props"]
    assert "outside the trace directory" in _text(bad[("banners", "children")])
    assert bad[("gantt", "figure")]["data"] == [] and bad[("panel-key", "data")] is None


def test_page_loads_plotly_early_with_the_compile_hint(state):
    client = VW.build(state).server.test_client()
    page = client.get("/").get_data(as_text=True)
    src = f"/_timeline-view/plotly-{VP.plotly_version()}.min.js"
    assert f'<script async src="{src}"' in page and "window.Plotly = new Promise" in page
    assert page.index(src) < page.index("dash_renderer")  # from the head, before Dash's bundles
    js = client.get(src)
    assert js.status_code == 200 and js.mimetype == "application/javascript"
    body = js.get_data()
    assert body.startswith(b"//# allFunctionsCalledOnLoad\n") and b"plotly.js v" + VP.plotly_version().encode() in body
    assert "immutable" in js.headers["Cache-Control"]


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
    text = _text(table)
    assert text.index("9.5") < text.index("2.0") < text.index("0.5") and "span_us ▼" in text
    heads = table.children[0].children[0].children.children
    assert [h.children.id for h in heads] == [{"type": "sort", "table": "t", "col": i} for i in range(2)]


def test_bad_time_window_says_why(state):
    with pytest.raises(ValueError, match="'from' box holds 'abc', not a number of µs"):
        VG.gantt(state, "small.arrow", "rank", None, None, None, None, None, "t0", None, "abc", None, None, None)


def test_autosize_does_not_redraw(state):
    with pytest.raises(Exception) as ex:
        VG.gantt(state, "small.arrow", "rank", None, None, None, None, None, "gantt", {"autosize": True}, None,
                    None, None, None)
    assert type(ex.value).__name__ == "PreventUpdate"


def test_click_pins_the_task(state):
    d = state.store.get("small.arrow").data
    _, st, *_ = VG.gantt(state, "small.arrow", "stage", None, None, None, None, None, "filters", None, None, None,
                            None, None)
    view = state.view(state.store.get("small.arrow"), "stage", None, None, None, None)
    pos = 1234
    i = int(view.order[pos])
    click = {"points": [{"x": (d.start[i] + d.end[i]) / 2e3, "y": int(view.row[pos])}]}
    panel = VG.details(state, "small.arrow", click, st)
    cells = [_text(tr.children[1]) for tr in panel.children.children]
    ivs = d.task_intervals(int(d.tid[i]))
    assert i in ivs.tolist()
    assert cells[:6] == [d.stage_names[d.stage[i]], str(d.task[i]), str(d.rank[i]), str(d.launch[i]),
                         str(d.cta[i]), str(d.wave[i])]
    assert cells[6].startswith("XCC ")
    assert cells[-4:] == [f"{(d.end[j] - d.start[j]) / 1e3:,.3f} µs" for j in ivs]
    assert _text(VG.details(state, "small.arrow", None, st)).startswith("Click a bar")


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
    assert len(rows) == path.num_rows and "rank 1 · launch 0" in _text(msg)
    assert [r["kind"] for r in rows] == path.column("kind").to_pylist()
    for scope in ("launch", "trace"):
        fig, cols, rows, msg = VT.compare(state, "small.arrow", "small.arrow", scope)
        assert all(r["Δ span_us"] == 0 for r in rows) and len(fig["data"]) == 2 and len(rows) == 11


def test_median_per_stage():
    r = pa.table({"rank": [0, 0, 1, 1, 0], "launch": [0, 0, 0, 0, 1], "stage": ["a", "b", "a", "b", "a"],
                  "tasks": [4, 2, 4, 2, 4], "span_us": [1.0, 5.0, 3.0, None, 8.0]})
    m = TC.median_per_stage(r)
    assert m.column("stage").to_pylist() == ["a", "b"]
    assert m.column("span_us").to_pylist() == [3.0, 5.0] and m.column("tasks").to_pylist() == [4, 2]


def test_compare_table_deltas():
    a = pa.table({"stage": ["x", "y"], "span_us": [10.0, 4.0], "start→hint p50_us": [1.0, 2.0]})
    b = pa.table({"stage": ["y", "x"], "span_us": [3.0, 15.0], "start→hint p50_us": [2.5, 0.5]})
    rows = TC.compare_table(a, b)
    assert rows == [
        {"stage": "x", "A span_us": 10.0, "B span_us": 15.0, "Δ span_us": 5.0, "B/A span": 1.5,
         "Δ start→hint p50_us": -0.5},
        {"stage": "y", "A span_us": 4.0, "B span_us": 3.0, "Δ span_us": -1.0, "B/A span": 0.75,
         "Δ start→hint p50_us": 0.5}]


def test_coarsen_keeps_the_time_weighted_mean():
    t = pa.table({"time_ns": [0, 10, 20, 30, 40, 0, 10, 20, 30, 40], "stage": ["a"] * 5 + ["b"] * 5,
                  "ctas": [1.0, 3.0, 5.0, 7.0, 9.0, 0.0, 0.0, 2.0, 2.0, 4.0]})
    c = A.coarsen(t, 2)
    assert c.column("time_ns").to_pylist() == [0, 20, 40, 0, 20, 40]
    assert c.column("ctas").to_pylist() == [2.0, 6.0, 9.0, 0.0, 2.0, 4.0]


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


def test_concurrency_is_stacked_and_pruned(tiny):
    # bins at 0, 10, 20, 30, 40 ns: stage a 2, 2, 2, 0, 0 CTAs; stage b 0, 1, 1, 1, 0
    t = pa.table({"time_ns": [0, 10, 20, 30, 40] * 2, "stage": ["a"] * 5 + ["b"] * 5,
                  "ctas": [2.0, 2, 2, 0, 0, 0, 1, 1, 1, 0]})
    a, b = F.concurrency_traces(t, tiny, [0, 1])
    assert (untyped(a["x"]) * 1e3).round().tolist() == [0, 30, 40]  # only where a's value changes
    assert untyped(a["y"]).tolist() == [2, 0, 0] and a["fill"] == "tozeroy"
    assert (untyped(b["x"]) * 1e3).round().tolist() == [0, 10, 30, 40]
    assert untyped(b["y"]).tolist() == [2, 3, 1, 0]  # a + b: stacked on the server
    assert untyped(b["customdata"]).tolist() == [0, 1, 1, 0] and b["fill"] == "tonexty"
    assert F.concurrency_traces(t, tiny, [1])[0]["meta"]["stage"] == "b"


def test_a_failing_callback_shows_a_message_not_a_traceback():
    @VS.guarded(VS.NO, VS.ERROR)
    def on_something(x):
        raise KeyError("boom")

    out = on_something(1)
    assert out[0] is VS.NO and _text(out[1]) == "on something: KeyError: 'boom'"


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
