"""A query's Arrow result as JSON rows, bounded before any Python object is made: each
batch cut to the rows still wanted, its text cut to ``MAX_CELL`` characters, its bytes
replaced by their length and its lists (maps, arrays; at every depth) cut to
``MAX_ITEMS`` items by Arrow compute, so a cell of a hundred million list items or a
gigabyte string costs what its first items cost; each row then converted alone and
kept while the answer stays within ``max_bytes`` of JSON. Rows past a bound are
counted, not converted ("truncated: N more rows")."""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
import pyarrow.compute as pc

MAX_CELL = 2000  # characters of one text cell
MAX_ITEMS = 100  # items of one list, map or array cell, at each depth


def _cut_text(arr: pa.Array) -> pa.Array:
    """Strings longer than ``MAX_CELL`` characters cut, "... (N characters)" added."""
    if arr.type != pa.string():
        arr = arr.cast(pa.large_string()) if pa.types.is_large_string(arr.type) else arr.cast(pa.string())
    n = pc.utf8_length(arr)
    cut = pc.utf8_slice_codeunits(arr, 0, MAX_CELL)
    note = pc.binary_join_element_wise("... (", pc.cast(n, pa.string()), " characters)", "")
    return pc.if_else(pc.greater(n, MAX_CELL), pc.binary_join_element_wise(cut, note, ""), cut)


def _byte_count(arr: pa.Array) -> pa.Array:
    """Bytes replaced by "<N bytes>" (their content is no text an answer can hold)."""
    return pc.binary_join_element_wise("<", pc.cast(pc.binary_length(arr), pa.string()), " bytes>", "")


def bound(arr: pa.Array) -> pa.Array:
    """``arr`` with every text, bytes and list cell bounded (module docstring), at any
    depth; a list keeps ``MAX_ITEMS + 1`` items, the last saying there were more."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return bound(arr.dictionary_decode())
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _cut_text(arr)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or \
            pa.types.is_binary_view(t):
        return _byte_count(arr)
    if pa.types.is_map(t):
        entries = pa.ListArray.from_arrays(arr.offsets, arr.values, mask=arr.is_null())
        return bound(entries)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or \
            pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        cut = pc.list_slice(arr, 0, MAX_ITEMS + 1)
        if pa.types.is_fixed_size_list(cut.type):
            cut = cut.cast(pa.list_(cut.type.value_field))
        return pa.ListArray.from_arrays(cut.offsets, bound(cut.values), mask=cut.is_null()) \
            if pa.types.is_list(cut.type) else pa.LargeListArray.from_arrays(cut.offsets, bound(cut.values),
                                                                              mask=cut.is_null())
    if pa.types.is_struct(t):
        fields = [bound(arr.field(i)) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(fields, names=[f.name for f in t], mask=arr.is_null())
    if pa.types.is_union(t):
        kids = [bound(arr.field(i)) for i in range(t.num_fields)]
        names, codes = [f.name for f in t], list(t.type_codes)
        if t.mode == "sparse":
            return pa.UnionArray.from_sparse(arr.type_codes, kids, names, codes)
        return pa.UnionArray.from_dense(arr.type_codes, arr.offsets, kids, names, codes)
    return arr


def cell(v):
    """One value as JSON holds it: a list past ``MAX_ITEMS`` with its note, NaN and
    infinity null, times and decimals as text, a map's pairs as a list."""
    if isinstance(v, float):
        return None if v != v or v in (float("inf"), float("-inf")) else v
    if isinstance(v, (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)):
        return str(v)
    if isinstance(v, dict):
        return {str(k): cell(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [cell(x) for x in v[:MAX_ITEMS]] + (["... more items"] if len(v) > MAX_ITEMS else [])
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(v):,} bytes>"
    return v


class Taken:
    """What ``take`` kept: ``rows``, ``more`` (rows past a bound, counted), ``size``
    (JSON bytes kept), ``why`` (the first bound met: None, ``rows``, ``bytes``)."""

    def __init__(self):
        self.rows, self.more, self.size, self.why = [], 0, 0, None


def take(batches, max_rows: int, max_bytes: int, out: Taken | None = None) -> Taken:
    """The rows of ``batches`` (Arrow record batches) within ``max_rows`` and
    ``max_bytes`` of JSON, the rest counted; ``out`` (a ``Taken``) filled as it goes, so
    a caller stopped midway keeps what was taken."""
    out = Taken() if out is None else out
    for batch in batches:
        if out.why is not None:
            out.more += batch.num_rows
            continue
        room = max_rows - len(out.rows)
        part = batch.slice(0, room)
        out.more += batch.num_rows - part.num_rows
        _rows(part, max_bytes, out)
        if out.why is None and len(out.rows) >= max_rows:
            out.why = "rows"
    return out


def _rows(part: pa.RecordBatch, max_bytes: int, out: Taken) -> None:
    """``part``'s rows bounded and converted one by one into ``out`` while they fit."""
    lengths = {j: pc.list_value_length(c) for j, c in enumerate(part.columns)
               if pa.types.is_list(c.type) or pa.types.is_large_list(c.type)}
    bounded = pa.RecordBatch.from_arrays([bound(c) for c in part.columns], names=part.schema.names)
    for i in range(bounded.num_rows):
        one = bounded.slice(i, 1)
        if out.why is not None or out.size + one.nbytes > max_bytes:  # deep lists: over before converting
            out.why = out.why or "bytes"
            out.more += bounded.num_rows - i
            return
        row = [cell(v) for v in one.to_pylist()[0].values()]
        for j, n in lengths.items():
            k = n[i].as_py()
            if k is not None and k > MAX_ITEMS:
                row[j] = row[j][:MAX_ITEMS] + [f"... {k - MAX_ITEMS:,} more items"]
        size = len(json.dumps(row, ensure_ascii=False, default=str))
        if out.size + size > max_bytes:
            out.why = "bytes"
            out.more += bounded.num_rows - i
            return
        out.rows.append(row)
        out.size += size


__all__ = ["MAX_CELL", "MAX_ITEMS", "Taken", "bound", "cell", "take"]
