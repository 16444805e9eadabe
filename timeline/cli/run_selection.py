"""The run commands that read task rows of a selection: ``export``, ``edges``,
``whatif`` and ``compare`` of a run, and ``merge ... -o RUN/`` (``timeline.cli.run_commands``
routes them here)."""

from __future__ import annotations

import sys
from pathlib import Path

from timeline.cli.run_common import json_out, launch_keys, map_launches, open_selected, run_head, selected_launches


def _selection_trace(run, args):
    """One Trace of the selected launches (``launchset.selection_trace``), within the
    memory budget: ``RunError`` naming how to narrow it otherwise."""
    from timeline.run.launchset import budget_check, selection_trace

    keys = launch_keys(run, args)
    budget_check(run, selected_launches(run, args), "this selection")
    return selection_trace(run, keys, args.rank)


def on_selection(args, command) -> int:
    """Run the trace-file command ``command`` (a ``timeline.commands`` function) on the
    selected launches of the run ``args.trace`` as one Trace, saved to a temporary file
    (launches numbered 0, 1, ... in (step, layer) order)."""
    import tempfile

    from timeline.cli.common import UsageError

    if getattr(args, "launch", None):
        raise UsageError("--launch picks a launch of a trace file; in a run select with --step / --layer / --rank")
    trace = _selection_trace(open_selected(args.trace, args), args)
    with tempfile.TemporaryDirectory(prefix="timeline-run-") as tmp:
        args.trace = str(trace.save(Path(tmp) / "selection.arrow"))
        args.rank = args.launch = None  # chosen already
        return command(args)


def cmd_export_run(args) -> int:
    """``timeline export RUN --step S --layer L ...``: the selection's export."""
    from timeline.cli.commands import cmd_export

    return on_selection(args, cmd_export)


def cmd_edges_run(args) -> int:
    """``timeline edges RUN``: per launch, per stage what held each wait (a map over launches)."""
    import pyarrow as pa

    from timeline.cli.textout import json_rows, format_table

    if args.output:  # every edge of the selection: the trace-file command on it as one trace
        from timeline.cli.graph_commands import cmd_edges

        return on_selection(args, cmd_edges)
    run = open_selected(args.trace, args)
    tables = map_launches(run, args, "edges")
    table = pa.concat_tables(tables, promote_options="permissive") if tables else None
    if args.json:
        json_out({"run": str(run.path), "report": "edges", "rows": json_rows(table)})
        return 0
    print(run_head(run))
    print("per launch and stage: what held each task's wait (its gating edge); slack in µs\n")
    print(format_table(table))
    return 0


def cmd_whatif_run(args) -> int:
    """``timeline whatif RUN``: the prediction per selected launch (a map over launches)."""
    import pyarrow as pa

    from timeline.analysis import whatif as W
    from timeline.cli.common import UsageError
    from timeline.cli.textout import json_rows, format_table

    changes = [W.parse_change(s) for s in args.scale or []] + [W.parse_change(s, add=True) for s in args.add or []]
    if not changes:
        raise UsageError("nothing to change: give --scale STAGE[.PHASE]=FACTOR and/or --add STAGE[.PHASE]=NS")
    run = open_selected(args.trace, args)
    table = pa.concat_tables(map_launches(run, args, "whatif", {"changes": changes}), promote_options="permissive")
    if args.json:
        json_out({"run": str(run.path), "report": "whatif", "changes": [c._asdict() for c in changes],
                   "rows": json_rows(table)})
        return 0
    print(run_head(run))
    print(format_table(table))
    return 0


def _typical(path, args):
    """A per-stage typical launch of a run (the median over its (rank, launch) stage
    reports) or of a trace file, and its name."""
    from timeline.analysis import stages as A
    from timeline.analysis import compare as C

    if Path(path).is_dir():
        run = open_selected(path, args)
        stages = run.stages(rank=args.rank, step=args.step, layer=args.layer)
        if stages is None:
            from timeline.run.layout import RunError

            raise RunError(f"run {path!r} is empty: nothing to compare")
        return C.median_per_stage(stages.drop_columns(["step", "layer", "capture", "append"]))
    from timeline.cli.common import load_trace

    return C.typical(A.stage_report(load_trace(path), by_launch=True), True)


def cmd_compare_run(args) -> int:
    """``timeline compare A B`` where either is a run: a typical launch of each (the
    median over the (rank, launch) pairs of the selection), per stage B - A."""
    import pyarrow as pa

    from timeline.analysis import compare as C
    from timeline.run import report as RP
    from timeline.cli.textout import format_table

    if args.scope != "launch":
        from timeline.cli.common import UsageError

        raise UsageError(f"--scope {args.scope}: a run compares as a typical launch (the default); select the "
                         "launches with --step / --layer / --rank")
    rows = C.compare_table(_typical(args.a, args), _typical(args.b, args))
    if args.json:
        json_out({"a": str(args.a), "b": str(args.b), "scope": "launch", "rows": rows})
        return 0
    print(f"A {args.a}\nB {args.b}\na typical launch of each (median over its (rank, launch) pairs); Δ = B - A, µs\n")
    print(format_table(RP.rows_table(rows)) if rows else "no stage in both")
    return 0


def cmd_merge_run(args) -> int:
    """``timeline merge TRACE... -o RUN/``: the merged trace appended to a run as one capture."""
    from timeline.cli.common import load_trace
    from timeline.ingest.merge import merge
    from timeline.run.write import append

    traces = [load_trace(p) for p in args.traces]
    merged = merge(traces, align=args.align)
    for note in merged.notes:
        print(f"warning: {note}", file=sys.stderr)
    written = append(args.output.rstrip("/") or "/", merged, capture="merge:" + ",".join(Path(p).name for p in args.traces))
    print(f"appended to run {args.output}: ranks {merged.ranks}, launches {merged.launches}, "
          f"{merged.tasks.num_rows} task rows, {len(written)} parts")
    return 0


__all__ = ["cmd_compare_run", "cmd_edges_run", "cmd_export_run", "cmd_merge_run", "cmd_whatif_run", "on_selection"]
