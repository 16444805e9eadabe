"""``timeline.analysis.compare`` (a typical launch, the per-stage delta) and the
concurrency coarsening of ``timeline.analysis``, on tables whose answer is known."""

from __future__ import annotations

import pyarrow as pa

from timeline.analysis import stages as A
from timeline.analysis import compare as C


def test_median_per_stage():
    r = pa.table({"rank": [0, 0, 1, 1, 0], "launch": [0, 0, 0, 0, 1], "stage": ["a", "b", "a", "b", "a"],
                  "tasks": [4, 2, 4, 2, 4], "span_us": [1.0, 5.0, 3.0, None, 8.0]})
    m = C.median_per_stage(r)
    assert m.column("stage").to_pylist() == ["a", "b"]
    assert m.column("span_us").to_pylist() == [3.0, 5.0] and m.column("tasks").to_pylist() == [4, 2]


def test_compare_table_deltas():
    a = pa.table({"stage": ["x", "y"], "span_us": [10.0, 4.0], "start→hint p50_us": [1.0, 2.0]})
    b = pa.table({"stage": ["y", "x"], "span_us": [3.0, 15.0], "start→hint p50_us": [2.5, 0.5]})
    rows = C.compare_table(a, b)
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
