"""Trace files that are damaged or crafted: one ``TraceFileError`` line from ``load``
and from every CLI command that reads one, never a different timeline."""

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timeline.contract import schema as S
from timeline.ingest import synth
from timeline.cli import main
from timeline.core.trace import TraceFileError, load, table_checksum

EXTS = (".arrow", ".parquet")


@pytest.fixture(scope="module")
def trace():
    """Two ranks of a small synthetic run: dictionary stage column, nulls nowhere."""
    return synth.synth_trace(S.Spec("k", [("a", 6), ("b", 5)], world=2, waves=2), grid=4, seed=3)


@pytest.fixture(scope="module")
def files(trace, tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    return {ext: (trace.save(d / f"t{ext}"), (d / f"t{ext}").read_bytes()) for ext in EXTS}


def same(a, b) -> bool:
    return (a.tasks.equals(b.tasks) and a.anomalies.equals(b.anomalies) and a.specs == b.specs
            and a.origins == b.origins and a.offsets == b.offsets)


def write(path, table: pa.Table, meta: dict, *, checksum=True):
    """Write ``table`` with ``meta`` as its metadata, the checksum recomputed (a crafted
    file passes the checksum: the checks after it must catch it) unless told not to."""
    meta = {k: v for k, v in meta.items() if k != S.META_CHECKSUM}
    if checksum:
        meta[S.META_CHECKSUM] = table_checksum(table.replace_schema_metadata(None), meta).encode()
    table = table.replace_schema_metadata(meta)
    if str(path).endswith(".parquet"):
        pq.write_table(table, str(path))
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    return path


def one_line_refusal(path) -> str:
    with pytest.raises(TraceFileError) as e:
        load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_round_trip_carries_a_checksum_and_no_note(trace, files):
    for ext in EXTS:
        back = load(files[ext][0])
        assert same(back, trace) and back.notes == ()
        assert re.fullmatch(rb"crc32:[0-9a-f]{32}", back.metadata()[S.META_CHECKSUM])


def test_a_blake2b_checksum_of_an_older_file_is_still_verified(trace, files, tmp_path):
    """A file whose checksum is the bare blake2b hex earlier releases wrote loads and is
    checked with that digest: one changed value is refused. A digest this release does
    not know is refused by name, never loaded unchecked."""
    src = pa.ipc.open_file(pa.memory_map(str(files[".arrow"][0]))).read_all()
    meta = {k: v for k, v in src.schema.metadata.items() if k != S.META_CHECKSUM}
    table = src.replace_schema_metadata(None)
    old = table_checksum(table, meta, "blake2b")
    assert re.fullmatch("[0-9a-f]{32}", old) and old != table_checksum(table, meta).partition(":")[2]
    def raw(name, t, checksum: bytes):
        t = t.replace_schema_metadata({**meta, S.META_CHECKSUM: checksum})
        with pa.OSFile(str(tmp_path / name), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
            w.write_table(t)
        return tmp_path / name

    back = load(raw("old.arrow", table, old.encode()))
    assert same(back, trace) and back.notes == ()
    i = table.schema.get_field_index("task")
    task = table.column(i).to_numpy().copy()
    task[0] += 1
    changed = table.set_column(i, "task", pa.array(task, table.schema.field(i).type))
    assert "checksum does not match" in one_line_refusal(raw("old_changed.arrow", changed, old.encode()))
    assert "digest 'sha3'" in one_line_refusal(raw("sha.arrow", table, b"sha3:" + b"0" * 32))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 2**63 - 1)), min_size=1, max_size=64), st.integers(0, 63),
       st.integers(0, 62), st.integers(1, 16))
