"""Damaged framework traces and bad fields (issue 48): a damaged, cut or flipped gzip
or JSON file is one ``FrameworkTraceError`` line and exit 2 from ``timeline attach``
and ``timeline-view --context`` (never ``zlib.error``'s traceback, never a hang); a
cut file's refusal says where it was cut; a negative ``dur``, a grid that is not
``[x, y, z]`` and a ``baseTimeNanoseconds`` that is not an integer are refused
naming the event or key, not read as something else."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timeline import load
from timeline.attach import AttachError, FrameworkTraceError
from timeline.attach.attach import attach_files
from timeline.attach import write as AW
from timeline.cli.parser import main

D = Path(__file__).resolve().parents[1] / "traces" / "h200_attach"
KERNEL = "mono_ffn_kernel"
TEXT = gzip.decompress((D / "plain.pt.trace.json.gz").read_bytes())  # a real torch.profiler trace (H200, 4 launches)
GZ = gzip.compress(TEXT)
ISSUE_GZ = b"\x1f\x8b\x08\x00garbagegarbage"  # the issue's damaged gzip


def attach_cli(*args) -> tuple:
    """``timeline attach`` in this process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["attach", *map(str, args)])
    return rc, err.getvalue()


def one_line_refusal(rc: int, err: str, start: str = "timeline attach: error: ") -> str:
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), err
    return lines[0]


def flipped(data: bytes, at: int, xor: int = 0xFF) -> bytes:
    b = bytearray(data)
    b[at % len(b)] ^= xor
    return bytes(b)


@pytest.mark.parametrize("name, data, said", [
    ("bad.json.gz", ISSUE_GZ, "zlib.error"),
    ("flip.json.gz", flipped(GZ, 400), "is truncated or damaged"),
    ("cut.json.gz", GZ[:len(GZ) // 2], "EOFError: Compressed file ended"),
])
def test_a_damaged_gzip_is_one_line_for_attach_and_the_viewer(tmp_path, capsys, name, data, said):
    path = tmp_path / name
    path.write_bytes(data)
    line = one_line_refusal(*attach_cli(D / "plain.arrow", path, "--kernel", KERNEL))
    assert repr(str(path)) in line and said in line and "copy or export it again" in line
    from viewer import app as V

    with pytest.raises(SystemExit) as ex:
        V.prepare([str(D / "plain.arrow"), "--context", str(path), "--context-kernel", KERNEL])
    err = capsys.readouterr().err  # argparse's usage, then the one line
    assert ex.value.code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("timeline-view: error: ") and said in line


@pytest.mark.parametrize("gz", [False, True])
def test_a_cut_file_names_where_it_was_cut(tmp_path, gz):
    cut = TEXT[:len(TEXT) // 2]
    last = cut.rfind(b"},")  # the last whole event's closing brace
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(gzip.compress(cut) if gz else cut)  # a gzip of the cut text: whole as gzip, cut as JSON
    line = one_line_refusal(*attach_cli(D / "plain.arrow", path, "--kernel", KERNEL))
    assert (f"ends inside its traceEvents array (after byte {len(cut):,}, its last whole event ending at byte "
            f"{last + 1:,}): the file is truncated or damaged") in line
    assert line.replace(repr(str(path)), "'cut.json'") in DOC or gz  # docs/ATTACH.md quotes it as printed


DOC = (Path(__file__).resolve().parents[1] / "docs" / "ATTACH.md").read_text()


def test_the_docs_quote_the_refusals_as_printed(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(ISSUE_GZ)
    line = one_line_refusal(*attach_cli(D / "plain.arrow", path, "--kernel", KERNEL))
    assert line.replace(repr(str(path)), "'bad.json.gz'") in DOC
    assert "printf '\\x1f\\x8b\\x08\\x00garbagegarbage' > bad.json.gz" in DOC


class Hang(Exception):
    pass


@contextlib.contextmanager
def watchdog(seconds: int):
    """A read that does not end within ``seconds`` fails the test (never a hang)."""
    def ring(*_):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


TRACE = load(D / "plain.arrow")
damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("garbage"), st.integers(0, 10**6), st.binary(min_size=1, max_size=40)),
)


def damaged(data: bytes, how) -> bytes:
    kind, at, arg = how
    if kind == "flip":
        return flipped(data, at, arg)
    at %= len(data)
    return data[:at] if kind == "cut" else data[:at] + arg + data[at:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=damage, gz=st.booleans(), damage_gz=st.booleans())
def test_any_damaged_file_is_read_or_refused_in_one_line(tmp_path, how, gz, damage_gz):
    """A real profiler trace with one byte flipped, cut anywhere, or garbage inserted,
    in the JSON or in its gzip: attach and both outputs either succeed or raise one
    documented error of one line; nothing else, and within 60 s."""
    data = damaged(GZ, how) if gz and damage_gz else gzip.compress(damaged(TEXT, how)) if gz else damaged(TEXT, how)
    path = tmp_path / ("f.json.gz" if gz else "f.json")
    path.write_bytes(data)
    with watchdog(60):
        try:
            att = attach_files(TRACE, [path], kernel=KERNEL)
            AW.write_perfetto(att, tmp_path / "o.pftrace")
            AW.write_chrome(att, tmp_path / "o.json")
        except (FrameworkTraceError, AttachError) as e:
            assert "\n" not in str(e) and str(e)


def test_the_cli_refuses_a_damaged_file_in_one_line_for_each_kind(tmp_path):
    """The property's kinds of damage as the user meets them: exit 2, one line."""
    for i, how in enumerate([("flip", 400, 0xFF), ("cut", 3000, 0), ("garbage", 1000, b"}]}")]):
        for gz in (False, True):
            path = tmp_path / f"d{i}.json{'.gz' if gz else ''}"
            path.write_bytes(damaged(GZ, how) if gz else damaged(TEXT, how))
            one_line_refusal(*attach_cli(D / "plain.arrow", path, "--kernel", KERNEL))


def kernel_doc(**change) -> dict:
    """``plain``'s trace as a document, its first kernel event's fields changed."""
    doc = json.loads(TEXT)
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    for key, v in change.items():
        if key == "base":
            doc["baseTimeNanoseconds"] = v
        elif key == "grid":
            k["args"]["grid"] = v
        else:
            k[key] = v
    return doc


@pytest.mark.parametrize("change, said", [
    ({"dur": -5}, "the kernel event 'mono_ffn_kernel' at ts 5672673730717.66 µs has dur -5 µs: a length cannot be "
                  "negative"),
    ({"grid": "abc"}, "the kernel event 'mono_ffn_kernel' at ts 5672673730717.66 µs has args.grid \"abc\", not "
                      "[x, y, z] integers"),
    ({"grid": [128, 1]}, "has args.grid [128,1], not [x, y, z] integers"),
    ({"base": 1.7e18}, "baseTimeNanoseconds is '1.7e+18', not a whole number of ns"),
    ({"base": "soon"}, "baseTimeNanoseconds is 'soon', not a whole number of ns"),
    ({"base": -1}, "baseTimeNanoseconds is '-1', not a whole number of ns"),
])
def test_bad_fields_are_refused_naming_the_event_and_the_fix(tmp_path, change, said):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(kernel_doc(**change)))
    line = one_line_refusal(*attach_cli(D / "plain.arrow", path, "--kernel", KERNEL))
    assert said in line and ("correct" in line or "remove" in line)


json_value = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False)
                          | st.text(max_size=8), lambda c: st.lists(c, max_size=4), max_leaves=6)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["dur", "grid", "base", "ts"]), value=json_value)
