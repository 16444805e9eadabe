"""A trace file's checksum (docs/FORMAT.md §5): blake2b-128 over every metadata entry
but the checksum and, column by column, each column's name, type and digests of its
validity and values. ``Checksum`` digests a table as its rows arrive, chunk by chunk
(``timeline.core.tracestream`` reads a file block by block); ``table_checksum`` is the
same over a whole table. Both give one result for the same chunks, whichever way
they were grouped into tables."""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np
import pyarrow as pa

from timeline.contract import schema as S
from timeline.core import rows as R
from timeline.core.filemeta import refuse

try:  # ISA-L's CRC-32 (python-isal): zlib's polynomial and results, 6.6x its speed (28 against 4.2 GB/s here)
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without its wheel: zlib's, the same digest
    crc32 = zlib.crc32

CHECKSUM_DIGESTS = ("crc32", "blake2b")  # what save writes first; blake2b: files written before crc32 was
_ONES = b"\x01" * (1 << 20)  # the validity bytes of rows without a null


class _ColumnDigest:
    """One column part's running digest: blake2b-128, or CRC-32 with the byte count
    (so two parts of one stream give what the stream gives, as blake2b does)."""

    def __init__(self, digest: str):
        self._h = hashlib.blake2b(digest_size=16) if digest == "blake2b" else None
        self._crc = self._n = 0

    def update(self, data) -> None:
        if self._h is not None:
            self._h.update(data)
        else:
            view = memoryview(data).cast("B")
            self._crc, self._n = crc32(view, self._crc), self._n + view.nbytes

    def digest(self) -> bytes:
        if self._h is not None:
            return self._h.digest()
        return self._crc.to_bytes(4, "little") + self._n.to_bytes(8, "little")


class _Column:
    """One column's running state: its validity and values digests, the rows before
    its first null (whose validity a CRC-32 digest adds once a null shows that the
    column has holes) and its dictionary unified over the chunks so far."""

    def __init__(self, name: str, type: pa.DataType, digest: str):
        self.name, self.type, self.digest = name, type, digest
        self.valid, self.values = _ColumnDigest(digest), _ColumnDigest(digest)
        self.rows = self.clean_rows = 0
        self.holed = False  # crc32: a null seen, so every chunk's validity is digested
        self.dictionary = None

    def _unified(self, chunk: pa.DictionaryArray) -> pa.Array:
        """The chunk's indices into the dictionary unified over every chunk so far
        (``Table.unify_dictionaries``: the earlier chunks' values first, in order)."""
        none = R.arrow(np.zeros(0, R.np_dtype(chunk.type.index_type)))  # not pa.array([]): it imports pandas
        head = [] if self.dictionary is None else [pa.DictionaryArray.from_arrays(none, self.dictionary)]
        col = pa.table({"c": pa.chunked_array(head + [chunk], chunk.type)}).unify_dictionaries().column(0)
        last = col.chunk(col.num_chunks - 1)
        self.dictionary = last.dictionary
        return last.indices

    def feed(self, chunk: pa.Array) -> None:
        self.rows += len(chunk)
        if pa.types.is_dictionary(chunk.type):
            chunk = self._unified(chunk)
        if not R.is_plain(chunk.type):  # no trace column has such a type: a damaged file's, hashed as it reads
            self.values.update(json.dumps(chunk.to_pylist(), default=repr).encode())
            return
        if self.digest != "blake2b" and chunk.null_count and not self.holed:
            self.holed = True
            for at in range(0, self.clean_rows, len(_ONES)):
                self.valid.update(_ONES[:min(len(_ONES), self.clean_rows - at)])
        if self.holed or chunk.null_count:
            self.valid.update(R.numpy(chunk.is_valid()).tobytes())
            chunk = R.filled(chunk, 0)
        else:
            self.clean_rows += len(chunk)
        self.values.update(np.ascontiguousarray(R.numpy(chunk)))

    def finish(self, h) -> None:
        h.update(f"{self.name}:{self.type}\0".encode())
        if self.dictionary is not None and self.rows:  # no rows: a file of none may keep the dictionary or not
            h.update(json.dumps(self.dictionary.to_pylist(), default=repr).encode())  # repr: bytes of a damaged file
        h.update(self.valid.digest() + self.values.digest())


