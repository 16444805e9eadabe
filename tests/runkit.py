"""Small SYNTHETIC traces with slot headers for the run-dataset tests, and a trace
equality that says which column differs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from timeline.contract import schema as S
from timeline.ingest import synth
from timeline.ingest.collect import collect
from timeline.ingest.merge import merge

SMALL_STAGES = (("load", 8), ("mix", 4), ("store", 8))


def small_spec(launches: int = 2, world: int = 2, clock: S.Clock = S.CLOCKS["memrealtime"]) -> S.Spec:
    return S.Spec("run_test_kernel", SMALL_STAGES, launches=launches, world=world, clock=clock)


def rank_traces(slots, *, world: int = 2, seed: int = 0, grid: int = 4, clock: S.Clock = S.CLOCKS["memrealtime"]) -> list:
    """One collected Trace per rank of a small SYNTHETIC build whose launch slots carry
    the headers ``slots`` ([(step, layer)] per slot)."""
    spec = small_spec(len(slots), world, clock)
    return [collect(buf, sp, synthetic=True)
            for sp, buf in synth.synth_buffers(spec, grid=grid, seed=seed, slots=slots, barriers=(), allreduce=())]


def run_trace(slots, *, world: int = 2, seed: int = 0, clock: S.Clock = S.CLOCKS["memrealtime"]):
    """The ranks of ``rank_traces`` merged into one Trace."""
    traces = rank_traces(slots, world=world, seed=seed, clock=clock)
    return traces[0] if len(traces) == 1 else merge(traces)


def launch_of(trace, launch: int):
    """``trace``'s rows of one launch slot, renumbered launch 0 (what ``Run.launch`` returns)."""
    t = trace.filter(launches=[launch])
    tasks = t.tasks.set_column(t.tasks.schema.get_field_index("launch"), "launch",
                               pa.array(np.zeros(t.tasks.num_rows, np.int32)))
    return tasks


def assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    """Same columns and, after sorting both by (rank, stage_index, task, slot_wave), the same values."""
    assert got.column_names == want.column_names
    keys = [(k, "ascending") for k in ("rank", "stage_index", "task", "slot_wave")]
    got, want = got.sort_by(keys), want.sort_by(keys)
    for name in want.column_names:
        g, w = got.column(name), want.column(name)
        if pa.types.is_dictionary(w.type):
            g, w = g.cast(pa.string()), w.cast(pa.string())
        assert g.equals(w), f"column {name} differs"
