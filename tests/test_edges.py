"""The task graph read against a trace (``timeline.contract.graph``, ``timeline.analysis.edges``):
gating producers, slack, causality violations, missing producers and the exact
critical path, on hand-built traces whose every answer is computed by hand (ticks of
10 ns from origin tick 100), across two ranks through an all-reduce, and on the
bundled real H200 trace with the Triton demo's graph."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bufkit import empty, put
from timeline import collect, load, merge
from timeline.contract import presets
from timeline.ingest import CollectError
from timeline.analysis import edges as E
from timeline.contract import graph as G
from timeline.contract import schema as S
from timeline.analysis import AnalysisError

REPO_TRACE = "traces/h200_mono_demo.arrow"
SPEC = S.Spec("hand", [("a", 2), ("b", 2)], graph={"b": [G.every("a")]})


def hand(records, spec=SPEC):
    """A trace of ``records``: ``(stage, task, cta, ticks)``."""
    buf = empty(spec)
    for stage, task, cta, ticks in records:
        put(buf, spec, stage=stage, task=task, ticks=ticks, cta=cta)
    return collect(buf, spec)


# a/0 on CTA 0 ends at 110 ns, a/1 on CTA 1 at 210 ns; b/0 (CTA 0) begins waiting at
# 120 ns and sees its data at 250 ns: a/1 held it; b/1 (CTA 1) begins at 220 ns, after
# both producers: its CTA held it
RECORDS = [("a", 0, 0, [100, 101, 102, 110, 111]), ("a", 1, 1, [100, 101, 102, 120, 121]),
           ("b", 0, 0, [112, 125, 126, 130, 131]), ("b", 1, 1, [122, 123, 124, 128, 129])]


def edge_rows(trace, g=None):
    """``{(consumer stage, task, producer stage, task, kind): (slack, gating)}``."""
    t = E.edges_table(trace, g).to_pylist()
    return {(r["stage"], r["task"], r["producer_stage"], r["producer_task"], r["kind"]): (r["slack_ns"], r["gating"])
            for r in t}


def test_gating_producer_and_slack_by_hand():
    trace = hand(RECORDS)
    g = E.edges(trace)
    assert edge_rows(trace, g) == {
        ("b", 0, "a", 0, "data"): (100, False),  # could have ended at 210 like a/1
        ("b", 0, "a", 1, "data"): (0, True),  # the latest producer, after b/0 began waiting
        ("b", 0, "a", 0, "cta-order"): (100, False),  # 10 ns of idle + 90 ns the data wait absorbed
        ("b", 1, "a", 0, "data"): (110, False),  # ready before b/1 began waiting at 220
        ("b", 1, "a", 1, "data"): (10, False),
        ("b", 1, "a", 1, "cta-order"): (0, True),  # the CTA was busy with a/1 until 210
    }
    assert g.violations.size == 0 and g.missing == 0
    m = g.tasks
    assert (m.wait_start[m.stage == 1].tolist(), m.wait_end[m.stage == 1].tolist()) == ([120, 220], [250, 230])


def test_ties_go_to_the_earliest_producer():
    tied = [("a", 0, 0, [100, 101, 102, 120, 121]), ("a", 1, 1, [100, 101, 102, 120, 121]),
            ("b", 0, 0, [112, 125, 126, 130, 131])]
    rows = edge_rows(hand(tied))
    assert rows[("b", 0, "a", 0, "data")] == (0, True) and rows[("b", 0, "a", 1, "data")] == (0, False)


def test_a_missing_producer_is_counted_not_invented():
    g = E.edges(hand(RECORDS[:1] + RECORDS[2:]))  # a/1's record never written
    assert g.missing == 2  # b/0 and b/1 each name a/1
    rows = edge_rows(hand(RECORDS[:1] + RECORDS[2:]))
    assert ("b", 0, "a", 1, "data") not in rows
    # a/0 ended at 110, before b/0 began waiting at 120: its CTA held it, not its data
    assert rows[("b", 0, "a", 0, "data")] == (10, False) and rows[("b", 0, "a", 0, "cta-order")] == (0, True)


def test_a_wait_that_ends_before_its_producer_is_ready_is_a_causality_violation():
    early = RECORDS[:2] + [("b", 0, 0, [112, 115, 126, 130, 131])] + RECORDS[3:]  # sees data at 150 ns
    g = E.edges(hand(early))
    m = g.tasks
    assert [(int(m.stage[i]), int(m.task[i])) for i in g.violations] == [(1, 0)]  # a/1 is ready at 200 ns


def test_exact_path_by_hand():
    path = E.exact_path(hand(RECORDS), launch=0).to_pylist()
    got = [(r["stage"], r["task"], r["kind"], r["start_ns"], r["end_ns"], r["via"]) for r in path]
    assert got == [("a", 1, "wait", 0, 10, ""), ("a", 1, "work", 10, 210, ""),
                   ("b", 0, "wait", 210, 250, "data"), ("b", 0, "work", 250, 310, "")]
    shares = E.path_shares(E.exact_path(hand(RECORDS), launch=0))
    assert shares.column("path_us").to_pylist() == pytest.approx([0.21, 0.1])


def test_all_reduce_edges_cross_ranks():
    """y on each rank waits for x on every rank: rank 1's x ends last, so rank 0's y
    is gated from rank 1 and the path crosses."""
    spec = S.Spec("tp", [("x", 1), ("y", 1)], world=2, graph={"y": [G.allreduce("x")]})
    ranks = []
    for r, x_end in ((0, 110), (1, 140)):
        sp = spec.replace(rank=r)
        buf = empty(sp)
        put(buf, sp, stage="x", task=0, ticks=[100, 101, 102, x_end - 1, x_end], cta=0)
        put(buf, sp, stage="y", task=0, ticks=[x_end + 1, 145 + r, 146 + r, 150 + r, 151 + r], cta=1)
        ranks.append(collect(buf, sp))
    trace = merge(ranks)
    t = E.edges_table(trace).to_pylist()
    assert sorted((r["rank"], r["producer_rank"]) for r in t if r["kind"] == "all-reduce") == \
        [(0, 0), (0, 1), (1, 0), (1, 1)]  # each y waits for both x
    gate0 = [r for r in t if r["rank"] == 0 and r["stage"] == "y" and r["gating"]]
    assert [(r["producer_rank"], r["kind"]) for r in gate0] == [(1, "all-reduce")]
    path = E.exact_path(trace, launch=0).to_pylist()
    assert [r["rank"] for r in path][0] == 1 and path[-1]["rank"] == 1  # rank 1 ends last, its y too
    path0 = E.exact_path(trace, launch=0, rank=0).to_pylist()
    assert {r["rank"] for r in path0} == {0, 1} and any(r["via"] == "all-reduce" for r in path0)


def test_graph_rules_are_checked_and_stored():
    with pytest.raises(S.SpecError, match=r"stage 'b' task 0 waits for 'a' tasks 0..2, but 'a' has 2 tasks"):
        S.Spec("x", [("a", 2), ("b", 2)], graph={"b": [G.block("a", 3)]})
    with pytest.raises(S.SpecError, match="unknown stage 'c'"):
        S.Spec("x", [("a", 2), ("b", 2)], graph={"b": [G.same("c")]})
    back = S.Spec.from_json(SPEC.to_json())
    assert back.graph == SPEC.graph and S.Spec.from_json(S.Spec("x", [("a", 1)]).to_json()).graph == {}
    r = G.tiles("up", 32, div=4, mul=32)
    assert [r.lo(t) for t in (0, 3, 4, 63)] == [0, 0, 32, 480] and G.mod("a", 3).lo(7) == 1
    with pytest.raises(AnalysisError, match="declares no task graph"):
        E.edges(hand(RECORDS, S.Spec("hand", [("a", 2), ("b", 2)])))


PLAIN = S.Spec("hand", [("a", 2), ("b", 2)], launches=2)


def test_listed_edges_supplied_at_collect_time(tmp_path):
    """MoE-style routing: b/0 waits for a/1 in every launch, b/1 for a/0 in launch 0
    only and for nothing listed in launch 1; the listed rule travels in the file."""
    buf = empty(PLAIN)
    for launch in (0, 1):
        for stage, task, cta, ticks in RECORDS:
            put(buf, PLAIN, stage=stage, task=task, ticks=[t + 1000 * launch for t in ticks], cta=cta, launch=launch)
    routed = [G.Edge("b", 0, "a", 1), ("b", 1, "a", 0, 0)]
    trace = collect(buf, PLAIN, edges=routed)
    (rule,) = trace.spec.graph["b"]
    assert rule.listed and sorted(rule.pairs) == [(-1, 0, 1), (0, 1, 0)]
    t = E.edges_table(trace).to_pylist()
    data = sorted((r["launch"], r["task"], r["producer_task"], r["gating"]) for r in t if r["kind"] == "data")
    assert data == [(0, 0, 1, True), (0, 1, 0, False), (1, 0, 1, True)]  # a/1 held b/0's wait, as by hand
    gate_b1 = [(r["launch"], r["kind"]) for r in t if r["task"] == 1 and r["gating"]]
    assert gate_b1 == [(0, "cta-order"), (1, "cta-order")]  # b/1's CTA was busy with a/1 until 210
    trace.save(tmp_path / "routed.arrow")
    back = load(tmp_path / "routed.arrow")
    assert back.spec.graph == trace.spec.graph and E.edges_table(back).equals(E.edges_table(trace))


def test_listed_edges_are_checked():
    buf = empty(PLAIN)
    with pytest.raises(S.SpecError, match=r"listed edge \(-1, 0, 2\) names 'a' task 2, but it has 2 tasks"):
        collect(buf, PLAIN, edges=[("b", 0, "a", 2)])
    with pytest.raises(S.SpecError, match="unknown stage 'z'"):
        collect(buf, PLAIN, edges=[("b", 0, "z", 0)])
    with pytest.raises(CollectError, match="names launch 2, but a buffer of 'hand' holds 2 launch slots"):
        collect(buf, PLAIN, edges=[("b", 0, "a", 0, 2)])
    with pytest.raises(S.SpecError, match=r"\(launch, consumer task, producer task\) triples"):
        S.Spec("x", [("a", 1)], graph={"a": [{"stage": "a", "pairs": [[0, 0]]}]})


def test_the_real_trace_has_no_causality_violation_under_its_graph():
    """The bundled H200 trace of the Triton FFN demo, read against the demo's own
    mailbox rules: every norm and down task saw its data after it was ready."""
    trace = load(REPO_TRACE).with_graph(presets.triton_ffn())
    g = E.edges(trace)
    assert g.missing == 0 and g.violations.size == 0
    m = g.tasks
    down = m.stage == trace.spec.stage_index("down")
    assert (g.gate[down] >= 0).all()  # every down task was held by something
    norm = m.stage == trace.spec.stage_index("norm")
    held = g.kind[g.gate[norm]]  # docs/GRAPH.md: most norm waits are their own polls, not their data
    assert (int((held == 0).sum()), int((held == 2).sum())) == (115, 909)
    for launch in trace.launches:
        path = E.exact_path(trace, launch=launch)
        d = path.column("duration_ns").to_numpy()
        s, e = path.column("start_ns").to_numpy(), path.column("end_ns").to_numpy()
        assert (d >= 0).all() and (s[1:] >= e[:-1] - 0).all()  # in time order, no overlap
        last = m.end[m.launch == launch].max()
        assert e[-1] == last  # it ends at the launch's last end


# -- what-if replay ----------------------------------------------------------------------------
def test_replay_without_change_is_the_recording():
    from timeline.analysis import whatif as W

    r = W.replay(hand(RECORDS))
    assert (r.simulated == r.recorded).all()
    assert W.fidelity(hand(RECORDS)) == W.Fidelity(0.0, 0.0)


def test_a_faster_producer_by_hand():
    """a's compute (staged→compute) halved: a/0 (80 ns of it) ends at 70, a/1 (180 ns)
    at 120; b/0, held by a/1, sees its data 40 ns later (its hand-off) at 160 and
    ends 60 ns after, at 220;
    b/1 starts 10 ns after a/1 (its idle) at 130, waits its own 10 ns and ends at 200.
    The launch: 310 ns measured, 220 predicted."""
    from timeline.analysis import whatif as W

    trace = hand(RECORDS)
    r = W.replay(trace, ["a.compute=0.5"])
    m = r.tasks
    ends = {(int(s), int(t)): float(e) for s, t, e in zip(m.stage, m.task, r.simulated[:, -1])}
    assert ends == {(0, 0): 70.0, (0, 1): 120.0, (1, 0): 220.0, (1, 1): 200.0}
    p = W.predict(trace, [W.Change("a", "compute", 0.5)])
    assert p.launches.to_pylist() == [{"launch": 0, "measured_us": 0.31, "predicted_us": 0.22,
                                       "saving_us": pytest.approx(0.09)}]
    slower = W.replay(trace, [W.parse_change("b=2")])  # every b interval but its wait, doubled
    assert slower.simulated[:, -1].max() == 250 + 2 * 60
    added = W.replay(trace, [W.parse_change("a.compute=100", add=True)])
    assert added.simulated[m.stage == 0, -1].tolist() == [210.0, 310.0]
    # taking away more than an interval lasted leaves it at no time, not less: as if scaled by 0
    gone = W.replay(trace, [W.parse_change("a.compute=-1e9", add=True)])
    assert (gone.simulated == W.replay(trace, ["a.compute=0"]).simulated).all()
    assert (np.diff(gone.simulated, axis=1) >= 0).all()


def test_replay_refuses_what_it_cannot_predict():
    from timeline.analysis import whatif as W

    with pytest.raises(AnalysisError, match="causality violations"):
        W.replay(hand(RECORDS[:2] + [("b", 0, 0, [112, 115, 126, 130, 131])] + RECORDS[3:]))
    with pytest.raises(AnalysisError, match="the wait for producers, which the replay predicts"):
        W.replay(hand(RECORDS), ["b.hint=0.5"])
    with pytest.raises(AnalysisError, match="unknown stage"):
        W.replay(hand(RECORDS), ["zz=0.5"])
    with pytest.raises(AnalysisError, match="give STAGE=X"):
        W.parse_change("a.compute")


@pytest.mark.parametrize("name", ["h200_mono_demo.arrow", "h200_mono_warps.parquet"])
def test_replay_reproduces_the_real_traces_exactly(name):
    """Fidelity on the bundled H200 traces of the Triton FFN demo (CTA mode, and one
    record per warp), read with the demo's graph: 0 ns on every task and launch."""
    from timeline.analysis import whatif as W

    trace = load(f"traces/{name}").with_graph(presets.triton_ffn())
    assert W.fidelity(trace) == W.Fidelity(0.0, 0.0)


