"""``trace.retime`` (the one home of ns = ticks_to_ns(tick - origin) + offset) against
the rule written row by row: its fast path for a table of one rank with every stamp
written gives exactly what the masked, per-rank form gives, on any mix of ranks,
unwritten stamps (0 ticks: null ns), ranks without a spec (left at 0, as ever) and
clocks (a rate dividing 1 GHz, and one that does not)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.core.trace import retime

PHASES = ("start", "end")
CLOCKS = [S.CLOCKS["memrealtime"], S.CLOCKS["globaltimer"], S.Clock("odd", 1_500_000_007)]


def _by_row(tasks: pa.Table, spec_of: dict, origins: dict, offsets: dict, phase: str) -> list:
    """The ``<phase>_ns`` column by the rule, one row at a time."""
    out = []
    for r, tick in zip(tasks.column("rank").to_pylist(), tasks.column(f"{phase}_tick").to_pylist()):
        if tick == 0:
            out.append(None)
        elif r not in spec_of:
            out.append(0)
        else:
            ns = S.ticks_to_ns(np.array([tick - origins.get(r, 0)]), S.table_clock(spec_of[r]))[0]
            out.append(int(ns) + offsets.get(r, 0))
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 40), st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
       st.sampled_from([0.0, 0.2, 1.0]), st.integers(0, 2), st.booleans(), st.integers(0, 2**32 - 1))
def test_retime_equals_the_rule_row_by_row(n, spec_ranks, unwritten, clock, one_rank, seed):
    rng = np.random.default_rng(seed)
    ranks = np.full(n, spec_ranks[0]) if one_rank else rng.integers(0, 4, n)
    origins = {r: int(rng.integers(1, 10**6)) for r in spec_ranks}
    offsets = {r: int(rng.integers(-10**6, 10**6)) for r in spec_ranks}
    cols = {"rank": R.arrow(ranks.astype(np.int16))}
    for p in PHASES:
        tick = np.array([origins.get(int(r), 0) for r in ranks], dtype=np.int64) + rng.integers(0, 10**9, n)
        tick[rng.random(n) < unwritten] = 0
        cols[f"{p}_tick"] = R.arrow(tick)
        cols[f"{p}_ns"] = pa.nulls(n, pa.int64())
    tasks = pa.table(cols)
    spec_of = {r: S.Spec("k", (("s", 1),), PHASES, clock=CLOCKS[clock], rank=r, world=4) for r in spec_ranks}
    got = retime(tasks, spec_of, origins, offsets)
    for p in PHASES:
        assert got.column(f"{p}_ns").to_pylist() == _by_row(tasks, spec_of, origins, offsets, p), p
