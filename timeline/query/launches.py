"""``launches``: the launches of a trace file or run by kernel time, and what they say of
it (``timeline.analysis.launches``' definitions): the document of schema
``timeline.launches/1`` (docs/EXPLAIN.md, "Definitions")."""

from __future__ import annotations

import shlex

import numpy as np
import pyarrow as pa

from timeline.analysis import launches as LA
from timeline.core import rows as R
from timeline.query.source import Selection, key_column, options

SCHEMA = "timeline.launches/1"


def us(v):
    """ns as µs, rounded to the ns; None for a missing value."""
    return None if v is None or v != v else round(float(v) / 1e3, 3)


def stats(times: pa.Table) -> dict:
    """The kernel-time figures of a set of launches: pNN, typical and noise in µs, and
    the keys of the p50 / p90 / p99 and slowest launches."""
    k = LA.kernel(times)
    keys = times.column("key").to_pylist()
    out = {f"p{round(q * 100)}_us": us(v) for q, v in zip(LA.QUANTILES, LA.quantiles(k))}
    out.update(typical_us=us(LA.typical_ns(k)), noise_us=us(LA.noise_ns(k)) if (~np.isnan(k)).any() else None)
    for q in LA.QUANTILES:
        i = LA.at_quantile(k, q)
        out[f"p{round(q * 100)}_launch"] = None if i is None else keys[i]
    top = LA.slowest(k)
    out["slowest_launch"] = keys[top[0]] if top else None
    return out


def rows(times: pa.Table) -> list:
    """A ``launch_times`` table as the document's rows."""
    return [{"launch": r["key"], "step": r["step"], "layer": r["layer"], "capture": r["capture"], "slot": r["slot"],
             "ranks": r["ranks"], "kernel_us": us(r["kernel_ns"]), "skew_us": us(r["skew_ns"]),
             "skew_pm_us": us(r["skew_pm_ns"]), "alignment": r["alignment"], "anomalies": r["anomalies"],
             "slowest_rank": r["slowest_rank"]} for r in times.to_pylist()]


def slowest_first(times: pa.Table, n: int | None = None) -> pa.Table:
    """The launches the slowest first (untimed last), the first ``n``."""
    order = LA.slowest(LA.kernel(times), times.num_rows)
    seen = set(order)
    order += [i for i in range(times.num_rows) if i not in seen]
    return times.take(R.arrow(np.asarray(order[:n] if n else order, np.int64)))  # not pa.array: it imports pandas


def launches(src, sel: Selection = Selection(), *, slowest: int | None = None, by_rank: bool = False,
             source_text: str | None = None) -> dict:
    """The launches document of ``src`` over ``sel``: one row per launch (or per (rank,
    launch) with ``by_rank``), the slowest first (the first ``slowest``), and ``kernel``:
    ``stats`` over all of the selection."""
    s = src.select(sel)
    times = s.times
    out_rows = rows(slowest_first(times, slowest))
    if by_rank:
        rr = src.rank_rows(s.ranks)
        keys = key_column(rr) if src.kind == "run" else LA.column_of(
            [str(src.loaded.launch_keys[int(x)]) for x in rr.column("trace_launch").to_pylist()], pa.string())
        want = {str(k) for k in s.keys}
        keep = np.array([k in want for k in keys.to_pylist()], dtype=bool)
        rr = rr.append_column("key", keys).filter(R.arrow(keep))
        out_rows = sorted(({"launch": r["key"], "rank": r["rank"], "kernel_us": us(r["kernel_ns"]),
                            "anomalies": r["anomalies"]} for r in rr.to_pylist()), key=lambda r: -(r["kernel_us"] or -1))
        out_rows = out_rows[:slowest] if slowest else out_rows
    note = LA.skew_note(src.rank_rows(s.ranks)) if src.kind == "run" else None
    cmd = " ".join(x for x in ("timeline launches", source_text or shlex.quote(src.path), options(sel), "--json") if x)
    return {"schema": SCHEMA, **src.about(), "launches": times.num_rows, "kernel_time": stats(times), "rows": out_rows,
            "by_rank": bool(by_rank), "notes": [note] if note else [], "reproduce": cmd}


__all__ = ["SCHEMA", "launches", "rows", "slowest_first", "stats", "us"]
