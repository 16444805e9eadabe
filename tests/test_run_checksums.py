"""A run part's checksums (docs/FORMAT.md §run): every part written now carries its
CRC-32 and its blake2b; a read checks the CRC-32 (blake2b where an older part has no
CRC-32); ``run info --verify`` checks both."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import runkit
from timeline.run import RunError, append, open_run
from timeline.run import layout as RL

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    append(run_dir, runkit.run_trace([(0, 0), (0, 1)]), capture="a")
    return run_dir


def _records(run_dir: Path) -> list:
    return sorted((run_dir / RL.MANIFEST_DIR).glob("*.json"))


def _edit_entries(run_dir: Path, edit) -> None:
    """Rewrite every manifest record's part entries by ``edit`` (a test's stand-in for a
    run written by another release: a run's records are otherwise never rewritten)."""
    for p in _records(run_dir):
        rec = {k: v for k, v in json.loads(p.read_text()).items() if k != RL.SEAL}
        other = p.parent.parent / p.name  # sealed anew beside the run, then put in its place
        RL.write_json(other, {**rec, "parts": [edit(dict(e)) for e in rec["parts"]]})
        other.replace(p)


def _info_verify(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "timeline", "run", "info", str(run_dir), "--verify"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_every_part_carries_the_crc32_and_blake2b_of_its_bytes(tmp_path):
    run_dir = _run(tmp_path)
    entries = [e for p in _records(run_dir) for e in json.loads(p.read_text())["parts"]]
    assert entries and {"tasks", "launches", "stages"} <= {e["table"] for e in entries}
    for e in entries:
        data = (run_dir / e["path"]).read_bytes()
        assert e[RL.PART_CRC] == f"{zlib.crc32(data):08x}"
        assert e[RL.HASH] == hashlib.blake2b(data, digest_size=16).hexdigest()
        assert e["bytes"] == len(data)


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("written", ["now", "before crc32"])
def test_a_flipped_bit_is_refused_by_a_read_whichever_checksums_the_part_has(tmp_path, written):
    run_dir = _run(tmp_path)
    if written == "before crc32":
        _edit_entries(run_dir, lambda e: {k: v for k, v in e.items() if k != RL.PART_CRC})
    assert open_run(run_dir).launch(0, 1).tasks.num_rows > 0  # whole: it reads
    part = next((run_dir / "tasks" / "rank=1" / "step=0").glob("part-*.parquet"))
    _flip_a_bit(part)
    with pytest.raises(RunError, match=rf"part tasks/rank=1/step=0/{part.name} is refused: its checksum"):
        open_run(run_dir).launch(0, 1)


def test_run_info_verify_checks_the_blake2b_a_read_does_not(tmp_path):
    run_dir = _run(tmp_path)
    assert _info_verify(run_dir).returncode == 0
    wrong = "0" * 32
    _edit_entries(run_dir, lambda e: {**e, RL.HASH: wrong} if e["table"] == "tasks" and e["rank"] == 1 else e)
    assert open_run(run_dir).launch(0, 1).tasks.num_rows > 0  # the CRC-32 a read checks still agrees
    r = _info_verify(run_dir)
    assert r.returncode == 2, r.stdout + r.stderr
    damaged = [ln for ln in r.stdout.splitlines() if "checksum does not match" in ln]
    assert len(damaged) == 1 and "tasks/rank=1/step=0/" in damaged[0], r.stdout
