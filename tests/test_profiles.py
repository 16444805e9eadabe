"""Every generation of the mono kernels' own timeline build (shared REFERENCE §1b),
read as it is: for each, a tensor in that kernel's write pattern (tests/legacykit.py,
written from the kernel's rules, not from timeline.contract.kernels), saved as its tool saves
it, through ``timeline import-legacy`` with no option: the profile detected, no
anomaly, each row on the CTA the kernel's rule gives it, the marks kept, and
``summary --legacy`` equal to that kernel's ``timeline_report()`` line for line.
Then detection's refusals, forced wrong profiles, per-range cells, and the TileRT
program-point trace (its own summary and the dashboard's Compare)."""

from __future__ import annotations

import numpy as np
import pytest

import legacykit as LK
from timeline.contract import kernels
from timeline.ingest import legacy as L
from timeline.contract import schema as S
from timeline.cli import main
from timeline.core.trace import load

torch = pytest.importorskip("torch")

# generation -> (tensor maker, profile, S, where its tool saves rank r, the tick key)
GENERATIONS = {
    "indexed-s1": (lambda seed: LK.indexed_tensor(1, seed=seed), "glm5-indexed", 1, "a8w4-s1/rank{r}/trace.pt", "ticks"),
    "indexed-s2": (lambda seed: LK.indexed_tensor(2, seed=seed), "glm5-indexed", 2, "a8w4-s2/rank{r}/trace.pt", "ticks"),
    "kimi-k3": (LK.kimi_tensor, "kimi-k3-attn", 1, "rank{r}/trace.pt", "ticks"),
    "mono": (lambda seed: LK.mono_tensor(False, seed=seed), "glm5-mono", 1, "raw_s1_bf16.pt", "timeline"),
    "mono-indexer": (lambda seed: LK.mono_tensor(True, seed=seed), "glm5-mono-indexer", 1, "rank{r}/trace.pt", "ticks"),
    "dsv4": (LK.dsv4_tensor, "dsv4", 1, "rank{r}/trace.pt", "ticks"),
}


