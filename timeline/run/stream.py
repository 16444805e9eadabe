"""Appending a trace file to a run block by block (``append_stream``), in memory
bounded by a few blocks of the file whatever its size: the dataset ``append`` writes
of the whole file loaded, value for value (tests/test_run_stream.py).

- The file's key columns are scanned first (``TraceStream.scan``): which blocks each
  (rank, launch) and each (rank, step) spans. A launch's rows wait (``pending``) until
  its last block has passed, then its aggregates (``aggregate.aggregates``) are taken
  over all of them, so the ``launches`` and ``stages`` rows are a whole-file append's.
  Trace files hold a launch's rows together (rank by rank, launch by launch), so few
  rows wait; a file whose launches are scattered over more than ``pending_rows``
  would make too many wait: its aggregates are then taken in further passes
  (``waves``) over the blocks that hold each group of launches, each block checked
  to be the one the first pass read.
- Each (rank, step)'s rows go to its task part as they come (``parts.PartWriter``: row
  groups of ``write.ROW_GROUP_ROWS``, encoded on a pool of threads), under temporary
  names in the append's own staging directory.
- The file's checksum is digested as the blocks pass; only when it matched at the
  end are the parts given their names and the manifest record written (the commit).
  A bad file (a checksum, a row, a read error) leaves the run as it was: its
  temporary files are removed, nothing was published."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.contract import schema as S
from timeline.core.filemeta import refuse
from timeline.core import rows as R
from timeline.run import aggregate as RA
from timeline.run import captures as RC
from timeline.run import layout as RL
from timeline.run import write as RW
from timeline.run.parts import encoder_pool, write_block

PENDING_ROWS = 1 << 20  # rows of unfinished launches held between blocks, or aggregated in one wave
AGGREGATE_ROWS = 1 << 18  # rows whose aggregates are taken at once: 1 << 17 took 1.1x its CPU for half its numpy
# peak (24 -> 13 MiB a 254k-row file), 1 << 16 1.2x (bench/add_profile.py)
SMALL_TABLES = ("launches", "stages", "anomalies")


class Added(NamedTuple):
    """What an append wrote: the parts' relative paths, task rows and intervals."""
    paths: list
    rows: int
    intervals: int


def pair_keys(rank, launch) -> np.ndarray:
    """(rank, launch) packed in one int64 each (rank int16, launch int32)."""
    return np.asarray(rank, dtype=np.int64) * (1 << 32) + (np.asarray(launch, dtype=np.int64) & 0xFFFFFFFF)


class Plan(NamedTuple):
    """From the scan: ``done[b]`` the pair keys whose last rows are in block b,
    ``closed[b]`` the (rank, step) partitions whose last rows are, ``peak`` the most
    rows of unfinished pairs held after a block, and ``waves`` (when ``peak`` is past
    the limit) ``[(pair keys, blocks holding them)]`` to aggregate in passes of their own."""
    done: list
    closed: list
    peak: int
    waves: list


def plan(keys: list, pending_rows: int) -> Plan:
    """The ``Plan`` of a file's ``BlockKeys`` (``[None]`` for a file of one block: every
    launch and partition ends in it, ``done`` and ``closed`` ``[None]``)."""
    nb = len(keys)
    if keys == [None]:
        return Plan([None], [None], 0, [])
    if not nb or not sum(k.rows for k in keys):
        return Plan([np.zeros(0, np.int64)] * nb, [set() for _ in range(nb)], 0, [])
    blk = np.concatenate([np.full(k.rank.size, b, np.int64) for b, k in enumerate(keys)])
    pair = np.concatenate([pair_keys(k.rank, k.launch) for k in keys])
    count = np.concatenate([k.count for k in keys])
    rank, step = np.concatenate([k.rank for k in keys]), np.concatenate([k.step for k in keys])
    pairs, inv = np.unique(pair, return_inverse=True)
    last, first = np.zeros(pairs.size, np.int64), np.full(pairs.size, nb, np.int64)
    np.maximum.at(last, inv, blk)
    np.minimum.at(first, inv, blk)
    done = [pairs[last == b] for b in range(nb)]
    held = np.zeros(nb + 1, np.int64)  # rows of pairs not finished after each block
    np.add.at(held, blk, count)
    np.add.at(held, last[inv], -count)
    peak = int(np.cumsum(held)[:nb].max())
    closed: list = [set() for _ in range(nb)]
    ends: dict = {}
    for b, r, s in zip(blk.tolist(), rank.tolist(), step.tolist()):  # one entry a (block, rank, launch, step)
        ends[(r, None if s < 0 else s)] = b  # a negative step is no header's: write.partition_groups' null
    for key, b in ends.items():
        closed[b].add(key)
    waves = [] if peak <= pending_rows else _waves(pairs, inv, first, blk, count, pending_rows)
    return Plan(done, closed, peak, waves)


