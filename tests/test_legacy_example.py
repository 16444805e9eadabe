"""The bundled SYNTHETIC GLM-5 layer kernel ``trace.pt`` (traces/glm5_legacy_synthetic/,
issue 39): it is what ``tools/glm5_legacy_trace.py`` makes from its seed, it has the
kernel's exact format (checked against the kernel's rules as REFERENCE §1 states them,
not against the tool or the profile), and the commands README's "Coming from the GLM-5
layer kernel" section and docs/PORTING_GLM5.md give run on it as written: parsed from
the docs, run by bash in a temporary folder standing in for the checkout's root (the
one thing changed: the working directory), their outputs checked."""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import legacykit as LK
from timeline import load
from timeline.cli import main
from tools import glm5_legacy_trace as LT

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "traces" / "glm5_legacy_synthetic"
FILES = [BUNDLED / "w8a8-s1" / f"rank{r}" / "trace.pt" for r in range(2)]
# the indexed kernel's stage_tasks(1, 8, 2048) as REFERENCE §1 lists it: the kernel's stage order
KERNEL_STAGES = [("qkv_a", 164), ("cache", 1), ("q_b", 128), ("uk", 32), ("split", 32), ("uv", 32), ("o", 192),
                 ("router", 32), ("ug", 256), ("down", 192)]
MARKS = {"split": (5, 6), "uv": (5,), "router": (5, 6, 7)}  # in the task's own row; ug 7: route_top8
README_SECTION = "## Coming from the GLM-5 layer kernel's timeline build"
VIEW_SECONDS = 240  # the dashboard loads the trace and warms its first view before it serves


@pytest.fixture(scope="module")
def saved():
    """Each bundled file as ``torch.load(weights_only=True)`` reads it."""
    return [torch.load(p, map_location="cpu", weights_only=True) for p in FILES]


def rows_of(stages) -> dict:
    first = np.cumsum([0] + [c for _, c in stages])[:-1]
    return {n: np.arange(f, f + c) for (n, c), f in zip(stages, first)}


def test_the_bundled_files_are_what_the_tool_makes_from_its_seed(saved):
    made = LT.tensors()  # the defaults the files were written with: seed 0, 2 ranks, 4 launches
    assert len(made) == len(saved) == 2
    for (stages, ticks), d in zip(made, saved):
        assert d["stages"] == stages and np.array_equal(d["ticks"].numpy(), ticks)
    assert not np.array_equal(made[0][1], made[1][1])  # two ranks, not one copied


def test_the_files_have_the_kernels_exact_format(saved):
    """What ``torch.save(dict(stages=layer.stages, ticks=layer.timeline.cpu()))`` holds:
    exactly those two keys, ``stages`` a list of (str, int) tuples in the kernel's stage
    order (not the base order), ``ticks`` a contiguous CPU int64 (1061, 8) tensor; and
    nothing in the archive says synthetic (traces/README.md does)."""
    for path, d in zip(FILES, saved):
        assert type(d) is dict and list(d) == ["stages", "ticks"]
        assert type(d["stages"]) is list and d["stages"] == KERNEL_STAGES
        assert all(type(s) is tuple and type(s[0]) is str and type(s[1]) is int for s in d["stages"])
        assert [n for n, _ in d["stages"]] != list(LK.GLM5_ORDER)  # the file carries the stage order
        t = d["ticks"]
        assert t.dtype == torch.int64 and tuple(t.shape) == (1061, 8) and t.is_contiguous() and t.device.type == "cpu"
        with zipfile.ZipFile(path) as z:
            assert "trace/data.pkl" in z.namelist()  # the archive named as torch.save names a trace.pt's
            assert not any(b"ynthetic" in z.read(n) or b"SYNTH" in z.read(n) for n in z.namelist())
    assert "glm5_legacy_synthetic" in (ROOT / "traces" / "README.md").read_text()


