"""The one home of a launch's kernel time and of what launches say of it
(``timeline.analysis.launches``): the kernel time on each kind of axis, the grouping of
(rank, launch) rows into launches by key, the spread bound, and typical / noise / pNN
/ slowest, as docs/EXPLAIN.md's definitions state them."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.analysis import launches as LA
from timeline.contract import clocks as K


def rows(**cols) -> pa.Table:
    n = len(cols["start_ns"])
    base = {"rank": pa.array(cols.pop("rank", range(n)), pa.int16()),
            "step": pa.array(cols.pop("step", [0] * n), pa.int64()),
            "layer": pa.array(cols.pop("layer", [0] * n), pa.int32()),
            "capture": pa.array(cols.pop("capture", ["c"] * n), pa.string()),
            "launch": pa.array(cols.pop("launch", [0] * n), pa.int32()),
            "anomalies": pa.array(cols.pop("anomalies", [0] * n), pa.int64())}
    return pa.table({**base, **{k: pa.array(v) for k, v in cols.items()}})


def test_kernel_time_on_one_axis_is_first_start_to_last_end_over_the_ranks():
    t = LA.launch_times(rows(start_ns=[100, 150], end_ns=[1_000, 1_300], append=["a", "a"]))
    r = t.to_pylist()[0]
    assert (r["kernel_ns"], r["skew_ns"], r["alignment"], r["key"]) == (1_200, 50, LA.MEASURED, "0:0")
    assert r["slowest_rank"] == 1  # its own span 1,150 ns, rank 0's 900


def test_ranks_appended_apart_are_placed_by_their_calibrations_else_assumed():
    apart = rows(start_ns=[100, 10**9 + 40], end_ns=[1_100, 10**9 + 2_040], append=["a", "b"])
    r = LA.launch_times(apart).to_pylist()[0]
    assert (r["kernel_ns"], r["skew_ns"], r["alignment"]) == (2_000, None, LA.ASSUMED)  # the slowest rank's span
    placed = apart.append_column("host_start_ns", pa.array([5_000, 5_030])) \
        .append_column("host_pm_ns", pa.array([40.0, 60.0])).append_column("axis_pm_ns", pa.array([0.0, 0.0]))
    r = LA.launch_times(placed).to_pylist()[0]
    assert (r["kernel_ns"], r["skew_ns"], r["skew_pm_ns"], r["alignment"]) == (2_030, 30, 100.0, LA.MEASURED)


def test_a_merge_by_assumption_says_so_and_bounds_nothing():
    t = rows(start_ns=[100, 150], end_ns=[1_000, 1_300], append=["a", "a"])
    t = t.append_column("axis_pm_ns", pa.array([None, None], pa.float64()))  # a merge by first stamps
    r = LA.launch_times(t).to_pylist()[0]
    assert r["alignment"] == LA.ASSUMED and r["skew_ns"] is None and r["kernel_ns"] == 1_200


def test_launches_are_grouped_by_header_else_capture_and_slot_in_key_order():
    t = rows(start_ns=[0] * 5, end_ns=[10, 20, 30, 40, 50], step=[1, None, 0, None, 1], layer=[2, None, 3, None, 2],
             capture=["x", "z", "x", "y", "x"], launch=[9, 4, 8, 4, 9], rank=[0, 0, 0, 0, 1])
    got = LA.launch_times(t)
    assert got.column("key").to_pylist() == ["0:3", "1:2", "y:4", "z:4"]
    assert got.column("ranks").to_pylist() == [1, 2, 1, 1]


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1e4)), min_size=0, max_size=40))
def test_the_spread_bound_is_the_two_largest_added_per_launch(pairs):
    gid = np.array([g for g, _ in pairs], dtype=np.int64)
    u = np.array([x for _, x in pairs], dtype=np.float64)
    got = LA._spread_pm(gid, 6, u)
    for g in range(6):
        assert got[g] == K.spread_uncertainty(u[gid == g].tolist())


@settings(max_examples=200)
@given(st.lists(st.one_of(st.floats(1, 1e6), st.just(math.nan)), min_size=1, max_size=50))
def test_typical_noise_pnn_and_slowest_as_defined(k):
    k = np.array(k)
    timed = k[~np.isnan(k)]
    if timed.size == 0:
        assert LA.at_quantile(k, 0.5) is None and LA.slowest(k) == []
        return
    assert LA.typical_ns(k) == float(np.median(timed))
    mad = float(np.median(np.abs(timed - np.median(timed))))
    assert LA.noise_ns(k) == max(3 * 1.4826 * mad, 100.0)
    srt = np.sort(timed)
    for q in (0.5, 0.9, 0.99):
        i = LA.at_quantile(k, q)
        assert k[i] == srt[max(math.ceil(q * srt.size) - 1, 0)]  # nearest rank: an actual launch
    top = LA.slowest(k)[0]
    assert k[top] == timed.max() and top == LA.at_quantile(k, 1.0)  # the p100 launch is the slowest
