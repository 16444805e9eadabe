"""Where one trace file's ``timeline run add`` spends its CPU (issue 51): a worker's
staging of the file (``stream.stage_stream``: its read, checks, fingerprint,
aggregates, the encoding of its parts) and the parent's commit of it
(``stream.commit``: the check against the run's captures, the renames, the manifest
record), profiled by cProfile with the encoder pool run inline (one thread, so the
profile sees every piece) and cut into the pieces printed. Beside it, the CPU seconds
a file costs with the pools as ``run add`` runs them (no profiler).

    python bench/add_profile.py FILE...        # the files of bench/run.py, say: DIR/step*_rank*.arrow
    python bench/add_profile.py --codecs FILE...   # and the first file's task part under each codec

bench/run.py prints this breakdown for the first files of its ``run add`` rows."""

from __future__ import annotations

import argparse
import cProfile
import concurrent.futures
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (label, module file tail, function name, caller's function name or None: every caller)
PIECES = (
    ("open: format, metadata checks", "core/tracestream.py", "open_stream", None),
    ("read the Arrow IPC file (decompress) + validate", "core/tracestream.py", "_read", None),
    ("file checksum (CRC-32 a column)", "core/checksum.py", "update", "_checked"),
    ("conform to the tasks schema", "core/trace.py", "_conform", "_checked"),
    ("row checks (ranks, stages, ns = retime(ticks))", "core/trace.py", "_check_rows", None),
    ("capture fingerprint", "run/captures.py", "update", None),
    ("per-launch aggregates (launches, stages)", "run/stream.py", "add", None),
    ("  of which the stage quantiles", "core/grouped.py", "grouped_quantiles", None),
    ("task parts: Parquet encode", "run/parts.py", "write", None),
    ("  of which checksum + fsync of the part", "run/layout.py", "finish_staged", "_finish"),
    ("small parts (launches, stages, anomalies): encode + checksum + fsync", "run/layout.py", "stage_parquet", None),
)
COMMIT = (
    ("check against the run's captures (reads its records)", "run/write.py", "check_capture", None),
    ("renames + directory fsyncs", "run/layout.py", "publish_staged", None),
    ("manifest record (write, fsync, rename)", "run/layout.py", "write_json", None),
)


class Inline:
    """A ``ThreadPoolExecutor`` stand-in that runs each task at once, in the caller's thread."""

    def __init__(self, *args, **kwargs):
        pass

    def submit(self, fn, *args, **kwargs):
        f = concurrent.futures.Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 (handed to the caller, as a pool would)
            f.set_exception(e)
        return f

    def map(self, fn, *iterables):
        return [fn(*a) for a in zip(*iterables)]

    def shutdown(self, wait=True, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cum(stats: pstats.Stats, tail: str, name: str, caller: str | None) -> float:
    """Cumulative seconds of the function ``name`` defined in a file ending ``tail``
    (only its calls from ``caller``, if given)."""
    total = 0.0
    for (file, _, func), (_, _, _, ct, callers) in stats.stats.items():
        if func != name or not file.replace("\\", "/").endswith(tail):
            continue
        if caller is None:
            total += ct
        else:
            total += sum(v[3] for (_, _, f), v in callers.items() if f == caller)
    return total


def _table(stats: pstats.Stats, pieces, n: int, total: float) -> list:
    rows, named = [], 0.0
    for label, tail, name, caller in pieces:
        s = _cum(stats, tail, name, caller)
        named += 0 if label.startswith("  ") else s
        rows.append(f"    {label:70s} {s / n * 1e3:7.1f} ms  {s / total * 100:5.1f} %")
    rest = total - named
    rows.append(f"    {'other (the rest)':70s} {rest / n * 1e3:7.1f} ms  {rest / total * 100:5.1f} %")
    return rows


def profile(files: list, scratch: Path) -> list:
    """The breakdown's lines: ``files[0]`` added first (imports, the run's build), the
    rest profiled one by one (staged, then committed), then added again with the pools
    as ``run add`` runs them, unprofiled, for the true CPU per file."""
    import timeline.run.stream as RS
    from timeline.core.process import tune_process
    from timeline.core.tracestream import open_stream

    tune_process()  # the command's memory settings (and a --jobs worker's)
    run = scratch / "profiled"
    shutil.rmtree(run, ignore_errors=True)
    RS.commit(RS.stage_stream(run, open_stream(files[0]), capture="warm", check=False))
    rest = files[1:]
    seen: dict = {}  # the run's records, read once for the command (as `run add` keeps them)
    stage, commit = cProfile.Profile(time.process_time), cProfile.Profile(time.process_time)  # every thread's CPU
    pool, RS.ThreadPoolExecutor = RS.ThreadPoolExecutor, Inline
    try:
        for f in rest:
            stage.enable()
            st = RS.stage_stream(run, open_stream(f), capture=Path(f).name, check=False)
            stage.disable()
            commit.enable()
            RS.commit(st, seen)
            commit.disable()
    finally:
        RS.ThreadPoolExecutor = pool
    ss, cs = pstats.Stats(stage), pstats.Stats(commit)
    n = len(rest)
    real = scratch / "real"
    cpu, wall = unprofiled(files, real, prefetch=True)
    one = unprofiled(files, scratch / "one", prefetch=False, threads=1)
    ivs = sum(e["rows"] for r in __import__("timeline.run.layout", fromlist=["x"]).committed_records(real)[1:]
              for e in r["parts"] if e["table"] == "tasks") / n
    out = [f"one file's `run add`, profiled (cProfile, the encoder pool inline) over {n} files of {ivs:,.0f} task rows "
           f"each; CPU ms a file (every thread of the process, the profiler's overhead included)",
           f"  worker: stage_stream {ss.total_tt / n * 1e3:.1f} ms a file"]
    out += _table(ss, PIECES, n, ss.total_tt)
    out.append(f"  parent: commit {cs.total_tt / n * 1e3:.1f} ms a file (CPU; its fsyncs wait on the disk besides)")
    out += _table(cs, COMMIT, n, cs.total_tt)
    out.append(f"  unprofiled, the pools as `run add --jobs 1` runs them: {cpu * 1e3:.1f} ms CPU a file "
               f"({wall * 1e3:.1f} ms wall), stage + commit")
    out.append(f"  unprofiled, as a `--jobs` worker with one core's share runs it (encodes inline, no reader thread; "
               f"Arrow's pool 1 thread): {one[0] * 1e3:.1f} ms CPU a file ({one[1] * 1e3:.1f} ms wall)")
    return out


def unprofiled(files: list, run: Path, *, prefetch: bool, threads: int | None = None) -> tuple:
    """CPU and wall seconds a file of ``files[1:]`` appended to a new run at ``run``
    (``files[0]`` first, to warm up), unprofiled: read ahead on a thread or not
    (``prefetch``); ``threads``: the encoder pool and Arrow's CPU pool of that many
    threads (1: encodes inline, as a ``--jobs`` worker with one core's share), else
    as they are."""
    import pyarrow as pa

    import timeline.run.stream as RS
    from timeline.core.tracestream import open_stream
    from timeline.run import write as RW

    was = RW.WRITER_THREADS, pa.cpu_count()
    if threads is not None:
        RW.WRITER_THREADS = threads
        pa.set_cpu_count(threads)
    try:
        shutil.rmtree(run, ignore_errors=True)
        RS.commit(RS.stage_stream(run, open_stream(files[0]), capture="warm", check=False))
        c0, w0, seen = time.process_time(), time.perf_counter(), {}
        for f in files[1:]:
            stream = open_stream(f)
            RS.commit(RS.stage_stream(run, stream.prefetch() if prefetch else stream, capture=Path(f).name, seen=seen))
        return (time.process_time() - c0) / len(files[1:]), (time.perf_counter() - w0) / len(files[1:])
    finally:
        RW.WRITER_THREADS = was[0]
        pa.set_cpu_count(was[1])


def aggregate_rows(files: list, sizes=(1 << 18, 1 << 17, 1 << 16, 1 << 15), repeat: int = 5) -> list:
    """The per-launch aggregates of ``files`` (read once, held) taken ``stream.AGGREGATE_ROWS``
    rows at a time for each of ``sizes``: the median CPU ms a file of ``repeat`` rounds
    (the sizes taking turns) and the peak of Python-side allocations (tracemalloc: numpy's
    arrays), the A/B behind ``AGGREGATE_ROWS``."""
    import tracemalloc

    import pyarrow as pa

    import timeline.run.stream as RS
    from timeline.core.tracestream import open_stream

    held = []
    for f in files:
        stream = open_stream(f)
        held.append((stream, pa.concat_tables([t for _, t, _ in stream.blocks()])))
    was, cpu, peak = RS.AGGREGATE_ROWS, {n: [] for n in sizes}, {}
    try:
        for _ in range(repeat):
            for n in sizes:
                RS.AGGREGATE_ROWS = n
                c0 = time.process_time()
                for stream, tasks in held:
                    agg = RS._Aggregates(stream, "c", "a")
                    agg.add(tasks)
                    agg.tables()
                cpu[n].append((time.process_time() - c0) / len(held))
        for n in sizes:
            RS.AGGREGATE_ROWS = n
            tracemalloc.start()
            agg = RS._Aggregates(held[0][0], "c", "a")
            agg.add(held[0][1])
            peak[n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    finally:
        RS.AGGREGATE_ROWS = was
    out = [f"the aggregates taken AGGREGATE_ROWS rows at a time (the run writes {was:,}): CPU ms a file, median of "
           f"{repeat} rounds over {len(held)} files; the peak of numpy's arrays for one file"]
    for n in sizes:
        out.append(f"    {n:>9,} rows  {sorted(cpu[n])[len(cpu[n]) // 2] * 1e3:6.1f} ms  {peak[n] / 2**20:6.1f} MiB")
    return out


def codecs(path: Path, repeat: int = 7) -> list:
    """One file's task part encoded with the run's options under each codec (and
    zstd's levels): the least CPU of ``repeat`` encodes and of reading it back, its
    bytes; the A/B behind ``write.TASK_CODEC``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from timeline.core.tracestream import open_stream
    from timeline.run import layout as RL
    from timeline.run import write as RW

    stream = open_stream(path)
    tasks = pa.concat_tables([t for _, t, _ in stream.blocks()])
    sp = stream.spec
    part = RL.declare_required(tasks.select(RW.stored_task_columns(sp.phases, sp.marks)))
    ticks = RW.tick_columns(sp.phases, sp.marks)
    base = RW.task_part_options(sp.phases, sp.marks)
    ivs = stream.trace(tasks).interval_count
    variants = [("zstd (level 1)", {"compression": "zstd"}), ("zstd level -1", {"compression": "zstd",
                                                                             "compression_level": -1}),
                ("lz4 (LZ4_RAW)", {"compression": "lz4"}), ("snappy", {"compression": "snappy"}),
                ("lz4, tick columns uncompressed", {"compression": {c: "none" if c in ticks else "lz4"
                                                                     for c in part.column_names}}),
                ("none", {"compression": "none"})]
    out = [f"a task part's codec ({part.num_rows:,} rows, {ivs:,} intervals; the run's other options; CPU ms, "
           f"best of {repeat}; the run writes {RW.TASK_CODEC}):"]
    for label, opts in variants:
        enc = read = float("inf")
        for _ in range(repeat):
            c0 = time.process_time()
            buf = pa.BufferOutputStream()
            pq.write_table(part, buf, **{**base, **opts})
            enc = min(enc, time.process_time() - c0)
            data = buf.getvalue()
            c0 = time.process_time()
            pq.read_table(pa.BufferReader(data))
            read = min(read, time.process_time() - c0)
        out.append(f"    {label:34s} encode {enc * 1e3:6.1f} ms  read {read * 1e3:6.1f} ms  "
                   f"{data.size / ivs:5.3f} B/interval")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="trace files (two at least: the first warms up)")
    ap.add_argument("--codecs", action="store_true", help="also the first file's task part under each codec")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="add_profile_"))
    try:
        print("\n".join(profile([Path(f) for f in args.files], scratch)))
        print("\n".join(aggregate_rows([Path(f) for f in args.files[1:9]])))
        if args.codecs:
            print("\n".join(codecs(Path(args.files[0]))))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