def test_the_tensor_is_written_by_the_kernels_rules(saved):
    """REFERENCE §1: qkv_a's hint and cache's compute never written, every other phase
    cell written in order; the debug marks exactly where the kernel stamps them (split 5,
    6; uv 5; router 5, 6, 7 inside their own task; route_top8's 7 in the ug row of each
    CTA's id, inside that CTA's last ug-or-down task); a CTA (task t of a stage on
    ``(base[s] + t) % 256``, base over the base order) runs its tasks one after another
    in stage order; 100 MHz ticks of one launch of a plausible layer."""
    rows = rows_of(KERNEL_STAGES)
    cta = np.concatenate(list(LK.rotation(KERNEL_STAGES, LK.GLM5_ORDER).values()))
    for d in saved:
        t = d["ticks"].numpy()
        unwritten = np.zeros((1061, 5), bool)
        unwritten[rows["qkv_a"], 1] = True
        unwritten[rows["cache"], 3] = True
        assert np.array_equal(t[:, :5] == 0, unwritten)
        for stage, cols in (("qkv_a", [0, 2, 3, 4]), ("cache", [0, 1, 2, 4])):
            assert (np.diff(t[np.ix_(rows[stage], cols)], axis=1) >= 0).all()
        rest = np.concatenate([rows[n] for n, _ in KERNEL_STAGES if n not in ("qkv_a", "cache")])
        assert (np.diff(t[rest, :5], axis=1) >= 0).all()
        want = np.zeros((1061, 3), bool)
        for stage, cols in MARKS.items():
            for c in cols:
                want[rows[stage], c - 5] = True
                inside = t[rows[stage], c]
                assert ((inside >= t[rows[stage], 0]) & (inside <= t[rows[stage], 4])).all()
        want[rows["ug"], 2] = True  # every CTA id < 256 has its ug row stamped
        assert np.array_equal(t[:, 5:] != 0, want)
        for bid in range(256):
            last = max((r for r in np.concatenate([rows["ug"], rows["down"]]) if cta[r] == bid), key=lambda r: t[r, 0])
            assert t[last, 0] <= t[rows["ug"][bid], 7] <= t[last, 4]
        for bid in range(256):
            mine = np.flatnonzero(cta == bid)  # row order is stage order: the order the CTA runs them
            assert (t[mine[1:], 0] >= t[mine[:-1], 4]).all()
        span_us = (t[:, 4].max() - t[:, 0].min()) / 100.0
        assert 20 < span_us < 500


# -- the docs' commands, as written --------------------------------------------------------------------------------

def fenced_blocks(text: str) -> list:
    """``[(language, [lines])]`` of the Markdown text's fenced code blocks (indented ones too)."""
    out, lang, body = [], None, []
    for line in text.splitlines():
        m = re.match(r"^\s*```(\w*)\s*$", line)
        if m and lang is None:
            lang, body = m.group(1), []
        elif m:
            out.append((lang, body))
            lang = None
        elif lang is not None:
            body.append(line.strip())
    assert lang is None, "an unclosed code fence"
    return out


def commands(blocks, lang="sh") -> list:
    return [line for la, body in blocks if la == lang for line in body if line and not line.startswith("#")]


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(README_SECTION)
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else None]


def checkout_like(tmp_path: Path) -> Path:
    """A working directory that has the checkout's bundled folder where the docs' paths
    look (``traces/glm5_legacy_synthetic``), and nothing else of it."""
    work = tmp_path / "work"
    (work / "traces").mkdir(parents=True)
    shutil.copytree(BUNDLED, work / "traces" / BUNDLED.name)
    return work


