"""Where one core's time goes when a step is appended to a run: the CPU seconds (this
process, all threads; the best of ``--repeat``) of each piece of ``timeline.run.append``
and of the checked load of one trace file (what ``timeline run add`` does per input),
on one SYNTHETIC step of the GLM-5 layer (``--ranks`` x ``--layers`` launches), each as
M intervals per CPU second of one core.

    python bench/run_append_profile.py            # 8 ranks x 128 layers: 8.1 M intervals

Pieces run one after another on one thread here; ``append`` runs the part encodes on a
pool of ``write.WRITER_THREADS`` beside the aggregates, so its wall time is less than
their sum. ``append(baseline=True)``'s pieces (the aggregates apart, nullable columns)
are printed beside the ones it replaced.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def best_cpu(fn, repeat: int) -> tuple:
    """``(least CPU seconds over repeat calls, the last result)``."""
    best, out = float("inf"), None
    for _ in range(repeat):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    import timeline.core.trace
    from timeline.ingest import synth
    from timeline.ingest.collect import collect
    from timeline.run import aggregate as RA
    from timeline.run import layout as RL
    from timeline.run import write as RW

    spec = synth.glm5_spec(launches=args.layers, world=args.ranks)
    slots = [(0, layer) for layer in range(args.layers)]
    trace = synth.synth_trace(spec, grid=64, seed=0, slots=slots).with_graph(synth.model_graph(spec))
    ivs = trace.intervals.num_rows
    print(f"bench/run_append_profile.py: {args.ranks} ranks x {args.layers} layers, one step: {trace.tasks.num_rows:,} task "
          f"rows, {ivs:,} intervals; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; CPU ms, best of "
          f"{args.repeat}\n")
    rows = []

    def piece(name: str, fn, n_iv=ivs):
        s, out = best_cpu(fn, args.repeat)
        rows.append((name, s, n_iv))
        return out

    keep = RW.stored_task_columns(trace.phases, trace.marks)
    opts = RW.task_part_options(trace.phases, trace.marks)
    groups = piece("(rank, step) partitions of the rows", lambda: RW.partition_groups(trace.tasks))
    parts = [(trace.tasks if i is None else trace.tasks.slice(i.start, i.stop - i.start)).select(keep) for _, _, i in groups]
    required = [RL._required(p) for p in parts]
    piece("Parquet encode of the task parts, null-free columns REQUIRED (now)",
          lambda: [pq.write_table(p, pa.BufferOutputStream(), **opts) for p in required])
    piece("  the same, every column nullable (before)", lambda: [pq.write_table(p, pa.BufferOutputStream(), **opts)
                                                               for p in parts])
    scratch = Path(tempfile.mkdtemp(prefix="append_profile_"))

    def write_all():
        shutil.rmtree(scratch / "run", ignore_errors=True)
        for (rank, step, _), p in zip(groups, parts):
            RL.write_parquet(scratch / "run", RL.tasks_part_path(rank, step, "x"), p, required=True, **opts)

    piece("  write_parquet of them: encode + file + blake2b + fsync + rename", write_all)
    launches, stages = piece("per-launch aggregates, one pass (now)",
                             lambda: RA.aggregates(trace, "c", "a", RW.STAGE_QUANTILES))
    piece("  launch_rows (before)", lambda: RW.launch_rows(trace, "c", "a"))
    piece("  stage_rows: the per-launch stage report (before; with this commit's int32 sort)",
          lambda: RW.stage_rows(trace, launches, "c", "a"))
    piece("small parts (launches, stages, anomalies) encoded",
          lambda: [pq.write_table(t, pa.BufferOutputStream(), **RW.PARQUET_OPTIONS) for t in (launches, stages)])

    def append_once(baseline: bool):
        shutil.rmtree(scratch / "run", ignore_errors=True)
        RW.append(scratch / "run", trace, capture="c", baseline=baseline)

    piece("append, whole (threads included)", lambda: append_once(False))
    piece("append(baseline=True), whole (threads included)", lambda: append_once(True))
    sp, buf = synth.synth_buffers(spec.replace(world=1), grid=64, seed=0, slots=slots)[0]
    one = collect(buf, sp, synthetic=True)
    path = one.save(scratch / "rank0.arrow")
    one_ivs = one.intervals.num_rows
    piece("load of one rank's trace file (Trace.load, checked): whole", lambda: timeline.core.trace.load(path), one_ivs)
    table = piece("  read the Arrow IPC file (zstd) + validate", lambda: timeline.core.trace._read_table(path, "f"), one_ivs)
    raw = table.schema.metadata
    piece("  checksum of the table, crc32 column digests (now)",
          lambda: timeline.core.trace.table_checksum(table.replace_schema_metadata(None), raw, "crc32"), one_ivs)
    piece("    the same, blake2b column digests (before)",
          lambda: timeline.core.trace.table_checksum(table.replace_schema_metadata(None), raw, "blake2b"), one_ivs)
    piece("  interval count without the intervals table (Trace.interval_count)",
          lambda: timeline.core.trace.Trace(one.tasks, one.specs, one.anomalies).interval_count, one_ivs)
    piece("    the intervals table, counted (before)",
          lambda: timeline.core.trace.Trace(one.tasks, one.specs, one.anomalies).intervals.num_rows, one_ivs)
    meta = timeline.core.trace.read_meta(raw, "f")
    tasks = timeline.core.trace._conform(table, meta.specs[0].phases, meta.specs[0].marks, "f")
    piece("  row checks (ranks, stages, ns = retime(ticks))", lambda: timeline.core.trace._check_rows(tasks, meta, "f"), one_ivs)
    piece("append of that one rank", lambda: (shutil.rmtree(scratch / "one", ignore_errors=True),
                                               RW.append(scratch / "one", one, capture="c")), one_ivs)
    shutil.rmtree(scratch, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'piece':{width}s}  {'CPU ms':>8s}  M intervals per CPU-s")
    for name, s, n in rows:
        print(f"{name:{width}s}  {s * 1e3:8.1f}  {n / s / 1e6:8.1f}")
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
