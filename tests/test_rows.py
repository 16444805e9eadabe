"""timeline.core.rows' Arrow <-> numpy conversions (no pyarrow conversion, so no pandas
import) agree with pyarrow's own, and the commands' hot paths never import pandas."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.core import rows as R

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.float64(), pa.bool_()]


def _values(t, n, rng):
    if t == pa.bool_():
        return rng.random(n) < 0.5
    dt = R.np_dtype(t)
    if dt.kind == "f":
        return rng.normal(size=n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TYPES), st.lists(st.integers(0, 40), min_size=0, max_size=4), st.integers(0, 7),
       st.integers(0, 2**32 - 1))
def test_numpy_equals_pyarrow_to_numpy(t, sizes, cut, seed):
    """Chunked, sliced (offset into a bit-packed buffer too), empty: the same values."""
    rng = np.random.default_rng(seed)
    chunks = [R.arrow(_values(t, n, rng)) for n in sizes]
    col = pa.chunked_array(chunks, t)
    got = R.numpy(col)
    assert got.dtype == (np.bool_ if t == pa.bool_() else R.np_dtype(t))
    assert np.array_equal(got, col.to_numpy())
    if chunks and len(chunks[0]) > cut:
        part = chunks[0].slice(cut)
        assert np.array_equal(R.numpy(part), part.to_numpy(zero_copy_only=False))


def test_numpy_nulls():
    """Float nulls read as NaN; an int column with nulls goes through pyarrow (float, NaN)."""
    assert np.array_equal(R.numpy(pa.array([1.5, None])), [1.5, np.nan], equal_nan=True)
    assert np.array_equal(R.numpy(pa.array([1, None])), [1.0, np.nan], equal_nan=True)


def test_filled_and_from_python():
    col = pa.chunked_array([pa.array([1, None, 3], pa.int32()), pa.array([None], pa.int32())])
    f = R.filled(col, -7)
    assert f.type == pa.int32() and f.to_pylist() == [1, -7, 3, -7]
    assert R.filled(pa.array([1, 2]), 0).to_pylist() == [1, 2]
    assert R.from_python(["ab", "", "ü"], pa.string()).to_pylist() == ["ab", "", "ü"]
    a = R.from_python((3, -1), pa.int16())
    assert a.type == pa.int16() and a.to_pylist() == [3, -1]


def test_collect_load_info_import_no_pandas(tmp_path):
    """A process that collects a buffer, saves and loads the trace, and runs
    ``timeline info`` never imports pandas (a fifth of a second of a short command)."""
    code = (
        "import sys\n"
        "from timeline import collect, load\n"
        "from timeline.ingest import synth\n"
        "from timeline.cli.info_commands import info_dict\n"
        "from pathlib import Path\n"
        "(sp, buf), = synth.synth_buffers(synth.glm5_spec(waves=2, launches=2), grid=64, seed=3)\n"
        f"p = Path({str(tmp_path / 't.arrow')!r})\n"
        "collect(buf, sp).save(p)\n"
        "info_dict(load(p), p)\n"
        "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_verdict_commands_on_runs_import_no_pandas(tmp_path):
    """The gate, compare and A/B explain on two runs (the answers CI waits for) never
    import pandas: ``pa.array``/``pa.scalar`` of Python or numpy values and
    ``pc.fill_null`` with a Python value do (a fifth of a second, and more on a loaded host)."""
    runs = []
    for name, inject in (("A", []), ("B", ["--inject", "1:o:*:compute:+3000"])):
        d = tmp_path / name
        subprocess.run([sys.executable, "-m", "timeline", "synth", "--steps", "4", "--ranks", "2", "--launches", "2",
                        "--grid", "32", "--seed", "7", *inject, "-o", f"{d}/"], check=True, capture_output=True)
        runs.append(str(d))
    a, b = runs
    code = ("import sys\nfrom timeline.cli.parser import main\n"
            f"for argv in ({['compare', a, b, '--fail-over', '2%']!r}, {['compare', a, b, '--json']!r},\n"
            f"             {['explain', b, '--baseline', a, '--json']!r}):\n"
            "    main(argv)\n"
            "print('pandas' in sys.modules, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stderr.strip().splitlines()[-1] == "False", out.stderr[-2000:]