def _save(d, where, key, stages, ticks, rank):
    path = d / where.format(r=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({key: torch.from_numpy(ticks), "stages": [list(s) for s in stages]}, path)
    return path


@pytest.fixture(scope="module", params=sorted(GENERATIONS))
def generation(request, tmp_path_factory):
    """The generation's files (two ranks; the vLLM fork's tool saves rank 0 only),
    imported with no option."""
    make, prof, samples, where, key = GENERATIONS[request.param]
    d = tmp_path_factory.mktemp(request.param)
    ranks = (0,) if "{r}" not in where else (0, 1)
    made = {r: make(seed=r) for r in ranks}
    files = [str(_save(d, where, key, made[r][0], made[r][1], r)) for r in ranks]
    out = d / "run.arrow"
    return dict(name=request.param, profile=prof, S=samples, made=made, files=files, out=out, d=d)


def test_each_generation_reads_with_no_option(generation, capsys):
    g = generation
    assert main(["import-legacy", *reversed(g["files"]), "-o", str(g["out"]), "-q"]) == 0
    said = capsys.readouterr()
    assert f"profile {g['profile']} (detected" in said.out and said.err == "", said
    trace = load(g["out"])
    assert trace.anomaly_summary() == {}  # declared cells silent, placement without overlap
    assert trace.ranks == sorted(g["made"])
    t = trace.tasks
    assert (t.column("flags").to_numpy() & S.Flag.DERIVED_PLACEMENT).all()
    names = list(trace.spec.stage_names)
    for r, (stages, ticks, cta) in g["made"].items():
        rows = t.filter(t.column("rank").to_numpy() == r)
        first = dict(zip([n for n, _ in stages], np.cumsum([0] + [c for _, c in stages])[:-1]))
        stage = [names[i] for i in rows.column("stage_index").to_numpy()]
        task = rows.column("task").to_numpy()
        row = np.array([first[s] + k for s, k in zip(stage, task)])
        assert rows.num_rows == sum(c for _, c in stages) == len(ticks)  # every task row, no 0-task stage
        want = np.array([cta[s][k] for s, k in zip(stage, task)])
        assert (rows.column("cta").to_numpy() == want).all()  # CTAs by the kernel's rule
        for k, mark in enumerate(trace.spec.marks):  # marks kept, the tensor's values exactly
            got = rows.column(f"{mark}_tick").to_numpy(zero_copy_only=False)
            assert (np.nan_to_num(got, nan=0).astype(np.int64) == ticks[row, 5 + k]).all(), mark
        assert len(trace.spec.marks) == ticks.shape[1] - 5


def test_each_generations_report_is_its_timeline_report(generation, capsys):
    g = generation
    if not g["out"].exists():
        assert main(["import-legacy", *g["files"], "-o", str(g["out"]), "-q"]) == 0
    capsys.readouterr()
    assert main(["summary", str(g["out"]), "--legacy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for r, (stages, ticks, _) in g["made"].items():
        theirs = LK.their_report_text(ticks, stages, g["S"]).splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(f"rank {r} launch"))
        assert lines[at + 1: at + 1 + len(theirs)] == theirs
    if g["profile"] == "glm5-mono-indexer":
        assert any(line.startswith(" " * 10 + "score-ready/sample ") for line in lines)
        assert any(line.startswith(" " * 10 + "select-done/sample ") for line in lines)


def test_indexed_at_s2_no_longer_warns_per_ug_row():
    """At S > 1 ug writes only start and end: declared, so none of its 512 rows per
    rank is a missing_phase (the issue's 3,072 warnings for two ranks)."""
    stages, ticks, _ = LK.indexed_tensor(2)
    assert len(ticks) == 1477
    trace = L.collect_legacy(ticks, stages, grid=256)
    assert trace.anomaly_summary() == {} and trace.spec.extra["params"]["S"] == 2
    assert trace.spec.unstamped["ug"] == ("hint", "staged", "compute")


def test_undeclared_unwritten_cells_stay_anomalies():
    """A cell the kernel writes, left 0, is a missing_phase; index_q's hint is
    declared unwritten below task 128 only, so task 200 without it is one too."""
    stages, ticks, _ = LK.mono_tensor(True)
    first = dict(zip([n for n, _ in stages], np.cumsum([0] + [c for _, c in stages])[:-1]))
    ticks = ticks.copy()
    ticks[first["uk"] + 3, 1] = 0  # uk always stamps its hint
    ticks[first["index_q"] + 200, 1] = 0  # index_q >= 128 stamps one too
    ticks[first["index_q"] + 5, 1] = 0  # (already 0: < 128 never stamps it)
    trace = L.collect_legacy(ticks, stages, grid=256)
    got = sorted((a["kind"], a["stage"], a["phase"], a["count"]) for a in trace.anomalies.to_pylist())
    assert got == [("missing_phase", "index_q", "hint", 1), ("missing_phase", "uk", "hint", 1)]
    t = trace.tasks
    flagged = t.filter((t.column("flags").to_numpy() & S.Flag.MISSING_PHASE) != 0)
    names = trace.spec.stage_names
    assert sorted((names[s], k) for s, k in zip(flagged.column("stage_index").to_pylist(),
                                                 flagged.column("task").to_pylist())) == [("index_q", 200), ("uk", 3)]


def test_a_wrong_forced_profile_shows_as_anomalies(tmp_path, capsys):
    """The GLM MonoKernel with the indexer forced through the profile without it:
    the index stages' fixed bases become running sums (their CTAs overlap others')
    and index_q's undeclared cells are missing: anomalies, never a clean timeline."""
    stages, ticks, _ = LK.mono_tensor(True)
    path = _save(tmp_path, "rank0/trace.pt", "ticks", stages, ticks, 0)
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "w.arrow"), "--profile", "glm5-mono", "-q"]) == 0
    assert "profile glm5-mono (forced" in capsys.readouterr().out
    summary = load(tmp_path / "w.arrow").anomaly_summary()
    assert summary.get("cta_overlap", 0) > 0 and summary.get("missing_phase", 0) >= 128
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "x.arrow"), "--profile", "nope"]) == 2
    assert "known: glm5-indexed, kimi-k3-attn" in capsys.readouterr().err


