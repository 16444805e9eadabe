"""A streamed append's task parts (``timeline.run.stream``): each (rank, step)'s rows
written as they come, in row groups, under temporary names in the append's staging
directory (``layout.staging_dir``), published only when the append commits."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pyarrow as pa

from timeline.core import rows as R
from timeline.run import layout as RL
from timeline.run import write as RW

BUFFER_ROWS = 1 << 20  # task rows held for their parts' next row groups, over all parts


class PartWriter:
    """One (rank, step)'s task rows of a streamed append, written as they come under a
    temporary name: row groups of ``ROW_GROUP_ROWS`` rows (the rest held until more
    come or the partition ends), columns without a null in its first row group stored
    REQUIRED (``layout.declare_required``); a null later in such a column starts the
    partition's next part (``part-<append>-<k>``). ``due`` and ``write`` split the work:
    the caller takes the due rows, a pool thread encodes them (one at a time a part)."""

    def __init__(self, run_dir: Path, rank: int, step, aid: str, options: dict, sync: bool = True):
        self.run_dir, self.rank, self.step, self.aid, self.sync = run_dir, rank, step, aid, sync
        self.options = {k: v for k, v in options.items() if k != "row_group_size"}
        self.held: list = []
        self.held_rows = 0
        self.views = False  # whether a held table is a slice of a block
        self.writer = self.schema = self.tmp = None
        self.rows = 0
        self.piece = 0
        self.staged: list = []

    def add(self, rows: pa.Table, view: bool) -> None:
        """Hold ``rows``; ``view``: a slice of a block (its buffers stay alive while held)."""
        self.held.append(rows)
        self.views = self.views or view
        self.held_rows += rows.num_rows

    def due(self, final: bool) -> pa.Table | None:
        """The held rows to write now: whole row groups, or with ``final`` all of them.
        The rest stays held: copied where it is a slice of a block (which it would keep
        whole), else as it is."""
        n = self.held_rows if final else self.held_rows // RW.ROW_GROUP_ROWS * RW.ROW_GROUP_ROWS
        if not n:
            return None
        held = pa.concat_tables(self.held)
        rest = held.slice(n)
        if rest.num_rows and self.views:
            rest = rest.take(R.arrow(np.arange(rest.num_rows)))
        self.held, self.views, self.held_rows = ([rest] if rest.num_rows else []), False, rest.num_rows
        return held.slice(0, n)

    def write(self, rows: pa.Table | None, final: bool) -> None:
        if rows is not None and rows.num_rows:
            if self.writer is not None and any(not f.nullable and rows.column(i).null_count
                                               for i, f in enumerate(self.schema)):
                self._finish()
            if self.writer is None:
                self._open(rows)
            self.writer.write_table(pa.Table.from_arrays(rows.columns, schema=self.schema),
                                    row_group_size=RW.ROW_GROUP_ROWS)
            self.rows += rows.num_rows
        if final and self.writer is not None:
            self._finish()

    def _open(self, rows: pa.Table) -> None:
        import pyarrow.parquet as pq

        self.rel = RL.tasks_part_path(self.rank, self.step, self.aid, self.piece)
        self.tmp = RL.staged_name(RL.staging_dir(self.run_dir, self.aid), self.rel)
        self.schema = RL.declare_required(rows).schema
        self.writer = pq.ParquetWriter(str(self.tmp), self.schema, **self.options)
        self.rows = 0

    def _finish(self) -> None:
        self.writer.close()
        st = RL.finish_staged(self.run_dir, self.rel, self.tmp, self.rows, sync=self.sync)
        self.staged.append(st._replace(entry={"table": "tasks", "rank": self.rank, "step": self.step, **st.entry}))
        self.writer, self.tmp, self.piece = None, None, self.piece + 1

    def abandon(self) -> None:
        """Close an unfinished part (its file is removed with the staging directory)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 (a half-written temp file is removed either way)
                pass



class Inline:
    """The encoder pool of a process with one core's share (a ``run add --jobs`` worker
    beside as many others as cores): each task run at once, in the caller's thread, its
    ``Future`` done. A pool thread there has no core of its own to run on, and handing
    the blocks between threads cost CPU (bench/add_profile.py)."""

    def submit(self, fn, *args, **kwargs) -> Future:
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 (handed to the caller through the Future, as a pool would)
            f.set_exception(e)
        return f

    def map(self, fn, *iterables):
        return [fn(*a) for a in zip(*iterables)]

    def shutdown(self, wait: bool = True, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


def encoder_pool(threads: int, pool_class):
    """The pool a streamed append encodes its parts on: ``pool_class`` (a
    ``ThreadPoolExecutor``) of ``threads``, or ``Inline`` for one thread."""
    return Inline() if threads <= 1 else pool_class(max_workers=threads)


def write_block(run_dir, tasks: pa.Table, keep, options, parts: dict, closed, pool, aid, sync: bool = True) -> list:
    """A block's rows to their (rank, step) parts; the writes now due (and those of the
    partitions ``closed`` here: None, all), on the pool; ``sync``: each part fsynced
    when written, else when published (``layout.Staged``)."""
    stored = tasks.select(keep)
    for rank, step, idx in RW.partition_groups(tasks):
        key = (rank, step)
        part = parts.get(key)
        if part is None:
            part = parts[key] = PartWriter(run_dir, rank, step, aid, options, sync)
        rows = stored if idx is None else (stored.slice(idx.start, idx.stop - idx.start)
                                           if isinstance(idx, slice) else stored.take(R.arrow(idx)))
        part.add(rows, view=not isinstance(idx, np.ndarray))  # a take is a copy; the rest view the block
    early, over = set(), sum(pt.held_rows for pt in parts.values()) - BUFFER_ROWS
    for key, pt in sorted(parts.items(), key=lambda kv: -kv[1].held_rows):  # past the buffer: the largest now
        if over <= 0:
            break
        early.add(key)
        over -= pt.held_rows
    jobs = []
    for key, pt in parts.items():
        final = closed is None or key in closed
        rows = pt.due(final or key in early)
        if rows is not None or final:
            jobs.append(pool.submit(pt.write, rows, final))
    return jobs


__all__ = ["BUFFER_ROWS", "Inline", "PartWriter", "encoder_pool", "write_block"]