def test_the_committed_what_if_traces():
    """The H200 run of bench/whatif_gpu.py: both settings carry the demo's graph, the
    replay reproduces each to 0 ns, and the spin added ~4 µs to every norm task's
    compute (what the replay was told to add)."""
    from timeline.analysis import whatif as W

    fast, slow = (load(f"traces/h200_whatif_delay{d}.arrow") for d in (0, 4000))
    assert fast.spec.graph == slow.spec.graph == load(REPO_TRACE).with_graph(presets.triton_ffn()).spec.graph
    assert W.fidelity(fast) == W.fidelity(slow) == W.Fidelity(0.0, 0.0)

    def norm_compute(t):
        iv = t.intervals.filter(pc.equal(t.intervals.column("stage"), "norm"))
        ph, d = iv.column("phase").to_pylist(), iv.column("duration_ns").to_numpy()
        return float(np.median(d[[p == "staged→compute" for p in ph]]))

    assert 3800 <= norm_compute(slow) - norm_compute(fast) <= 4300


def test_the_committed_run_predicts_the_spin_within_the_goal():
    """bench/results/whatif_h200.txt's +0 -> +4 µs row, recomputed from the committed
    traces: the kernel time +4 µs predicts from the +0 trace is within 1 µs and 10 % of
    the measured change, and back."""
    from timeline.analysis import whatif as W

    fast, slow = (load(f"traces/h200_whatif_delay{d}.arrow") for d in (0, 4000))

    base = W.predict(fast, [W.Change("norm", "compute", 1.0, 4000.0)]).launches
    back = W.predict(slow, [W.Change("norm", "compute", 1.0, -4000.0)]).launches
    m0, m4 = (float(np.median(t.column("measured_us").to_numpy())) for t in (base, back))
    p4, p0 = (float(np.median(t.column("predicted_us").to_numpy())) for t in (base, back))
    change = m4 - m0
    assert change > 3.5
    assert abs(p4 - m4) <= min(1.0, 0.1 * change) and abs(p0 - m0) <= min(1.0, 0.1 * change)


