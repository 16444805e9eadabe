"""Issue 48, 1: every command and option × every kind of source the docs tell users to
make. The commands and their options are read from the parser itself
(``timeline.cli.parser.build_parser``): a new command or option joins the matrix by
itself (a new option that takes a value needs its value in ``VALUES``, else its cell
fails saying so). The sources are made once per session as the docs make them:

- ``file``: a trace file (``timeline synth -o t.arrow --profile glm5 ...``);
- ``headed``: a run of SYNTHETIC appends with slot headers (``timeline synth -o RUN/ --steps``);
- ``stepped``: a headerless run keyed by ``run add ... --step S`` (two files, two appends);
- ``appends``: several SYNTHETIC appends without headers (``run add RX A.arrow B.arrow``);
- ``h100``: the bundled real H100 run (``traces/h100_graph_run``, a copy);
- ``legacy``: the bundled GLM-5 files imported (``timeline import-legacy ... -o run.arrow``);
- ``damaged``: a run whose second append's parts lost bytes;
- ``duplicate``: a run given the same capture twice (the second refused).

Each cell: exit 0 with output that parses (``--json`` and ``mcp --call`` as JSON, every
file written non-empty, a Chrome export as JSON) and no error inside, or exit 2 with one
line on stderr; never a traceback. Where the source is sound the cell must answer (exit
0; the gate's 1 and 3 are answers) unless ``REFUSED`` says why refusing is right; a
damaged source must be refused naming the damage, or read past with ``--skip-damaged``.
Whole-run reads (export, ``summary --union/--idle/--legacy``, attach) therefore answer on
every multi-append kind. ``KNOWN``: cells that fail today, each with its issue item,
``xfail(strict=True)`` so that a fix makes the cell fail until its entry is removed."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import shutil
import traceback
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
SOURCES = ("file", "headed", "stepped", "appends", "h100", "legacy", "damaged", "duplicate")
MULTI = ("headed", "stepped", "appends", "h100")  # several appends: whole-run reads must answer
RUNS = ("headed", "stepped", "appends", "h100", "damaged", "duplicate")
FILES = ("file", "legacy")
SYNTH = ["--profile", "glm5", "--ranks", "2", "--grid", "64"]


# -- the surface, from the parser ------------------------------------------------------------
def commands(parser=None, prefix=()) -> dict:
    """``{("summary",): subparser, ("run", "add"): ..., ...}``: every subcommand the
    parser has (nested ones by their full path)."""
    parser = parser or build_parser()
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                inner = commands(sub, prefix + (name,))
                out.update(inner or {prefix + (name,): sub})
    return out


def options(sub) -> list:
    """The optional arguments of one subcommand (its longest spelling), but --help and
    --quiet (every command's; the matrix passes neither)."""
    return [a for a in sub._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
            and a.dest != "quiet"]


def positionals(sub) -> list:
    return [a for a in sub._actions if not a.option_strings]


SURFACE = commands()
SOURCELESS = {("synth",)}  # takes no source: its options alone


# -- what each option is given ---------------------------------------------------------------
def _out(ext):
    return lambda c: [str(c.tmp / f"out{ext}")]


OUTPUT_EXT = {("convert",): ".arrow", ("set-graph",): ".arrow", ("merge",): ".arrow", ("import-legacy",): ".arrow",
              ("synth",): ".arrow", ("edges",): ".parquet", ("attach",): ".pftrace"}

VALUES = {  # option -> argv after it, from the cell's context ``c`` (``Cell``)
    "--launch": lambda c: [c.fact("key")], "--baseline-launch": lambda c: [c.fact("key")],
    "--step": lambda c: [c.fact("step")], "--baseline-step": lambda c: [c.fact("step")],
    "--layer": lambda c: ["0"], "--baseline-layer": lambda c: ["0"], "--rank": lambda c: ["0"],
    "--stage": lambda c: [c.fact("stage")], "--align": lambda c: [c.fact("stage")],
    "--scale": lambda c: [f"{c.fact('stage')}.compute=0.8"], "--add": lambda c: [f"{c.fact('stage')}.compute=1000"],
    "--chrome": lambda c: [str(c.tmp / "out.json")], "--perfetto": lambda c: [str(c.tmp / "out.pftrace")],
    "--worst": lambda c: ["2"], "--slowest": lambda c: ["2"], "--top": lambda c: ["2"], "--across": lambda c: ["2"],
    "--scope": lambda c: ["trace"], "--fail-over": lambda c: ["5%"], "--confidence": lambda c: ["90%"],
    "--engine": lambda c: ["dask"], "--workers": lambda c: ["1"], "--scheduler": lambda c: ["tcp://127.0.0.1:9"],
    "--baseline": lambda c: [c.path], "--preset": lambda c: [c.fact("preset")],
    "--graph": lambda c: [c.file("graph.json", "{}")],
    "--edges": lambda c: [c.file("edges.csv", "stage,task,producer_stage,producer_task\n")],
    "--kernel": lambda c: [c.fact("kernel")], "--device": lambda c: ["0"], "--step-offset": lambda c: ["0"],
    "--host-clock": lambda c: ["0:1000"], "--spec": lambda c: [str(c.spec)], "--window-gap-ms": lambda c: ["50"],
    "--grid": lambda c: ["64"], "--profile": lambda c: ["glm5-indexed" if c.cmd == ("import-legacy",) else "glm5"],
    "--base-order": lambda c: [c.fact("stage")], "--stages": lambda c: [f"{c.fact('stage')}:4"],
    "--capture": lambda c: ["named"], "--layers-per-step": lambda c: ["2"],
    "--ranks": lambda c: ["2"], "--waves": lambda c: ["2"], "--launches": lambda c: ["2"], "--steps": lambda c: ["2"],
    "--seed": lambda c: ["1"], "--jitter-seed": lambda c: ["1"], "--inject": lambda c: ["0:down:*:compute:+1000"],
    "--root": lambda c: [str(Path(c.path).parent)], "--max-rows": lambda c: ["10"], "--sql-seconds": lambda c: ["5"],
    "--call": lambda c: ["launches", json.dumps({"source": c.path, "slowest": 2})],
    "--change": lambda c: ["1:0:o:*:compute:+3%"], "--drift": lambda c: ["1:0:o:*:compute:+3%"],
    "--slow-unit": lambda c: ["xcd3:+12%"], "--as-capture": lambda c: ["again"], "--jobs": lambda c: ["2"],
}
WITH = {  # an option that means something only beside another: the other given too
    ("explain", "--baseline-launch"): ["--baseline", "{path}"],
    ("explain", "--baseline-step"): ["--baseline", "{path}"],
    ("explain", "--baseline-layer"): ["--baseline", "{path}"], ("compare", "--stage"): ["--fail-over", "5%"],
    ("summary", "--workers"): ["--engine", "dask"], ("edges", "--workers"): ["--engine", "dask"],
    ("whatif", "--workers"): ["--engine", "dask"], ("run add", "--layers-per-step"): ["--step", "0"],
    ("synth", "--change"): ["--steps", "2"], ("synth", "--drift"): ["--steps", "2"],
}
BASE = {  # what a command needs to run at all (its required options and the like)
    ("set-graph",): ["--preset", "{preset}"], ("whatif",): ["--scale", "{stage}.compute=0.8"],
    ("mcp",): ["--call", "list_sources", "{{}}"], ("export",): ["--chrome", "{tmp}/base.json"],
}
BASE_SKIP = {("set-graph",): ("--preset", "--graph"), ("export",): ("--chrome", "--perfetto"), ("mcp",): ("--call",)}
DASK_SOURCES = ("file", "headed")  # a LocalCluster per cell costs seconds: the headed run stands for the runs


# -- the sources, made once ------------------------------------------------------------------
def cli(argv) -> tuple:
    """``(exit status, stdout, stderr, traceback or None)`` of ``timeline argv`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    tb = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except BaseException:  # noqa: BLE001 - an escaped exception is the finding
            rc, tb = None, traceback.format_exc()
    return rc, out.getvalue(), err.getvalue(), tb


def made(argv) -> str:
    rc, out, err, tb = cli(argv)
    assert rc == 0 and tb is None, f"making a source: timeline {' '.join(map(str, argv))}: {err}{tb or ''}"
    return out


def _damage(run: Path) -> None:
    """Flip bytes in the middle of every part of the run's last append (by name order)."""
    for table in ("tasks", "stages", "launches", "anomalies"):
        parts = sorted((run / table).glob("part-*"))
        if parts:
            p = parts[-1]
            data = bytearray(p.read_bytes())
            mid = len(data) // 2
            data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
            p.write_bytes(bytes(data))


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict:
    """``{kind: path}``: each kind of source in its own folder (``mcp --root`` serves
    that folder), plus ``"_a"``: the trace file the runs are made of."""
    d = tmp_path_factory.mktemp("matrix")
    for k in SOURCES:
        (d / k).mkdir()
    a, b = d / "a.arrow", d / "b.arrow"
    made(["synth", "-o", a, *SYNTH, "--launches", "4", "-q"])
    made(["synth", "-o", b, *SYNTH, "--launches", "4", "--jitter-seed", "5", "-q"])
    shutil.copy(a, d / "file" / "t.arrow")
    made(["synth", "-o", f"{d / 'headed' / 'RH'}/", *SYNTH, "--steps", "3", "--launches", "4", "-q"])
    made(["run", "add", d / "stepped" / "RS", a, "--step", "0", "-q"])
    made(["run", "add", d / "stepped" / "RS", b, "--step", "1", "-q"])
    made(["run", "add", d / "appends" / "RX", a, b, "-q"])
    shutil.copytree(TRACES / "h100_graph_run", d / "h100" / "H1")
    made(["import-legacy", *sorted(TRACES.glob("glm5_legacy_synthetic/w8a8-s1/rank*/trace.pt")), "-o",
          d / "legacy" / "run.arrow", "-q"])
    shutil.copytree(d / "headed" / "RH", d / "damaged" / "RZ")
    _damage(d / "damaged" / "RZ")
    made(["run", "add", d / "duplicate" / "RD", a, "-q"])
    again = cli(["run", "add", d / "duplicate" / "RD", a, "-q"])  # refused (one line); today accepted: KNOWN
    paths = {"file": d / "file" / "t.arrow", "headed": d / "headed" / "RH", "stepped": d / "stepped" / "RS",
             "appends": d / "appends" / "RX", "h100": d / "h100" / "H1", "legacy": d / "legacy" / "run.arrow",
             "damaged": d / "damaged" / "RZ", "duplicate": d / "duplicate" / "RD"}
    return {**{k: str(v) for k, v in paths.items()}, "_a": str(a), "_dir": d, "_again": again}


FACTS: dict = {}
TWIN = {"damaged": "headed", "duplicate": "appends"}  # whose facts a source's cells take


def facts(kind: str, sources: dict) -> dict:
    """What a cell's values are made of, read once per source: its first launch key and
    step, a stage, its kernel's name and task-graph preset (the damaged run's from its
    sound twin, so that every option reaches the damage; the duplicate's from the run of
    its capture and another)."""
    if kind not in FACTS:
        from timeline.query.source import open_source

        path = sources[TWIN.get(kind, kind)]
        src = open_source(path)
        keys = [str(k) for k in src.select().keys]
        steps = [s for s in src.times().column("step").to_pylist() if s is not None]
        stages = src.stage_names()
        FACTS[kind] = {"key": keys[0], "step": str(steps[0] if steps else 0), "stage": stages[-1],
                       "kernel": src.spec().kernel, "preset": "glm5" if "down" in stages else "triton-ffn"}
    return FACTS[kind]


class Cell:
    """One cell's context: the command, the option, the source kind and path, a folder of its own."""

    def __init__(self, cmd, opt, kind, sources, tmp):
        self.cmd, self.opt, self.kind, self.sources, self.tmp = cmd, opt, kind, sources, tmp
        self.path = sources.get(kind, "")
        self.spec = sources["_a"]

    def fact(self, name):
        return facts(self.kind or "file", self.sources)[name]

    def file(self, name, text):
        p = self.tmp / name
        p.write_text(text)
        return str(p)

    def fill(self, argv) -> list:
        return [a.format(path=self.path, tmp=self.tmp, **(facts(self.kind, self.sources) if self.kind else {}))
                for a in argv]


# -- a cell's command line --------------------------------------------------------------------
FRAMEWORKS: dict = {}


def frameworks(kind: str, sources: dict, tmp_root: Path) -> list:
    """The framework traces ``attach`` takes for a source: per rank, a Kineto JSON whose
    kernel events hold that rank's launches (``kinetokit.gpu_trace`` around a real torch
    profiler trace), made from the source as ``attach`` reads it (the damaged run's from
    its sound twin; the duplicate's from its one capture)."""
    if kind not in FRAMEWORKS:
        import kinetokit as KK

        from timeline.query.source import open_source

        base = FRAMEWORKS.get("_base")
        if base is None:
            base = FRAMEWORKS["_base"] = KK.torch_trace(tmp_root / "torch.json", marks=False)
        path = sources[{"damaged": "headed", "duplicate": "_a"}.get(kind, kind)]
        src = open_source(path)
        trace = src.trace(src.select())
        out = []
        for r in sorted(trace.ranks):
            f = tmp_root / f"{kind}.rank{r}.pt.trace.json"
            KK.gpu_trace(base, f, trace.filter(ranks=[r]), kernel=trace.spec.kernel)
            out.append(str(f))
        FRAMEWORKS[kind] = out
    return FRAMEWORKS[kind]


def argv_of(c: Cell) -> list:
    """The command line of a cell: the command, its positionals filled with the source
    (attach: also its framework traces; run add: a new run), what it needs to run at
    all, then the option with its value (and what it means something beside)."""
    sub = SURFACE[c.cmd]
    argv = list(c.cmd)
    for a in positionals(sub):
        if a.metavar == "FRAMEWORK":
            argv += frameworks(c.kind, c.sources, c.sources["_dir"])
        elif c.cmd == ("run", "add") and a.dest == "run":
            argv.append(f"{c.tmp / 'NEW'}/")
        else:
            argv.append(c.path)
    for a in sub._actions:  # required options
        if a.required and a.option_strings:
            argv += [a.option_strings[-1], *_value(c, a, OUTPUT_EXT)]
    if c.opt not in BASE_SKIP.get(c.cmd, ()):
        argv += c.fill(BASE.get(c.cmd, []))
    if c.opt:
        a = next(x for x in options(sub) if x.option_strings[-1] == c.opt)
        if not a.required:
            argv += [c.opt, *([] if a.nargs == 0 else _value(c, a, OUTPUT_EXT))]
        argv += c.fill(WITH.get((" ".join(c.cmd), c.opt), []))
    return argv


def _value(c: Cell, a, exts) -> list:
    o = a.option_strings[-1]
    if o == "--output":
        return [str(c.tmp / f"out{exts.get(c.cmd, '.arrow')}")]
    if o in VALUES:
        return VALUES[o](c)
    if a.choices:
        return [next(x for x in a.choices if x != a.default)]
    pytest.fail(f"timeline {' '.join(c.cmd)} {o}: the matrix has no value for it; add one to VALUES")


# -- what a cell must do ---------------------------------------------------------------------
def cells() -> list:
    """``(command, option or None, kind or None)`` for every cell."""
    out = []
    for cmd, sub in SURFACE.items():
        for opt in [None] + [a.option_strings[-1] for a in options(sub)]:
            if cmd in SOURCELESS:
                out.append((cmd, opt, None))
                continue
            kinds = DASK_SOURCES if opt in ("--engine", "--workers") else SOURCES
            out += [(cmd, opt, k) for k in kinds]
    return out


def _files_written(argv) -> list:
    """The output files a command line names (after -o / --output / --chrome / --perfetto;
    attach's --chrome of several ranks: OUT.rank<R>.json)."""
    out = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-o", "--output", "--chrome", "--perfetto")]
    fw = [a for a in argv if a.endswith(".pt.trace.json")]
    if argv[0] == "attach" and len(fw) > 1:
        out = [f"{f[:-5]}.rank{r}.json" if f.endswith(".json") else f for f in out for r in range(len(fw))]
    return out


def check_answer(argv, out, err) -> None:
    """Exit 0: output that parses, no error inside."""
    said = out + err
    assert "Traceback" not in said and "error:" not in said, said[-2000:]
    if "--json" in argv or "--call" in argv:
        doc = json.loads(out)
        assert not (isinstance(doc, dict) and doc.get("error")), out[:2000]
    for f in _files_written(argv):
        p = Path(f)
        if f.endswith("/"):
            assert p.is_dir() and any(p.iterdir()), f
            continue
        assert p.exists() and p.stat().st_size > 0, f"{f}: not written"
        if f.endswith(".json"):
            json.loads(p.read_text())
        elif f.endswith(".json.gz"):
            json.loads(gzip.decompress(p.read_bytes()))


def check_refusal(err) -> None:
    """Exit 2: one line on stderr, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, f"a refusal in {len(lines)} lines:\n{err[-3000:]}"


HEADERLESS = ("file", "appends", "legacy", "duplicate")  # no slot headers: --step / --layer name nothing
NO_HEADERS = "carry no slot headers"
REFUSED = {  # (command, option or "" or "*", kind or "*") -> the refusal is right: fragments of its line (any)
    **{(" ".join(c), o, k): NO_HEADERS for c, sub in SURFACE.items() if "--launch" in {a.option_strings[-1] for a in
       options(sub)} for o in ("--step", "--layer") for k in HEADERLESS},  # the selection options' --step / --layer
    **{("explain", o, k): NO_HEADERS for o in ("--baseline-step", "--baseline-layer") for k in HEADERLESS},
    **{("*", "--skip-damaged", k): "is a trace file: leave it out" for k in FILES},  # CLI.md: refused, not ignored
    **{("*", o, k): "map over a run's launches" for o in ("--engine", "--scheduler", "--workers") for k in FILES},
    ("*", "--scheduler", "*"): "give --engine dask too",
    ("convert", "*", "*"): ("stamp buffer", "not a whole number of int64 words"),  # a source is not a raw buffer
    ("import-legacy", "*", "*"): ("is not a file", "is a timeline arrow trace file already"),
    **{(c, "*", k): "is a directory, not a trace file" for c in ("set-graph", "merge") for k in RUNS},  # TRACE only
    **{("run add", "*", k): "does not exist or is not a file" for k in RUNS},  # a run is no input of a run
    **{("run add", "--legacy", k): "not a torch file" for k in FILES},
    **{("run info", "*", k): "is not a directory" for k in FILES},
    **{("compare", "--scope", k): "a run compares as a typical launch" for k in RUNS},
    **{("changes", "*", k): "no launch carries a slot header" for k in HEADERLESS},  # change points are over steps
    ("edges", "*", "legacy"): "declares no task graph", ("whatif", "*", "legacy"): "declares no task graph",
    ("attach", "--skip-damaged", "damaged"): "instrumented launches but",  # the damaged append's launches left out
    **{("attach", "--rank", k): "give one framework trace per rank" for k in SOURCES if k != "h100"},  # two ranks
    **{("attach", o, k): "instrumented launches but" for o in ("--launch", "--step", "--layer") for k in SOURCES
       if k != "legacy" and (o == "--launch" or k not in HEADERLESS)},  # every kernel framed (legacy: 1 launch)
}
STDOUT_REFUSALS = {("mcp",), ("run", "info")}  # exit 2 saying why on stdout: mcp --call's error document, the damage


def known(why, cmd, opts, kinds) -> list:
    return [((cmd, o, k), why) for o in opts for k in kinds]


KNOWN = dict([  # (command, option or "", kind) -> why the cell fails today; the lead empties it as fixes merge
])


def expected(cmd, opt, kind):
    """("answer" | "refuse", fragments of the refusal, any of them, or None) for a cell."""
    c = " ".join(cmd)
    found = [REFUSED[key] for key in [(x, o, k) for k in (kind, "*") for x in (c, "*") for o in (opt or "", "*")]
             if key in REFUSED]
    if kind == "damaged" and opt != "--skip-damaged" and not (cmd == ("mcp",) and opt != "--call"):
        found.append("damaged")  # (mcp list_sources lists what it can read, naming what it skipped)
    if not found:
        return "answer", None
    return "refuse", tuple(f for x in found for f in ((x,) if isinstance(x, str) else x))


def _param(cell):
    cmd, opt, kind = cell
    cid = f"{' '.join(cmd)}|{opt or '-'}|{kind or '-'}"
    why = KNOWN.get((" ".join(cmd), opt or "", kind))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(cmd, opt, kind, id=cid, marks=marks)


@pytest.mark.parametrize("cmd,opt,kind", [_param(x) for x in cells()])
def test_cell(cmd, opt, kind, sources, tmp_path):
    c = Cell(cmd, opt, kind, sources, tmp_path)
    argv = argv_of(c)
    rc, out, err, tb = cli(argv)
    line = f"timeline {' '.join(argv)}"
    assert tb is None, f"{line}: a traceback\n{tb}"
    assert rc in (0, 2) or (rc in (1, 3) and cmd == ("compare",) and "--fail-over" in argv), f"{line}: exit {rc}"
    why = err
    if rc == 2 and cmd in STDOUT_REFUSALS and not err.strip():
        why = out
        assert out.strip(), f"{line}: exit 2 saying nothing"
    elif rc == 2:
        check_refusal(err)
    else:
        check_answer(argv, out, err)
    want, fragments = expected(cmd, opt, kind)
    if want == "answer":
        assert rc != 2, f"{line}: refused where it should answer: {why.strip()}"
    else:
        assert rc == 2, f"{line}: answered (exit {rc}) where it should refuse ({fragments})"
        assert any(f in why for f in fragments), f"{line}: refused for another reason than {fragments}: {why.strip()}"



def test_the_refused_duplicate_left_the_run_as_its_one_capture(sources, tmp_path):
    """``run add RD A.arrow`` twice: the second refused in one line, and the run reads as
    a run of A alone (it was accepted: every launch twice, ``ranks 8`` of a 4-rank trace)."""
    rc, _, err, tb = sources["_again"]
    assert tb is None and rc == 2 and len(err.strip().splitlines()) == 1, err
    made(["run", "add", tmp_path / "R1", sources["_a"], "-q"])
    got = json.loads(cli(["launches", sources["duplicate"], "--json"])[1])
    want = json.loads(cli(["launches", tmp_path / "R1", "--json"])[1])
    assert [(r["launch"], r["ranks"], r["kernel_us"]) for r in got["rows"]] == \
        [(r["launch"], r["ranks"], r["kernel_us"]) for r in want["rows"]]


def test_the_matrix_reaches_every_command_and_kind():
    """The parser's every command is in the matrix, each sound multi-append kind's
    whole-run reads among its cells, and no KNOWN or REFUSED entry names a command,
    option or kind the parser or the sources do not have (a stale entry)."""
    got = cells()
    assert {c for c, _, _ in got} == set(SURFACE) and len(SURFACE) >= 17
    for k in MULTI:
        for cmd, opt in ((("export",), "--chrome"), (("summary",), "--union"), (("summary",), "--idle"),
                         (("summary",), "--legacy"), (("attach",), None)):
            assert (cmd, opt, k) in got
    names = {" ".join(c): {a.option_strings[-1] for a in options(s)} | {"", "*"} for c, s in SURFACE.items()}
    for c, o, k in list(KNOWN) + list(REFUSED):
        assert c == "*" or o in names[c], (c, o)
        assert k in SOURCES + ("*",), k
