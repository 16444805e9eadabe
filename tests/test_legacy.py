"""The GLM-5 layer kernel's own timeline build, read as it is: a (1061, 8) tensor in
the kernel's write pattern (tests/legacykit.py), saved as its benchmark.py saves
it, through ``timeline import-legacy`` into a trace, the kernel's own reports and
the dashboard; the same tensor given to ``convert`` is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

import legacykit as LK
from timeline.ingest import legacy as L
from timeline.analysis import legacy_reports as LR
from timeline.contract import schema as S
from timeline.cli import main
from timeline.core.trace import load

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """rank0/trace.pt and rank1/trace.pt as ``torch.save(dict(stages=..., ticks=...))``."""
    d = tmp_path_factory.mktemp("glm5")
    tensors = {}
    for rank in (0, 1):
        (d / f"rank{rank}").mkdir()
        ticks = LK.glm5_tensor(seed=rank, t0=7_000_000_000 + 12_345 * rank)
        tensors[rank] = ticks
        torch.save(dict(stages=list(L.GLM5_STAGES), ticks=torch.from_numpy(ticks)), d / f"rank{rank}" / "trace.pt")
    return d, tensors


@pytest.fixture(scope="module")
def imported(run_dir):
    d, _ = run_dir
    out = d / "run.arrow"
    assert main(["import-legacy", str(d / "rank1" / "trace.pt"), str(d / "rank0" / "trace.pt"),
                 "-o", str(out), "--grid", "256", "-q"]) == 0
    return load(out)


def test_the_tensor_is_the_kernels_shape():
    ticks = LK.glm5_tensor()
    assert ticks.shape == (1061, 8)
    assert sum(c for _, c in L.GLM5_STAGES) == 1061


def test_import_keeps_every_row_with_its_rotation_cta(imported, run_dir):
    _, tensors = run_dir
    t = imported.tasks
    assert imported.ranks == [0, 1] and t.num_rows == 2 * 1061
    assert imported.spec.wait == ("hint", "staged") and imported.spec.marks == L.LEGACY_MARKS
    assert imported.anomaly_summary() == {}  # qkv_a's hint, cache's compute: declared never stamped
    assert imported.spec.unstamped == {"qkv_a": ("hint",), "cache": ("compute",)}
    stage, task, cta = (t.column(c).to_numpy() for c in ("stage_index", "task", "cta"))
    want = L.rotation_ctas(L.GLM5_STAGES, 256)
    first = np.cumsum([0] + [c for _, c in L.GLM5_STAGES])[:-1]
    assert (cta == want[first[stage] + task]).all()
    assert (t.column("flags").to_numpy() & S.Flag.DERIVED_PLACEMENT).all()  # derived, and said so
    assert t.column("cu").null_count == t.num_rows and t.column("hw_unit").null_count == t.num_rows
    # marks: their own columns, the tensor's values exactly, never inherited
    for rank in (0, 1):
        rows = t.filter(pa_eq(t, "rank", rank))
        order = np.argsort(first[rows.column("stage_index").to_numpy()] + rows.column("task").to_numpy())
        for k, mark in enumerate(L.LEGACY_MARKS):
            got = rows.column(f"{mark}_tick").to_numpy()[order]
            assert (got == tensors[rank][:, 5 + k]).all(), mark
    ug = t.filter(pa_eq(t, "stage", "ug")).filter(pa_eq(t.filter(pa_eq(t, "stage", "ug")), "rank", 0))
    assert ug.column("mark7_ns").null_count == 0  # route_top8 stamped every ug row
    assert imported.intervals.num_rows == 2 * 1061 * 4


def pa_eq(table, col, value):
    import pyarrow.compute as pc

    c = table.column(col)
    if col == "stage":
        c = pc.cast(c, "string")
    return pc.equal(c, value)


def test_legacy_report_is_the_kernels_own_numbers(imported, run_dir):
    _, tensors = run_dir
    for rank in (0, 1):
        rep = LR.legacy_report(imported, rank=rank)
        theirs = LK.their_timeline_report(tensors[rank], L.GLM5_STAGES)
        ours = [tuple(r.values()) for r in rep.to_pylist()]
        assert ours == theirs  # bit for bit: the same float64 arithmetic, torch's medians
        lines = LR.legacy_text(rep).splitlines()
        assert lines[0].startswith("qkv_a   x 164  [   0.0 | hint ") and len(lines) == 10


def test_profile_csv_is_the_tools_own_rows(imported, run_dir, tmp_path, capsys):
    d, tensors = run_dir
    got = [tuple(r.values()) for r in LR.profile_summary(imported, rank=0).to_pylist()]
    assert got == LK.their_profile_rows(tensors[0], L.GLM5_STAGES)
    single = tmp_path / "r0.arrow"
    assert main(["import-legacy", str(d / "rank0" / "trace.pt"), "-o", str(single), "-q"]) == 0
    capsys.readouterr()
    assert main(["summary", str(single), "--profile-csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "event,ctas,first_us,median_us,last_us"
    assert lines[1:] == [f"{e},{n},{a:.3f},{m:.3f},{b:.3f}" for e, n, a, m, b in
                         LK.their_profile_rows(tensors[0], L.GLM5_STAGES)]
    assert not any(line.startswith("qkv_a_hint") for line in lines)  # never written: left out


def test_the_raw_tensor_is_refused_by_convert(run_dir, tmp_path, capsys):
    _, tensors = run_dir
    np.save(tmp_path / "ticks.npy", tensors[0])
    spec = L.legacy_spec(L.GLM5_STAGES)
    (tmp_path / "spec.json").write_text(spec.to_json())
    assert main(["convert", str(tmp_path / "ticks.npy"), "--spec", str(tmp_path / "spec.json"),
                 "-o", str(tmp_path / "t.arrow")]) == 2
    err = capsys.readouterr().err
    assert "(1061, 8)" in err and "import-legacy" in err and err.strip().count("\n") == 0
    # the .npy itself goes through import-legacy with its stage list
    stages = ",".join(f"{n}:{c}" for n, c in L.GLM5_STAGES)
    assert main(["import-legacy", str(tmp_path / "ticks.npy"), "--stages", stages, "-o",
                 str(tmp_path / "n.arrow"), "-q"]) == 0


@pytest.mark.parametrize("kw, message", [
    (dict(ticks=np.zeros((1060, 8), np.int64)), r"expected \(1061, 8\)"),
    (dict(ticks=np.zeros((1061, 6), np.int64)), r"expected \(1061, 8\).*5 phases \+ 3 debug marks"),
    (dict(grid=100), "power of two"),
    (dict(base_order=("qkv_a", "cache")), "not an order of the stages"),
])
def test_a_tensor_that_does_not_match_says_why(kw, message):
    args = dict(ticks=LK.glm5_tensor(), grid=256, base_order=None)
    args.update(kw)
    with pytest.raises(L.LegacyError, match=message):
        L.collect_legacy(args["ticks"], L.GLM5_STAGES, grid=args["grid"], base_order=args["base_order"])


@pytest.mark.parametrize("grid, base_order, overlaps", [(128, None, 848), (64, None, 979),
                                                       (256, tuple(reversed(L.GLM5_BASE_ORDER)), 349)])
def test_a_wrong_grid_or_base_order_shows_as_cta_overlaps(run_dir, tmp_path, capsys, grid, base_order, overlaps):
    """CTAs derived with another G or base[] order than the kernel's put tasks that ran
    at the same time on one CTA: counted as ``cta_overlap`` (per launch and stage; of
    the 1,061 tasks of the seeded tensor, the counts docs/PORTING_GLM5.md cites), a
    warning from the command, an error with --strict. With the kernel's (G = 256) none."""
    d, tensors = run_dir
    assert L.collect_legacy(tensors[0], L.GLM5_STAGES, grid=256).anomaly_summary() == {}
    wrong = L.collect_legacy(tensors[0], L.GLM5_STAGES, grid=grid, base_order=base_order)
    summary = wrong.anomaly_summary()
    assert summary == {"cta_overlap": overlaps} and wrong.tasks.num_rows == len(tensors[0])  # every row kept
    assert wrong.anomaly_count == summary["cta_overlap"]
    argv = ["import-legacy", str(d / "rank0" / "trace.pt"), "-o", str(tmp_path / "w.arrow"), "--grid", str(grid)]
    argv += ["--base-order", ",".join(base_order)] if base_order else []
    assert main(argv + ["-q"]) == 0
    assert "cta_overlap" in capsys.readouterr().err
    assert load(tmp_path / "w.arrow").anomaly_summary() == summary
    assert main(argv + ["-q", "--strict"]) == 2
    assert "a CTA runs its tasks one after another" in capsys.readouterr().err


