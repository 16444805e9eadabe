"""The dashboard's data side without a browser: row layout and window search
(``viewer.model``), the raster (``viewer.raster``) and the figure builders
(``viewer.figures``), on a hand-built trace whose every bar is known."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pyarrow as pa
import pytest

from bufkit import empty, put
from timeline import Spec, collect
from timeline.ingest import synth
from viewer import colours as VCO
from viewer import figures as F
from viewer import model as M
from viewer import raster as VR
from viewerkit import bars_of, untyped


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


@pytest.fixture(scope="module")
def tiny():
    return M.TraceData(tiny_trace())


@pytest.fixture(scope="module")
def mid():
    """A synthetic trace big enough for both Gantt modes: 2 ranks x 2 launches x 32
    CTAs x 2 waves."""
    return M.TraceData(synth.synth_trace(synth.glm5_spec(waves=2, world=2, launches=2), grid=32, seed=3))


# -- decoding what the figures send ---------------------------------------------------------------
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
    cov = VR.coverage(s, e, prow, cls, pal, 0.0, 900.0, w, h)
    assert np.allclose(cov[0], brute_coverage(s, e, prow, 0.0, 900.0, w, h))
    for c in range(3):  # the colour channels are the coverage of that colour's intervals
        m = cls == c
        assert np.allclose(cov[1 + c], brute_coverage(s[m], e[m], prow[m], 0.0, 900.0, w, h))


def test_shade_and_png_round_trip():
    cov = np.zeros((4, 2, 3))
    cov[:, 0, 0] = [1.0, 1.0, 0.0, 0.0]  # one row fully busy in red
    cov[:, 1, 2] = [0.5, 0.0, 0.5, 0.0]  # half busy in green, 2 rows per pixel
    img = VR.shade(cov, np.array([1.0, 2.0]))
    assert img[0, 0].tolist() == [255, 0, 0]
    assert img[0, 1].tolist() == [255, 255, 255]  # idle is white
    g = img[1, 2]
    assert g[1] == 255 and 0 < g[0] < 255 and g[0] == g[2]  # green, faded by occupancy 1/4
    assert (png_pixels(VR.png_bytes(img)) == img).all()


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


def test_bars_past_the_gl_limit_are_one_exact_image(tiny):
    """``gl_limit``: the same bars as one image, a band of pixel rows per row (white
    between bands), each interval in its class colour over exactly its columns."""
    v = M.build_view(tiny, "rank")
    fig, info = F.gantt_figure(tiny, v, r0=0, r1=2, t0_ns=0, t1_ns=1500, width_px=150, height_px=100, gl_limit=11)
    assert info == {"mode": "bars", "intervals": 12, "rows": 2} and fig["layout"]["meta"]["drawn"] == "image"
    img = fig["data"][0]
    assert img["type"] == "image" and img["meta"]["kind"] == "bars-image" and not bars_of(fig)
    pix = png_pixels(base64.b64decode(img["source"].split(",", 1)[1]))
    assert pix.shape == (100, 150, 3) and img["dy"] == pytest.approx(2 / 100)  # 10 ns a column, 50 px a row
    rgb = np.round(VCO.class_rgb(2, 4, tiny.wait_index) * 255)
    for stage, p, row, s, e in TINY_BARS:
        band = pix[row * 50 + 5:row * 50 + 45, s // 10:e // 10]
        assert (band == rgb[stage == "b" and 4 + p or p]).all(), (stage, p, row)
    assert (pix[[0, 4, 45, 49, 50, 54, 95, 99]] == 255).all()  # the gaps between bands
    assert (pix[25, 60:100] == 255).all() and (pix[75, 75:100] == 255).all()  # idle: white
    fig, _ = F.gantt_figure(tiny, v, r0=0, r1=2, t0_ns=0, t1_ns=1500, gl_limit=12)
    assert bars_of(fig) == TINY_BARS  # at the limit: WebGL bars


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
    rgb = VCO.class_rgb(2, 4)
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


def test_rows_and_hovers_name_a_launch_by_its_key():
    """A trace whose launches carry slot headers: each Gantt row names its launch by
    its key (``r0 1:2``, as every command prints it), each hover point too; a trace
    known by launch numbers alone keeps ``r0 L1``."""
    from viewer_runkit import SLOTS, small_trace

    d = M.TraceData(small_trace())
    v = M.build_view(d, "rank")
    heads = {M.group_label(d, v, r) for r in range(v.n_rows)}
    assert heads == {f"r{rk} {s}:{la}" for rk in (0, 1) for s, la in SLOTS}
    traces = F.bar_traces(d, v, np.arange(v.order.size), 4.0)
    hovers = [t["hovertemplate"] for t in traces if t["meta"]["kind"] == "hover"]
    assert {h.split(" · launch ")[1].split(" · ")[0] for h in hovers} == {f"{s}:{la}" for s, la in SLOTS}
    plain = M.TraceData(synth.synth_trace(synth.glm5_spec(world=1, launches=2), grid=4))
    pv = M.build_view(plain, "rank")
    assert {M.group_label(plain, pv, r) for r in range(pv.n_rows)} == {"r0 L0", "r0 L1"}
