"""Traces and helpers the dashboard tests share (not a test module)."""

from __future__ import annotations

import base64
import os

import numpy as np

import pyarrow as pa
import pyarrow.parquet as pq

from timeline import Spec, collect
from timeline.ingest import synth


def dashboard_bundle():
    """The plotly.js bundle ``make demo`` serves (``make plotly-bundle`` builds it;
    ``make test`` does before the tests): a browser test that needs it fails, naming
    the command, when it is missing or stale."""
    from tools.plotly_bundle import CHECKOUT_BUNDLE
    from viewer import page

    try:
        return page.plotly_bundle(CHECKOUT_BUNDLE)
    except page.BundleError as e:
        raise AssertionError(f"{e} (make setup-test builds it)") from None


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


def component_text(component) -> str:
    """All text inside a Dash component tree."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(component_text(c) for c in component)
    return component_text(getattr(component, "children", None))


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
