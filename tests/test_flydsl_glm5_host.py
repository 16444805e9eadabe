"""Host side of the GLM-5-shaped FlyDSL demo (``instrument.demo.flydsl_glm5``), on the
CPU: its rotation agrees with the importer's rule, its producer map stays inside the
stages it names, its reference follows that map, its mailbox decoding reads the
tagged pairs it writes. Needs flydsl (the module is a kernel module) but no GPU."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flydsl", reason="the GLM-5 demo module imports flydsl (make setup-test installs it)")

from instrument.demo import flydsl_glm5 as G5  # noqa: E402
from instrument.demo import glm5_run  # noqa: E402
from timeline.ingest import legacy as L  # noqa: E402


@pytest.mark.parametrize("grid", [64, 256])
def test_every_task_runs_once_on_the_cta_the_importer_derives(grid):
    """The kernel's loops (first task, stride G) and ``legacy.rotation_ctas`` (what
    ``import-legacy --grid`` marks as derived placement) place every row alike."""
    want = L.rotation_ctas(L.GLM5_STAGES, grid)
    got = np.full(G5.N_TASKS, -1)
    for name, n in L.GLM5_STAGES:
        for bid in range(grid):
            for t in range(G5.first_task(bid, name, grid), n, grid):
                assert got[G5.FIRST[name] + t] == -1, (name, t)
                got[G5.FIRST[name] + t] = bid
    assert (got == want).all()


def test_rows_and_counts_are_the_kernels():
    assert G5.N_TASKS == 1061
    assert [G5.FIRST[n] for n, _ in L.GLM5_STAGES] == list(np.cumsum([0] + [c for _, c in L.GLM5_STAGES])[:-1])
    assert G5.SPEC.wait == L.GLM5_WAIT and G5.SPEC.marks == L.LEGACY_MARKS
    assert G5.SPEC.phases == L.LEGACY_PHASES and G5.SPEC.grid == L.GLM5_GRID


def test_producers_are_earlier_stages_and_inside_their_counts():
    order = [n for n, _ in L.GLM5_STAGES]
    for name, n in L.GLM5_STAGES:
        for p in G5.PRODUCERS[name]:
            assert order.index(p.stage) < order.index(name), (name, p)
            los = [p.lo(t) for t in range(n)]
            assert min(los) >= 0 and max(los) + p.n(G5.COUNT[p.stage]) <= G5.COUNT[p.stage], (name, p)
    # uk's task t waits for the 12 q_nope tiles of head t // 4 (16 q_b tiles a head)
    uk = G5.PRODUCERS["uk"][0]
    assert [uk.lo(t) for t in (0, 3, 4, 31)] == [0, 0, 16, 112]


def test_reference_follows_the_producer_map():
    rng = np.random.default_rng(1)
    x = rng.normal(size=G5.COUNT["qkv_a"])
    w = rng.normal(size=(G5.N_TASKS, G5.THREADS * 4))
    v = glm5_run.reference(x, w)
    rowsum = w.sum(axis=1)
    np.testing.assert_allclose(v["qkv_a"], x * rowsum[:164])
    np.testing.assert_allclose(v["cache"][0], v["qkv_a"][128:164].mean() * rowsum[164])
    np.testing.assert_allclose(v["uk"][5], v["q_b"][16:28].mean() * rowsum[G5.FIRST["uk"] + 5])
    want_down = (v["ug"].mean() + v["router"].mean()) * rowsum[G5.FIRST["down"] + 7]
    np.testing.assert_allclose(v["down"][7], want_down)


def test_mailbox_pairs_decode_to_task_values_and_tags():
    """A wave's pair is ``tag << 32 | f32 bits`` (``flydsl_mono.pair``); a task's value
    is the sum of its 8 waves' pairs."""
    rng = np.random.default_rng(2)
    parts = rng.normal(size=(G5.N_TASKS, G5.WAVES)).astype(np.float32)
    tags = rng.integers(1, 2**20, size=(G5.N_TASKS, G5.WAVES))
    words = (tags.astype(np.int64) << 32) | parts.view(np.uint32).astype(np.int64)
    values, got_tags = glm5_run.read_boxes(words.reshape(-1))
    np.testing.assert_allclose(values, parts.astype(np.float64).sum(axis=1))
    assert (got_tags == tags).all()
