"""``bench/explain_gpu.py`` (issue 33, run 3) made ready on the CPU: its ``--interp``
mode runs the whole script in Triton's interpreter (emulated clocks, one CTA), a
%globaltimer spin in one norm task of one launch and in every norm task, and
``timeline explain`` must name the injected (stage, CTA, phase) and predict the
measured saving within 10 %; the one-task spin build compiles to sm_90 PTX with
the spin behind a branch on the task; ``--from`` re-evaluates the saved traces
without Triton to the same rows, and a row whose effect is below the noise says so.
The GPU run itself where a GPU is present."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def _bench(out: Path, *args, timeout=300):
    return subprocess.run([sys.executable, "bench/explain_gpu.py", "--out", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_the_interp_run_names_the_injected_task_and_its_saving(tmp_path):
    p = _bench(tmp_path, "--interp")
    assert p.returncode == 0, p.stdout + p.stderr  # rc 1 where a goal is not met
    rows = {r["setting"]: r for r in json.loads((tmp_path / "explain_cpu-interp.json").read_text())["rows"]}
    one, stage = rows["task2+1000"], rows["stage+1000"]
    assert one["named"] == ["task norm cta0 task2 compute"] and one["named_right"] == one["rounds"] == 2
    assert stage["named"] == ["stage norm ctaNone taskNone compute"]
    assert 0.9 <= one["measured_us"] <= 1.2 and abs(one["error"]) <= 0.10  # the spin, and explain's saving
    assert 3.6 <= stage["measured_us"] <= 4.5 and abs(stage["error"]) <= 0.10  # 4 norm tasks in one CTA
    assert {f.name for f in tmp_path.glob("*.arrow")} == {"explain_base.arrow", "explain_task2+1000.arrow",
                                                          "explain_stage+1000.arrow"}
    assert p.stdout.count("(rc 0)") == 2 and "culprit: norm compute (the stage" in p.stdout
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    again = subprocess.run([sys.executable, "bench/explain_gpu.py", "--from", str(tmp_path), "--out",
                            str(tmp_path / "again")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    redo = json.loads((tmp_path / "again" / "explain_from_files.json").read_text())
    assert redo["rows"] == list(rows.values()) and redo["card"].startswith("cpu-interp")
    assert (redo["launches"], redo["spun"], redo["task"]) == (4, 2, 2)


def _script():
    spec = importlib.util.spec_from_file_location("explain_gpu", ROOT / "bench" / "explain_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_row_below_the_noise_says_so_and_keeps_its_goal_honest():
    eg = _script()
    row = {"setting": "task32+1000", "spin_ns": 1000, "task": 32, "rounds": 24, "named_right": 0, "named": ["none"],
           "said_none": 24, "noise_us": 1.281, "within_noise": True, "predicted_us": 0.0, "measured_us": 0.112,
           "error": -1.0, "met": False}
    lines = eg.report([row], "card", tuple(range(9)), 32,
                      ("norm", 32, "compute"), 24, 8, 5)
    assert "(noise)" in lines[3]
    assert "NOT met  within noise: said none in 24/24 (measured 0.112 < noise 1.281 µs)" in lines[3]
    assert lines[4].startswith("task32+1000: the goal as written is NOT met") and "-100" not in "\n".join(lines)


def test_from_reads_the_settings_from_the_names_and_refuses_strangers(tmp_path):
    eg = _script()
    for name in ("h100_explain_base.arrow", "h100_explain_stage+4000.arrow", "h100_explain_task32+16000.arrow",
                 "h100_explain_task32+1000.arrow", "h200_whatif_delay0.arrow"):
        (tmp_path / name).write_bytes(b"")
    prefix, sets = eg.saved_settings(tmp_path)
    assert prefix == "h100_" and list(sets.items()) == [("base", (0, -1)), ("task32+1000", (1000, 32)),
                                                        ("task32+16000", (16000, 32)), ("stage+4000", (4000, -1))]
    (tmp_path / "h100_explain_other.arrow").write_bytes(b"")
    with pytest.raises(SystemExit, match="h100_explain_other.arrow: not a setting's trace"):
        eg.saved_settings(tmp_path)
    with pytest.raises(SystemExit, match="needs one <prefix>explain_base.arrow"):
        eg.saved_settings(tmp_path / "nowhere")


def test_the_one_task_spin_compiles_for_sm90_behind_a_branch():
    from instrument import triton as itl
    from instrument.demo import triton_mono as tm

    s = tm.Shape()
    sp = tm.spec(s, launches=4)

    def ptx(delay, task):
        k = itl.compile_launch(tm.mono_ffn_kernel, *([torch.float16] * 6), torch.int64, torch.int32, torch.int64,
                               3, 17, s.M, s.D, s.F, s.BM, s.BN, s.BK, s.R, s.BF, s.G, sp.layout, True, tm.MAX_SPIN,
                               delay, grid=(s.G,), DELAY_TASK=task, num_warps=s.num_warps, num_stages=s.num_stages)
        return k.asm["ptx"]

    plain, one = ptx(0, -1), ptx(4000, 5)
    timer = "%globaltimer;"
    assert one.count(timer) == plain.count(timer) + 2  # the spin's first read and its loop's
    assert "4000" in one and "4000" not in plain


@pytest.mark.gpu
def test_the_gpu_run_meets_its_goals(tmp_path):
    """8 rounds on whatever card is lent. Every round names the injected culprit or
    says none, never another one; a spin far above the launch-to-launch noise (16 us)
    is named in every round, one near it (4 us; and 4 us in every norm task) in at
    least half; where named, the saving explain predicts is within 10 % of the
    measured one (25 % for the whole stage, docs/EXPLAIN.md says why), or within the
    noise where that is wider: a median of 8 launch differences is uncertain by about
    the noise. On an H200 (noise 1.9-2.1 us) the 4 us spin was named in 6 to 8 of 8
    rounds, its saving -10 % to -24 % off (bench/results/explain_h200.txt); on an
    H100 (noise 1.3 us) in 24 of 24, -3.3 % (explain_h100.txt). The bench's own
    verdict keeps the goal as written."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    p = _bench(tmp_path, "--rounds", "8", timeout=600)
    assert p.returncode in (0, 1), p.stdout + p.stderr  # 1: a goal not met, a result
    doc, = tmp_path.glob("explain_*.json")
    rows = {r["setting"]: r for r in json.loads(doc.read_text())["rows"]}
    for name, least, tol in (("task32+16000", 1.0, 0.10), ("task32+4000", 0.5, 0.10), ("stage+4000", 0.5, 0.25)):
        r = rows[name]
        assert r["named_right"] + r["said_none"] == r["rounds"], r  # never a wrong culprit
        assert r["named_right"] >= least * r["rounds"] and r["measured_us"] > 0, r
        assert abs(r["predicted_us"] - r["measured_us"]) <= max(tol * r["measured_us"], r["noise_us"]), r
    one = rows["task32+1000"]  # named, or below the noise and said none
    assert one["met"] or (one["within_noise"] and one["said_none"] == one["rounds"]), one