def _waves(pairs, inv, first, blk, count, pending_rows: int) -> list:
    """Pairs in order of their first block, cut into groups of at most ``pending_rows``
    rows (a larger pair alone), each with the blocks that hold its rows."""
    rows = np.bincount(inv, weights=count, minlength=pairs.size).astype(np.int64)
    order = np.lexsort((pairs, first))
    out, cur, n = [], [], 0
    for p in order:
        if cur and n + rows[p] > pending_rows:
            out.append(cur)
            cur, n = [], 0
        cur.append(p)
        n += rows[p]
    if cur:
        out.append(cur)
    waves = []
    for group in out:
        member = np.zeros(pairs.size, bool)
        member[group] = True
        waves.append((np.sort(pairs[group]), sorted(set(blk[member[inv]].tolist()))))
    return waves


class _Pending:
    """Rows of pairs whose last block has not passed yet, in file order."""

    def __init__(self):
        self.tables: list = []
        self.keys: list = []

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables)

    def take_done(self, block: pa.Table, done: np.ndarray | None) -> tuple:
        """Add ``block``; return the held rows of the pairs ``done`` (None: all; every
        row of them: their last block is this one), in file order, and their pair keys
        (None where not computed)."""
        if done is None:
            out = pa.concat_tables(self.tables + [block]) if self.tables else block
            self.tables, self.keys = [], []
            return out, None
        keys = _row_pairs(block)
        allkeys = np.concatenate(self.keys + [keys]) if self.keys else keys
        mine = _member(allkeys, done)
        if not self.tables and mine.all():
            return block, keys
        rows = pa.concat_tables(self.tables + [block])
        n = int(mine.sum())
        if mine[:n].all():  # the finished pairs first (rows launch by launch): slices, no copy of them
            out, rest, out_keys, rest_keys = rows.slice(0, n), rows.slice(n), allkeys[:n], allkeys[n:]
        else:
            out, rest = rows.filter(R.arrow(mine)), rows.filter(R.arrow(~mine))
            out_keys, rest_keys = allkeys[mine], allkeys[~mine]
        self.tables = [rest.take(R.arrow(np.arange(rest.num_rows)))] if rest.num_rows else []  # a copy: no block pinned
        self.keys = [rest_keys] if rest.num_rows else []
        return out, out_keys


def _member(keys: np.ndarray, among: np.ndarray) -> np.ndarray:
    """``np.isin(keys, among)`` over the runs of equal keys (rows come launch by launch:
    a few runs a block), each run's first key looked up once."""
    start = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if keys.size else np.zeros(0, np.int64)
    return np.repeat(np.isin(keys[start], among), np.diff(np.r_[start, keys.size]))


def _row_pairs(tasks: pa.Table) -> np.ndarray:
    return pair_keys(R.column(tasks, "rank", dtype=np.int64), R.column(tasks, "launch", dtype=np.int64))