def test_unknown_or_ambiguous_stage_lists_are_refused_with_candidates(tmp_path, capsys, monkeypatch):
    stages = (("a", 3), ("b", 2))
    path = _save(tmp_path, "rank0/trace.pt", "ticks", stages, np.ones((5, 8), np.int64), 0)
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "o.arrow")]) == 2
    err = capsys.readouterr().err
    assert "no kernel profile has this stage list" in err and err.strip().count("\n") == 0
    assert all(p.name in err for p in kernels.PROFILES) and "--profile NAME" in err and "--base-order" in err
    # --base-order reads a kernel nobody profiled
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "o.arrow"), "--base-order", "b,a", "--grid",
                 "4", "-q"]) == 0
    twin = kernels.Profile("glm5-twin", "a copy", "-", "-", kernels.profile("glm5-indexed").stages,
                           kernels.GLM5_BASE_ORDER, kernels.profile("glm5-indexed").params)
    monkeypatch.setattr(kernels, "PROFILES", kernels.PROFILES + (twin,))
    stages, ticks, _ = LK.indexed_tensor(1)
    path = _save(tmp_path, "rank1/trace.pt", "ticks", stages, ticks, 1)
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "o.arrow")]) == 2
    assert "matches several kernel profiles (glm5-indexed, glm5-twin)" in capsys.readouterr().err


def test_every_profile_has_data_for_the_synthetic_model():
    """``kernels.model`` gives any profile's stage list (0-task stages left out) and
    a task graph the spec accepts; GLM-5 S = 1 gets the declared preset graph."""
    from timeline.contract import presets
    from timeline.ingest import synth

    for prof in kernels.PROFILES:
        stages, graph = kernels.model(prof.name)
        assert all(c > 0 for _, c in stages) and graph
        spec = S.Spec(prof.name, stages, graph=graph)
        assert synth.synth_trace(spec, grid=64).tasks.num_rows == sum(c for _, c in stages)
    assert kernels.model("glm5-indexed")[1] == presets.glm5()
    assert kernels.model("glm5-indexed", S=2)[0][-1] == ("down", 256)


# -- the TileRT program-point trace ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def points_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tilert")
    made = {}
    for name, idle in (("s1", None), ("idle", 17)):
        ticks = LK.points_tensor(seed=3, idle_cta=idle)
        path = d / name / "rank0" / "trace.pt"
        path.parent.mkdir(parents=True)
        torch.save(dict(points={0x1000 + 8 * i: p for i, p in enumerate(LK.TILERT_POINTS)},
                        ticks=torch.from_numpy(ticks)), path)
        made[name] = (path, ticks)
    return d, made


def test_program_points_read_as_a_trace_per_cta(points_dir, capsys):
    d, made = points_dir
    path, ticks = made["s1"]
    assert main(["import-legacy", str(path), "-o", str(d / "points.arrow"), "-q"]) == 0
    assert "TileRT program-point trace (30 points)" in capsys.readouterr().out
    trace = load(d / "points.arrow")
    assert trace.anomaly_summary() == {}
    assert trace.spec.wait == ("wait", "ready") and trace.spec.marks == LK.TILERT_POINTS
    assert trace.spec.stage_names[:4] == ("entry", "q_a", "cache", "q_b")
    t = trace.tasks
    assert (t.column("cta").to_numpy() == t.column("task").to_numpy()).all()  # true placement: the row
    assert not (t.column("flags").to_numpy() & S.Flag.DERIVED_PLACEMENT).any()
    q_b = t.filter(t.column("stage_index").to_numpy() == trace.spec.stage_index("q_b"))
    cta = q_b.column("cta").to_numpy()
    slot = {p: i for i, p in enumerate(LK.TILERT_POINTS)}
    assert (q_b.column("wait_tick").to_numpy() == ticks[cta, slot["q_b_wait"]]).all()
    assert (q_b.column("ready_tick").to_numpy() == ticks[cta, slot["q_b_ready"]]).all()
    assert (q_b.column("start_tick").to_numpy() == ticks[cta, slot["cache_publish"] - 3 * (cta % 8 != 0)]).all()
    for i, p in enumerate(LK.TILERT_POINTS):  # each point an instant of its own name, on its CTA, exactly
        got = t.column(f"{p}_tick").to_numpy()
        on = got != 0
        assert (got[on] == ticks[t.column("cta").to_numpy()[on], i]).all() and on.sum() == (ticks[:, i] != 0).sum()