# -- a graph from a user's JSON: anything is checked, or refused as a GraphError ----------------------
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 300) | st.integers() | st.floats(allow_nan=True)
                     | st.sampled_from(["up", "norm", "down", "nope", "", "1"]),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.sampled_from(["stage", "count", "div", "mul", "mod", "offset", "allreduce",
                                                        "pairs", "up", "norm", "down", "x"]), inner, max_size=5),
                     max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(graph=st.dictionaries(st.sampled_from(["up", "norm", "down", "nope"]), _JSON, max_size=3) | _JSON)
@example(graph={"up": None})  # each of these raised a TypeError or OverflowError, not a GraphError
@example(graph={"norm": 5})
@example(graph="up")
@example(graph={"up": {"stage": None, "pairs": None}})
@example(graph={"norm": {"stage": "up", "count": float("inf")}})
@example(graph={"norm": {"stage": "up", "offset": 2 ** 63}})
@example(graph={"norm": {"stage": "up", "pairs": [[0, 10 ** 40, 1]]}})
def test_any_json_graph_is_checked_or_refused_in_one_line(graph):
    """What ``set-graph --graph`` reads from a file, whatever it holds: a checked graph
    whose every rule names a stage and tasks the spec has, or one ``GraphError`` line;
    never another exception."""
    stages = [("up", 8), ("norm", 4), ("down", 4)]
    try:
        checked = G.check_graph(graph, stages)
    except G.GraphError as e:
        assert str(e) and "\n" not in str(e)
        return
    count = dict(stages)
    for consumer, rules in checked.items():
        assert consumer in count
        for r in rules:
            assert r.stage in count and r.count >= 0 and r.div >= 1
