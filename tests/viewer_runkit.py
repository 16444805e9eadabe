"""A small run for the dashboard's run tests (not a test module): SYNTHETIC traces
whose launch slots carry step / layer headers, appended to a run directory through
``timeline.run`` and saved as one trace file too."""

from __future__ import annotations

from timeline.ingest import synth
from timeline.ingest.collect import collect
from timeline.ingest.merge import merge

STEPS, LAYERS = 2, 3  # the small run's launches: 2 steps x 3 layers, on 2 ranks
SLOTS = [(s, la) for s in range(STEPS) for la in range(LAYERS)]


def small_trace(seed: int = 3, slots=SLOTS, grid: int = 8):
    """2 ranks x one launch per slot (default 2 steps x 3 layers), ``grid`` CTAs, GLM-5 stages."""
    spec = synth.glm5_spec(world=2, launches=len(slots))
    return merge([collect(buf, sp, synthetic=True)
                  for sp, buf in synth.synth_buffers(spec, grid=grid, seed=seed, slots=slots)])


def make_run(root, name: str = "small_run"):
    """``(run directory, the same launches as one trace file)`` under ``root``."""
    from timeline.run import append

    tr = small_trace()
    run = root / name
    append(run, tr)
    tr.save(root / f"{name}.arrow")
    return run, root / f"{name}.arrow"
