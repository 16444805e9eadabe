"""Issue 48, 5: every fenced ``timeline …`` / ``timeline-view …`` command of README.md and
docs/*.md runs exactly as printed.

Each command line runs in a folder of its own holding ``traces/`` (the checkout's) and,
made on demand, the files it names that the docs leave to the reader (``run.arrow``,
``RUN``, ``r0.arrow``, ``step.pt.trace.json`` ...: ``PLACEHOLDERS``, each made the way
the docs say to make one, or from the bundled data). Where an earlier line of the same
block writes a file the line reads (``-o X``, ``run add X``, ``> X``), that line runs
first, in the same folder: a block's ``synth`` or ``import-legacy`` makes what the lines
after it read. ``timeline`` runs in this process (``timeline.cli.main``) and must exit 0
(the gate's PASS / FAIL / UNDECIDED: 0, 1, 3). The servers are checked without a port:
``timeline-view`` is prepared and built as the command does (``viewer.app.prepare`` /
``build``) and its page fetched through Flask's test client; ``timeline mcp`` without
``--call`` is started over stdio by the SDK's own client (``mcpkit.session``), its tools
listed, then stopped. ``EXCLUDED``: lines that cannot run here, each with its reason;
``KNOWN``: lines that fail today, in docs other helpers own right now (xfail strict).

Where an output block (a fence without a language) follows a command block, every number
it quotes must be among the numbers the block's commands print now (``QUOTED``: the
blocks whose outputs are real, not illustrative)."""

from __future__ import annotations

import contextlib
import glob
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

from timeline.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^\s*(timeline|timeline-view)(\s+(?![\w-]+: )|$)")  # not `timeline attach: error: ...`


# -- the commands of the docs ----------------------------------------------------------------
def fences(path: Path) -> list:
    """``[(first line number, language, [lines])]``: the fenced blocks of a Markdown file."""
    out, block, lang, start = [], None, "", 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            if block is None:
                block, lang, start = [], line.strip()[3:].strip(), i + 1
            else:
                out.append((start, lang, block))
                block = None
        elif block is not None:
            block.append(line)
    return out


def commands(lines: list, start: int) -> list:
    """``[(line number, command line)]``: the ``timeline`` / ``timeline-view`` lines of a
    block, a line ending in ``\\`` joined with the next."""
    out, i = [], 0
    while i < len(lines):
        n, line = start + i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        if COMMAND.match(line):
            out.append((n, line.strip()))
        i += 1
    return out


def blocks() -> list:
    """``[(doc name, first line, [(line number, command)])]``: every shell block with a command."""
    out = []
    for path in DOCS:
        for start, lang, lines in fences(path):
            if lang in ("", "sh", "bash", "console", "shell"):
                cmds = commands(lines, start)
                if cmds:
                    out.append((path.relative_to(ROOT).as_posix(), start, cmds))
    return out


def argv_of(line: str, cwd: Path) -> tuple:
    """``(argv, file stdout goes to or None)``: the line as a shell splits it (comments
    dropped, globs expanded in ``cwd``, ``> FILE`` taken as the redirection)."""
    words = shlex.split(line, comments=True)
    out = None
    if ">" in words:
        i = words.index(">")
        out, words = words[i + 1], words[:i]
    argv = []
    for w in words:
        hits = sorted(glob.glob(w, root_dir=cwd)) if any(ch in w for ch in "*?[") else []
        argv += hits or [w]
    return argv, out


def writes(argv: list) -> list:
    """The files and runs a command line writes (what a later line of its block may read)."""
    out = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-o", "--output", "--chrome", "--perfetto")]
    if argv[1:3] == ["run", "add"] and len(argv) > 3:
        out.append(argv[3])
    return [o.rstrip("/") for o in out]


# -- what the docs leave to the reader ---------------------------------------------------------
TRACES = ROOT / "traces"
SYNTH_RUN = ["--profile", "glm5", "--ranks", "2", "--grid", "64", "-q"]


def _cli(*argv) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main([str(a) for a in argv])
    assert rc == 0, f"making a placeholder: timeline {' '.join(map(str, argv))}: {err.getvalue()}"


def _copy(src):
    return lambda d, name: (shutil.copytree if Path(src).is_dir() else shutil.copy)(src, d / name)


def _raw(d, name):
    import numpy as np

    z = np.load(TRACES / "h200_raw_buffers.npz")
    if name == "spec.json":
        (d / name).write_text(str(z["lead_spec"]))
    else:
        np.asarray(z["lead"]).tofile(d / name)