def test_two_files_of_one_rank_are_named(run_dir, tmp_path, capsys):
    """A file outside a rank<r>/ folder takes its place in the list as its rank: given
    first beside rank0/trace.pt, both are rank 0, and the error names both and why."""
    d, _ = run_dir
    loose = tmp_path / "trace.pt"
    loose.write_bytes((d / "rank0" / "trace.pt").read_bytes())
    assert main(["import-legacy", str(loose), str(d / "rank0" / "trace.pt"), "-o", str(tmp_path / "o.arrow")]) == 2
    err = capsys.readouterr().err
    assert "two files of rank 0" in err and "its place in the list" in err and "its rank<r>/ folder" in err
    assert str(loose) in err and err.strip().count("\n") == 0


def test_bad_legacy_files_are_one_line(tmp_path, capsys):
    """Each bad file is one error line naming the file: not a torch file, not the
    kernel's dict, a tensor of another dtype or shape than its stage list implies."""
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    torch.save({"x": 1}, tmp_path / "other.pt")
    torch.save({"stages": [["a", 3]], "ticks": torch.ones(3, 8, dtype=torch.int32)}, tmp_path / "int32.pt")
    torch.save({"stages": [["a", 3]], "ticks": torch.ones(4, 8, dtype=torch.int64)}, tmp_path / "short.pt")
    for name, message in (("junk.pt", "not a torch file"), ("other.pt", "dict(stages=..., ticks=...)"),
                          ("int32.pt", "holds int32, not int64 ticks"), ("short.pt", "expected (3, 8)")):
        assert main(["import-legacy", str(tmp_path / name), "-o", str(tmp_path / "o.arrow")]) == 2
        err = capsys.readouterr().err
        assert message in err and name in err and err.strip().count("\n") == 0, err


