"""``timeline launches`` and ``timeline summary`` of a trace file or a run, alike
(``timeline.query.source``): the launches by kernel time with the run's quantiles, and
the stage report in every mode (typical launch, per launch, idle, critical path, the
p99 launch, the kernels' own reports). Every number is ``timeline.analysis.launches``'
definition; every launch is named by its key."""

from __future__ import annotations

import json

import pyarrow as pa

from timeline.analysis import launches as LA
from timeline.cli.common import UsageError, reproduce, selection_of, source_of
from timeline.cli.textout import Progress, format_table, json_rows
from timeline.query import launches as QL
from timeline.query.launches import us as _us


def dump(doc) -> None:
    """``doc`` as indented JSON on stdout."""
    print(json.dumps(doc, ensure_ascii=False, indent=1, default=str))


def progress(name: str, args, total=None) -> Progress:
    return Progress(name, total=total, enabled=not getattr(args, "quiet", False))


def source_cmd(args, trace_arg: str = "trace") -> str:
    """The command line's source as ``reproduce`` lines quote it."""
    import shlex

    return shlex.quote(getattr(args, trace_arg))


def _text_rows(rows: list) -> pa.Table:
    """The launch rows as the text table shows them: skew as ``S ± PM`` where bounded."""
    show = []
    for r in rows:
        s, pm = r["skew_us"], r["skew_pm_us"]
        show.append({"launch": r["launch"], "ranks": r["ranks"], "kernel_us": r["kernel_us"],
                     "skew_us": None if s is None else f"{s:.3f} ± {pm:.3f}" if pm else f"{s:.3f}",
                     "alignment": r["alignment"], "anomalies": r["anomalies"], "slowest_rank": r["slowest_rank"]})
    return LA.rows_table(show)


def cmd_launches(args) -> int:
    """``timeline launches SRC``: one row per launch, the slowest first, and the kernel
    time's p50 / p90 / p99, typical and noise over the selection (``timeline.query.launches``)."""
    src = source_of(args.trace, args)
    doc = QL.launches(src, selection_of(args), slowest=args.slowest, by_rank=args.by_rank,
                      source_text=source_cmd(args))
    doc["reproduce"] = reproduce(args)
    if args.json:
        dump(doc)
        return 0
    st = doc["kernel"]
    print(src.head())
    print(f"kernel time over {doc['launches']} launch(es): p50 {st['p50_us']} µs ({st['p50_launch']}), "
          f"p90 {st['p90_us']} µs ({st['p90_launch']}), p99 {st['p99_us']} µs ({st['p99_launch']}); "
          f"typical {st['typical_us']} µs, launch-to-launch noise {st['noise_us']} µs; slowest "
          f"{st['slowest_launch']}")
    if args.by_rank:
        print("one row per (rank, launch): the rank's own first start to last end, the slowest first\n")
        print(format_table(LA.rows_table(doc["rows"])))
    else:
        print("one row per launch, the slowest first: kernel time = the launch's first start to last end over its "
              "ranks on their common axis; skew = latest rank's start - earliest, ± its bound (docs/EXPLAIN.md, "
              "definitions)\n")
        print(format_table(_text_rows(doc["rows"])))
    for note in doc["notes"]:
        print(f"\n{note}")
    return 0


# -- summary ------------------------------------------------------------------------------
def cmd_summary(args) -> int:
    """``timeline summary SRC``: the stage report in the mode the options name."""
    src = source_of(args.trace, args)
    if args.worst is not None and args.worst < 1:
        raise UsageError(f"--worst {args.worst}: give at least 1")
    sel = src.select(selection_of(args))
    if args.critical_path:
        return _critical_paths(src, sel, args)
    if args.p99:
        return _p99(src, sel, args)
    if args.by_launch:
        return _by_launch(src, sel, args)
    if src.kind == "run" and not (args.legacy or args.profile_csv or args.idle or args.union):
        return _run_summary(src, sel, args)
    from timeline.cli import trace_summary

    return trace_summary.summary_of(src.trace(sel), args)


def _run_summary(src, sel, args) -> int:
    """A run's stage report: per stage p50 / p90 / p99 over the selected launches of the
    per-launch stage reports (no task row read), and the worst launches."""
    from timeline.run import report as RP

    stages = src.stage_rows(sel)
    table = RP.stage_summary(stages.drop_columns(["key"]))
    times = sel.times
    top = LA.slowest(LA.kernel(times), args.worst or 5)
    worst = QL.rows(times.take(pa.array(top, pa.int64())))
    if args.json:
        dump({**src.about(), "report": "run_stage_summary", "rows": json_rows(table), "worst": worst,
              "kernel": QL.stats(times), "reproduce": reproduce(args)})
        return 0
    print(src.head())
    print(f"stage report over {times.num_rows} launches ({stages.num_rows // max(len(set(stages.column('stage').to_pylist())), 1)}"
          " (rank, launch) rows): per stage, p50 / p90 / p99 over launches of its span and of each launch's median "
          "interval (µs)\n")
    print(format_table(table))
    print(f"\nthe {len(worst)} slowest launches (docs/EXPLAIN.md, definitions)\n")
    print(format_table(_text_rows(worst)))
    return 0