def _synth_run(*extra):
    return lambda d, name: _cli("synth", "-o", f"{d / name}/", *SYNTH_RUN, *extra)


def _step41(d, name):
    """A rank's trace file of step 41 (slot headers 41:0..41:3), as a capture keeps it."""
    from timeline.ingest import synth_graph as SG

    spec = SG.graph_spec(*SG.profiles()["glm5"], world=2, launches=4)
    t = SG.graph_trace(spec, grid=64, seed=41, slots=[(41, la) for la in range(4)])
    t.filter(ranks=[int(name[len("step41_rank")])]).save(d / name)


def _ticks(path):
    """PORTING_GLM5.md's own line: ``numpy.save('ticks.npy', torch.load(...)['ticks'].numpy())``."""
    import numpy
    import torch

    numpy.save(path, torch.load(TRACES / "glm5_legacy_synthetic/w8a8-s1/rank0/trace.pt")["ticks"].numpy())


def _framework(d, name):
    """A PyTorch profiler trace around ``run.arrow`` (kernel ``my_kernel``; ``rank<R>.json``:
    around rank R of ``tp.arrow``, its spec's kernel name)."""
    import kinetokit as KK

    from timeline import load

    base = d / "_torch.json"
    if not base.exists():
        KK.torch_trace(base, marks=False)
    if name.startswith("rank"):
        make(d, "tp.arrow")
        tp = load(d / "tp.arrow")
        r = int(name[4])
        KK.gpu_trace(base, d / name, tp.filter(ranks=[r]), kernel=tp.spec.kernel)
    else:
        make(d, "run.arrow")
        KK.gpu_trace(base, d / name, load(d / "run.arrow"), kernel="my_kernel", gz=name.endswith(".gz"))


PLACEHOLDERS = {  # a name the docs leave to the reader -> how it is made here
    "run.arrow": _copy(TRACES / "h200_mono_demo.arrow"), "big.arrow": _copy(TRACES / "h200_mono_demo.arrow"),
    "other.parquet": _copy(TRACES / "h200_mono_warps.parquet"),
    "A": _copy(TRACES / "h200_whatif_delay0.arrow"), "B": _copy(TRACES / "h200_whatif_delay4000.arrow"),
    "before.arrow": _copy(TRACES / "h200_whatif_delay0.arrow"),
    "after.arrow": _copy(TRACES / "h200_whatif_delay4000.arrow"),
    "r0.arrow": _copy(TRACES / "h200_tp2_rank0.arrow"), "r1.arrow": _copy(TRACES / "h200_tp2_rank1.arrow"),
    "rank0": _copy(TRACES / "glm5_legacy_synthetic/w8a8-s1/rank0"),
    "rank1": _copy(TRACES / "glm5_legacy_synthetic/w8a8-s1/rank1"),
    "stamps.bin": _raw, "rank3.bin": _raw, "spec.json": _raw,
    "RUN": _synth_run("--steps", "4", "--launches", "64"), "RUN_A": _synth_run("--steps", "4", "--launches", "4"),
    "RUN_B": _synth_run("--steps", "4", "--launches", "4", "--inject", "1:down:*:compute:+5000"),
    "baseline_run": _synth_run("--steps", "4", "--launches", "4"),
    "candidate_run": _synth_run("--steps", "4", "--launches", "4", "--inject", "1:down:*:compute:+5000"),
    "s5.arrow": lambda d, name: _cli("synth", "-o", d / name, *SYNTH_RUN, "--launches", "4"),
    "step41_rank0.arrow": _step41, "step41_rank1.arrow": _step41,
    "tp.arrow": lambda d, name: (make(d, "r0.arrow"), make(d, "r1.arrow"),
                                 _cli("merge", d / "r0.arrow", d / "r1.arrow", "-o", d / name, "-q")),
    "step.pt.trace.json": _framework, "step.pt.trace.json.gz": _framework,
    "rank0.json": _framework, "rank1.json": _framework,
    "ticks.npy": lambda d, name: _ticks(d / name),
    "runs": lambda d, name: ((d / name).mkdir(), shutil.copy(TRACES / "h200_mono_demo.arrow", d / name)),
}
GLOBS = {"rank*/trace.pt": ["rank0", "rank1"], "r*.arrow": ["r0.arrow", "r1.arrow"],
         "step41_rank*.arrow": ["step41_rank0.arrow", "step41_rank1.arrow"],
         "step*_rank*.arrow": ["step41_rank0.arrow", "step41_rank1.arrow"]}


def make(d: Path, name: str) -> None:
    """Make the placeholder ``name`` in ``d`` unless it is there."""
    if not (d / name).exists():
        PLACEHOLDERS[name](d, name)