@pytest.mark.parametrize("name", ["s1", "idle"])
def test_profile_csv_is_their_points_branch(points_dir, tmp_path, capsys, name):
    """Their start is the minimum of column 0 over all rows, zeros included: with a CTA
    that never passed ``entry`` it is 0, and every time is µs from 0."""
    _, made = points_dir
    path, ticks = made[name]
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "p.arrow"), "-q"]) == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "p.arrow"), "--profile-csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    theirs = LK.their_points_rows(ticks, LK.TILERT_POINTS)
    assert lines[0] == "event,ctas,first_us,median_us,last_us"
    assert lines[1:] == [f"{e},{n},{a:.3f},{m:.3f},{b:.3f}" for e, n, a, m, b in theirs]
    assert (theirs[0][2] > 1e6) == (name == "idle")


def test_program_points_and_a_flydsl_trace_compare_side_by_side(points_dir):
    """The dashboard's Compare takes the TileRT trace and the FlyDSL GLM-5 kernel's
    (both per CTA): the stages of both (cache, q_b, uk, ... down) side by side."""
    from viewer import app as V
    from viewer.panels import tables as VT

    d, made = points_dir
    stages, ticks, _ = LK.indexed_tensor(1)
    flydsl = _save(d, "flydsl/rank0/trace.pt", "ticks", stages, ticks, 0)
    assert main(["import-legacy", str(flydsl), "-o", str(d / "flydsl.arrow"), "-q"]) == 0
    if not (d / "points.arrow").exists():
        assert main(["import-legacy", str(made["s1"][0]), "-o", str(d / "points.arrow"), "-q"]) == 0
    state, _, _ = V.prepare([str(d / "flydsl.arrow"), str(d / "points.arrow")])
    fig, cols, rows, note = VT.compare(state, "flydsl.arrow", "points.arrow")
    both = {"cache", "q_b", "uk", "split", "uv", "o", "router", "ug", "down"}
    assert {r["stage"] for r in rows} == both
    assert fig["data"] and "only stages of both" in str(note)
    from viewer.panels import gantt as VG

    for name in ("flydsl.arrow", "points.arrow"):  # each drawn one row per CTA
        assert state.store.get(name).trace.spec.grid == 256
        drawn = VG.on_gantt(state, VG.GanttQuery(name, grouping="cta", px=[1000, 560])).figure
        assert drawn["data"], name


def test_a_points_file_among_stage_files_is_named(points_dir, tmp_path, capsys):
    d, made = points_dir
    stages, ticks, _ = LK.indexed_tensor(1)
    other = _save(tmp_path, "rank1/trace.pt", "ticks", stages, ticks, 1)
    assert main(["import-legacy", str(made["s1"][0]), str(other), "-o", str(tmp_path / "o.arrow")]) == 2
    err = capsys.readouterr().err
    assert "is a TileRT program-point trace and the others are stage tensors" in err


# -- properties: the decoders on any input either read it exactly or refuse it in one documented error ------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from timeline.ingest import points  # noqa: E402