class Checksum:
    """The checksum of a tasks table fed in pieces (``update``, in row order): each
    column by its name, type, validity and values (dictionary columns by their
    unified dictionary and indices), and every metadata entry but the checksum, so a
    flipped bit anywhere in what load reads changes it. ``digest`` names how a
    column's bytes are digested: ``"crc32"`` (what ``save`` writes, ``"crc32:<hex>"``):
    CRC-32, which catches every flipped bit and every burst up to 32 bits, at about 4x
    blake2b's speed on the ~37 bytes per interval a file decodes to; the validity of
    every chunk of a column that holds a null, so that how the rows are chunked does
    not matter. ``"blake2b"`` (bare hex, files written before): blake2b-128, the
    validity of the chunks holding a null (as those files were written). Column
    digests and metadata are combined by blake2b-128 either way."""

    def __init__(self, metadata: dict, digest: str = "crc32"):
        if digest not in CHECKSUM_DIGESTS:
            raise ValueError(f"digest {digest!r} is not one of {CHECKSUM_DIGESTS}")
        self.digest, self._columns = digest, None
        self._h = hashlib.blake2b(digest_size=16)
        for key in sorted(k for k in metadata if k != S.META_CHECKSUM):
            for part in (key, metadata[key]):
                self._h.update(len(part).to_bytes(8, "little") + part)

    def update(self, table: pa.Table) -> "Checksum":
        """Digest the next rows: each column's chunks, columns by position (a damaged
        file may repeat a name); every piece of one stream has the same columns."""
        if self._columns is None:
            self._columns = [_Column(f.name, f.type, self.digest) for f in table.schema]
        if [(c.name, c.type) for c in self._columns] != [(f.name, f.type) for f in table.schema]:
            raise ValueError("a piece of the table has other columns than the first")
        for col, values in zip(self._columns, table.columns):
            for chunk in values.chunks:
                col.feed(chunk)
        return self

    def columns(self, fields) -> list | None:
        """This digest's running state of the columns ``fields`` (``pa.Field``s), in
        their order, each digested once under its name and type; None where one is not
        (or no row was digested yet). A digest of some of a table's columns, fed the
        same chunks, is these states (``adopt``): one pass over the bytes serves both."""
        if not self._columns:
            return None
        named: dict = {}
        for col in self._columns:
            named.setdefault(col.name, []).append(col)
        out = []
        for f in fields:
            held = named.get(f.name, [])
            if len(held) != 1 or held[0].type != f.type:
                return None
            out.append(held[0])
        return out

    def adopt(self, columns: list) -> "Checksum":
        """Take ``columns`` (another digest's ``columns``, of this digest's kind) as this
        one's: as if their chunks had been fed here."""
        if any(c.digest != self.digest for c in columns):
            raise ValueError("columns of another digest kind")
        self._columns = list(columns)
        return self

    def hexdigest(self) -> str:
        h = self._h.copy()
        for col in self._columns or ():
            col.finish(h)
        return h.hexdigest() if self.digest == "blake2b" else f"{self.digest}:{h.hexdigest()}"


def table_checksum(tasks: pa.Table, metadata: dict, digest: str = "crc32") -> str:
    """The checksum of a whole tasks table and its metadata (``Checksum``)."""
    return Checksum(metadata, digest).update(tasks).hexdigest()


def checksum_digest(value: str, where: str) -> str:
    """The digest a file's checksum entry names (``CHECKSUM_DIGESTS``): ``"<digest>:<hex>"``,
    or bare hex for blake2b (older files); anything else refused (``TraceFileError``)."""
    digest, sep, _ = value.partition(":")
    if not sep:
        return "blake2b"
    if digest not in CHECKSUM_DIGESTS or digest == "blake2b":
        raise refuse(where, f"its checksum names the digest {digest[:40]!r}: this release writes "
                     f"'{CHECKSUM_DIGESTS[0]}:<hex>' (and reads blake2b as bare hex)",
                     "read it with the release that wrote it, or upgrade")
    return digest


__all__ = ["CHECKSUM_DIGESTS", "Checksum", "checksum_digest", "crc32", "table_checksum"]
