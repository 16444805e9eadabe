"""What explain compares against (``timeline.analysis.sides``): a side's typical launch
from the launches nearest its median, and whether two sides compare at all, each
reason to abstain named (issue 40, 2), the launches paired by key or by position."""

from __future__ import annotations

import json

import numpy as np
import pytest

from timeline.analysis import sides as SD
from timeline.cli import main
from timeline.contract import graph as G
from timeline.contract import schema as S
from timeline.core import launchkey as KY

BASE = S.Spec("k", [("a", 4), ("b", 2)], grid=64, graph={"b": [G.every("a")]})


def about(ranks=(0, 1), synthetic=False, keys=None):
    keys = keys if keys is not None else [KY.LaunchKey(0, la) for la in range(4)]
    return {"launches": len(keys), "ranks": list(ranks), "keys": keys, "synthetic": synthetic}


@pytest.mark.parametrize("b,why", [
    (BASE.replace(stages=(("a", 4), ("c", 2)), graph={}), "different stage lists"),
    (BASE.replace(stages=(("a", 8), ("b", 2))), "different task counts: a 4 vs 8"),
    (BASE.replace(graph={"b": [G.same("a")]}), "different task graphs"),
    (BASE.replace(grid=128), "different grids: A 64 CTAs, B 128"),
    (BASE.replace(clock="globaltimer"), "clocks of different kinds: A memrealtime, B globaltimer"),
])
def test_each_reason_not_to_compare_is_named(b, why):
    c = SD.comparability(BASE, b, about(), about())
    assert not c.comparable and any(why in r for r in c.reasons), c.reasons
    assert why in c.says()


def test_synthetic_against_measured_and_other_ranks_do_not_compare():
    c = SD.comparability(BASE, BASE, about(), about(synthetic=True))
    assert c.reasons == ["side B is SYNTHETIC (a model), the other measured"]
    c = SD.comparability(BASE, BASE, about(ranks=(0, 1)), about(ranks=(0, 1, 2)))
    assert c.reasons == ["different ranks: A [0, 1], B [0, 1, 2]"]


def test_launches_are_paired_by_key_where_both_carry_headers_else_by_position():
    c = SD.comparability(BASE, BASE, about(), about(keys=[KY.LaunchKey(0, la) for la in range(2, 6)]))
    assert c.comparable and (c.by, c.paired) == ("(step, layer)", 2)
    bare = [KY.LaunchKey(capture="x", slot=i) for i in range(3)]
    c = SD.comparability(BASE, BASE, about(), about(keys=bare))
    assert (c.by, c.paired) == ("position", 3)


def test_a_side_is_typical_over_the_launches_nearest_its_median():
    k = np.array([100.0, 300.0, 101.0, 102.0, 99.0, 500.0, np.nan])
    assert SD.nearest(k, 3) == [2, 3, 0]  # median 101.5: 101, 102, 100
    assert SD.nearest(k, 3, leave_out=[2]) == [3, 0, 4]
    loaded = []
    s = SD.side("t", list(range(7)), k, lambda key: loaded.append(key) or _trace(), leave_out=[5])
    assert len(loaded) == min(SD.TYPICAL_LAUNCHES, 5) and 5 not in loaded
    assert s.typical_ns == 101.5 and s.noise_ns >= 100.0
    few = SD.side("t", [0, 1], np.array([1.0, 2.0]), lambda key: pytest.fail("read"))
    assert few.typical is None


def _trace():
    from timeline.ingest import synth_graph as SG

    return SG.graph_trace(SG.graph_spec(*SG.profiles()["triton-ffn"], launches=1), seed=0)


def test_the_cli_abstains_naming_each_reason(tmp_path, capsys):
    assert main(["explain", "traces/h200_whatif_delay4000.arrow", "--baseline", "traces/h200_tp2_rank0.arrow",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"].startswith("cannot compare B with A: different stage lists")
    assert doc["baseline"]["comparable"] is False and not doc["explained"]
    assert main(["synth", "-q", "-o", str(tmp_path / "s.arrow"), "--profile", "triton-ffn", "--launches", "8"]) == 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "s.arrow"), "--baseline", "traces/h200_whatif_delay0.arrow", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "side B is SYNTHETIC" in doc["verdict"]
