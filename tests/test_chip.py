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
from timeline.ingest import synth_chip as SCH
from timeline.ingest import synth_graph as SG

TRACES = Path(__file__).resolve().parent.parent / "traces"


def _check_against_direct(trace, launch: int, rank: int = 0):
    """The columnar report of one launch equals ``chipkit.direct`` to the ns."""
    vendor = CHP.vendor_levels(trace.tasks, trace.spec.arch)
    want = chipkit.direct(trace, launch, rank, vendor)
    c = CHP.chip(trace, [launch])
    fine = [n for n in c.level_names if n != "slot"][-1]
    u = c.units.filter(np.asarray(c.units.column("level").to_pylist()) == fine).to_pylist()
    plain = lambda name: name.removeprefix(f"r{rank}.") if trace.ranks != [0] else name  # noqa: E731 - ranks named
    got = {plain(r["unit"]): (r["busy_ns"], r["wait_ns"], r["idle_ns"], r["last_end_ns"]) for r in u
           if r["rank"] == rank}
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


@pytest.mark.parametrize("arch,units,waves", [("gfx942", 304, 1), ("gfx950", 256, 4), ("sm_90", 132, 2)])
def test_synth_chips_equal_the_direct_computation(arch, units, waves):
    grid, chip = SCH.chip(arch, waves=waves)
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=2, waves=waves, arch=arch)
    trace = SG.graph_trace(spec, grid=grid, seed=11, chip=chip)
    for rank in (0, 1):
        c = _check_against_direct(trace, 1, rank)
    assert CHP.rows_of(trace)[0].disjoint == (waves == 1)  # both ways of a union: sums, and sweeps where waves overlap
    amd = arch.startswith("gfx")
    want = ("xcd", "se", "cu") if amd else ("sm",)
    assert c.level_names == want + (("slot",) if waves > 1 else ())
    fine = c.units.filter(np.asarray(c.units.column("level").to_pylist()) == want[-1])
    assert fine.num_rows == 2 * units  # one CTA a unit: every unit of the chip, on each rank
    if amd:  # XCDs sum their CUs
        lv = c.units.to_pandas()
        lv = lv[(lv["rank"] == 0)]
        assert lv[lv.level == "xcd"].busy_ns.sum() == lv[lv.level == "cu"].busy_ns.sum()
        assert sorted(lv[lv.level == "xcd"].units) == [units // 8] * 8


def test_slow_unit_lands_where_it_says_and_nowhere_else():
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=1, launches=1, arch="gfx942")
    grid, clean = SCH.chip("gfx942")
    _, slow = SCH.chip("gfx942", slows=["xcd3.se1:+25%"])
    a, b = (SG.graph_trace(spec, grid=grid, seed=4, chip=c).tasks.to_pandas() for c in (clean, slow))
    own = lambda t: (t.end_ns - t.hint_ns)  # noqa: E731 - staging + compute + epilogue
    hit = (b.xcc == 3) & (b.se == 1)
    assert hit.sum() > 0 and (b.xcc.nunique(), (b.cu[b.xcc == 0]).max()) == (8, 9)
    assert np.abs(own(b)[hit] - 1.25 * own(a)[hit]).max() <= 20  # two of the clock's 10 ns ticks
    first = b.start_ns.min()
    untouched = (b.start_ns - first) < (b.start_ns[hit] - first).min()
    assert (a[untouched][["start_ns", "end_ns"]].values - first == b[untouched][["start_ns", "end_ns"]].values
            - first).all()


@pytest.mark.parametrize("text", ["xcd3", "xcd3:20%", "cu17:+0%", "foo:+5%", "xcd3.cu2:+5%", "sm40:+5"])
def test_slow_unit_form_refused_in_one_line(text):
    with pytest.raises(SCH.ChipError, match="--slow-unit"):
        SCH.parse_slow(text)


def test_slow_unit_not_on_the_chip():
    for arch, text in (("gfx942", "sm3:+5%"), ("sm_90", "xcd1:+5%"), ("gfx950", "xcd8:+5%"), ("sm_90", "sm132:+5%")):
        with pytest.raises(SCH.ChipError, match=text.split(":")[0]):
            SCH.chip(arch, slows=[text])
