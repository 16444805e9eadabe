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


HEADED_STEPS = (0, 4, 8)  # a run sampled every 4th step: the overview's columns are named 0, 4, 8
GRAPH_SLOTS = [(s, la) for s in HEADED_STEPS for la in (0, 1)]
INJECTED = "1:norm:5:compute:+20000"  # B's regression: rank 1's norm task 5, every launch


def graph_pair(root):
    """``(A trace file, B run directory)`` under ``root``: the Triton FFN task graph on
    2 ranks, launches of steps 0, 4, 8 x layers 0, 1 with slot headers, SYNTHETIC, the
    same seed; B with rank 1's norm task 5 computing 20 µs longer in every launch."""
    from timeline.ingest import synth_graph as SG
    from timeline.run import append

    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=len(GRAPH_SLOTS))
    a = root / "graph_a.arrow"
    SG.graph_trace(spec, seed=3, slots=GRAPH_SLOTS).save(a)
    b = root / "graph_b_run"
    append(b, SG.graph_trace(spec, seed=3, slots=GRAPH_SLOTS, inject=[SG.parse_injection(INJECTED)]))
    return a, b


def headerless(trace):
    """``trace`` as a capture without the ring's launch-slot headers (step, layer null)."""
    import pyarrow as pa

    from timeline.core.trace import Trace

    t = trace.tasks
    for col in ("step", "layer"):
        i = t.column_names.index(col)
        t = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type))
    return Trace(t, trace.specs, trace.anomalies, origins=trace.origins, offsets=trace.offsets,
                 synthetic=trace.synthetic, notes=trace.notes)