def _launch_pieces(tasks: pa.Table, keys: np.ndarray | None = None) -> list:
    """``tasks`` cut between launches into pieces of about ``AGGREGATE_ROWS`` rows (a
    launch is never cut; rows of launches that do not lie together stay one piece);
    ``keys``: the rows' pair keys, if known."""
    if tasks.num_rows <= AGGREGATE_ROWS:
        return [tasks] if tasks.num_rows else []
    keys = _row_pairs(tasks) if keys is None else keys
    start = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    if np.unique(keys[start]).size != start.size:
        return [tasks]
    cuts = [0]
    for at in start[1:].tolist():  # a launch's rows a run each: cut at the first run past the size
        if at - cuts[-1] >= AGGREGATE_ROWS:
            cuts.append(at)
    cuts.append(tasks.num_rows)
    return [tasks.slice(a, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]


class _Aggregates:
    """The ``launches`` and ``stages`` rows of an append, launch group by launch group,
    put back in a whole-file append's order (pairs by (rank, launch), stages within)."""

    def __init__(self, stream, capture: str, aid: str):
        self.stream, self.capture, self.aid = stream, capture, aid
        self.launches: list = []
        self.stages: list = []

    def add(self, tasks: pa.Table, keys: np.ndarray | None = None) -> None:
        """The aggregates of every launch of ``tasks`` (all the rows of each; ``keys``
        their pair keys, if known), taken ``AGGREGATE_ROWS`` rows at a time where the
        launches' rows lie together."""
        for piece in _launch_pieces(tasks, keys):
            launches, stages = RA.aggregates(self.stream.trace(piece), self.capture, self.aid, RW.STAGE_QUANTILES)
            self.launches.append(launches)
            self.stages.append(stages)

    def tables(self) -> tuple:
        if not self.launches:
            sp = self.stream.spec
            empty = self.stream.trace(R.empty(S.tasks_schema(sp.phases, sp.marks)))
            return RW.aggregate_tables(empty, self.capture, self.aid)
        launches, stages = pa.concat_tables(self.launches), pa.concat_tables(self.stages)
        keys = pair_keys(R.column(launches, "rank", fill=0), R.column(launches, "launch", fill=0))
        order = np.argsort(keys, kind="stable")
        if (np.diff(keys[order]) == 0).any():
            raise AssertionError("a launch was aggregated twice")  # a bug: every pair is finished once
        if (order != np.arange(order.size)).any():
            nst = len(self.stream.spec.stages)
            launches = launches.take(R.arrow(order))
            stages = stages.take(R.arrow((order[:, None] * nst + np.arange(nst)).reshape(-1)))
        return launches.combine_chunks(), stages.combine_chunks()


def append_stream(run_dir, stream, *, capture=None, progress=None, pending_rows: int = PENDING_ROWS,
                  as_capture: bool = False, seen: dict | None = None) -> Added:
    """Append the trace file ``stream`` (``timeline.core.tracestream.open_stream``) to
    the run at ``run_dir``, block by block (module docstring): the dataset of
    ``append(run_dir, load(path), as_capture=...)``, committed only when every block
    passed its checks, the file's checksum matched and the run may take the capture
    (``write.check_capture``: its fingerprint, digested as the blocks pass, and its
    launch keys); a ``TraceFileError`` (or ``RunError``) leaves the run as it was.
    ``progress(done, total)`` after each block; ``seen``: the run's records read before
    (``layout.committed_records``). ``stage_stream`` then ``commit``."""
    return commit(stage_stream(run_dir, stream, capture=capture, progress=progress, pending_rows=pending_rows,
                               as_capture=as_capture, seen=seen))


class StagedAppend(NamedTuple):
    """An append whose parts are written under temporary names in its staging
    directory, not yet part of the run (``commit`` publishes it, ``discard`` drops it):
    ``staged`` in publish order, the manifest ``record`` that will commit them, and
    ``check`` (``write.check_capture``'s keywords) where the check against the run's
    captures is left to the commit (``stage_stream(check=False)``), else None."""
    run_dir: Path
    staging: Path
    staged: list
    record: dict
    check: dict | None
    added: Added
    created: list


def stage_stream(run_dir, stream, *, capture=None, progress=None, pending_rows: int = PENDING_ROWS,
                 as_capture: bool = False, aid: str | None = None, check: bool = True,
                 seen: dict | None = None, sync: bool = True) -> StagedAppend:
    """``append_stream``'s reading, checking and encoding of ``stream``, every part
    staged, nothing published: a ``StagedAppend`` (``aid``: the append's id, given where
    several appends are staged at once and must commit in order; ``check``: False
    leaves the check against the run's captures to ``commit``, which runs it against
    what was committed since; ``seen``: the run's records read before,
    ``layout.committed_records``; ``sync``: False leaves each part's fsync to the
    commit, which publishes it). A bad file raises, its staging removed."""
    run_dir = Path(run_dir)
    RW.check_dir(run_dir)
    RW.ensure_build(run_dir, stream.spec, create=False)  # another build: refused before any reading
    aid = aid or RL.new_append_id()
    capture = str(capture) if capture is not None else aid
    keys = stream.scan()
    p = plan(keys, pending_rows)
    created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # removed again if the file is bad
    staging = RL.staging_dir(run_dir, aid)
    staging.mkdir(parents=True)
    parts: dict = {}
    m = stream.meta
    fpr = RC.Fingerprint(m.specs, m.origins, m.offsets, stream.spec.phases, stream.spec.marks)
    with encoder_pool(RW.WRITER_THREADS, ThreadPoolExecutor) as pool:
        try:
            rows, firsts, prints, agg = _main_pass(run_dir, stream, p, parts, pool, (aid, capture, fpr, sync), progress)
            for pairs, blocks in p.waves:
                agg.add(_wave_rows(stream, pairs, blocks, prints))
            launches, stages = agg.tables()
            keywords = {"aid": aid, "capture": capture, "fp": fpr.hexdigest(), "as_capture": as_capture,
                        "launches": launches}
            if check:
                RW.check_capture(run_dir, **keywords, seen=seen)
            anomalies = RW.keyed(stream.meta.anomalies, launches, capture, aid)
            small = [pool.submit(RL.stage_parquet, run_dir, RL.small_part_path(name, aid), table, staging=staging,
                                 sync=sync, **RW.PARQUET_OPTIONS)
                     for name, table in zip(SMALL_TABLES, (launches, stages, anomalies))]
            small = [f.result() for f in small]
            RW.ensure_build(run_dir, stream.spec)  # created now if the run is new: the file is good
        except BaseException:
            pool.shutdown(wait=True)  # no write still running into a file about to be removed
            stream.close()
            _discard(parts, staging, created)
            raise
    staged = [st for key in sorted(parts, key=_part_order) for st in parts[key].staged]
    entries = [st.entry for st in staged] + [{"table": t, **st.entry} for t, st in zip(SMALL_TABLES, small)]
    origins, note = dict(m.origins or {}), None
    missing = sorted(r for r in firsts if r not in origins)
    if missing:
        origins.update({r: firsts[r] or 0 for r in missing})
        note = RW.origin_note(missing)
    notes = list(stream.notes) + ([note] if note else [])
    rec = RW.record(aid, capture, m.specs, origins, m.offsets, m.synthetic, notes, entries,
                    fingerprint=fpr.hexdigest(), as_capture=as_capture)
    intervals = int(np.asarray(R.column(launches, "intervals", fill=0)).sum())
    return StagedAppend(run_dir, staging, staged + small, rec, None if check else keywords,
                        Added([e["path"] for e in entries], rows, intervals), created)


def commit(st: StagedAppend, seen: dict | None = None, pool=None) -> Added:
    """Publish a staged append: its deferred check against the run's captures (a
    ``RunError`` drops it, the run as it was; ``seen``: the run's records read before,
    ``layout.committed_records``), its parts renamed into the run, then the manifest
    record that commits them (docs/RUN.md: a crash before it leaves none). ``pool``:
    the threads that rename (a caller committing many appends keeps one), else a
    pool of ``write.WRITER_THREADS`` made for this one."""
    if st.check is not None:
        try:
            RW.check_capture(st.run_dir, **st.check, seen=seen)
        except BaseException:
            discard(st)
            raise
    if pool is None:
        with ThreadPoolExecutor(max_workers=RW.WRITER_THREADS) as own:
            return commit(st._replace(check=None), seen, own)
    list(pool.map(RL.publish_staged, st.staged))  # the renames and directory fsyncs at once
    st.staging.rmdir()  # empty now: every part renamed out of it
    RL.write_json(RL.manifest_path(st.run_dir, st.record["append"]), st.record)
    return st.added


def discard(st: StagedAppend) -> None:
    """Drop a staged append: its staging directory, and the directories it created for
    a new run where nothing else is in them. Nothing of it was published."""
    _discard({}, st.staging, st.created)


def append_file(run_dir, path, *, capture=None, progress=None, as_capture: bool = False) -> Added:
    """Append the trace file at ``path`` to the run, streamed (``append_stream``): the
    run of ``append(run_dir, timeline.load(path))`` in bounded memory."""
    from timeline.core.tracestream import open_stream

    return append_stream(run_dir, open_stream(path), capture=capture, progress=progress, as_capture=as_capture)


def _part_order(key) -> tuple:
    return key[0], -1 if key[1] is None else key[1]


def _main_pass(run_dir, stream, p: Plan, parts: dict, pool, append: tuple, progress):
    """Every block once: checked, its rows to their parts, its finished launches
    aggregated (unless the plan has waves), digested by the capture's fingerprint;
    ``append``: ``(append id, capture, captures.Fingerprint, sync)``; ``(rows, {rank: first
    tick}, {block: fingerprint} (with waves), aggregates)``.
    Raises after the last block when the file's checksum does not match."""
    aid, capture, fpr, sync = append
    sp = stream.spec
    keep = RW.stored_task_columns(sp.phases, sp.marks)
    options = RW.task_part_options(sp.phases, sp.marks)
    agg, pending = _Aggregates(stream, capture, aid), _Pending()
    firsts, prints = {}, {}
    rows = 0
    nblocks = stream.block_count
    shared = stream.digests(fpr.fields)  # the file's checksum digests the fingerprint's columns as they pass
    for b, tasks, fp in stream.blocks(fingerprint=bool(p.waves)):
        rows += tasks.num_rows
        prints[b] = fp
        if not shared:
            fpr.update(tasks)
        jobs = write_block(run_dir, tasks, keep, options, parts, p.closed[b], pool, aid, sync)  # encoded meanwhile
        if not p.waves:
            agg.add(*pending.take_done(tasks, p.done[b]))
        _first_ticks(tasks, stream, firsts)
        for f in jobs:  # this block's writes done (a part's row groups in order), its rows let go
            f.result()
        del tasks, jobs
        if progress is not None:
            progress(b + 1, nblocks + 1)
    if shared and not fpr.adopt(stream.checksum):
        raise AssertionError("the file's checksum lacks a column it said it digests")  # a bug
    for pt in parts.values():  # every partition closed by the plan; a part left open would be a bug
        if pt.held_rows or pt.writer is not None:
            raise AssertionError(f"part {(pt.rank, pt.step)} left open after the last block")
    if pending.rows:
        raise AssertionError("rows of unfinished launches left after the last block")  # a bug: the plan covers all
    return rows, firsts, prints, agg


def _first_ticks(tasks: pa.Table, stream, firsts: dict) -> None:
    """Each rank's earliest written tick so far, for the ranks the file has no origin of."""
    origins = stream.meta.origins or {}
    if all(sp.rank in origins for sp in stream.specs) or not tasks.num_rows:
        return
    ranks = np.unique(R.numpy(tasks.column("rank"))).tolist()
    want = [r for r in ranks if r not in origins]
    if not want:
        return
    for r, t in RW.first_ticks(tasks, stream.spec.phases, stream.spec.marks, want).items():
        old = firsts.get(r)
        firsts[r] = t if old is None else (old if t is None else min(old, t))


def _wave_rows(stream, pairs: np.ndarray, blocks: list, prints: dict) -> pa.Table:
    """The rows of ``pairs`` in file order, read again from the ``blocks`` holding them,
    each block checked (``TraceStream.blocks``) and its fingerprint compared with the
    first pass's: the file must not change between passes."""
    out = []
    for b, tasks, fp in stream.blocks(wanted=blocks, fingerprint=True):
        if fp != prints[b]:
            raise refuse(stream.where, f"its rows changed while it was read (block {b} differs from its first "
                            "reading)", "add it again once nothing writes to it")
        out.append(tasks.filter(R.arrow(_member(_row_pairs(tasks), pairs))))
    rows = pa.concat_tables(out)
    keys = _row_pairs(rows)
    order = np.argsort(keys, kind="stable")  # each launch's rows together (in file order): aggregated in pieces
    return rows.take(R.arrow(order)) if (order != np.arange(order.size)).any() else rows


def _discard(parts: dict, staging: Path, created: list) -> None:
    """Remove what a failed append wrote: its staging directory, whole (its own: no other
    writer's file is in it), and the directories it created for a new run where nothing
    else is in them. Nothing was published, so nothing else is touched."""
    import shutil

    for pt in parts.values():
        pt.abandon()
    shutil.rmtree(staging, ignore_errors=True)
    for d in created:  # the run's directory first, then the parents made for it
        try:
            d.rmdir()
        except OSError:
            break


__all__ = ["Added", "PENDING_ROWS", "Plan", "StagedAppend", "append_file", "append_stream", "commit", "discard",
           "pair_keys", "plan", "stage_stream"]