_NAMES = ("entry", "a_wait", "a_ready", "a_publish", "b_wait", "b_ready", "b_computed", "b_publish", "c_publish",
          "tail", "a_wait")  # the repeated a_wait: two points giving one stage the same phase


@settings(max_examples=60, deadline=None)
@given(ctas=st.integers(1, 6), names=st.lists(st.sampled_from(_NAMES), min_size=1, max_size=7, unique=False),
       data=st.data())
def test_points_decode_exactly_or_refuse(ctas, names, data):
    """Any point list and tensor (zeros anywhere, any order of times): a trace whose
    points are the tensor's cells exactly and whose summary is profile_summary.py's,
    or a PointsError (repeated names, phase-name clashes)."""
    ticks = np.array(data.draw(st.lists(st.lists(st.integers(0, 5).map(lambda v: v * 1000 + 1_000_000 if v else 0),
                                                 min_size=len(names), max_size=len(names)),
                                        min_size=ctas, max_size=ctas)), dtype=np.int64)
    try:
        trace = points.collect_points(ticks, names)
    except points.PointsError as e:
        assert (len(set(names)) < len(names) and "distinct name" in str(e)) or \
            (not (ticks != 0).any() and "every tick is 0" in str(e))
        return
    assert len(set(names)) == len(names)
    t = trace.tasks
    for i, p in enumerate(names):
        got = t.column(f"{p}_tick").to_numpy()
        on = got != 0
        assert sorted(got[on]) == sorted(ticks[:, i][ticks[:, i] != 0])
    rows = [tuple(r.values()) for r in points.points_summary(trace).to_pylist()]
    assert rows == LK.their_points_rows(ticks, names)


@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from([p.name for p in kernels.PROFILES]), s=st.integers(1, 8), bump=st.integers(-2, 2),
       at=st.integers(0, 30))
def test_detection_takes_only_an_exact_stage_list(which, s, bump, at):
    """A profile's own stage list at any of its parameter sets is detected as that
    profile; the same list with one count changed is refused (or, for a profile
    whose counts are the file's, still that one), never another profile."""
    prof = kernels.profile(which)
    params = prof.params[min(s - 1, len(prof.params) - 1)]
    stages = list(kernels.stage_list(prof, params))
    assert [p.name for p, _ in kernels.match(stages)] == [which]
    k = at % len(stages)
    stages[k] = (stages[k][0], max(0, stages[k][1] + bump))
    hits = [(p.name, q) for p, q in kernels.match(stages)]
    if bump == 0 or stages[k][1] == kernels.stage_list(prof, params)[k][1]:
        assert [h for h, _ in hits] == [which]
    elif prof.free_counts:
        assert [h for h, _ in hits] == [which]
    else:
        assert all(h == which for h, _ in hits)  # another parameter set of the same kernel at most
        if not hits:
            with pytest.raises(L.LegacyError, match="no kernel profile has this stage list"):
                L.choose_profile(stages)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 12), cols=st.integers(1, 9), dtype=st.sampled_from(["int64", "int32", "float64"]))
def test_a_tensor_of_another_shape_or_dtype_is_one_error(rows, cols, dtype):
    stages = (("a", 3), ("b", 2))
    ticks = np.ones((rows, cols), dtype=dtype)
    ok = rows == 5 and cols in (5, 8) and dtype == "int64"
    if ok:
        L.check_shape(ticks, stages)
    else:
        with pytest.raises(L.LegacyError) as e:
            L.check_shape(ticks, stages)
        assert "\n" not in str(e.value) and ("expected (5, 8)" in str(e.value) or "not int64" in str(e.value))


def test_a_file_named_for_another_S_is_refused(tmp_path, capsys):
    """The tools put S in the name (raw_s{S}_{tag}.pt, <mode>-s<S>/): a stage list of
    another S is not read as if it were that run's."""
    stages, ticks, _ = LK.indexed_tensor(1)
    path = _save(tmp_path, "a8w4-s2/rank0/trace.pt", "ticks", stages, ticks, 0)
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "o.arrow")]) == 2
    assert "its name says S = 2, but its stage list is glm5-indexed's at S = 1" in capsys.readouterr().err


