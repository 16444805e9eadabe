"""The dashboard's command line (``viewer.app``) and trace sources (``viewer.sources``):
bad input is a one-line message, files outside the trace directory are refused."""

from __future__ import annotations

import pytest

from viewer import app as V
from viewer import figures as F
from viewer.sources import Catalog, SourceError
from viewerkit import make_trace_dir


# -- sources ------------------------------------------------------------------------------------------
def test_catalog_refuses_files_outside_the_trace_dir(tmp_path):
    d, secret = make_trace_dir(tmp_path)  # its own: the test adds a link
    cat = Catalog(d)
    assert cat.resolve("small.arrow") == (d / "small.arrow").resolve()
    link = d / "link.arrow"
    if not link.exists():
        link.symlink_to(secret)
    try:
        for bad, why in [("../outside/secret.arrow", "outside the trace directory"),
                         (str(secret), "outside the trace directory"),
                         ("link.arrow", "leads outside"),
                         ("nope.arrow", "no trace 'nope.arrow'"),
                         ("", "no trace name")]:
            with pytest.raises(SourceError, match=why):
                cat.resolve(bad)
        assert "secret.arrow" not in cat.names()
    finally:
        link.unlink()
    assert Catalog(d, [secret]).resolve("secret.arrow") == secret.resolve()  # named on the command line


# -- command line --------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["missing.arrow"], "trace file 'missing.arrow' does not exist"),
    (["{d}/corrupt.arrow"], "could not be read as a trace"),
    (["{d}/plain.parquet"], "not a mono-timeline trace"),
    (["--trace-dir", "{d}/nowhere"], "is not a directory"),
    (["--trace-dir", "{empty}"], "no trace given and none in"),
    (["--gl-limit", "-1"], "-1 is negative: give a count, 0 or more"),
    (["--gl-limit", "many"], "'many' is not a whole number"),
])
def test_cli_bad_input(trace_dir, tmp_path, capsys, args, message):
    d, _ = trace_dir
    args = [a.format(d=d, empty=tmp_path) for a in args]
    with pytest.raises(SystemExit) as ex:
        V.prepare(args)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_defaults(trace_dir, tmp_path, monkeypatch):
    d, _ = trace_dir
    _, args = V.parse_args([])
    assert args.host == "127.0.0.1" and args.port == 8050 and not args.debug
    assert args.trace_dir == V.DEFAULT_TRACE_DIR
    assert V.default_trace(d) == "anomalies.arrow"  # first trace file while the bundled one is absent
    (tmp_path / V.DEFAULT_TRACE).write_bytes((d / "small.arrow").read_bytes())
    (tmp_path / "aaa.arrow").write_bytes((d / "small.arrow").read_bytes())
    assert V.default_trace(tmp_path) == V.DEFAULT_TRACE
    state, _, first = V.prepare(["--trace-dir", str(tmp_path)])
    assert first == V.DEFAULT_TRACE and state.requested("") == V.DEFAULT_TRACE
    assert args.gl_limit == state.gl_limit == F.GL_LIMIT  # WebGL bars up to 4,000, one image beyond
    assert V.prepare(["--trace-dir", str(tmp_path), "--gl-limit", "0"])[0].gl_limit == 0


def test_no_argument_where_there_is_no_traces_directory_says_what_to_give(tmp_path, monkeypatch, capsys):
    """``timeline-view`` alone, from an installed wheel started where there is no
    ``./traces``: one line saying what to give, not a complaint about a flag the user
    never gave; ``--trace-dir`` given and missing still names the flag."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ex:
        V.prepare([])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ex.value.code == 2 and "--trace-dir 'traces'" not in err
    assert "no trace named and no ./traces directory here" in err and "timeline-view TRACE.arrow | RUN" in err
    with pytest.raises(SystemExit):
        V.prepare(["--trace-dir", "traces"])
    assert "--trace-dir 'traces' is not a directory" in capsys.readouterr().err


def test_main_serves_on_localhost_without_debug(trace_dir, monkeypatch, capsys):
    d, _ = trace_dir
    seen = {}
    monkeypatch.setattr("dash.Dash.run", lambda self, **kw: seen.update(kw))
    assert V.main([str(d / "small.arrow"), "--port", "8123"]) == 0
    assert seen == {"host": "127.0.0.1", "port": 8123, "debug": False}
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out


def test_main_compresses_beyond_loopback(trace_dir, monkeypatch, capsys):
    import importlib.util

    d, _ = trace_dir
    seen = {}
    monkeypatch.setattr("dash.Dash.run", lambda self, **kw: seen.update(kw, compress=self.config.compress))
    assert V.main([str(d / "small.arrow"), "--port", "8123"]) == 0
    assert seen["compress"] is False  # loopback: compressing costs more than it saves
    assert V.main([str(d / "small.arrow"), "--port", "8123", "--host", "0.0.0.0"]) == 0
    if importlib.util.find_spec("flask_compress") is None:
        assert seen["compress"] is False and "pip install flask-compress" in capsys.readouterr().err
    else:
        assert seen["compress"] is True
