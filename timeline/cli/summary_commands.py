"""``timeline launches`` and ``timeline summary`` of a trace file or a run, alike
(``timeline.cli.source``): the launches by kernel time with the run's quantiles, and
the stage report in every mode (typical launch, per launch, idle, critical path, the
p99 launch, the kernels' own reports). Every number is ``timeline.analysis.launches``'
definition; every launch is named by its key."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from timeline.analysis import launches as LA
from timeline.cli.common import UsageError
from timeline.cli.source import open_source
from timeline.cli.textout import Progress, format_table, json_rows

LAUNCHES_SCHEMA = "timeline.launches/1"
IDLE_GAPS = 20  # the largest gaps ``summary --idle`` lists


def _us(v):
    return None if v is None or v != v else round(float(v) / 1e3, 3)


def dump(doc) -> None:
    """``doc`` as indented JSON on stdout."""
    print(json.dumps(doc, ensure_ascii=False, indent=1, default=str))


def progress(name: str, args, total=None) -> Progress:
    return Progress(name, total=total, enabled=not getattr(args, "quiet", False))


def source_cmd(args, trace_arg: str = "trace") -> str:
    """The command line's source as ``reproduce`` lines quote it."""
    import shlex

    return shlex.quote(getattr(args, trace_arg))


# -- launches -----------------------------------------------------------------------------
def launch_stats(times: pa.Table) -> dict:
    """The kernel-time figures of a set of launches (``launches`` module's definitions),
    as the JSON documents give them: pNN, typical and noise in µs, and the launch keys of
    the p50 / p90 / p99 and slowest launches."""
    k = LA.kernel(times)
    keys = times.column("key").to_pylist()
    out = {f"p{round(q * 100)}_us": _us(v) for q, v in zip(LA.QUANTILES, LA.quantiles(k))}
    out.update(typical_us=_us(LA.typical_ns(k)), noise_us=_us(LA.noise_ns(k)) if (~np.isnan(k)).any() else None)
    for q in LA.QUANTILES:
        i = LA.at_quantile(k, q)
        out[f"p{round(q * 100)}_launch"] = None if i is None else keys[i]
    top = LA.slowest(k)
    out["slowest_launch"] = keys[top[0]] if top else None
    return out


def _launch_rows(times: pa.Table) -> list:
    """A ``launch_times`` table as the JSON rows of ``timeline launches``."""
    out = []
    for r in times.to_pylist():
        out.append({"launch": r["key"], "step": r["step"], "layer": r["layer"], "capture": r["capture"],
                    "slot": r["slot"], "ranks": r["ranks"], "kernel_us": _us(r["kernel_ns"]),
                    "skew_us": _us(r["skew_ns"]), "skew_pm_us": _us(r["skew_pm_ns"]), "alignment": r["alignment"],
                    "anomalies": r["anomalies"], "slowest_rank": r["slowest_rank"]})
    return out


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
    time's p50 / p90 / p99, typical and noise over the selection."""
    src = open_source(args.trace, args)
    sel = src.select(args)
    times = sel.times
    stats = launch_stats(times)
    order = LA.slowest(LA.kernel(times), times.num_rows)
    order += [i for i in range(times.num_rows) if i not in set(order)]  # untimed launches last
    shown = times.take(pa.array(order[: args.slowest] if args.slowest else order, pa.int64()))
    note = LA.skew_note(src.rank_rows(sel.ranks)) if src.kind == "run" else None
    reproduce = f"timeline launches {source_cmd(args)} --json"
    if args.by_rank:
        rows = src.rank_rows(sel.ranks)
        from timeline.cli.source import key_column

        keys = key_column(rows) if src.kind == "run" else LA.column_of(
            [str(src.loaded.launch_keys[int(x)]) for x in rows.column("trace_launch").to_pylist()], pa.string())
        want = set(str(k) for k in sel.keys)
        keep = np.array([k in want for k in keys.to_pylist()], dtype=bool)
        rows = rows.append_column("key", keys).filter(pa.array(keep))
        rank_rows = [{"launch": r["key"], "rank": r["rank"], "kernel_us": _us(r["kernel_ns"]),
                      "anomalies": r["anomalies"]} for r in rows.to_pylist()]
        rank_rows.sort(key=lambda r: -(r["kernel_us"] or -1))
        rank_rows = rank_rows[: args.slowest] if args.slowest else rank_rows
    if args.json:
        doc = {"schema": LAUNCHES_SCHEMA, **src.about(), "launches": times.num_rows, "kernel": stats,
               "rows": rank_rows if args.by_rank else _launch_rows(shown), "by_rank": bool(args.by_rank),
               "notes": [note] if note else [], "reproduce": reproduce}
        dump(doc)
        return 0
    print(src.head())
    print(f"kernel time over {times.num_rows} launch(es): p50 {stats['p50_us']} µs ({stats['p50_launch']}), "
          f"p90 {stats['p90_us']} µs ({stats['p90_launch']}), p99 {stats['p99_us']} µs ({stats['p99_launch']}); "
          f"typical {stats['typical_us']} µs, launch-to-launch noise {stats['noise_us']} µs; slowest "
          f"{stats['slowest_launch']}")
    if args.by_rank:
        print("one row per (rank, launch): the rank's own first start to last end, the slowest first\n")
        print(format_table(LA.rows_table(rank_rows)))
    else:
        print("one row per launch, the slowest first: kernel time = the launch's first start to last end over its "
              "ranks on their common axis; skew = latest rank's start - earliest, ± its bound (docs/EXPLAIN.md, "
              "definitions)\n")
        print(format_table(_text_rows(_launch_rows(shown))))
    if note:
        print(f"\n{note}")
    return 0


# -- summary ------------------------------------------------------------------------------
def cmd_summary(args) -> int:
    """``timeline summary SRC``: the stage report in the mode the options name."""
    src = open_source(args.trace, args)
    if args.worst is not None and args.worst < 1:
        raise UsageError(f"--worst {args.worst}: give at least 1")
    sel = src.select(args)
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
    worst = _launch_rows(times.take(pa.array(top, pa.int64())))
    if args.json:
        dump({**src.about(), "report": "run_stage_summary", "rows": json_rows(table), "worst": worst,
              "kernel": launch_stats(times), "reproduce": f"timeline summary {source_cmd(args)} --json"})
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
              "reproduce": f"timeline summary {source_cmd(args)} --by-launch --json"})
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
        dump({**src.about(), "report": "critical_path", "rows": rows,
              "reproduce": f"timeline summary {source_cmd(args)} --critical-path --json"})
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
    stats = launch_stats(times)
    if args.json:
        dump({**src.about(), "report": "p99_launch", "p99_launch": str(keys[at99]), "p50_launch": str(keys[at50]),
              "p99_kernel_us": _us(k[at99]), "p50_kernel_us": _us(k[at50]), "kernel": stats,
              "delta": json_rows(delta), "path_shares": json_rows(shares),
              "reproduce": f"timeline summary {source_cmd(args)} --p99 --json"})
        return 0
    print(src.head())
    print(f"p99 launch {keys[at99]}: {_us(k[at99])} µs; p50 launch {keys[at50]}: {_us(k[at50])} µs "
          f"(nearest rank over {times.num_rows} launches)\n\nper stage, the p99 launch (B) against the p50 launch (A), µs")
    print(format_table(delta))
    print("\nits critical path, per stage:")
    print(format_table(shares))
    return 0


__all__ = ["IDLE_GAPS", "LAUNCHES_SCHEMA", "cmd_launches", "cmd_summary", "dump", "launch_stats", "source_cmd"]
