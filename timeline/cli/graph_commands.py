"""The ``timeline`` commands of the task graph: ``set-graph`` (attach a graph to a
trace), ``edges`` (which producer held each task, per launch and stage, and the
edges table) and ``whatif`` (the replay with changed phase times), of a trace file
or a run alike."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from timeline.contract import schema as S
from timeline.cli.common import UsageError, load_trace, out_dir_exists, trace_out
from timeline.cli.textout import format_table


EDGE_COLUMNS = ("stage", "task", "producer_stage", "producer_task")  # then optionally "launch"


def load_edges(path: str) -> list:
    """Listed task-graph edges (``graph.Edge``) from a CSV file with the header
    ``stage,task,producer_stage,producer_task[,launch]`` (launch -1 or empty: every
    launch)."""
    import csv

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"edge list {path!r} does not exist (a CSV: {','.join(EDGE_COLUMNS)}[,launch])")
    try:
        with p.open(newline="") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise UsageError(f"edge list {path!r} is not a CSV file: {e}") from None
    if not rows or tuple(rows[0][:4]) != EDGE_COLUMNS or rows[0][4:] not in ([], ["launch"]):
        raise UsageError(f"edge list {path!r}: the first line must be {','.join(EDGE_COLUMNS)} or "
                         f"{','.join(EDGE_COLUMNS)},launch; got {','.join(rows[0]) if rows else 'an empty file'}")
    from timeline.contract.graph import Edge

    out = []
    for i, r in enumerate(rows[1:], start=2):
        try:
            launch = int(r[4]) if len(r) > 4 and r[4].strip() else -1
            out.append(Edge(r[0].strip(), int(r[1]), r[2].strip(), int(r[3]), launch))
        except (IndexError, ValueError):
            raise UsageError(f"edge list {path!r} line {i}: {','.join(r)!r} is not stage,task,producer_stage,"
                             "producer_task[,launch] with integer tasks and launch") from None
    return out


def cmd_set_graph(args) -> int:
    from timeline.contract import presets

    if (args.preset is None) == (args.graph is None):
        both = ", not both" if args.preset is not None else ""
        raise UsageError("give the graph: --preset NAME (" + ", ".join(presets.PRESETS)
                         + f") or --graph FILE.json{both}")
    out = trace_out(args.output)
    trace = load_trace(args.trace)
    if args.preset is not None:
        if args.preset not in presets.PRESETS:
            raise UsageError(f"--preset {args.preset!r}: known presets are {list(presets.PRESETS)}")
        graph = presets.PRESETS[args.preset]()
    else:
        p = Path(args.graph)
        if not p.is_file():
            raise UsageError(f"graph file {args.graph!r} does not exist")
        try:
            graph = json.loads(p.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"graph file {args.graph!r} is not JSON: {e}") from None
        if not isinstance(graph, dict):
            raise UsageError(f"graph file {args.graph!r}: a graph is {{stage: [rule, ...]}}; see docs/GRAPH.md")
    if args.edges:
        from timeline.ingest.collect import with_edges

        graph = with_edges(trace.spec.replace(graph=graph), load_edges(args.edges)).graph
    try:
        traced = trace.with_graph(graph)
    except S.SpecError as e:  # the graph's own error (a spec refuses a bad graph), said of its file
        if args.graph is None:
            raise
        raise S.SpecError(f"graph file {args.graph!r}: {e}") from None
    traced.save(out)
    print(f"wrote {out}: {sum(len(r) for r in traced.spec.graph.values())} producer rules over "
          f"{len(traced.spec.graph)} stages")
    return 0


def cmd_edges(args) -> int:
    """``timeline edges SRC``: per selected launch and stage, what held each task's wait
    (``timeline.query.reports.edges``, a run's on its engine); ``-o`` every edge of the
    selection."""
    from timeline.analysis.launches import rows_table
    from timeline.cli.common import reproduce, selection_of, source_of
    from timeline.query import reports as QR

    src = source_of(args.trace, args)
    sel = src.select(selection_of(args))
    totals = {}
    if args.output:
        out = Path(args.output)
        out_dir_exists(out)
        table, totals = QR.edge_list(src, sel)
        _write_table(table, out)
    with _progress("edges", args, len(sel.keys)) as bar:
        doc = {**QR.edges(src, sel, progress=bar), "output": args.output, **totals}
    if args.json:
        print(json.dumps({**doc, "reproduce": reproduce(args)}, ensure_ascii=False, indent=1, default=str))
        return 0
    print(src.head())
    print("per launch and stage: what held each task's wait (its gating edge); slack = how much later the other "
          "producers could have ended (µs)\n")
    print(format_table(rows_table(doc["rows"])))
    if args.output:
        print(f"\nwrote {args.output}: every edge of the selection (consumer, producer, kind, slack_ns, gating)")
    return 0


def _progress(name: str, args, total):
    from timeline.cli.textout import Progress

    return Progress(name, total=total, enabled=not getattr(args, "quiet", False))


def _write_table(table: pa.Table, out: Path) -> None:
    if out.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    else:
        with pa.OSFile(str(out), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)


def cmd_whatif(args) -> int:
    """``timeline whatif SRC``: each selected launch replayed with the changes
    (``timeline.query.reports.whatif``), beside the replay's fidelity."""
    from timeline.analysis import whatif as W
    from timeline.analysis.launches import rows_table
    from timeline.cli.common import reproduce, selection_of, source_of
    from timeline.query import reports as QR

    changes = [W.parse_change(s) for s in args.scale or []] + [W.parse_change(s, add=True) for s in args.add or []]
    if not changes:
        raise UsageError("nothing to change: give --scale STAGE[.PHASE]=FACTOR and/or --add STAGE[.PHASE]=NS")
    src = source_of(args.trace, args)
    sel = src.select(selection_of(args))
    with _progress("whatif", args, len(sel.keys)) as bar:
        doc = QR.whatif(src, sel, changes, progress=bar)
    if args.json:
        print(json.dumps({**doc, "reproduce": reproduce(args)}, ensure_ascii=False, indent=1))
        return 0
    print(src.head())
    print("what if: " + ", ".join(f"{c.stage}{'.' + c.phase if c.phase else ''} x{c.factor:g}"
                                  + (f" {c.add_ns:+g} ns" if c.add_ns else "") for c in changes))
    fid = doc["fidelity"]
    if fid:
        print(f"fidelity of the replay (no change): every task's end within {fid['task_end_ns']:g} ns, every "
              f"launch's within {fid['kernel_end_ns']:g} ns")
    print()
    print(format_table(rows_table(doc["launches"])))
    if doc["stages"] is not None:
        print()
        print(format_table(rows_table(doc["stages"])))
    return 0
