"""A trace file read block by block, with every check ``timeline.core.trace.load``
makes, in bounded memory: the metadata checked when it is opened; each block (the
file's record batches or Parquet pieces, gathered up to ``BLOCK_ROWS`` rows)
validated, conformed and row-checked as it is read (``trace._conform``,
``trace._check_rows``); the checksum digested as the blocks pass
(``checksum.Checksum``) and compared after the last one, so a pass that ends without
an error read a file whose checksum matched. ``scan`` reads the key columns alone
first (rank, launch, step: a few bytes a row), so a consumer knows beforehand which
blocks each launch spans (``timeline.run.stream`` appends a file launch by launch)."""

from __future__ import annotations

import queue
import threading
import zlib
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from timeline.core import grouped as GR
from timeline.core import rows as R
from timeline.core.trace import (READ_ERRORS, Trace, _check_rows, _conform, checksum_mismatch, damaged, file_format,
                                  file_notes, headed_tasks, headers_held, not_a_trace, trace_path)
from timeline.core.checksum import Checksum, checksum_digest
from timeline.core.filemeta import read_meta
from timeline.core.filemeta import refuse as _refuse

BLOCK_ROWS = 1 << 20  # rows a block gathers from whole batches or pieces (Trace.save writes batches of this many)
PARQUET_PIECE_ROWS = 1 << 17  # pq.read_table's chunks within a row group: what an older (blake2b) checksum digested
CHECK_ROWS = 1 << 18  # rows the row checks take at once (their numpy arrays: ~100 bytes a row)
KEY_COLUMNS = (("rank", pa.int16()), ("launch", pa.int32()), ("step", pa.int64()))
NO_STEP = -1  # a null step in BlockKeys (no slot header), as timeline.run.write partitions it


class BlockKeys(NamedTuple):
    """The distinct (rank, launch, step) of one block's rows (``step`` ``NO_STEP``
    where null) and each one's row count; ``rows`` the block's rows."""
    rows: int
    rank: np.ndarray
    launch: np.ndarray
    step: np.ndarray
    count: np.ndarray


def distinct_keys(rank: np.ndarray, launch: np.ndarray, step: np.ndarray) -> BlockKeys:
    """``BlockKeys`` of rows' key arrays: from the runs of equal neighbours (rows come
    launch by launch), so a block costs a comparison, not a sort."""
    n = rank.size
    if not n:
        z = np.zeros(0, np.int64)
        return BlockKeys(0, z, z, z, z)
    head = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (launch[1:] != launch[:-1]) | (step[1:] != step[:-1])])
    gid, ng, (r, l, s) = GR.group_ids(rank[head], launch[head], step[head])
    count = np.bincount(gid, weights=np.diff(np.r_[head, n]), minlength=ng).astype(np.int64)
    return BlockKeys(n, r.astype(np.int64), l.astype(np.int64), s.astype(np.int64), count)


def key_digest(rank: np.ndarray, launch: np.ndarray, step: np.ndarray, crc: int = 0) -> int:
    """CRC-32 of rows' (rank, launch, step) int64 arrays (nulls: 0, ``NO_STEP``), continuing
    ``crc``: what a block's reading must give again for its scan to hold."""
    for a in (rank, launch, step):
        crc = zlib.crc32(memoryview(np.ascontiguousarray(a, dtype=np.int64)).cast("B"), crc)
    return crc


def table_key_digest(tasks: pa.Table) -> int:
    """``key_digest`` of a (conformed) tasks table."""
    return key_digest(R.column(tasks, "rank", dtype=np.int64), R.column(tasks, "launch", dtype=np.int64),
                      R.column(tasks, "step", fill=NO_STEP, dtype=np.int64))


