"""``timeline explain`` of a run, as of a trace file: the slowest launch by default (not
the p99 one), ``--p99`` the p99 launch by ``timeline.analysis.launches``' one rule (the
one ``summary --p99`` and ``launches`` name), the launch named by its key everywhere
(text, JSON, ``reproduce``), on runs with slot headers and without."""

from __future__ import annotations

import json

import numpy as np
import pytest

from timeline.analysis import launches as LA
from timeline.cli import main
from timeline.ingest import synth_graph as SG
from timeline.run import write as RW

FFN = SG.profiles()["triton-ffn"]


def _run(tmp_path, name, headers: bool, inject="0:norm:9:compute:+15000@5", launches=8):
    spec = SG.graph_spec(*FFN, world=2, launches=launches)
    slots = [(0, la) for la in range(launches)] if headers else None
    trace = SG.graph_trace(spec, seed=4, inject=[SG.parse_injection(inject)] if inject else [], slots=slots)
    folder = tmp_path / name
    RW.append(folder, trace, capture="cap.arrow")
    return folder


def _doc(capsys, *argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("headers", [True, False])
def test_the_slowest_launch_is_explained_and_named_by_its_key(tmp_path, capsys, headers):
    folder = _run(tmp_path, "r", headers)
    key = "0:5" if headers else "cap.arrow:5"
    doc = _doc(capsys, "explain", str(folder))
    e = doc["explained"][0]
    assert e["launch"] == key and doc["launches"][0]["launch"] == key
    first = e["culprits"][0]
    assert (first["rank"], first["stage"], first["task"], first["significant"]) == (0, "norm", 9, True)
    assert f"--launch {key} --json" in first["reproduce"] and f"--launch {key}" in e["path"]["reproduce"]
    assert key in e["verdict"]
    # the text names it too
    assert main(["explain", str(folder)]) == 0
    assert f"launch {key} took" in capsys.readouterr().out


def test_one_injected_slow_launch_among_many_is_the_one_explained(tmp_path, capsys):
    """400 launches, one +20 µs: the slowest is explained, not the p99 launch (issue 39, 5)."""
    spec = SG.graph_spec(*FFN, world=1, launches=200)
    folder = tmp_path / "many"
    for part in range(2):
        trace = SG.graph_trace(spec, seed=7 + part, inject=[SG.parse_injection("0:norm:9:compute:+20000@133")]
                               if part else [], model=SG.Model(kernel_seed=7),
                               slots=[(part, la) for la in range(200)])
        RW.append(folder, trace, capture=f"c{part}")
    doc = _doc(capsys, "explain", str(folder))
    assert doc["explained"][0]["launch"] == "1:133"
    p99 = _doc(capsys, "explain", str(folder), "--p99")["explained"][0]["launch"]
    assert p99 != "1:133"
    assert _doc(capsys, "summary", str(folder), "--p99")["p99_launch"] == p99 == \
        _doc(capsys, "launches", str(folder))["kernel_time"]["p99_launch"]


def test_top_n_explains_n_launches_of_a_run(tmp_path, capsys):
    folder = _run(tmp_path, "r", True)
    doc = _doc(capsys, "explain", str(folder), "--top", "3")
    got = [e["launch"] for e in doc["explained"]]
    rows = _doc(capsys, "launches", str(folder), "--slowest", "3")["rows"]
    assert got == [r["launch"] for r in rows] and len(got) == 3


def test_a_named_launch_and_a_missing_one(tmp_path, capsys):
    folder = _run(tmp_path, "r", True)
    assert _doc(capsys, "explain", str(folder), "--launch", "0:2")["explained"][0]["launch"] == "0:2"
    assert main(["explain", str(folder), "--launch", "0:42"]) == 2
    err = capsys.readouterr().err
    assert "--launch 0:42: no such launch" in err and "0:0, 0:1" in err and err.count("\n") == 1


def test_launches_and_explain_give_one_kernel_time(tmp_path, capsys):
    """Issue 39, 6: the same launch's kernel time in `launches` and `explain` (the first
    start to the last end over its ranks on their common axis)."""
    folder = _run(tmp_path, "r", True)
    rows = {r["launch"]: r["kernel_us"] for r in _doc(capsys, "launches", str(folder))["rows"]}
    doc = _doc(capsys, "explain", str(folder), "--launch", "0:3")
    assert doc["explained"][0]["kernel_us"] == rows["0:3"]
    assert {r["launch"]: r["kernel_us"] for r in doc["launches"]} == {k: rows[k] for k in
                                                                        [r["launch"] for r in doc["launches"]]}


def test_nearest_rank_quantiles():
    k = np.arange(200, dtype=float)[::-1]  # 200 launches, the slowest first
    assert LA.at_quantile(k, 0.99) == 2  # nearest rank ceil(0.99 * 200) = 198: the 198th smallest, 197, at index 2
    assert LA.at_quantile(k, 0.5) == 100 and LA.slowest(k, 2) == [0, 1]
    assert LA.quantiles(k, (0.5, 0.99)) == [99.0, 197.0]
