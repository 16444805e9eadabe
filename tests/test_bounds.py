"""Uncertainty carried through (issue 40, 3): every cross-rank statement ``explain``
makes carries the alignment bound of the ranks it compares, and one it calls certain
holds for any placement of the ranks within their bounds. The property test: a
two-rank SYNTHETIC trace whose ranks are stated aligned within ± U, each rank moved by
any offset within ± U: no arrival order and no culprit called certain changes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.analysis import bounds as BD
from timeline.analysis import explain as X
from timeline.analysis import sides as SD
from timeline.contract import clocks as K
from timeline.core.trace import Trace, retime
from timeline.ingest import synth_graph as SG

SPEC = SG.graph_spec(*SG.profiles()["glm5"], world=2, launches=6)


def stated(trace, u: float, moved: dict) -> Trace:
    """``trace`` with each rank's axis moved by ``moved[rank]`` ns and stated aligned by
    measured clocks within ``± u`` (as a merge by clocks writes it)."""
    offsets = {r: trace.offsets.get(r, 0) + int(moved.get(r, 0)) for r in trace.ranks}
    specs = [sp.replace(extra={**sp.extra, K.ALIGNMENT: {"by": "clocks", "uncertainty_ns": float(u)}})
             for sp in trace.specs]
    tasks = retime(trace.tasks, {sp.rank: sp for sp in specs}, trace.origins, offsets)
    return Trace(tasks, specs, trace.anomalies, origins=trace.origins, offsets=offsets, synthetic=True)


def statements(trace) -> tuple:
    """``(arrivals called certain {(rule, launch): last rank}, the culprit called certain
    or None)`` of ``explain`` on launch 4 against the trace's typical launch."""
    k = X.kernel_times(trace)[1].astype(float)
    side = SD.side("t", list(range(len(k))), k, lambda i: trace.filter(launches=[i]), leave_out=[4])
    e = X.explain_launch(trace, 4, side.typical, kernel_ns=float(k[4]), typical_ns=side.typical_ns, noise=side.noise_ns)
    al = BD.alignment(trace, int(e.graph.cross_rank.size))
    arrivals = {(c, p, la): a.last for c, p, per in BD.arrivals(trace, al) for la, a in per.items() if a.certain}
    sig = X.significant(e)
    certain = sig and BD.culprits_certain([c.saving_ns for c in e.culprits], e.noise_ns, al)
    return arrivals, (SD.identity(e, sig[0]) if certain else None), al


@pytest.fixture(scope="module")
def base():
    return SG.graph_trace(SPEC, grid=64, seed=9, inject=[SG.parse_injection("1:o:*:compute:+1500@4")])


@settings(max_examples=20, deadline=None)
@given(u=st.sampled_from([100.0, 600.0, 1500.0]), d0=st.floats(-1, 1), d1=st.floats(-1, 1))
def test_no_statement_called_certain_changes_within_the_bounds(base, u, d0, d1):
    nominal = stated(base, u, {})
    arrivals, culprit, al = statements(nominal)
    assert al.kind in (BD.MEASURED, BD.CONTRADICTED)
    moved_arrivals, moved_culprit, moved_al = statements(stated(base, u, {0: d0 * u, 1: d1 * u}))
    for k, last in arrivals.items():
        if moved_al.kind == BD.MEASURED:  # a placement the clocks contradict says nothing certain at all
            assert moved_arrivals.get(k, last) == last, (k, last)
    if culprit is not None and moved_al.kind == BD.MEASURED:
        assert moved_culprit in (None, culprit)


def test_an_arrival_within_the_bound_is_not_certain_and_names_both_ranks():
    al = BD.Alignment(BD.MEASURED, {0: 500.0, 1: 400.0})
    a = BD.arrival({0: 10_000, 1: 9_500}, al)  # rank 0 last by 500 ns, within the 900 ns the two bounds allow
    assert a.last == 0 and not a.certain and set(a.tied) == {0, 1}
    b = BD.arrival({0: 10_000, 1: 9_000}, al)
    assert b.certain and b.tied == (0,)
    assumed = BD.Alignment(BD.ASSUMED, {0: None, 1: None})
    assert not BD.arrival({0: 10_000, 1: 1_000}, assumed).certain
    one = BD.Alignment(BD.ONE_CLOCK, {0: 0.0})
    assert BD.culprits_certain([5_000.0], 1_000.0, one)


def test_a_culprit_ranking_is_certain_only_past_twice_the_spread():
    al = BD.Alignment(BD.MEASURED, {0: 300.0, 1: 300.0})  # spread 600 ns
    assert BD.culprits_certain([5_000.0, 3_000.0], 1_000.0, al)
    assert not BD.culprits_certain([5_000.0, 4_000.0], 1_000.0, al)  # lead 1,000 < 1,200
    assert not BD.culprits_certain([1_500.0], 1_000.0, al)  # margin over the noise 500 < 1,200
    assert not BD.culprits_certain([5_000.0], 1_000.0, BD.Alignment(BD.CONTRADICTED, {0: 1.0, 1: 1.0}, 3))


def test_explain_text_names_both_ranks_when_the_bound_cannot_settle_the_order(base):
    from timeline.analysis import explain_report as XR

    t = stated(base, 50_000.0, {})  # a bound far past any lead: no arrival is certain
    al = BD.alignment(t)
    recs = XR.arrival_records(t, al, {})
    assert recs and all(r["certain_launches"] == 0 for r in recs)
    assert all("certain in 0 of" in r["says"] for r in recs)
    np.testing.assert_equal(al.spread, 100_000.0)
