"""``timeline summary``'s reports printed from the ``Trace`` of a selection (a trace
file's, or a run's launches read back: ``timeline.cli.summary_commands`` chooses):
``--idle``, and the mono kernels' own ``--legacy`` / ``--profile-csv`` reports. A launch is named by its key
(``Trace.launch_keys``)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from timeline.cli.common import UsageError, reproduce
from timeline.query.titles import title
from timeline.cli.textout import format_table, json_rows
from timeline.core import rows as R

IDLE_GAPS = 20  # the largest gaps ``summary --idle`` lists


def summary_of(trace, args) -> int:
    """The report ``args`` asks for, of ``trace`` (already the selection)."""
    from timeline.analysis import legacy_reports as LR

    keys = trace.launch_keys
    if args.profile_csv:
        for r in trace.ranks:
            for launch in trace.launches:
                print(LR.profile_csv(_profile_rows(trace, r, launch)))
        return 0
    if args.legacy:
        from timeline.ingest import points

        if points.is_points(trace):
            raise UsageError(f"{args.trace} is a TileRT program-point trace: it has no timeline_report(); its own "
                             "summary is --profile-csv (profile_summary.py's points branch)")
        blocks = []
        for r in trace.ranks:
            for launch in trace.launches:
                blocks.append((r, launch, LR.legacy_report(trace, rank=r, launch=launch),
                               LR.legacy_extra(trace, rank=r, launch=launch)))
        if args.json:
            rows = []
            for r, launch, t, _ in blocks:
                rows += [{"rank": r, "launch": str(keys[launch]), **row} for row in json_rows(t)]
            _print_json(trace, "legacy", rows, by_launch=True, reproduce=reproduce(args))
            return 0
        print(title(trace))
        for r, launch, t, extra in blocks:
            print(f"\nrank {r} launch {keys[launch]}: the kernel's timeline_report(), µs from the earliest start "
                  "[first start | median hint | last end], then median phases (torch's median; a missing "
                  "mark 1-3 inherits the previous one)")
            print(LR.legacy_text(t, extra))
        return 0
    if args.idle:
        return _summary_idle(trace, args)
    raise UsageError("the stage report of a selection is timeline.query.reports.stage_report's (summary_commands)")


def _summary_idle(trace, args) -> int:
    """``summary --idle``: idle time per CTA, the idlest first."""
    from timeline.analysis import stages as A

    t = A.idle_per_cta(trace)
    order = np.argsort(-np.nan_to_num(R.numpy(t.column("idle_share"))), kind="stable")
    t = t.take(pa.array(order))
    t = _keyed(t, trace)
    gaps = A.idle_gaps(trace)
    gaps = _keyed(gaps.take(pa.array(np.argsort(-R.numpy(gaps.column("duration_ns")), kind="stable")[:IDLE_GAPS])),
                  trace)
    unplaced = A.unplaced_rows(t)
    if args.json:
        _print_json(trace, "idle", json_rows(t), by_launch=True, gaps=json_rows(gaps), unplaced_rows=unplaced,
                    reproduce=reproduce(args))
        return 0
    print(title(trace))
    print("idle per CTA, the idlest first: time between a CTA's tasks inside its launch (ns)\n")
    if unplaced:
        print(f"({unplaced} task rows without a placement word are left out: their CTA is unknown; "
              "see the anomaly report's no_placement)\n")
    print(format_table(t))
    print(f"\nthe {gaps.num_rows} largest gaps between a wave's tasks (ns), and the stages around them\n")
    print(format_table(gaps))
    return 0


def _keyed(table: pa.Table, trace) -> pa.Table:
    """``table`` with its ``launch`` numbers as the launches' keys."""
    if "launch" not in table.column_names or table.num_rows == 0:
        return table
    keys = trace.launch_keys
    at = table.schema.get_field_index("launch")
    return table.set_column(at, "launch", pa.array([str(keys[int(x)]) for x in table.column("launch").to_pylist()],
                                                   pa.string()))


def _print_json(trace, report: str, rows: list, *, by_launch: bool, **extra):
    doc = {
        "kernel": trace.spec.kernel,
        "synthetic": trace.synthetic,
        "report": report,
        "by_launch": by_launch,
        "units": {"*_us": "µs from the earliest start of the scope", "share": "fraction"},
        "anomalies": trace.anomaly_summary(),
        "rows": rows,
        **extra,
    }
    print(json.dumps(doc, ensure_ascii=False, indent=1))


def _profile_rows(trace, rank, launch):
    """``profile_summary.py``'s rows for a trace: its points branch for a TileRT
    program-point trace, its stages branch otherwise."""
    from timeline.analysis import legacy_reports as LR
    from timeline.ingest import points

    if points.is_points(trace):
        return points.points_summary(trace, rank=rank, launch=launch)
    return LR.profile_summary(trace, rank=rank, launch=launch)


__all__ = ["IDLE_GAPS", "summary_of"]