def test_legacy_summary_of_a_points_trace_points_to_its_own(points_dir, tmp_path, capsys):
    _, made = points_dir
    assert main(["import-legacy", str(made["s1"][0]), "-o", str(tmp_path / "p.arrow"), "-q"]) == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "p.arrow"), "--legacy"]) == 2
    assert "--profile-csv" in capsys.readouterr().err


def test_info_names_the_profile_and_its_per_stage_waits(tmp_path, capsys):
    """The waits that are not the profile's (split's start→hint with the indexer, none
    for index_score / index_select) are kept in the spec and shown by ``timeline info``."""
    stages, ticks, _ = LK.mono_tensor(True)
    path = _save(tmp_path, "rank0/trace.pt", "ticks", stages, ticks, 0)
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "m.arrow"), "-q"]) == 0
    assert load(tmp_path / "m.arrow").spec.extra["stage_wait"] == {
        "index_score": [], "index_select": [], "split": ["start", "hint"]}
    capsys.readouterr()
    assert main(["info", str(tmp_path / "m.arrow")]) == 0
    out = capsys.readouterr().out
    assert "profile    glm5-mono-indexer (detected); per-stage waits: index_score none, index_select none, " \
           "split start→hint" in out and "(wait for producers hint→staged)" in out


def test_a_profile_naming_statistics_median_gets_the_mean_of_the_middle_two():
    """Where a profile's report uses ``statistics.median`` (the Kimi-K3 host stage
    profiler does; none of the stamped builds' timeline_report() does), the medians
    are the mean of the two middle values, not torch's lower one."""
    import statistics

    from timeline.analysis import legacy_reports as LR

    stages, ticks, _ = LK.kimi_tensor()
    trace = L.collect_legacy(ticks, stages, grid=256)
    torch_rep = LR.legacy_report(trace).to_pylist()
    trace.spec.extra["median"] = "statistics"
    rep = LR.legacy_report(trace).to_pylist()
    us = ticks[:, :5].astype(np.float64) / 100.0
    first = 0
    for (name, n), row, low in zip(stages, rep, torch_rep):
        st = us[first: first + n].copy()
        first += n
        for c in (1, 2, 3):
            st[:, c] = np.where(st[:, c] > 0, st[:, c], st[:, c - 1])
        assert row["staging_us"] == statistics.median((st[:, 2] - st[:, 1]).tolist()), name
        assert row["hint_median_us"] == statistics.median(st[:, 1].tolist()) - us[:, 0].min(), name
    assert any(r["staging_us"] != t["staging_us"] for r, t in zip(rep, torch_rep))  # even counts differ


@pytest.mark.parametrize("data, message", [
    (lambda: {"points": [1, 2], "ticks": torch.zeros(4, 2, dtype=torch.int64)},
     "looks like a TileRT program-point trace but"),
    (lambda: {"points": {1: "a_wait", 2: "a_ready"}, "ticks": torch.ones(4, 3, dtype=torch.int64)},
     "expected int64 (CTAs, 2)"),
    (lambda: {"points": {1: "a_wait", 2: "a_ready"}, "ticks": torch.zeros(4, 2, dtype=torch.int64)},
     "every tick is 0"),
    (lambda: {"timeline": 3, "stages": [["a", 3]]}, "'timeline' is not a tensor"),
    (lambda: {"traceEvents": []}, "is a Chrome trace"),
    (lambda: [1, 2], "holds a list"),
])
def test_files_of_other_formats_are_named_in_one_line(tmp_path, capsys, data, message):
    torch.save(data(), tmp_path / "x.pt")
    assert main(["import-legacy", str(tmp_path / "x.pt"), "-o", str(tmp_path / "o.arrow")]) == 2
    err = capsys.readouterr().err
    assert message in err and "x.pt" in err and err.strip().count("\n") == 0, err
