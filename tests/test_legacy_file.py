"""``import-legacy`` on a file that is not a kernel's saved timeline (issue 39): one
``LegacyFileError`` line saying what the file is and what the command expects, told by
its first bytes before torch reads it, never PyTorch's own weights-only text; a damaged
archive refused, never read as plausible wrong ticks. And the torch files it must still
read: torch's older pickle format, an archive saved without CRCs."""

from __future__ import annotations

import gzip
import pickle
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.cli import main
from timeline.errors import TimelineError
from timeline.ingest import legacy_file as LF
from timeline.ingest.synth import synth_trace

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "traces" / "glm5_legacy_synthetic" / "w8a8-s1" / "rank0" / "trace.pt"
TORCH_TEXT = ("Weights only load failed", "In PyTorch 2.6", "arbitrary code execution", "miniz", "Traceback")


def _flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0xFF
    return bytes(b)


def _member_offset(path: Path, name: str) -> int:
    """Where member ``name``'s bytes start in the archive."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
        with z.open(info):
            pass
        head = path.read_bytes()[info.header_offset: info.header_offset + 30]
        return info.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")


def _zip_without_torch(p: Path) -> None:
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("notes.txt", "hello")


def _other_objects(p: Path) -> None:
    torch.save({"stages": [("a", 1)], "ticks": torch.zeros(1, 8, dtype=torch.int64), "where": Path("x")}, p)


CASES = {
    "empty": (lambda p: p.write_bytes(b""), "is an empty file (0 bytes), not a torch file"),
    "text": (lambda p: p.write_text("hello world\nsecond line\n"), "is a text file (it begins 'hello world'), "
                                                                   "not a torch file"),
    "binary": (lambda p: p.write_bytes(bytes(range(7, 200))), "is a binary file of another format (it begins with "
                                                              "the bytes 07 08 09 0a 0b 0c 0d 0e), not a torch file"),
    "truncated": (lambda p: p.write_bytes(GOOD.read_bytes()[:40_000]), "is a damaged zip archive (its directory is "
                                                                       "missing: truncated"),
    "crc": (lambda p: p.write_bytes(_flip(GOOD.read_bytes(), _member_offset(GOOD, "trace/data/0") + 100)),
            "is a damaged torch file (its member trace/data/0 fails its CRC check)"),
    "plain pickle of a list": (lambda p: p.write_bytes(pickle.dumps([1, 2, 3])),
                               "is a Python pickle that torch.save did not write"),
    "plain pickle of the dict": (lambda p: p.write_bytes(pickle.dumps({"stages": [("a", 1)], "ticks": [0] * 8})),
                                 "is a Python pickle that torch.save did not write"),
    "torch pickle of a list": (lambda p: torch.save([1, 2, 3], p), "holds a list, not the kernel's trace dict"),
    "npy": (lambda p: np.save(p.open("wb"), np.zeros((3, 8), np.int64)), "is a NumPy .npy array (name it .npy, "
                                                                          "give --stages), not a torch file"),
    "npz": (lambda p: np.savez(p.open("wb"), ticks=np.zeros((3, 8))), "is a NumPy .npz archive, not a torch file"),
    "zip": (_zip_without_torch, "is a zip archive of 1 files without torch's data.pkl, not a torch file"),
    "gzip": (lambda p: p.write_bytes(gzip.compress(GOOD.read_bytes())), "is a gzip-compressed file (gunzip it "
                                                                         "first), not a torch file"),
    "arrow": (lambda p: synth_trace(grid=4).save(p.with_suffix(".arrow")).rename(p),
              "is a timeline arrow trace file already"),
    "other objects": (_other_objects, "is a torch file of Python objects other than tensors"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_file_that_is_not_the_kernels_is_one_line_saying_what_it_is(tmp_path, capsys, case):
    make, says = CASES[case]
    path = tmp_path / "rank0" / "trace.pt"
    path.parent.mkdir()
    make(path)
    with pytest.raises(LF.LegacyFileError) as e:
        LF.read_legacy(path)
    assert isinstance(e.value, LF.LegacyError) and isinstance(e.value, TimelineError)
    assert main(["import-legacy", str(path), "-o", str(tmp_path / "o.arrow")]) == 2
    cap = capsys.readouterr()
    err = cap.err
    assert err.startswith("timeline import-legacy: error: ") and err.count("\n") == 1, err
    assert f"{str(path)!r} {says}" in err, err
    assert ("import-legacy expects the trace.pt tools/benchmark.py --trace saves" in err
            or "give dict(stages=..., ticks=...)" in err), err
    assert not any(t in err for t in TORCH_TEXT), err
    assert cap.out == "" and not (tmp_path / "o.arrow").exists()


def test_torch_files_it_must_still_read(tmp_path):
    """torch's pre-zip format (``_use_new_zipfile_serialization=False``) and an archive
    saved with ``set_crc32_options(False)`` (every CRC 0, nothing to check) read as the
    kernel's dict."""
    d = torch.load(GOOD, weights_only=True)
    old = tmp_path / "old.pt"
    torch.save(d, old, _use_new_zipfile_serialization=False)
    no_crc = tmp_path / "nocrc.pt"
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(d, no_crc)
    finally:
        torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(no_crc) as z:
        assert not any(i.CRC for i in z.infolist())
    for p in (old, no_crc):
        f = LF.read_legacy(p)
        assert f.stages == tuple(d["stages"]) and np.array_equal(f.ticks, d["ticks"].numpy())


def _read(data: bytes):
    """``read_legacy`` of ``data`` saved as ``rank0/trace.pt``: the LegacyFile, or the error."""
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "rank0" / "trace.pt"
        p.parent.mkdir()
        p.write_bytes(data)
        try:
            return LF.read_legacy(p)
        except LF.LegacyError as e:
            assert "\n" not in str(e) and not any(t in str(e) for t in TORCH_TEXT), str(e)
            return e


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_are_read_or_refused_in_one_line(data):
    got = _read(data)
    assert isinstance(got, (LF.LegacyFile, LF.LegacyError))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, GOOD.stat().st_size - 1))
def test_a_truncated_copy_is_refused(n):
    got = _read(GOOD.read_bytes()[:n])
    assert isinstance(got, LF.LegacyFileError)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, GOOD.stat().st_size - 1))
def test_a_damaged_byte_is_refused_or_changes_nothing(at):
    """One byte flipped anywhere in the archive: refused in one line, or read as exactly
    the original (a byte no reader uses), never plausible wrong ticks."""
    want = torch.load(GOOD, weights_only=True)
    got = _read(_flip(GOOD.read_bytes(), at))
    if isinstance(got, LF.LegacyFile):
        assert got.stages == tuple(want["stages"]) and np.array_equal(got.ticks, want["ticks"].numpy()), at