class _Ahead:
    """An iterator's items produced on a daemon thread, one ahead of the consumer: the
    next is read while the consumer works on this one, and no further (two items in
    memory at most). An error is raised where the item it replaced would have been."""

    def __init__(self, items):
        self._q: queue.Queue = queue.Queue(maxsize=1)
        self._taken = threading.Semaphore(0)
        self._closed = False
        threading.Thread(target=self._run, args=(items,), daemon=True).start()

    def _run(self, items) -> None:
        try:
            for item in items:
                self._q.put((True, item))
                self._taken.acquire()
                if self._closed:
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._q.put((False, e))
            return
        self._q.put((False, None))

    def __iter__(self):
        while True:
            ok, item = self._q.get()
            if not ok:
                if item is None:
                    return
                raise item
            self._taken.release()
            yield item

    def close(self) -> None:
        """Stop reading ahead (the thread ends after the item it is reading)."""
        self._closed = True
        self._taken.release()


class _Ipc:
    """An Arrow IPC file's record batches: the units of its blocks."""

    def __init__(self, path):
        self.path = str(path)
        with pa.OSFile(self.path, "rb") as src:  # read, not mapped: a mapped file's pages would count as held
            reader = pa.ipc.open_file(src)
            self.schema, self.count = reader.schema, reader.num_record_batches

    def single(self, block_rows: int) -> bool:
        """Whether the file is one block: one record batch (or none)."""
        return self.count <= 1

    def units(self, columns=None, wanted=None):
        """``(unit, RecordBatch)`` of the ``wanted`` units (all: None) in order, of
        ``columns`` (field indices; all: None)."""
        opts = pa.ipc.IpcReadOptions(included_fields=list(columns)) if columns is not None else None
        with pa.OSFile(self.path, "rb") as src:
            reader = pa.ipc.open_file(src, options=opts) if opts else pa.ipc.open_file(src)
            for u in range(self.count) if wanted is None else sorted(wanted):
                yield u, reader.get_batch(u)


class _Parquet:
    """A Parquet file's pieces (``PARQUET_PIECE_ROWS`` rows of one row group, as
    ``pq.read_table`` chunks it): the units of its blocks."""

    def __init__(self, path):
        import pyarrow.parquet as pq

        self.file = pq.ParquetFile(str(path))
        self.schema = self.file.schema_arrow
        self.groups = self.file.metadata.num_row_groups
        self.group_units = None  # each row group's pieces, once read through

    def single(self, block_rows: int) -> bool:
        """Whether the file is one block: ``block_rows`` rows at most."""
        return self.file.metadata.num_rows <= block_rows

    def units(self, columns=None, wanted=None):
        names = None if columns is None else [self.schema.field(i).name for i in columns]
        if wanted is not None and self.group_units is None:
            raise ValueError("read every unit once before asking for some")
        seen, u = [], 0
        for g in range(self.groups):
            first = u
            if wanted is not None:
                mine = range(u, u + self.group_units[g])
                u += len(mine)
                if not any(k in wanted for k in mine):
                    continue
                u = first
            for batch in self.file.iter_batches(batch_size=PARQUET_PIECE_ROWS, row_groups=[g], columns=names):
                if wanted is None or u in wanted:
                    yield u, batch
                u += 1
            seen.append(u - first)
        if wanted is None:
            self.group_units = seen