def test_the_dashboard_shows_it_with_the_declared_wait(imported, run_dir):
    from viewer import app as V
    from viewer.panels import gantt as VG
    from viewer.panels import trace as VTR

    d, _ = run_dir
    state, _, _ = V.prepare([str(d / "run.arrow")])
    out = VTR.select(state, "", None, False)
    labels = [o["label"] for o in out.phase_options]
    assert labels[1] == " hint→staged (wait for producers)" and "wait" not in labels[0]
    fig = VG.on_gantt(state, VG.GanttQuery(out.key['name'], px=[1000, 560])).figure
    assert fig["data"], "drawn"
    assert "derived" in json.dumps(state.banners(state.store.get("run.arrow")), default=str).lower()


def test_marks_are_instants_in_the_export_and_ticks_on_the_gantt(imported, run_dir, tmp_path):
    from timeline.export import write_chrome
    from viewer import app as V
    from viewer.panels import gantt as VG

    d, tensors = run_dir
    r0 = imported.filter(ranks=[0])
    write_chrome(r0, tmp_path / "g.json")
    doc = json.loads((tmp_path / "g.json").read_text())
    whole, frac = doc["otherData"]["origin_ts_us"].split(".")
    base = int(whole) * 1000 + int(frac)
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "mark"]
    written = (tensors[0][:, 5:] != 0).sum(axis=0)
    assert [sum(e["name"] == m for e in marks) for m in L.LEGACY_MARKS] == written.tolist()
    got = sorted(int(round(e["ts"] * 1000)) - base for e in marks)
    want = sorted(v for m in L.LEGACY_MARKS for v in r0.tasks.column(f"{m}_ns").drop_null().to_pylist())
    assert got == want  # each mark at its exact ns
    state, _, _ = V.prepare([str(d / "run.arrow")])
    fig = VG.on_gantt(state, VG.GanttQuery("run.arrow", ranks=[0], px=[1000, 560]))[0]
    ticks = {t["meta"]["mark"]: t for t in fig["data"] if t.get("meta", {}).get("kind") == "mark"}
    assert set(ticks) == set(L.LEGACY_MARKS)