def needs(words: list) -> list:
    """The placeholders a command line's words name (``rank0/trace.pt``: ``rank0``)."""
    out = []
    for w in words:
        w = w.rstrip("/")
        for name in GLOBS.get(w, [w, w.split("/")[0]]):
            if name in PLACEHOLDERS and name not in out:
                out.append(name)
    return out


EXCLUDED = {  # a fragment of the line -> why it cannot run here exactly as printed
    "tcp://head:8786": "a running Dask cluster at head:8786 (the LocalCluster line beside it runs)",
    "--root /data/runs": "a folder of the reader's machine (tests/test_mcp.py serves a --root)",
    "r1.arrow ...": "`...` stands for the reader's further files (`run add RUN r0.arrow r1.arrow` is the same)",
    "report.sqlite": "an nsys export (tests/test_attach.py::test_nsys_sqlite_and_rocprof_csv attaches one)",
    "kernel_trace.csv": "a rocprofv3 kernel trace (tests/test_attach.py::test_nsys_sqlite_and_rocprof_csv)",
    "--plotly-js .cache/": "the plotly.js bundle `make demo` builds (tests/test_viewer_app.py serves one)",
}
KNOWN: dict = {}  # (doc, fragment of the line) -> why it fails today; the lead empties it as the fixes merge
INDEPENDENT = {("docs/RUN.md", 13)}  # independent examples: a line reads the placeholder, not an earlier line's run


# -- running a line ----------------------------------------------------------------------------
def _view(args: list) -> tuple:
    """``timeline-view ARGS`` prepared and built as the command does, its page fetched
    through Flask's test client (no port bound): ``(status, page bytes, stderr)``."""
    from viewer import app as VA

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            state, a, _ = VA.prepare(args)
        except SystemExit as e:
            return e.code, "", err.getvalue()
        dash = VA.build(state, compress=False, host=a.host, plotly=a.plotly)
        client = dash.server.test_client()
        page, layout = client.get("/"), client.get("/_dash-layout")
    ok = page.status_code == 200 and layout.status_code == 200 and b"<html" in page.data.lower()
    return (0 if ok else 1), layout.data.decode()[:200], err.getvalue()


def _serve_mcp(args: list, d: Path) -> tuple:
    """``timeline mcp ARGS`` started over stdio by the SDK's client, its tools listed, stopped."""
    import mcpkit

    with mcpkit.session(*args, cwd=d, timeout=120) as s:
        tools = sorted(s.tools())
    return (0 if "explain" in tools and "sql" in tools else 1), " ".join(tools), ""


def run_line(line: str, d: Path) -> tuple:
    """``(exit status, stdout, stderr)`` of one doc line run in ``d`` (the working folder)."""
    argv, to = argv_of(line, d)
    if argv[0] == "timeline-view":
        return _view(argv[1:])
    if argv[1] == "mcp" and "--call" not in argv:
        return _serve_mcp(argv[2:], d)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv[1:])
    if to:
        (d / to).write_text(out.getvalue())
    return rc, out.getvalue(), err.getvalue()


def _words(line: str) -> list:
    return shlex.split(line, comments=True)


def producers(cmds: list, i: int) -> list:
    """Indices of the earlier lines of a block that write what line ``i`` reads (the
    latest writer of each name, and what those read in turn), in block order."""
    own = set(writes(_words(cmds[i])))
    reads = {w.rstrip("/") for w in _words(cmds[i])} - own
    out = set()
    for j in range(i - 1, -1, -1):
        hit = reads & set(writes(_words(cmds[j])))
        if hit:
            reads -= hit
            out |= {j, *producers(cmds, j)}
    return sorted(out)


def prepare_line(cmds: list, i: int, d: Path) -> None:
    """Run the lines line ``i`` depends on, then make the placeholders it names."""
    for j in producers(cmds, i):
        prepare_line(cmds, j, d)
        rc, _, err = run_line(cmds[j], d)
        assert rc in (0, 1, 3), f"the block's earlier line `{cmds[j]}`: exit {rc}: {err}"
    own = set(writes(_words(cmds[i])))
    for name in needs([w for w in _words(cmds[i]) if w.rstrip("/") not in own]):
        make(d, name)


def _gate(line: str) -> bool:
    return " compare " in f" {line} " and "--fail-over" in line


LINES = [(doc, start, n, [c for _, c in cmds], k) for doc, start, cmds in blocks() for k, (n, _) in enumerate(cmds)]


