"""A real run dataset (issue 33, run 4): the Triton demo's 16-layer CUDA graph
replayed for ``--steps`` decode steps, one step in ``--every`` captured into a run
(``instrument.demo.triton_graph``), then ``timeline launches``, ``summary`` and
``explain`` on it, each command's wall time, the run's size on disk and the
capture's report. On the GPU (one card)::

    PYTHONPATH=. python3 bench/run_gpu.py --out $OUT --layers 16 --steps 400 --every 4 --ring 128

writes ``$OUT/run_h200.txt`` (or ``run_h100.txt``: the card's name in the file
name and the text), and the run ``$OUT/run`` (commit it under ``traces/`` when a
few MB, else a few of its launch files and this command). On the CPU, the same pipeline on a tiny run in
Triton's interpreter (``tools.triton_interp``: emulated clocks, eager launches, one
CTA; ``tests/test_run_gpu_script.py`` runs it)::

    PYTHONPATH=. python3 bench/run_gpu.py --out "$(mktemp -d)" --interp

Each step is a subprocess, the command printed as run: what a user types.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERP = {"layers": 3, "steps": 8, "every": 4}  # 2 sampled steps x 3 layers: the 6 launches explain reads
_INTERP_CHILD = ("import sys; from tools import triton_interp; triton_interp.install(4); "
                 "from instrument.demo import triton_graph as tg; sys.exit(tg.main(sys.argv[1:]))")


def card_name() -> str:
    """``h200`` / ``h100`` / the device's name lower-cased without spaces; ``cpu-interp`` without CUDA."""
    try:
        import torch
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower()
            return next((c for c in ("h200", "h100", "a100") if c in name), name.replace(" ", "_"))
    except ImportError:
        pass
    return "cpu-interp"


def capture_cmd(a, run: Path) -> list:
    """The demo's command line that fills ``run`` (GPU: ``--graph``; interp: eager launches on the CPU)."""
    args = ["--layers", str(a.layers), "--steps", str(a.steps), "--every", str(a.every), "--ring", str(a.ring),
            "--run", str(run)]
    if a.interp:
        return [sys.executable, "-c", _INTERP_CHILD, "--device", "cpu", *args]
    return [sys.executable, "-m", "instrument.demo.triton_graph", "--graph", *args]


def timed(cmd: list, env: dict) -> tuple:
    """Run ``cmd`` (cwd the repo root); ``(seconds, stdout + stderr)``; a failure raises with its output."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if p.returncode:
        raise SystemExit(f"error: {' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return dt, p.stdout + p.stderr


def size_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--ring", type=int, default=2, help="sampled steps the capture's ring holds")
    ap.add_argument("--interp", action="store_true", help="a tiny run in Triton's interpreter on the CPU")
    a = ap.parse_args(argv)
    if a.interp:
        a.layers, a.steps, a.every = INTERP["layers"], INTERP["steps"], INTERP["every"]
    card = "cpu-interp" if a.interp else card_name()
    if card == "cpu-interp" and not a.interp:
        print("no GPU: run with --interp on the CPU, or on an NVIDIA GPU", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    run = a.out / "run"
    if run.exists():
        print(f"error: {run} exists; give an empty --out (a run is appended to, never rewritten)", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if a.interp:
        env["TRITON_INTERPRET"] = "1"
    lines = [f"run dataset on {card}: Triton demo, {a.layers} layers a step, {a.steps} steps, one in {a.every} "
             f"captured ({'CUDA graph replayed' if not a.interp else 'eager launches in the interpreter'})"]
    cmd = capture_cmd(a, run)
    dt, out = timed(cmd, env)
    lines += [f"\n$ {' '.join(map(str, cmd[-12:]))}   # {dt:.2f} s", out.rstrip()]
    env.pop("TRITON_INTERPRET", None)
    for sub in (["launches", str(run), "--slowest", "10"], ["summary", str(run)], ["explain", str(run)]):
        cmd = [sys.executable, "-m", "timeline", *sub]
        dt, out = timed(cmd, env)
        lines += [f"\n$ timeline {' '.join(sub)}   # {dt:.2f} s", out.rstrip()]
    files = sum(1 for f in run.rglob("*") if f.is_file())
    lines.append(f"\nrun size: {size_bytes(run) / 1e6:.3f} MB in {files} files ({run})")
    text = "\n".join(lines)
    print(text)
    (a.out / f"run_{card}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
