"""The what-if replay level by level (``timeline.analysis.whatif_levels``, which ``timeline
chip``'s rebalancing replays run on) against the one-task-at-a-time loop it stands for
(``whatif.replay`` with a plan without a ``Schedule``): the same simulated times to the
bit, with changes and single tasks' added ns, on random task graphs (ties included: a
producer that comes after its consumer in the order, so a group is read in part), on
the bundled traces and on a SYNTHETIC gfx942 launch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_edges_fast import cases, trace_of
from timeline import load
from timeline.analysis import AnalysisError
from timeline.analysis import edges as E
from timeline.analysis import whatif as W
from timeline.analysis import whatif_levels as WL
from timeline.contract import graph as G
from timeline.contract import schema as S

TRACES = Path(__file__).resolve().parent.parent / "traces"


def _both(trace, changes=(), task_ns=None) -> tuple:
    """``(levels, loop, schedule)``: the simulated times of the replay by levels (the
    schedule forced, however narrow) and by the loop."""
    g = E.edges(trace)
    p = W.plan(trace, g)
    s = WL.schedule(p, g.producers.groups, rounds=g.tasks.n + 1)
    assert s is not None
    by_levels = W.replay(trace, changes, g, task_ns=task_ns, plan_=p._replace(schedule=s)).simulated
    by_loop = W.replay(trace, changes, g, task_ns=task_ns, plan_=p._replace(schedule=None)).simulated
    return by_levels, by_loop, s


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), st.data())
def test_levels_replay_the_loop_to_the_bit_on_random_graphs(case, data):
    spec, records, _ = case
    trace = trace_of(spec, records)
    if trace.tasks.num_rows == 0:
        return
    try:
        W.plan(trace, E.edges(trace))
    except AnalysisError:
        return  # causality violations: no replay either way
    n = E.edges(trace).tasks.n
    changes = [W.Change(data.draw(st.sampled_from(spec.stage_names)), None,
                        data.draw(st.sampled_from([0.0, 0.5, 2.0])), data.draw(st.integers(0, 40)))]
    task_ns = np.zeros((n, len(trace.phases) - 1))
    task_ns[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(-30, 50))
    a, b, _ = _both(trace, changes, task_ns)
    assert np.array_equal(a, b)
    a, b, _ = _both(trace)
    assert np.array_equal(a, b)


def _partial_trace():
    """Stage ``p`` (2 tasks) feeds every task of ``c`` (one group reference each); p's
    task 1 ends as c's task 0's wait ends, and starts later: it comes after c's task 0
    in the order, so c's task 0 reads its group in part (task 0 simulated, task 1's
    recorded end still to come)."""
    stages = [("p", 2), ("c", 1)]
    spec = S.Spec("partial", stages, world=1, launches=1, graph={"c": [G.every("p")]})
    records = [[(0, "p", 0, 0, [100, 101, 102, 103, 104]), (0, "p", 1, 1, [105, 110, 110, 110, 110]),
                (0, "c", 0, 2, [100, 110, 111, 112, 113])]]
    return trace_of(spec, records)


def test_a_group_read_in_part_by_levels_as_by_the_loop():
    trace = _partial_trace()
    for add in (0.0, 3.0, -2.0):
        task_ns = np.full((E.edges(trace).tasks.n, len(trace.phases) - 1), add)
        a, b, s = _both(trace, [W.Change("p", None, 1.5)], task_ns)
        assert s.partial and np.array_equal(a, b)


@pytest.mark.parametrize("name", ["h100_explain_base.arrow", "h200_mono_hybrid.arrow", "h200_tp2_rank0.arrow",
                                  "h200_whatif_delay4000.arrow"])
def test_levels_replay_the_loop_on_the_bundled_traces(name):
    trace = load(TRACES / name)
    n = E.edges(trace).tasks.n
    rng = np.random.default_rng(5)
    task_ns = rng.normal(0, 800, (n, len(trace.phases) - 1)) * (rng.random((n, 1)) < 0.3)
    for changes, add in (((), None), ([W.Change(trace.spec.stage_names[-1], None, 0.6)], task_ns)):
        a, b, _ = _both(trace, changes, add)
        assert np.array_equal(a, b)
    g = E.edges(trace)
    assert W.plan(trace, g).schedule is not None  # wide and shallow: the replay runs by levels by default


def test_a_synthetic_chip_launch_replays_by_levels_to_the_bit():
    from timeline.ingest import synth_chip as SCH
    from timeline.ingest import synth_graph as SG

    spec = SG.graph_spec(*SG.profiles()["dsv4"], world=2, launches=1, arch="gfx942")
    grid, chip = SCH.chip("gfx942", slows=["xcd3:+10%"])
    trace = SG.graph_trace(spec, grid=grid, seed=4, chip=chip, model=SG.Model(task_sigma=0.05))
    n = E.edges(trace).tasks.n
    task_ns = np.where(np.arange(n)[:, None] % 7 == 0, -25.5, 0.0) * np.ones((1, len(trace.phases) - 1))
    a, b, s = _both(trace, (), task_ns)
    assert np.array_equal(a, b) and len(s.levels) < n / 100
