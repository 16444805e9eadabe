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
from timeline.cli.textout import Progress, format_table
from timeline.query import launches as QL


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
    st = doc["kernel_time"]
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
    if not (args.legacy or args.profile_csv or args.idle):
        return _run_summary(src, sel, args) if src.kind == "run" and not args.union else _stage_report(src, sel, args)
    from timeline.cli import trace_summary

    return trace_summary.summary_of(src.trace(sel), args)


def _stage_report(src, sel, args) -> int:
    """A trace file's (or with ``--union`` a run selection's) stage report
    (``timeline.query.reports.stage_report``): a typical launch, or the whole scope."""
    from timeline.query import reports as QR

    doc = QR.stage_report(src, sel, union=args.union)
    if args.json:
        dump({**doc, "reproduce": reproduce(args)})
        return 0
    scope = (f"a typical launch: the median over {doc['pairs']} (rank, launch) pairs, µs from each launch's first "
             "start; worst span = the slowest launch's (--union: all launches as one)"
             if doc["report"] == "typical_launch" else "µs from the earliest start")
    print(src.head())
    print(f"stage report, {scope}; share = stage span / kernel span; interval columns are per-row p50 / p90 (µs)\n")
    print(format_table(LA.rows_table(doc["rows"])))
    return 0


def _run_summary(src, sel, args) -> int:
    """A run's stage report (``timeline.query.reports.run_summary``)."""
    from timeline.query import reports as QR

    doc = QR.run_summary(src, sel, args.worst or 5)
    if args.json:
        dump({**doc, "reproduce": reproduce(args)})
        return 0
    print(src.head())
    print(f"stage report over {doc['launches']} launches ({doc['pairs']} (rank, launch) rows): per stage, "
          "p50 / p90 / p99 over launches of its span and of each launch's median interval (µs)\n")
    print(format_table(LA.rows_table(doc["rows"])))
    print(f"\nthe {len(doc['worst'])} slowest launches (docs/EXPLAIN.md, definitions)\n")
    print(format_table(_text_rows(doc["worst"])))
    return 0


def _by_launch(src, sel, args) -> int:
    """``summary --by-launch`` (``timeline.query.reports.by_launch``)."""
    from timeline.query import reports as QR

    doc = QR.by_launch(src, sel)
    if args.json:
        dump({**doc, "reproduce": reproduce(args)})
        return 0
    print(src.head())
    print("stage report per (rank, launch), µs from the earliest start of each rank's launch\n")
    print(format_table(LA.rows_table(doc["rows"])))
    return 0


def _critical_paths(src, sel, args) -> int:
    """``summary --critical-path`` (``timeline.query.reports``): each selected launch's
    critical path, by its key."""
    from timeline.analysis.critical import path_us
    from timeline.query import reports as QR

    with progress("critical path", args, len(sel.keys)) as bar:
        if args.json:
            dump({**QR.critical_paths(src, sel, progress=bar), "reproduce": reproduce(args)})
            return 0
        paths = QR.path_tables(src, sel, progress=bar)
    print(src.head())
    for key, p, shares in paths:
        print(f"\nlaunch {key}: critical path, µs from the path's first start")
        print(format_table(path_us(p.drop_columns(["launch"]))))
        if shares is not None:
            print("\nper stage on the path:")
            print(format_table(shares))
    return 0


def _p99(src, sel, args) -> int:
    """``summary --p99`` (``timeline.query.reports.p99``)."""
    from timeline.query import reports as QR

    doc = QR.p99(src, sel)
    if args.json:
        dump({**doc, "reproduce": reproduce(args)})
        return 0
    print(src.head())
    print(f"p99 launch {doc['p99_launch']}: {doc['p99_kernel_us']} µs; p50 launch {doc['p50_launch']}: "
          f"{doc['p50_kernel_us']} µs (nearest rank over {doc['launches']} launches)\n\n"
          "per stage, the p99 launch (B) against the p50 launch (A), µs")
    print(format_table(LA.rows_table(doc["delta"])))
    print("\nits critical path, per stage:")
    print(format_table(LA.rows_table(doc["path_shares"])))
    return 0


__all__ = ["cmd_launches", "cmd_summary", "dump", "source_cmd"]