def test_the_crc32_checksum_changes_with_any_flipped_bit_and_not_with_chunking(values, at, bit, parts):
    """One flipped bit in any value of any row, or a value made null, changes the
    checksum; splitting the column into chunks does not, nulls or not (the digest is
    of the values, not of how they lie). Before: a column's validity was digested
    only for the chunks holding a null, so a file chunked otherwise than the table it
    was saved from failed its own checksum."""
    at %= len(values)
    col = pa.array(values, pa.int64())
    table = pa.table({"v": col})
    cuts = [i * len(values) // parts for i in range(parts + 1)]
    chunked = pa.table({"v": pa.chunked_array([col.slice(a, b - a) for a, b in zip(cuts, cuts[1:])], pa.int64())})
    assert table_checksum(chunked, {}) == table_checksum(table, {})
    changed = list(values)
    changed[at] = None if changed[at] is not None and bit % 2 else (changed[at] or 0) ^ (1 << bit)
    if changed[at] != values[at]:
        assert table_checksum(pa.table({"v": pa.array(changed, pa.int64())}), {}) != table_checksum(table, {})


@pytest.mark.parametrize("ext", EXTS)
def test_a_trace_of_no_rows_round_trips(tmp_path, ext):
    """A buffer with nothing stamped decodes to a trace of no rows (its slots reported
    unwritten) whose file loads back: the checksum of an empty dictionary column does
    not depend on whether the file kept its dictionary (Arrow IPC writes no batch)."""
    from timeline.ingest.collect import collect

    sp = S.Spec("k", [("a", 6), ("b", 5)], waves=2)
    empty = collect(np.zeros(sp.layout.words, np.int64), sp)
    assert empty.tasks.num_rows == 0 and empty.anomaly_summary() == {"unwritten": 22}
    back = load(empty.save(tmp_path / f"e{ext}"))
    assert same(back, empty) and back.notes == ()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ext=st.sampled_from(EXTS), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_is_refused_or_changes_nothing(trace, files, tmp_path, ext, where, bit):
    """Any single flipped bit anywhere in the file: a ``TraceFileError``, or (padding,
    an unused byte) exactly the timeline that was saved."""
    data = bytearray(files[ext][1])
    k = int(where * len(data))
    data[k] ^= 1 << bit
    p = tmp_path / f"flip{ext}"
    p.write_bytes(bytes(data))
    try:
        back = load(p)
    except TraceFileError as e:
        assert "\n" not in str(e)
        return
    assert same(back, trace), f"byte {k} bit {bit} changed the timeline"


def _drop_column(t, m):
    return t.drop_columns(["end_ns"]), m


def _name_repeated(t, m):
    return t.rename_columns(["hint_ns" if n == "hint_tick" else n for n in t.column_names]), m


def _meta(key, value):
    return lambda t, m: (t, {**m, key: value})


def _column(name, fn):
    def edit(t, m):
        i = t.schema.get_field_index(name)
        return t.set_column(i, name, pa.array(fn(t.column(name).to_numpy()))), m
    return edit


def _retyped(name, array):
    """Column ``name`` replaced by ``array(n)``: a type no trace column has."""
    def edit(t, m):
        return t.set_column(t.schema.get_field_index(name), name, array(t.num_rows)), m
    return edit


def _specs(fn):
    """Both spec entries edited alike (the first rank's spec is the spec entry): a
    crafted file whose metadata agrees with itself, for the checks of its rows."""
    def edit(t, m):
        d = json.loads(m[S.META_SPECS])
        fn(d)
        return t, {**m, S.META_SPECS: json.dumps(d).encode(), S.META_SPEC: json.dumps(d[0]).encode()}
    return edit


def _stage_renamed(d):
    for sp in d:
        sp["stages"][0][0] = "zz"


def _phases_changed(d):
    for sp in d:
        sp["phases"] = ["start", "end"]
        sp["wait"] = []


def _fewer_tasks(d):
    for sp in d:
        sp["stages"][1][1] = 2


CRAFTED = {
    "a missing column": (_drop_column, r"lacks the tasks columns \['end_ns'\]"),
    "a column name repeated": (_name_repeated, r"lacks the tasks columns \['hint_tick'\]|Multiple matches for "
                                               r"FieldRef.Name\(hint_ns\)"),
    "metadata that is not JSON": (_meta(S.META_SPECS, b"{nope"), "is not valid JSON"),
    "anomalies that are not JSON": (_meta(S.META_ANOMALIES, b"\xff"), "is not valid JSON"),
    "a spec that is not a dict": (_meta(S.META_SPECS, b"[3]"), "not a valid spec"),
    "no specs at all": (_meta(S.META_SPECS, b"[]"), "not a valid spec"),
    "an unknown anomaly kind": (_meta(S.META_ANOMALIES, json.dumps(
        [{"rank": 0, "kind": "gremlins", "launch": 0, "stage": "a", "phase": "", "count": 1,
          "stamps": 1}]).encode()), "unknown anomaly kinds"),
    "a wrong layout version": (_meta(S.META_LAYOUT, b"7"), "layout version '7'"),
    "origins that are not numbers": (_meta(S.META_ORIGIN, b'{"origins": {"0": "x"}}'), "map of rank"),
    "a stage renamed in the spec": (_specs(_stage_renamed), "stage names disagree with stage_index"),
    "phases the columns lack": (_specs(_phases_changed), r"holds columns \['hint_ns'"),
    "a stage with fewer tasks than its rows": (_specs(_fewer_tasks), "past its spec's slots"),
    "a rank no spec has": (_column("rank", lambda v: np.where(v == 1, 5, v).astype(np.int16)),
                           "ranks its specs lack"),
    "a stage index out of range": (_column("stage_index", lambda v: (v * 9).astype(np.int16)),
                                   "stage_index outside"),
    "a launch past the slots": (_column("launch", lambda v: (v + 3).astype(np.int32)), "past its spec's slots"),
    "a negative task": (_column("task", lambda v: (v - 1).astype(np.int32)), "past its spec's slots"),
    "fractional times": (_column("start_ns", lambda v: v + 0.5), "does not hold the type"),
    "a column of nulls": (_retyped("hint_ns", pa.nulls), "hint_ns is not the time"),
    "a column of bools with nulls": (_retyped("flags", lambda n: pa.array([True, None] * (n // 2) + [None] * (n % 2))),
                                     r"columns \['flags'\] hold nulls"),
    "a task without a number": (_retyped("task", lambda n: pa.array([None] + [0] * (n - 1), pa.int32())),
                                r"columns \['task'\] hold nulls"),
    "a column of words": (_retyped("task", lambda n: pa.array(["x"] * n)), "does not hold the type"),
    "a time that is not its tick's": (_column("end_ns", lambda v: v + 1), "end_ns is not the time"),
    "a tick past the exact span": (_column("end_tick", lambda v: v + (1 << 62)), "exact time axis"),
}


@pytest.mark.parametrize("ext", EXTS)
@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_files_are_refused_in_one_line(files, tmp_path, ext, case):
    edit, message = CRAFTED[case]
    src = pq.read_table(files[ext][0]) if ext == ".parquet" else pa.ipc.open_file(
        pa.memory_map(str(files[ext][0]))).read_all()
    table, meta = edit(src.replace_schema_metadata(None), dict(src.schema.metadata))
    msg = one_line_refusal(write(tmp_path / f"c{ext}", table, meta))
    import re

    assert re.search(message, msg), msg


def test_a_file_without_a_checksum_loads_with_a_note(trace, files, tmp_path):
    src = pa.ipc.open_file(pa.memory_map(str(files[".arrow"][0]))).read_all()
    p = write(tmp_path / "old.arrow", src, dict(src.schema.metadata), checksum=False)
    back = load(p)
    assert same(back, trace) and len(back.notes) == 1 and "no checksum" in back.notes[0]
    meta = dict(src.schema.metadata)
    meta[S.META_CHECKSUM] = b"0" * 32
    table = src.replace_schema_metadata(meta)
    with pa.OSFile(str(tmp_path / "bad.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    assert "checksum does not match" in one_line_refusal(tmp_path / "bad.arrow")


def _meta_spec_other(t, m):
    d = json.loads(m[S.META_SPEC])
    d["kernel"] = "another"
    return t, {**m, S.META_SPEC: json.dumps(d).encode()}


# Every metadata entry is parsed and checked against the tables, checksum or not (docs/FORMAT.md section 5).
METADATA = {
    "a spec entry that is not JSON": (_meta(S.META_SPEC, b"{nope"), "mono_timeline.spec' is not valid JSON"),
    "a spec entry that is not a spec": (_meta(S.META_SPEC, b"[1, 2]"), "mono_timeline.spec' is not a valid spec"),
    "a spec entry of another build": (_meta_spec_other, "mono_timeline.spec' is not the first rank's spec"),
    "a clock entry that is garbage": (_meta(S.META_CLOCK, b"\x00\x01"), "mono_timeline.clock' is not valid JSON"),
    "a clock entry that is no clock": (_meta(S.META_CLOCK, b'[1]'), "mono_timeline.clock' is not its spec's clock"),
    "a clock entry of another rate": (_meta(S.META_CLOCK, b'{"name": "memrealtime", "hz": 1000000000}'),
                                      "mono_timeline.clock' is not its spec's clock"),
    "a version entry that is garbage": (_meta(S.META_VERSION, b"\xff\xfe"), "mono_timeline.version' is not a release"),
    "a synthetic entry that is not 0 or 1": (_meta(S.META_SYNTHETIC, b"yes"), "mono_timeline.synthetic' is not 0 or 1"),
    "a layout entry that is garbage": (_meta(S.META_LAYOUT, b"\xff"), "layout version"),
    "a checksum that is not one": (_meta(S.META_CHECKSUM, b"zz"), "checksum"),
    "a checksum that is empty": (_meta(S.META_CHECKSUM, b""), "checksum does not match"),
    "an entry this release does not know": (_meta(b"mono_timeline.gremlin", b"1"),
                                            "mono_timeline.gremlin' is no entry this release knows"),
    "origins that are not an object": (_meta(S.META_ORIGIN, b"[]"), "is not a JSON object"),
}


@pytest.mark.parametrize("checksum", [False, True], ids=["no checksum", "checksum"])
@pytest.mark.parametrize("ext", EXTS)
@pytest.mark.parametrize("case", sorted(METADATA))
def test_every_metadata_entry_is_checked_with_or_without_a_checksum(files, tmp_path, ext, case, checksum):
    """A file whose metadata entry says something else than the tables (or nothing):
    one line, whether or not it carries a checksum (a file of an older release has none:
    its entries are still parsed and checked). Before: without a checksum the spec,
    clock, version and synthetic entries were never read, and such a file loaded."""
    edit, message = METADATA[case]
    src = pq.read_table(files[ext][0]) if ext == ".parquet" else pa.ipc.open_file(
        pa.memory_map(str(files[ext][0]))).read_all()
    table, meta = edit(src.replace_schema_metadata(None), dict(src.schema.metadata))
    if case.startswith("a checksum that is"):
        p = tmp_path / f"m{ext}"
        t = table.replace_schema_metadata(meta)
        if ext == ".parquet":
            pq.write_table(t, str(p))
        else:
            with pa.OSFile(str(p), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
                w.write_table(t)
    else:
        p = write(tmp_path / f"m{ext}", table, meta, checksum=checksum)
    import re

    msg = one_line_refusal(p)
    assert re.search(message, msg), msg


JSON_KEYS = (S.META_SPEC, S.META_SPECS, S.META_ANOMALIES, S.META_CLOCK, S.META_ORIGIN)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(JSON_KEYS + (S.META_VERSION, S.META_LAYOUT, S.META_SYNTHETIC)),
       value=st.one_of(st.binary(max_size=24), st.text(max_size=12).map(str.encode),
                       st.sampled_from([b"{}", b"[]", b"null", b"1", b'"x"', b'{"name": "globaltimer", "hz": 1}',
                                        b'{"name": "memrealtime", "hz": 100000000}', b"0.1.0", b"3", b"0"]),
                       st.recursive(st.none() | st.integers() | st.text(max_size=4),
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                                    max_leaves=6).map(lambda v: json.dumps(v).encode())))
def test_an_entry_without_a_checksum_loads_only_if_it_says_what_was_written(trace, files, tmp_path, key, value):
    """Any bytes in any metadata entry of a file without a checksum: refused in one
    line, or the entry means what the saved one meant (the same JSON value; a
    release version; a layout this release reads; the synthetic flag the trace then
    carries) and the tables are the ones saved."""
    src = pa.ipc.open_file(pa.memory_map(str(files[".arrow"][0]))).read_all()
    meta = dict(src.schema.metadata)
    original = meta[key]
    meta[key] = value
    p = write(tmp_path / "any.arrow", src.replace_schema_metadata(None), meta, checksum=False)
    try:
        back = load(p)
    except TraceFileError as e:
        assert "\n" not in str(e)
        return
    if key in JSON_KEYS:
        assert json.loads(value) == json.loads(original)
    elif key == S.META_VERSION:
        import re

        assert re.fullmatch(rb"[0-9]+(\.[0-9]+)*([.+-]?[0-9A-Za-z]+)*", value)
    elif key == S.META_LAYOUT:
        assert value in (b"1", b"2", b"3")
    else:
        assert value in (b"0", b"1") and back.synthetic == (value == b"1")
    assert same(back, trace)


def test_not_a_regular_file_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.arrow")
    assert "not a regular file" in one_line_refusal(tmp_path / "pipe.arrow")  # no hang on open


@pytest.mark.parametrize("command", [["info"], ["summary"], ["export", "--chrome", "{out}"]])
def test_every_command_refuses_a_damaged_file_in_one_line(files, tmp_path, capsys, command):
    p = tmp_path / "damaged.arrow"
    for k in range(len(files[".arrow"][1]) // 2, len(files[".arrow"][1])):  # the first damaging flip
        data = bytearray(files[".arrow"][1])
        data[k] ^= 0x10
        p.write_bytes(bytes(data))
        try:
            load(p)
        except TraceFileError:
            break
    args = [command[0], str(p)] + [a.format(out=tmp_path / "o.json") for a in command[1:]]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "re-copy it" in err and "Traceback" not in err


def test_info_prints_the_notes(files, tmp_path, capsys):
    src = pa.ipc.open_file(pa.memory_map(str(files[".arrow"][0]))).read_all()
    p = write(tmp_path / "old.arrow", src, dict(src.schema.metadata), checksum=False)
    assert main(["info", str(p)]) == 0
    assert "no checksum" in capsys.readouterr().err


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_the_checksum_crc32_is_zlibs_digest(data, start):
    """The checksum's CRC-32 (ISA-L's, a dependency) gives zlib's value for any bytes
    and running value: files checksummed by either read as the same."""
    import zlib

    from timeline.core import checksum

    assert checksum.crc32 is not zlib.crc32  # the fast one is installed (pyproject's dependency)
    assert checksum.crc32(data, start) == zlib.crc32(data, start)