def env() -> dict:
    """This interpreter's scripts (``timeline``, ``timeline-view``, ``python``) first on the
    PATH, this checkout's packages first on the import path."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = str(ROOT)
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def run(line: str, cwd: Path, extra_env=None) -> subprocess.CompletedProcess:
    e = env()
    e.update(extra_env or {})
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=e, capture_output=True, text=True, timeout=600)


def serve(line: str, cwd: Path) -> str:
    """Run a ``timeline-view`` line until it serves (its URL printed, the server listening);
    return what it printed and its page (HTML and Dash layout), then stop the process it started
    (by its handle)."""
    p = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=cwd, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, bufsize=0)
    out = {p.stdout.fileno(): b"", p.stderr.fileno(): b""}
    try:
        sel = selectors.DefaultSelector()
        for fd in out:
            sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + VIEW_SECONDS
        while True:
            text = b"".join(out.values()).decode(errors="replace")
            url = re.search(r"timeline-view: .* at (http://\S+)", text)
            if url and "Running on" in text:
                break
            left = deadline - time.monotonic()
            assert left > 0, f"{line!r} did not serve within {VIEW_SECONDS} s: {text}"
            assert sel.get_map(), f"{line!r} exited {p.wait(timeout=60)}" + (
                ": port 8050 is taken by another process (the command binds it)"
                if "Address already in use" in text else "") + f": {text}"
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    out[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
        with urllib.request.urlopen(url.group(1), timeout=60) as r:
            assert r.status == 200
            page = r.read().decode()
        with urllib.request.urlopen(url.group(1) + "_dash-layout", timeout=60) as r:
            layout = r.read().decode()
        return text + page + layout
    finally:
        p.terminate()
        p.wait(timeout=60)
        p.stdout.close()
        p.stderr.close()


def check_import(r, out: Path) -> None:
    """``import-legacy`` of the bundled pair: profile detected, CTAs derived by the kernel's
    rule, no anomaly, both ranks."""
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "profile glm5-indexed (detected; S=1 heads=8 topk=2048)" in r.stdout
    assert "CTAs derived by its placement rules" in r.stdout and "wait for producers hint→staged" in r.stdout
    trace = load(out)
    assert trace.ranks == [0, 1] and trace.anomaly_count == 0
    assert trace.spec.extra["profile"] == "glm5-indexed" and trace.spec.extra["placement"] == "derived"
    cta = LK.rotation(KERNEL_STAGES, LK.GLM5_ORDER)
    t = trace.filter(ranks=[0]).tasks
    got = dict(zip(zip(t.column("stage").to_pylist(), t.column("task").to_pylist()), t.column("cta").to_pylist()))
    assert got == {(n, i): int(cta[n][i]) for n, c in KERNEL_STAGES for i in range(c)}


def check_legacy_summary(r, saved) -> None:
    """``summary --legacy --rank 0``: rank 0's ``timeline_report()`` by its rules, line for line."""
    assert r.returncode == 0, r.stderr
    want = LK.their_report_text(saved[0]["ticks"].numpy(), KERNEL_STAGES)
    assert want in r.stdout, r.stdout


def check_profile_csv(r, saved) -> None:
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "event,ctas,first_us,median_us,last_us"
    assert lines[1:] == [f"{e},{n},{a:.3f},{m:.3f},{b:.3f}" for e, n, a, m, b in
                         LK.their_profile_rows(saved[0]["ticks"].numpy(), KERNEL_STAGES)]


def spans(trace) -> dict:
    """``{(stage, task): end - start ns}`` of a trace's tasks."""
    t = trace.tasks
    keys = zip(t.column("stage").to_pylist(), t.column("task").to_pylist())
    return dict(zip(keys, (t.column("end_ns").to_numpy() - t.column("start_ns").to_numpy()).tolist()))