def test_any_value_of_a_read_field_is_read_as_itself_or_refused(tmp_path, field, value):
    """Any JSON value in a field attach reads: read (and then matched or refused as a
    mismatch), or one refusal; a negative dur or a grid that is not three integers
    never passes."""
    path = tmp_path / "f.json"
    path.write_text(json.dumps(kernel_doc(**{field: value})))
    try:
        att = attach_files(TRACE, [path], kernel=KERNEL)
    except (FrameworkTraceError, AttachError) as e:
        assert "\n" not in str(e)
        return
    fw = att.frameworks[0]
    if field == "dur":
        assert value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                 and value > -1e-3)  # -0.0009 µs is -0 ns: digits past the ns are dropped
    if field == "grid":
        assert value is None or (isinstance(value, list) and len(value) == 3)
    if field == "base":
        assert value is None or type(value) in (int, str)  # an integer (or its digits, as text)
        assert fw.base_ns == (None if value is None else int(value))


def test_a_negative_dur_of_any_converted_event_is_refused_by_the_perfetto_output(tmp_path):
    """A host op's ``dur`` is read only for the Perfetto output: there too a negative one
    is one line naming it (it was made 0 long without a word)."""
    doc = json.loads(TEXT)
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cuda_driver")
    op["dur"] = -5
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    assert attach_cli(D / "plain.arrow", path, "--kernel", KERNEL)[0] == 0  # the attach itself does not read it
    line = one_line_refusal(*attach_cli(D / "plain.arrow", path, "--kernel", KERNEL, "-o", tmp_path / "o.pftrace"))
    assert f"the cuda_driver event {op['name']!r} at ts" in line and "has dur -5 µs: a length cannot be negative" in line
    assert not (tmp_path / "o.pftrace").exists()
