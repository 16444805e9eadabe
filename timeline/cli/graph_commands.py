"""The ``timeline`` commands of the task graph: ``set-graph`` (attach a graph to a
trace), ``edges`` (which producer held each task, per stage, and the edges table),
and the exact critical path that ``summary --critical-path`` prints when a trace
has a graph."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from timeline.contract import schema as S
from timeline.cli.common import UsageError, load_trace, out_dir_exists, title, trace_out
from timeline.analysis.critical import path_us
from timeline.cli.textout import json_rows, format_table


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
    from timeline.analysis import edges as E

    trace = load_trace(args.trace)
    g = E.edges(trace)
    table = E.edges_per_stage(trace, g)
    if args.output:
        out = Path(args.output)
        out_dir_exists(out)
        _write_table(E.edges_table(trace, g), out)
    if args.json:
        print(json.dumps({"kernel": trace.spec.kernel, "violations": int(g.violations.size), "missing": g.missing,
                          "edges": g.edge_count, "rows": json_rows(table)}, ensure_ascii=False, indent=1))
        return 0
    print(title(trace))
    print(f"task graph: {g.edge_count:,} edges; what held each task's wait (its gating edge), per stage; "
          f"slack = how much later the other producers could have ended (µs)\n")
    print(format_table(table))
    print(f"\ncausality violations: {g.violations.size} (a wait that ended before a producer was ready: a wrong "
          f"graph, wrong declared wait or misaligned ranks); producers named but absent: {g.missing}")
    if args.output:
        print(f"wrote {args.output}: the edges table")
    return 0


def _write_table(table: pa.Table, out: Path) -> None:
    if out.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    else:
        with pa.OSFile(str(out), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)


def print_exact_paths(trace, args, ranks, launches) -> int:
    """``summary --critical-path`` of a trace with a graph: the exact path of each
    selected launch (its last end on any rank, or on the selected ranks), its stages'
    shares, µs from the path's first start."""
    from timeline.analysis import edges as E
    from timeline.analysis.critical import critical_path

    g = E.edges(trace)
    blocks = []
    for launch in launches or trace.launches:
        for r in (ranks or [None]):
            path = critical_path(trace, launch=launch, rank=r, g=g)
            if path.num_rows:
                blocks.append((r, launch, path))
    if args.json:
        rows = [{"launch": la, **row} for _, la, p in blocks for row in json_rows(path_us(p))]
        print(json.dumps({"kernel": trace.spec.kernel, "report": "critical_path", "exact": True,
                          "violations": int(g.violations.size), "rows": rows}, ensure_ascii=False, indent=1))
        return 0
    print(title(trace))
    for r, launch, path in blocks:
        where = "any rank" if r is None else f"rank {r}"
        print(f"\nlaunch {launch} (its last end on {where}): exact critical path along the task graph's gating "
              "edges, µs from the path's first start")
        print(format_table(path_us(path)))
        print("\nper stage on the path:")
        print(format_table(E.path_shares(path)))
    print(f"\ncausality violations: {g.violations.size}")
    return 0


def cmd_whatif(args) -> int:
    from timeline.analysis import whatif as W

    changes = [W.parse_change(s) for s in args.scale or []] + [W.parse_change(s, add=True) for s in args.add or []]
    if not changes:
        raise UsageError("nothing to change: give --scale STAGE[.PHASE]=FACTOR and/or --add STAGE[.PHASE]=NS")
    trace = load_trace(args.trace)
    p = W.predict(trace, changes)
    if args.json:
        print(json.dumps({"kernel": trace.spec.kernel, "changes": [c._asdict() for c in changes],
                          "fidelity": p.fidelity._asdict(), "launches": p.launches.to_pylist(),
                          "stages": p.stages.to_pylist()}, ensure_ascii=False, indent=1))
        return 0
    print(title(trace))
    print("what if: " + ", ".join(f"{c.stage}{'.' + c.phase if c.phase else ''} x{c.factor:g}"
                                  + (f" {c.add_ns:+g} ns" if c.add_ns else "") for c in changes))
    print(f"fidelity of the replay (no change): every task's end within {p.fidelity.task_end_ns:g} ns, every "
          f"launch's within {p.fidelity.kernel_end_ns:g} ns\n")
    print(format_table(p.launches))
    print()
    print(format_table(p.stages))
    return 0