def run_doc_lines(lines, work: Path, saved) -> set:
    """Run each line in ``work``, in order, and check what it printed; returns the kinds
    of line it checked (every line is one known kind, else the test fails: a command
    added to the docs gets a check here)."""
    kinds = set()
    for line in lines:
        if line.startswith("timeline-view "):
            doc = serve(line, work)
            assert "timeline-view: run.arrow at http://127.0.0.1:8050/" in doc and "<html>" in doc
            assert '"id":"gantt"' in doc.replace(" ", "")
            kinds.add("view")
            continue
        r = run(line, work)
        assert r.returncode == 0, f"{line!r} exited {r.returncode}: {r.stderr}"
        assert "Traceback" not in r.stderr and "error" not in r.stderr.lower(), r.stderr
        if re.match(r"timeline import-legacy traces/\S+/rank\*/trace\.pt -o run\.arrow", line):
            check_import(r, work / "run.arrow")
            kinds.add("import")
        elif line.startswith("timeline summary run.arrow --legacy --rank 0"):
            check_legacy_summary(r, saved)
            kinds.add("legacy")
        elif line.startswith("timeline summary run.arrow --profile-csv --rank 0"):
            check_profile_csv(r, saved)
            kinds.add("csv")
        elif line.startswith("timeline export run.arrow --chrome run.json"):
            events = json.loads((work / "run.json").read_text())["traceEvents"]
            assert sum(e.get("cat") == "mark" for e in events) == 2 * int((saved[0]["ticks"][:, 5:] != 0).sum())
            kinds.add("chrome")
        elif line.startswith("python -c") and "ticks.npy" in line:
            assert np.array_equal(np.load(work / "ticks.npy"), saved[0]["ticks"].numpy())
            kinds.add("npy")
        elif line.startswith("timeline import-legacy ticks.npy --stages "):
            assert "profile glm5-indexed (detected" in r.stdout and r.stderr == ""
            assert spans(load(work / "npy.arrow")) == spans(load(work / "run.arrow").filter(ranks=[0]))
            kinds.add("npy-import")
        else:
            raise AssertionError(f"a docs command this test does not check: {line!r}")
    return kinds


def test_readme_section_runs_as_written(tmp_path, saved):
    lines = commands(fenced_blocks(readme_section()))
    kinds = run_doc_lines(lines, checkout_like(tmp_path), saved)
    assert kinds == {"import", "legacy", "view"}


def test_porting_guide_commands_run_as_written(tmp_path, saved):
    blocks = fenced_blocks((ROOT / "docs" / "PORTING_GLM5.md").read_text())
    kinds = run_doc_lines(commands(blocks), checkout_like(tmp_path), saved)
    assert kinds == {"import", "legacy", "csv", "view", "chrome", "npy", "npy-import"}


def test_porting_guide_gpu_commands_as_written(tmp_path):
    """The guide's unlabelled block is the demo kernel's AMD GPU run: its first line is
    refused here in one line (no GPU: its flags parse), its second reads the
    ``rank0/trace.pt`` the first leaves, as it reads the bundled one."""
    blocks = fenced_blocks((ROOT / "docs" / "PORTING_GLM5.md").read_text())
    lines = commands(blocks, "")
    assert [line.split()[:3] for line in lines] == [["python", "-m", "instrument.demo.glm5_run"],
                                                    ["timeline", "import-legacy", "rank0/trace.pt"]]
    r = run(lines[0], tmp_path, {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and r.stderr.strip().startswith("no GPU visible to torch"), r.stderr
    work = tmp_path / "s1"
    shutil.copytree(BUNDLED / "w8a8-s1", work)
    r = run(lines[1], work)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "profile glm5-indexed (detected" in r.stdout and "CTAs derived" in r.stdout
    assert load(work / "legacy.arrow").ranks == [0]


def test_a_stage_list_in_the_base_order_is_refused_naming_where(tmp_path, saved, capsys):
    """``--stages`` takes the kernel's stage order (the file's); the base order (split
    before uk) is not read with rows sliced at the wrong places, it is refused."""
    np.save(tmp_path / "ticks.npy", saved[0]["ticks"].numpy())
    count = dict(KERNEL_STAGES)
    base = ",".join(f"{n}:{count[n]}" for n in LK.GLM5_ORDER)
    assert main(["import-legacy", str(tmp_path / "ticks.npy"), "--stages", base, "-o", str(tmp_path / "o.arrow")]) == 2
    err = capsys.readouterr().err
    assert "glm5-indexed: stage 3 is 'split', its is 'uk'" in err and err.count("\n") == 1
