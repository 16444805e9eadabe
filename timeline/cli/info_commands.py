"""``timeline info``: what a trace file holds (spec, sizes, rows, time, clocks and
their alignment, anomalies), as text or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from timeline.contract import clocks as K
from timeline.core import rows as R
from timeline.contract import schema as S
from timeline.cli.common import load_trace
from timeline.cli.textout import format_table
from timeline.core.trace import file_format


def info_dict(trace, path: Path) -> dict:
    """What ``timeline info`` shows, as a JSON-ready dict."""
    import pyarrow.compute as pc

    from timeline.core import grouped as GR

    gid, ng, (ranks, launches) = GR.group_ids(R.column(trace.tasks, "rank"), R.column(trace.tasks, "launch"))
    rows = np.bincount(gid, minlength=ng)
    span = {}
    phase_cols = [trace.tasks.column(f"{p}_ns") for p in trace.phases]
    lo = min((pc.min(c).as_py() for c in phase_cols if c.null_count < len(c)), default=None)
    hi = max((pc.max(c).as_py() for c in phase_cols if c.null_count < len(c)), default=None)
    if lo is not None:
        span = {"first_ns": lo, "last_ns": hi, "span_us": (hi - lo) / 1000.0}
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "format": file_format(path),
        "synthetic": trace.synthetic,
        "spec": trace.spec.to_dict(),
        "ranks": trace.ranks,
        "launches": trace.launches,
        "specs_per_rank": len(trace.specs),
        "task_rows": trace.tasks.num_rows,
        "intervals": trace.intervals.num_rows,
        "rows_per_rank_launch": [
            {"rank": r, "launch": launch, "rows": n}
            for r, launch, n in zip(ranks.tolist(), launches.tolist(), rows.tolist())],
        "time": span,
        "origins": trace.origins,
        "offsets": trace.offsets,
        "alignment": [a._asdict() for a in K.alignment_of(trace)],
        "calibrations": {sp.rank: [c.to_dict() for c in K.calibrations_of(sp)] for sp in trace.specs},
        "anomalies": trace.anomalies.to_pylist(),
        "anomaly_totals": trace.anomaly_summary(),
        "buffer_bytes_per_rank": trace.spec.layout.nbytes,
    }


def _clock_lines(trace) -> list:
    """``timeline info``'s lines on the clocks: each rank's calibrations (or none) and,
    in a trace of several ranks, how each was put on the common axis."""
    lines = []
    for sp in sorted(trace.specs, key=lambda s: s.rank):
        cals = K.calibrations_of(sp)
        if cals:
            best = min(c.uncertainty_ns for c in cals)
            tail = ""
            if len(cals) > 1:
                d = K.drift(cals[0], cals[-1])
                tail = f", drift {d.ppm:+.3f} ± {d.uncertainty_ppm:.3f} ppm over {d.seconds:.1f} s"
            lines.append(f"clock      rank {sp.rank}: {len(cals)} calibration(s) against the host, "
                         f"best ± {best:,.0f} ns{tail}")
    if len(trace.ranks) > 1:
        lines += [f"aligned    {K.describe(a)}" for a in K.alignment_of(trace)]
    return lines


def cmd_info(args) -> int:
    """``timeline info TRACE``: what the file holds; ``timeline info RUN``: the run's report
    (``timeline run info RUN``'s)."""
    from timeline.cli.run_commands import cmd_info_run, is_run

    if is_run(args.trace):
        return cmd_info_run(args)
    if getattr(args, "skip_damaged", False):  # a trace file has no parts to leave out: refused, not ignored
        from timeline.query.source import Options, refuse_run_options

        refuse_run_options(args.trace, Options(skip_damaged=True))
    trace = load_trace(args.trace)
    d = info_dict(trace, Path(args.trace))
    if args.json:
        print(json.dumps(d, ensure_ascii=False, indent=1))
        return 0
    sp = d["spec"]
    stages = ", ".join(f"{n}({c})" for n, c in sp["stages"])
    lay = trace.spec.layout
    print(f"file       {d['file']} ({d['format']}, {d['bytes']:,} bytes)")
    if d["synthetic"]:
        print("SYNTHETIC  yes: made by timeline.ingest.synth, not measured on a GPU")
    print(f"kernel     {sp['kernel']}  arch {sp['arch']}  clock {sp['clock']['name']} "
          f"{sp['clock']['hz'] / 1e6:g} MHz" + (f" + cycle counter {sp['cycles']} (hybrid)" if sp.get("cycles") else "")
          + f"  grid {sp['grid'] or '?'}")
    print(f"stages     {stages}")
    print(f"phases     {', '.join(sp['phases'])}" + (f"  (wait for producers {'→'.join(sp['wait'])})"
                                                         if sp.get("wait") else ""))
    prof = (sp.get("extra") or {}).get("profile")
    if prof:  # a kernel's own build read by its profile (timeline.contract.kernels)
        ex = sp["extra"]
        waits = ", ".join(f"{s} {'→'.join(w) or 'none'}" for s, w in (ex.get("stage_wait") or {}).items())
        print(f"profile    {prof} ({ex.get('profile_how', '')})" + (f"; per-stage waits: {waits}" if waits else ""))
    print(f"buffer     {lay.shape} int64 (launches, rows, waves, cols) = {lay.nbytes:,} bytes per rank; "
          f"waves per task {sp['waves']}")
    print(f"ranks      {d['ranks']} (world {sp['world']})   launches {d['launches']}")
    print(f"rows       {d['task_rows']:,} task rows, {d['intervals']:,} intervals")
    for r in d["rows_per_rank_launch"]:
        print(f"           rank {r['rank']} launch {r['launch']}: {r['rows']:,} rows")
    if d["time"]:
        print(f"time       {d['time']['span_us']:.2f} µs from first to last stamp")
    for line in _clock_lines(trace):
        print(line)
    if not d["anomalies"]:
        print("anomalies  none")
    else:
        import pyarrow as pa

        print(f"anomalies  {d['anomaly_totals']}")
        print(format_table(pa.Table.from_pylist(d["anomalies"])))
        for kind in d["anomaly_totals"]:
            print(f"  {kind}: {S.ANOMALY_KINDS.get(kind, '')}")
    return 0