def _param(doc, start, n, cmds, k):
    line = cmds[k]
    skip = next((why for frag, why in EXCLUDED.items() if frag in line), None)
    why = next((why for (dd, frag), why in KNOWN.items() if dd == doc and frag in line), None)
    marks = [pytest.mark.skip(reason=f"excluded: {skip}")] if skip else \
        [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(cmds, k, (doc, start) in INDEPENDENT, id=f"{doc}:{n}", marks=marks)


@pytest.mark.parametrize("cmds,k,alone", [_param(*x) for x in LINES])
def test_doc_command_runs_as_printed(cmds, k, alone, tmp_path, monkeypatch):
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    prepare_line(cmds[k:k + 1] if alone else cmds, 0 if alone else k, tmp_path)
    rc, out, err = run_line(cmds[k], tmp_path)
    assert rc in ((0, 1, 3) if _gate(cmds[k]) else (0,)), f"`{cmds[k]}`: exit {rc}\n{err[-2000:]}"
    assert "Traceback" not in out + err


# -- the numbers a doc quotes from a command's output ---------------------------------------------
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
QUOTED = {  # (doc, first line of an output block) -> the line of the command block before it that printed it
    ("docs/CHANGES.md", 22): "timeline changes RUN",
}
COMMENTED = [  # (doc, the line) whose comment quotes numbers of its output
    ("docs/EXPLAIN.md", "timeline explain inj.arrow"),
]
ILLUSTRATIVE = {  # output blocks (doc, their first line) that are not a bundled input's output, and why
    ("docs/ATTACH.md", "timeline attach: error: 'bad.json.gz' cannot be read past byte 0 of its gunzipped text "
                       "(zlib.error: Error -3 while decompressing data: invalid code lengths set): the file is "
                       "truncated or damaged; copy or export it again"):
        "refusals of files the prose makes (tests/test_trust3_answers.py cuts the bundled trace the same way)",
    ("docs/ATTACH.md", "attach: triton_mono_ffn"): "a report of the reader's own run.arrow and profiler trace (the bundled capture's figures: "
                            "traces/h200_attach/README.md, tests/test_attach.py)",
}


def numbers(text: str) -> set:
    return {m.replace(",", "") for m in NUMBER.findall(text)}


def _block_of(doc: str, line: str) -> list:
    return next([c for _, c in cmds] for d, _, cmds in blocks()
                if d == doc and any(c == line or c.startswith(line + " ") for _, c in cmds))


def _printed(doc: str, line: str, d: Path) -> str:
    cmds = _block_of(doc, line)
    k = next(i for i, c in enumerate(cmds) if c == line or c.startswith(line + " "))
    prepare_line(cmds, k, d)
    rc, out, err = run_line(cmds[k], d)
    assert rc == 0, f"`{cmds[k]}`: exit {rc}: {err}"
    return out


@pytest.mark.parametrize("doc,start", sorted(QUOTED))
def test_an_output_block_quotes_what_its_command_prints_now(doc, start, tmp_path, monkeypatch):
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    block = next(lines for s, _, lines in fences(ROOT / doc) if s == start)
    out = _printed(doc, QUOTED[(doc, start)], tmp_path)
    missing = sorted(numbers("\n".join(block)) - numbers(out), key=float)
    assert not missing, f"{doc}:{start} quotes {missing}, which `{QUOTED[(doc, start)]}` no longer prints:\n{out}"


@pytest.mark.parametrize("doc,line", COMMENTED)
def test_a_comment_quotes_what_its_line_prints_now(doc, line, tmp_path, monkeypatch):
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    full = next(c for c in _block_of(doc, line) if c.startswith(line))
    said = numbers(full.split("#", 1)[1])
    out = _printed(doc, line, tmp_path)
    assert said and not said - numbers(out), f"{doc}: `{full}` quotes {sorted(said - numbers(out))}:\n{out}"


def test_every_output_block_after_a_command_is_compared_or_said_illustrative():
    """An output block (a fence without a language, with numbers, the next fence after a
    command block) is in QUOTED or ILLUSTRATIVE: a new doc example joins by itself."""
    for path in DOCS:
        doc, prev = path.relative_to(ROOT).as_posix(), False
        for start, lang, lines in fences(path):
            if commands(lines, start):
                prev = True
                continue
            if prev and lang == "" and NUMBER.search("\n".join(lines)):
                assert (doc, start) in QUOTED or (doc, lines[0]) in ILLUSTRATIVE, f"{doc}:{start}: an output block " \
                    "after a command block: compare it (QUOTED) or say why not (ILLUSTRATIVE)"
            prev = False