def _by_launch(src, sel, args) -> int:
    """``summary --by-launch``: one stage report row per (rank, launch, stage), the launch
    by its key (a run's from its stored reports: no task row read)."""
    rows = src.stage_rows(sel)
    front = ["key", "rank", "stage"]
    rows = rows.select(front + [c for c in rows.column_names if c not in front and c not in
                                ("launch", "step", "layer", "capture", "append")])
    rows = rows.rename_columns(["launch"] + rows.column_names[1:])
    if args.json:
        dump({**src.about(), "report": "stage", "by_launch": True, "rows": json_rows(rows),
              "reproduce": reproduce(args)})
        return 0
    print(src.head())
    print("stage report per (rank, launch), µs from the earliest start of each rank's launch\n")
    print(format_table(rows))
    return 0


def _critical_paths(src, sel, args) -> int:
    """``summary --critical-path``: each selected launch's critical path (exact along the
    task graph when there is one, else each rank's heuristic path), by its key."""
    from timeline.analysis import edges as E
    from timeline.analysis.critical import path_us

    with progress("critical path", args, len(sel.keys)) as bar:
        paths = src.map(sel, "critical_path", progress=bar)
    if args.json:
        rows = []
        for p in paths:
            key = p.column("launch")[0].as_py() if p.num_rows else None
            rows += [{"launch": key, **r} for r in json_rows(path_us(p.drop_columns(["launch"])))]
        dump({**src.about(), "report": "critical_path", "exact": bool(src.spec().graph), "rows": rows,
              "reproduce": reproduce(args)})
        return 0
    print(src.head())
    for key, p in zip(sel.keys, paths):
        print(f"\nlaunch {key}: critical path, µs from the path's first start")
        print(format_table(path_us(p.drop_columns(["launch"]))))
        if "via" in p.column_names and p.num_rows:
            print("\nper stage on the path:")
            print(format_table(E.path_shares(p)))
    return 0


def _p99(src, sel, args) -> int:
    """``summary --p99``: the p99 launch, its critical path and its per-stage delta
    against the p50 launch (both by ``launches``' definitions)."""
    from timeline.analysis import edges as E
    from timeline.analysis.critical import path_us
    from timeline.analysis import compare as C

    times = sel.times
    k = LA.kernel(times)
    at99, at50 = LA.at_quantile(k, 0.99), LA.at_quantile(k, 0.5)
    if at99 is None:
        raise UsageError(f"{src.name} has no timed launch in this selection")
    keys = LA.keys(times)
    pick = sel._replace(times=times.take(pa.array([at99], pa.int64())), keys=[keys[at99]])
    path = src.map(pick, "critical_path")[0]
    rows = src.stage_rows(sel._replace(times=times.take(pa.array([at50, at99], pa.int64())),
                                       keys=[keys[at50], keys[at99]]))
    drop = [c for c in ("step", "layer", "capture", "append") if c in rows.column_names]
    of = lambda key: rows.filter(pa.compute.equal(rows.column("key"), str(key))).drop_columns(drop + ["key"])  # noqa: E731
    delta = LA.rows_table(C.compare_table(C.median_per_stage(of(keys[at50])), C.median_per_stage(of(keys[at99]))))
    shares = E.path_shares(path) if path.num_rows and "via" in path.column_names else path_us(path.drop_columns(["launch"]))
    stats = QL.stats(times)
    if args.json:
        dump({**src.about(), "report": "p99_launch", "p99_launch": str(keys[at99]), "p50_launch": str(keys[at50]),
              "p99_kernel_us": _us(k[at99]), "p50_kernel_us": _us(k[at50]), "kernel": stats,
              "delta": json_rows(delta), "path_shares": json_rows(shares),
              "reproduce": reproduce(args)})
        return 0
    print(src.head())
    print(f"p99 launch {keys[at99]}: {_us(k[at99])} µs; p50 launch {keys[at50]}: {_us(k[at50])} µs "
          f"(nearest rank over {times.num_rows} launches)\n\nper stage, the p99 launch (B) against the p50 launch (A), µs")
    print(format_table(delta))
    print("\nits critical path, per stage:")
    print(format_table(shares))
    return 0


__all__ = ["cmd_launches", "cmd_summary", "dump", "source_cmd"]
