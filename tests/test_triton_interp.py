"""``instrument.triton``'s stamps run on the CPU: Triton's interpreter executes the
stamps' own source, the special registers emulated (``tools.triton_interp``), so CI checks what
the PTX checks cannot: each stamp, plain or deferred, lead thread or per warp, plain
or hybrid clock, stores the very reading it took into its own column; the buffer
decodes whole with those readings as its times; a task past its stage's slots is
counted, not stored. (The same on an H200: ``test_triton_gpu.py``.)"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from timeline import schema as S  # noqa: E402
from timeline.collect import collect  # noqa: E402
from tools.triton_interp import readings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ORDER_PHASES = (0, 1, 5, 2, 6, 3, 4)  # tritonkit.DEFERRED_ORDER as phase / mark indices
GRID, PER_CTA = 3, 4

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from tools import triton_interp
    from instrument import alloc
    from tritonkit import deferred_spec, deferred_work, stamped_work
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    for r in runs:
        triton_interp.install(r["num_warps"], seed=r["seed"])
        sp = deferred_spec(r["waves"], r["hybrid"], tasks=r["slots"], grid=r["grid"])
        buf = alloc(sp, device="cpu")
        kernel = deferred_work if r["kernel"] == "deferred" else stamped_work
        kernel[(r["grid"],)](torch.zeros(r["n"]), buf.tensor, r["n"], sp.layout, num_warps=r["num_warps"])
        np.save(f"{out}/{r['name']}.npy", buf.tensor.numpy())
        with open(f"{out}/{r['name']}.json", "w") as f:
            json.dump({"spec": sp.to_json(), "reads": triton_interp.READS}, f)
""")


def _run(kernel, waves, hybrid, slots, n, seed):
    name = f"{kernel}_w{waves}_{'hybrid' if hybrid else 'plain'}_{slots}_{n}"
    return {"name": name, "kernel": kernel, "waves": waves, "hybrid": hybrid, "num_warps": 4, "grid": GRID,
            "slots": slots, "n": n, "seed": seed}


CONFIGS = [_run(k, w, h, GRID * PER_CTA, GRID * PER_CTA, seed)
           for seed, (k, w, h) in enumerate((k, w, h) for k in ("stamped", "deferred") for w in (1, 4)
                                             for h in (False, True))]
DROPS = [_run("deferred", w, True, 6, 9, 10 + w) for w in (1, 4)] + [_run("stamped", 4, False, 6, 9, 20)]


class Run:
    """One interpreted launch: its buffer words, spec and the readings each CTA took."""

    def __init__(self, folder: Path, name: str):
        self.words = np.load(folder / f"{name}.npy")
        meta = json.loads((folder / f"{name}.json").read_text())
        self.spec = S.Spec.from_json(meta["spec"])
        self.reads = meta["reads"]

    def readings(self, cta: int, register: str) -> np.ndarray:
        return readings(self.reads, cta, register)

    def column(self, task: int, wave: int, col: int) -> int:
        return int(self.words[S.word_offset(self.spec.layout, 0, 0, task, wave, col)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every config interpreted in one child process (``TRITON_INTERPRET`` is read when
    a kernel is decorated, so before triton is imported)."""
    folder = tmp_path_factory.mktemp("interp")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder), json.dumps(CONFIGS + DROPS)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["name"]: Run(folder, r["name"]) for r in CONFIGS + DROPS}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["name"])
def test_every_stamp_stores_the_reading_it_took(runs, config):
    """Task ``k`` of CTA ``p`` holds, in the chain's order of columns, the ``k``-th seven
    stamp readings CTA ``p`` took (``%clock64`` in a hybrid build, ``%globaltimer`` in a
    plain one), in every warp's record; a hybrid record's anchors the two timer reads of
    its first and last stamp; the placement word names the CTA, warp and SM. A deferred
    stamp storing the wrong held reading, or into another column, breaks the equality."""
    run = runs[config["name"]]
    lay = run.spec.layout
    stamp_register = "clock64" if config["hybrid"] else "globaltimer"
    for cta in range(GRID):
        stamps = run.readings(cta, stamp_register).reshape(PER_CTA, len(ORDER_PHASES))
        anchors = run.readings(cta, "globaltimer").reshape(PER_CTA, 2) if config["hybrid"] else None
        for k in range(PER_CTA):
            task = cta + k * GRID
            for wave in range(config["waves"]):
                got = [run.column(task, wave, S.phase_col(p)) for p in ORDER_PHASES]
                assert got == stamps[k].tolist(), (task, wave)
                if anchors is not None:
                    assert [run.column(task, wave, S.anchor_col(lay, j)) for j in (0, 1)] == anchors[k].tolist()
                place = S.unpack_placement(np.array([run.column(task, wave, S.PLACEMENT_COL)]), "sm_90")
                assert (int(place["cta"][0]), int(place["wave"][0]), int(place["sm"][0])) == (cta, wave, cta)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["name"])
def test_the_buffer_decodes_whole_with_its_readings_as_times(runs, config):
    """Every (task, warp) row, no anomaly; each phase interval is the time between the
    two readings: exactly the timer's difference (plain); in a hybrid build the cycle
    difference at 2 GHz, within what a rate fitted to anchors that step by 32 ns can
    know: 1 ns of rounding plus the interval x two steps / the SM's anchor span."""
    run = runs[config["name"]]
    trace = collect(run.words, run.spec)
    assert trace.tasks.num_rows == GRID * PER_CTA * config["waves"]
    assert trace.anomaly_summary() == {}
    phases = run.spec.phases
    got = np.stack([trace.tasks.column(f"{p}_ns").to_numpy() for p in phases], axis=1)
    task = trace.tasks.column("task").to_numpy()
    want = np.array([[run.column(t, 0, S.phase_col(i)) for i in range(len(phases))] for t in task])
    if not config["hybrid"]:
        assert (np.diff(got, axis=1) == np.diff(want, axis=1)).all()
        return
    interval = np.diff(want, axis=1) / 2  # ns: %clock64 = 2 T
    span = {c: np.ptp(run.readings(c, "globaltimer")) for c in range(GRID)}
    bound = 1 + interval * 64 / np.array([span[t % GRID] for t in task])[:, None]
    assert (np.abs(np.diff(got, axis=1) - interval) <= bound).all()


@pytest.mark.parametrize("config", DROPS, ids=lambda c: c["name"])
def test_tasks_past_the_stage_are_counted_not_stored(runs, config):
    """9 tasks into a stage of 6 slots: the 3 past it store nothing and add 1 each (per
    stamping warp) to the stage's drop counter, which the decode reports as dropped."""
    run = runs[config["name"]]
    extra = config["n"] - config["slots"]
    assert run.words[S.drop_counter_word(run.spec.layout, 0)] == extra * config["waves"]
    trace = collect(run.words, run.spec)
    assert trace.tasks.num_rows == config["slots"] * config["waves"]
    assert trace.anomaly_summary() == {"dropped": extra * config["waves"]}
