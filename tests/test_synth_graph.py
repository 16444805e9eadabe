"""SYNTHETIC traces over a kernel profile's task graph with injected delays
(``timeline.ingest.synth_graph``, ``timeline synth --inject``): the injection lands exactly
where it says and nowhere else (same seed, same draws), whole stages and CTAs too,
and propagates through an all-reduce to every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline import load
from timeline.analysis.stages import overlapping_tasks
from timeline.core import rows as R
from timeline.ingest import synth_graph as SG
from timeline.cli import main

FFN = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=2)


def phases(trace):
    """``{(rank, launch, stage, task): (cta, start, hint, staged, compute, end)}`` ns."""
    t = trace.tasks
    ns = R.phase_matrix(t, trace.phases)
    keys = zip(*(t.column(c).to_pylist() for c in ("rank", "launch", "stage", "task")))
    cta = t.column("cta").to_pylist()
    return {k: (c, *v) for k, c, v in zip(keys, cta, ns.tolist())}


@pytest.fixture(scope="module")
def clean():
    return phases(SG.graph_trace(FFN, seed=5))


def test_parse_and_label_round_trip():
    for text in ("3:o:17:compute:+5000@2", "*:uv:*:end:+100", "0:ug:cta7:staged:+1"):
        assert SG.parse_injection(text).label() == text
    inj = SG.parse_injection("*:ug:cta7:hint:+250")
    assert (inj.rank, inj.task, inj.cta, inj.phase, inj.ns, inj.launch) == (None, None, 7, "hint", 250.0, None)


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="0123456789:*+@abcdeghinoprtuy-", max_size=24))
def test_any_injection_text_parses_or_says_the_form(text):
    try:
        inj = SG.parse_injection(text)
    except SG.SynthError as e:
        assert "--inject" in str(e)
    else:
        assert inj.ns >= 0 and inj.phase in SG.INTERVALS


def test_one_task_delayed_and_nothing_before_it(clean):
    inj = SG.parse_injection("1:norm:5:compute:+3000@1")
    trace = SG.graph_trace(FFN, seed=5, inject=[inj])
    assert trace.synthetic and trace.spec.extra["injections"] == [inj.label()]
    got = phases(trace)
    key = (1, 1, "norm", 5)
    grew = (got[key][4] - got[key][3]) - (clean[key][4] - clean[key][3])
    assert abs(grew - 3000) <= 10  # one 10 ns tick of rounding
    assert all(got[k] == v for k, v in clean.items() if k[1] == 0)  # launch 0 untouched
    injected_end = got[key][5]
    before = [k for k, v in clean.items() if k[1] == 1 and v[5] < clean[key][3]]  # ended before it computed
    assert before and all(got[k] == clean[k] for k in before)
    down = [k for k in got if k[:3] == (1, 1, "down") and k[3] // 8 == 5 // 4]  # down reads norm's row block
    assert all(got[k][2] >= injected_end for k in down)  # their waits ended after the late norm task


def test_a_whole_stage_and_a_cta(clean):
    got = phases(SG.graph_trace(FFN, seed=5, inject=[SG.parse_injection("*:down:*:end:+500@0")]))
    d = [(got[k][5] - got[k][4]) - (clean[k][5] - clean[k][4]) for k in got if k[1] == 0 and k[2] == "down"]
    assert len(d) == 2 * 128 and all(abs(x - 500) <= 10 for x in d)
    got = phases(SG.graph_trace(FFN, seed=5, inject=[SG.parse_injection("0:up:cta3:compute:+700")]))
    for k, v in got.items():
        if k[2] == "up" and v[0] == 3 and k[0] == 0:
            assert abs((v[4] - v[3]) - (clean[k][4] - clean[k][3]) - 700) <= 10
        elif k[2] == "up":
            assert v[4] - v[3] == clean[k][4] - clean[k][3]


def test_a_delay_crosses_ranks_through_the_all_reduce():
    spec = SG.glm5_spec(world=8, launches=1)
    got = phases(SG.graph_trace(spec, grid=256, seed=2, inject=[SG.parse_injection("5:o:3:compute:+30000")]))
    o_end = got[(5, 0, "o", 3)][5]
    router_hints = [v[2] for k, v in got.items() if k[2] == "router"]
    assert len(router_hints) == 8 * 32 and min(router_hints) >= o_end + 800 - 10  # every rank waited for it


def test_bad_injections_are_one_line(tmp_path, capsys):
    with pytest.raises(SG.SynthError, match="unknown stage 'nope'"):
        SG.graph_trace(FFN, inject=[SG.parse_injection("0:nope:1:compute:+5")])
    with pytest.raises(SG.SynthError, match="stage 'norm' has tasks 0..63"):
        SG.graph_trace(FFN, inject=[SG.parse_injection("0:norm:64:compute:+5")])
    with pytest.raises(SG.SynthError, match="phase 'start' ends no interval"):
        SG.parse_injection("0:norm:1:start:+5")
    out = tmp_path / "x.arrow"
    assert main(["synth", "-q", "-o", str(out), "--inject", "0:norm:1:compute:5"]) == 2
    assert "give RANK:STAGE:TASK:PHASE:+NS" in capsys.readouterr().err


def test_the_command_writes_a_labelled_trace(tmp_path, capsys):
    out = tmp_path / "x.arrow"
    assert main(["synth", "-q", "-o", str(out), "--ranks", "2", "--launches", "2", "--profile", "triton-ffn",
                 "--inject", "1:norm:5:compute:+3000@1"]) == 0
    said = capsys.readouterr().out
    assert "SYNTHETIC" in said and "injected 1:norm:5:compute:+3000@1" in said
    t = load(out)
    assert t.synthetic and t.spec.graph and t.ranks == [0, 1] and np.array_equal(t.launches, [0, 1])


@pytest.mark.parametrize("name", ["glm5-indexed", "kimi-k3-attn", "glm5-mono", "glm5-mono-indexer", "dsv4"])
def test_every_kernel_generation_runs_with_an_injection(name):
    """Every profile of ``timeline.contract.kernels`` is a model ``synth --profile`` runs
    (its stage list and graph, ``kernels.model``), and an injection lands on its task."""
    from timeline.contract import kernels

    stages, graph = SG.profiles()[name]
    assert (stages, graph) == kernels.model(name)
    spec = SG.graph_spec(stages, graph, world=2, launches=1)
    stage, count = stages[len(stages) // 2]
    task = count - 1
    base = phases(SG.graph_trace(spec, seed=3))
    hit = phases(SG.graph_trace(spec, seed=3, inject=[SG.parse_injection(f"1:{stage}:{task}:compute:+7000")]))
    key = (1, 0, stage, task)
    assert hit[key][4] - hit[key][3] == pytest.approx(base[key][4] - base[key][3] + 7000, abs=1)
    # nothing that ended before the injected compute began moved (the model is causal)
    began = base[key][3]
    assert all(hit[k] == v for k, v in base.items() if v[5] <= began)


def test_a_runs_steps_replay_one_kernel_and_carry_their_slots():
    """``Model(kernel_seed=...)``: two steps (seeds) of one kernel differ by jitter only
    (each task's compute within a few % of the other step's), while two kernels (no
    kernel_seed) differ per task; ``slots`` key every launch (step, layer)."""
    spec = SG.glm5_spec(launches=2, world=2)

    def compute(seed, model):
        t = SG.graph_trace(spec, seed=seed, model=model, slots=[(seed, 0), (seed, 1)]).tasks
        assert set(t.column("step").to_pylist()) == {seed} and set(t.column("layer").to_pylist()) == {0, 1}
        order = np.lexsort([t.column(c).to_numpy() for c in ("task", "stage", "rank", "launch")])
        d = t.column("compute_ns").to_numpy() - t.column("staged_ns").to_numpy()
        return d[order].astype(float)

    one = SG.Model(kernel_seed=0)
    same = np.abs(np.log(compute(1, one) / compute(2, one)))
    other = np.abs(np.log(compute(1, SG.Model()) / compute(2, SG.Model())))
    assert np.median(same) < 0.06 < 0.15 < np.median(other)


def test_bases_place_each_stage_where_a_kernel_rule_says():
    """``graph_buffers(bases=...)``: task t of stage s on CTA ``(bases[s] + t) % grid`` (a
    kernel's own base order, not the row order), with CTAs still running their tasks one
    after another; the same draws otherwise; bases of another length refused."""
    bases = [3, 60, 17]  # not the row-order running sum (0, 512 % 64, 576 % 64)
    t = SG.graph_trace(FFN, grid=64, seed=5, bases=bases).tasks
    stage = np.array(t.column("stage_index").to_pylist())
    task, cta = t.column("task").to_numpy(), t.column("cta").to_numpy()
    assert np.array_equal(cta, (np.array(bases)[stage] + task) % 64)
    assert overlapping_tasks(SG.graph_trace(FFN, grid=64, seed=5, bases=bases)).num_rows == 0
    default = SG.graph_trace(FFN, grid=64, seed=5).tasks.column("cta").to_numpy()
    assert np.array_equal(default, (np.array([0, 0, 0])[stage] + task) % 64)  # 512 and 576 are 0 mod 64
    with pytest.raises(SG.SynthError, match="give each of the 3 stages its first CTA"):
        SG.graph_buffers(FFN, bases=[1, 2])