class TraceStream:
    """A trace file opened for reading block by block (``open_stream``): ``meta`` (its
    checked metadata), ``notes`` (what it leaves unchecked, as ``Trace.notes``),
    ``scan()`` (each block's keys), ``blocks()`` (each block checked)."""

    def __init__(self, path, where: str, source, meta, raw: dict, block_rows: int):
        self.path, self.where, self._src, self.meta, self._raw = path, where, source, meta, raw
        self.block_rows = block_rows
        self.notes = file_notes(meta, where)
        self._units = self._keys = self._digests = None  # each block's units, BlockKeys and key digest, once scanned
        self._ahead = None
        self.headers = None  # KY.Headers to give its launches (``with_headers``), else None
        self.checksum = None  # the file checksum's digest of the last whole pass (``Checksum``), once it matched

    def with_headers(self, headers) -> "TraceStream":
        """Give the file's launches the slot headers ``headers`` says they had
        (``timeline.core.trace.headed_tasks``: refused for a file that carries its own),
        in the keys ``scan`` reads and in every block; before the first scan."""
        if self._units is not None:
            raise AssertionError("with_headers after the file was scanned")  # a bug: the blocks' keys are fixed
        self.headers = headers
        return self

    @property
    def specs(self) -> list:
        return self.meta.specs

    @property
    def spec(self):
        return self.meta.specs[0]

    def trace(self, tasks: pa.Table):
        """A ``Trace`` of some of the file's checked rows (a block, a launch) with the
        file's specs, anomaly report, origins and notes."""
        m = self.meta
        return Trace(tasks, m.specs, m.anomalies, origins=m.origins, offsets=m.offsets, synthetic=m.synthetic,
                     notes=self.notes)

    def _key_fields(self) -> list:
        names = self._src.schema.names
        return [names.index(n) if n in names else None for n, _ in KEY_COLUMNS]

    def scan(self) -> list:
        """``[BlockKeys]`` of every block, from the key columns alone (what each block
        holds of which launch); fixes the blocks. A file whose keys cannot be read is
        the ``TraceFileError`` a full read would give. Scanned once. A file of one
        block (one record batch; a Parquet file of ``block_rows`` rows at most) is not
        scanned: ``[None]`` (every launch ends in its one block)."""
        if self._keys is not None:
            return self._keys
        if self._src.single(self.block_rows):
            self._units, self._keys, self._digests, self._first_row = [None], [None], [None], [0]
            return self._keys
        fields = self._key_fields()
        cols = [i for i in fields if i is not None]
        out, units, digests, cur, rows = [], [], [], [], 0
        keys: list = []

        def close_block():
            if cur:
                units.append(list(cur))
                parts = [np.concatenate(k) for k in zip(*keys)] if keys else [np.zeros(0, np.int64)] * 3
                out.append(distinct_keys(*parts))
                digests.append(key_digest(*parts))
                cur.clear()
                keys.clear()

        for u, batch in self._read(self._src.units(columns=cols)):
            n = batch.num_rows
            if cur and rows + n > self.block_rows:
                close_block()
                rows = 0
            cur.append(u)
            rows += n
            keys.append(self._keys_of(batch, fields))
        close_block()
        self._units, self._keys, self._digests = units, out, digests
        self._first_row = np.r_[0, np.cumsum([k.rows for k in out])].tolist()
        return out

    def _keys_of(self, batch: pa.RecordBatch, fields) -> tuple:
        """A batch's (rank, launch, step) as int64 arrays (nulls: 0, step ``NO_STEP``)."""
        out = []
        for (name, typ), i in zip(KEY_COLUMNS, fields):
            if i is None:  # a file from before slot headers: no step
                out.append(np.full(batch.num_rows, NO_STEP, np.int64) if self.headers is None else
                           np.asarray(self.headers.step_layer(out[1])[0], dtype=np.int64))
                continue
            try:
                col = batch.column(batch.schema.get_field_index(name)).cast(typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise _refuse(self.where, f"a column does not hold the type the format says "
                              f"({str(e).splitlines()[0]})") from None
            if name == "step" and self.headers is not None:
                if col.null_count < len(col):
                    raise headers_held(self.where)
                out.append(np.asarray(self.headers.step_layer(out[1])[0], dtype=np.int64))
                continue
            out.append(R.numpy(R.filled(col, NO_STEP if name == "step" else 0)).astype(np.int64))
        return tuple(out)

    def _read(self, units):
        """``units`` with every read error as the file's one damaged line, each batch
        validated in full (offsets and lengths of a crafted file) before any use."""
        try:
            for u, batch in units:
                batch.validate(full=True)
                yield u, batch
        except READ_ERRORS as e:
            raise damaged(self.where, e) from None

    def blocks(self, wanted=None, *, fingerprint: bool = False):
        """``(block, tasks table, fingerprint)`` of each block in file order (only the
        ``wanted`` block numbers, if given), each conformed to the tasks schema and
        row-checked. A pass over every block digests the checksum and raises after
        the last block when it does not match. ``fingerprint``: each block's own
        CRC-32 digest, to tell a later pass that the file changed (else None)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if wanted is None and not fingerprint:
                return iter(ahead)
            ahead.close()  # a prefetch of another pass: its block or two read for nothing
        return self._blocks(wanted, fingerprint)

    def _blocks(self, wanted, fingerprint: bool):
        if self._units is None:
            self.scan()
        m = self.meta
        whole = wanted is None
        check = Checksum(self._raw, checksum_digest(m.checksum, self.where)) if whole and m.checksum else None
        if check is not None:
            check.update(R.empty(self._src.schema))  # its columns, for a file of no rows too
        want_units = None if whole or self._units == [None] else {u for b in wanted for u in self._units[b]}
        last_of = {us[-1]: b for b, us in enumerate(self._units) if us}  # a block ends with its last unit
        batches = []
        for u, batch in self._read(self._src.units(wanted=want_units)):
            batches.append(batch)
            if u in last_of:  # yielded at once: the next block's first batch is not read ahead of it
                yield self._checked(last_of[u], batches, check, fingerprint)
                batches = []
        if self._units == [None]:  # one block, not scanned: its units all read
            yield self._checked(0, batches, check, fingerprint)
        if check is not None and check.hexdigest() != m.checksum:
            raise checksum_mismatch(self.where)
        self.checksum = check

    def _checked(self, b: int, batches: list, check, fingerprint: bool) -> tuple:
        table = pa.Table.from_batches(batches, self._src.schema)
        if check is not None:
            check.update(table)
        fp = Checksum({}).update(table).hexdigest() if fingerprint else None
        tasks = _conform(table, self.spec.phases, self.spec.marks, self.where)
        for at in range(0, tasks.num_rows, CHECK_ROWS):  # in slices: the check's arrays stay small
            _check_rows(tasks.slice(at, CHECK_ROWS), self.meta, self.where, first_row=self._first_row[b] + at)
        if self.headers is not None:
            tasks = headed_tasks(tasks, self.headers, self.where)
        if self._keys[b] is not None and (tasks.num_rows != self._keys[b].rows or
                                          table_key_digest(tasks) != self._digests[b]):
            raise _refuse(self.where, f"its rows changed while it was read (block {b} holds other launches than "
                          "its first reading found)", "add it again once nothing writes to it")
        return b, tasks, fp

    def digests(self, fields) -> bool:
        """Whether a whole pass's ``checksum`` digests the columns ``fields`` (tasks-schema
        ``pa.Field``s) as a digest of them alone would: the file has a CRC-32 checksum and
        holds each of them once, of that type (so conforming leaves its chunks as read)."""
        m = self.meta
        if not m.checksum or checksum_digest(m.checksum, self.where) != "crc32":
            return False
        names = self._src.schema.names
        return all(names.count(f.name) == 1 and self._src.schema.field(f.name).type == f.type for f in fields)

    def prefetch(self) -> "TraceStream":
        """Start reading the blocks of the next full pass on a thread, one block ahead
        of ``blocks()`` (so a caller's work on one file overlaps the reading of the
        next); scans first if not yet scanned."""
        if self._units is None:
            self.scan()
        if self._ahead is None:
            self._ahead = _Ahead(self._blocks(None, False))
        return self

    def close(self) -> None:
        """Stop a prefetch nobody will read."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    @property
    def block_count(self) -> int:
        if self._units is None:
            self.scan()
        return len(self._units)


def open_stream(path, *, block_rows: int = BLOCK_ROWS) -> TraceStream:
    """Open a trace file for reading block by block: its format (by magic bytes) and
    metadata checked now, its columns against its specs' (as ``load`` checks them),
    its rows as they are read. One ``TraceFileError`` line for anything wrong."""
    path, where = trace_path(path)
    fmt = file_format(path)
    if fmt is None:
        raise not_a_trace(path, where)
    try:
        source = _Ipc(path) if fmt == "arrow" else _Parquet(path)
    except READ_ERRORS as e:
        raise damaged(where, e) from None
    raw = source.schema.metadata or {}
    meta = read_meta(raw, where)
    _conform(R.empty(source.schema), meta.specs[0].phases, meta.specs[0].marks, where)  # columns, types
    return TraceStream(path, where, source, meta, raw, block_rows)


__all__ = ["BLOCK_ROWS", "BlockKeys", "CHECK_ROWS", "NO_STEP", "PARQUET_PIECE_ROWS", "TraceStream", "distinct_keys",
           "open_stream",
           "key_digest", "table_key_digest"]
