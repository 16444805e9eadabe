"""Every option of the ``timeline`` command checked (issue 39, 8): each numeric option of
every subcommand, given a negative, zero (where zero is not allowed), huge, NaN or
non-number value, exits 2 with one line on stderr, before any file is read; a selection
that names nothing in a trace file or a run exits 2 listing what there is; ``--arch``
takes only known targets."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.cli import main
from timeline.cli import parser as CP


def _subparsers(ap: argparse.ArgumentParser, prefix=()):
    """``(argv prefix, parser)`` of every (sub)command."""
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield (*prefix, name), sub
                yield from _subparsers(sub, (*prefix, name))


def _numeric_options():
    """``(argv prefix, option, action)`` of every option whose value is a number or a list of them."""
    out = []
    for argv, sub in _subparsers(CP.build_parser()):
        for a in sub._actions:
            if a.option_strings and a.type is not None and getattr(a.type, "__name__", "") in (
                    "integer", "number", "int_list", "launch_keys"):
                out.append((argv, a.option_strings[-1], a))
    return out


OPTIONS = _numeric_options()
BAD = ["-1", "-5", "1e400", str(10 ** 30), "nan", "NaN", "inf", "x", "", "1.5.2", "--", "0x10"]


def _positionals(sub) -> list:
    """Placeholder values for a subcommand's positional arguments (never read: the bad
    option fails first)."""
    out = []
    for a in sub._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.dest != "help":
            out += ["never-read.arrow"] * (2 if a.nargs in ("+", 2) else 1)
    return out


def test_every_subcommand_has_its_numeric_options_checked():
    names = {(" ".join(argv), opt) for argv, opt, _ in OPTIONS}
    for want in [("launches", "--slowest"), ("summary", "--worst"), ("explain", "--top"), ("synth", "--ranks"),
                 ("synth", "--steps"), ("convert", "--window-gap-ms"), ("summary", "--launch"),
                 ("summary", "--workers"), ("run add", "--grid"), ("export", "--rank")]:
        assert want in names, want


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(OPTIONS), st.sampled_from(BAD))
def test_a_bad_numeric_value_is_one_line_and_exit_2(option, bad):
    import contextlib
    import io

    argv, opt, action = option
    sub = dict(_subparsers(CP.build_parser()))[argv]
    if action.type.__name__ in ("int_list", "launch_keys") and bad in ("1e400",):
        bad = "1e400x"
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
        rc = main([*argv, *_positionals(sub), f"{opt}={bad}"])
    err = buf.getvalue()
    assert rc == 2, (argv, opt, bad)
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv,opt", [(("launches",), "--slowest"), (("summary",), "--worst"), (("explain",), "--top"),
                                      (("synth",), "--ranks"), (("synth",), "--launches"), (("synth",), "--grid")])
def test_zero_where_at_least_one_is_needed(capsys, argv, opt):
    sub = dict(_subparsers(CP.build_parser()))[argv]
    assert main([*argv, *_positionals(sub), opt, "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of range" in err


def test_arch_takes_only_known_targets(tmp_path, capsys):
    assert main(["synth", "-o", str(tmp_path / "t.arrow"), "--arch", "sm_999"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sm_999'" in err and err.count("\n") == 1
    assert not (tmp_path / "t.arrow").exists()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A trace file with slot headers, a run made of it, and a run without headers."""
    from timeline.ingest import synth_graph as SG
    from timeline.run import write as RW

    d = tmp_path_factory.mktemp("src")
    spec = SG.graph_spec(*SG.profiles()["triton-ffn"], world=2, launches=4)
    headed = SG.graph_trace(spec, seed=1, slots=[(s, la) for s in range(2) for la in range(2)])
    headed.save(d / "h.arrow")
    RW.append(d / "run", headed, capture="h.arrow")
    RW.append(d / "bare", SG.graph_trace(spec, seed=1), capture="b.arrow")
    return d


@pytest.mark.parametrize("src", ["h.arrow", "run"])
@pytest.mark.parametrize("cmd", ["launches", "summary", "explain", "edges", "whatif", "export"])
@pytest.mark.parametrize("opt,bad,says", [("--step", "99", "its steps are [0, 1]"),
                                          ("--layer", "7", "its layers are [0, 1]"),
                                          ("--launch", "9:9", "its launches: 0:0, 0:1, 1:0, 1:1"),
                                          ("--rank", "5", "its ranks are [0, 1]")])
def test_a_selection_that_names_nothing_lists_what_there_is(sources, capsys, src, cmd, opt, bad, says):
    more = {"whatif": ["--scale", "norm=0.5"], "export": ["--chrome", str(sources / "x.json")]}.get(cmd, [])
    assert main([cmd, str(sources / src), opt, bad, *more]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_step_on_a_run_without_slot_headers_says_how_to_name_its_launches(sources, capsys):
    assert main(["summary", str(sources / "bare"), "--step", "0"]) == 2
    err = capsys.readouterr().err
    assert "carry no slot headers" in err and "--launch" in err and "b.arrow:0" in err


def test_engine_options_on_a_trace_file_are_refused_not_ignored(sources, capsys):
    for argv in (["--engine", "dask"], ["--skip-damaged"], ["--workers", "3"]):
        assert main(["summary", str(sources / "h.arrow"), "--critical-path", *argv]) == 2
        err = capsys.readouterr().err
        assert "trace file" in err and err.count("\n") == 1
