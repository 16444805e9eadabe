"""``timeline explain`` of a run dataset (``timeline.cli.explain_run``), coded against the
run-dataset contract (``open_run(path).launches()`` / ``.launch(step, layer)``):
the p99 launch of a run found and explained against the launches nearest the median.
``StandInRun`` implements that contract over one trace until the run dataset lands."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from timeline.analysis import explain as X
from timeline.cli import explain_run as XN
from timeline.core import rows as R
from timeline.ingest import synth_graph as SG


class StandInRun:
    """The contract's two reading methods over one multi-launch trace: launch L is step L, layer 0."""

    def __init__(self, trace):
        self.trace = trace

    def launches(self, *, rank=None, step=None, layer=None) -> pa.Table:
        t = self.trace.tasks
        start, end = R.extent(R.phase_matrix(t, self.trace.phases))
        rk, la = R.column(t, "rank"), R.column(t, "launch")
        rows = []
        for r in np.unique(rk):
            for L in np.unique(la):
                sel = (rk == r) & (la == L)
                rows.append({"rank": int(r), "step": int(L), "layer": 0, "capture": "c0", "launch": int(L),
                             "start_ns": int(start[sel].min()), "end_ns": int(end[sel].max()),
                             "kernel_ns": int(end[sel].max() - start[sel].min()), "tasks": int(sel.sum()),
                             "anomalies": 0})
        return pa.Table.from_pylist(rows)

    def launch(self, step=None, layer=None, ranks=None, *, capture=None, slot=None):
        return self.trace.filter(launches=[step])


@pytest.fixture(scope="module")
def run():
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=8)
    return StandInRun(SG.graph_trace(spec, seed=4, inject=[SG.parse_injection("0:norm:9:compute:+15000@5")]))


def test_the_p99_launch_is_found_and_explained(run):
    keys, kernel = XN.run_kernel_times(run.launches())
    assert keys == [(s, 0) for s in range(8)] and int(np.argmax(kernel)) == 5
    assert XN.percentile_index(kernel) == 5  # 8 launches: the 99th percentile is the slowest
    trace, typ, launch, key = XN.explain_run(run)
    assert key == (5, 0) and launch == 5 and typ.kernel_ns.size == 7  # the noise: the other launches
    e = X.explain_launch(trace, launch, typ)
    first = X.significant(e)[0]
    assert (first.rank, trace.spec.stage_names[first.stage], first.task) == (0, "norm", 9)


def test_a_named_launch_and_a_missing_one(run):
    assert XN.explain_run(run, step=2, layer=0)[3] == (2, 0)
    with pytest.raises(X.ExplainError, match="--step 42 --layer 0: no such launch in the run"):
        XN.explain_run(run, step=42, layer=0)


def test_percentile_by_nearest_rank():
    k = np.arange(200)[::-1]  # 200 launches, the slowest first
    assert XN.percentile_index(k) == 2  # nearest rank ceil(0.99 * 200) = 198: the 198th smallest, 197, at index 2


def test_a_run_folder(tmp_path, capsys):
    """The command on a run folder: with the run dataset, its p99 launch (a capture's
    slot here: the synthetic trace has no slot headers) explained; without it (before
    the run-dataset work lands), one line saying so."""
    import json

    from timeline.cli import main

    folder = tmp_path / "run"
    try:
        from timeline import run as RN
    except ImportError:
        folder.mkdir()
        assert main(["explain", str(folder)]) == 2
        assert "read as a run dataset, but this build has no timeline.run" in capsys.readouterr().err
        return
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=8)
    RN.append(folder, SG.graph_trace(spec, seed=4, inject=[SG.parse_injection("0:norm:9:compute:+15000@5")]))
    assert main(["explain", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = doc["explained"][0]["culprits"][0]
    assert (first["rank"], first["stage"], first["task"], first["significant"]) == (0, "norm", 9, True)
    assert "--slot 5 --json" in first["reproduce"] and "--capture" in first["reproduce"]
