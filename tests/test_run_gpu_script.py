"""``bench/run_gpu.py --interp``: the run-dataset pipeline of issue 33's run 4 end to
end on the CPU (the demo in Triton's interpreter captured into a run, then
``timeline launches / summary / explain`` on it), so a GPU session only runs it;
and the GPU command itself where a GPU is present."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


def _run(out: Path, *args) -> str:
    p = subprocess.run([sys.executable, "bench/run_gpu.py", "--out", str(out), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_the_interp_run_is_captured_and_every_command_reads_it(tmp_path):
    text = _run(tmp_path, "--interp")
    assert "2 written whole" in text and "0 ring_overrun, 0 host_behind, 0 incomplete" in text  # steps 0 and 4
    assert "6 (rank, launch) rows" in text  # summary read all 3 layers x 2 steps
    assert "typical launch" in text and "verdict:" in text  # explain ran on the run
    assert (tmp_path / "run_cpu-interp.txt").read_text().strip() == text.strip()
    assert (tmp_path / "run" / "run.json").is_file()


def test_an_existing_run_is_never_appended_to(tmp_path):
    (tmp_path / "run").mkdir()
    p = subprocess.run([sys.executable, "bench/run_gpu.py", "--out", str(tmp_path), "--interp"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "exists" in p.stderr


@pytest.mark.gpu
def test_the_gpu_run_is_small_and_readable(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    text = _run(tmp_path, "--layers", "16", "--steps", "104", "--every", "4", "--ring", "32")
    assert "26 written whole" in text and "0 ring_overrun" in text  # a ring holding every sampled step
