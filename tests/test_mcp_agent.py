"""A scripted agent on ``timeline mcp`` over a SYNTHETIC run with one injected delay of
known truth (rank 2's down tasks' compute +6 µs in launch 1:1): list_sources ->
launches (the slowest launch is the injected one) -> explain (the culprit is rank 2's
down compute, significant, its saving beside the replay's fidelity) -> whatif with the
culprit's stage at its typical time on the culprit's rank (its tasks' excess taken
off) -> sql (every rank's first and last stamp of the launch) -> the launch's kernel
time predicted (the other ranks' ends unchanged) saves what explain said it would,
within explain's fidelity."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mcpkit import ENV, ROOT, session

INJECT = "2:down:*:compute:+6000@9"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent")
    subprocess.run([sys.executable, "-m", "timeline", "synth", "-o", f"{d}/RUN/", "--profile", "glm5", "--ranks", "4",
                    "--steps", "2", "--launches", "8", "--inject", INJECT, "-q"], cwd=ROOT, env=ENV, check=True,
                   capture_output=True)
    return d


def test_an_agent_finds_the_injected_delay_and_checks_its_fix(root):
    with session("--root", root, cwd=root) as mcp:
        ok = lambda tool, args: mcp.call(tool, args)  # noqa: E731
        sources, failed = ok("list_sources", {})
        assert not failed and [s["name"] for s in sources["sources"]] == ["RUN"]
        assert sources["sources"][0]["synthetic"] is True

        launches, failed = ok("launches", {"source": "RUN", "slowest": 3})
        assert not failed
        slowest = launches["kernel_time"]["slowest_launch"]
        assert slowest == "1:1"  # step 1, layer 1: the 9th launch, the injected one
        kernel_us = launches["rows"][0]["kernel_us"]
        assert kernel_us - launches["kernel_time"]["typical_us"] > launches["kernel_time"]["noise_us"]

        ex, failed = ok("explain", {"source": "RUN", "launch": slowest})
        assert not failed and not ex["cannot_establish"]
        x = ex["explained"][0]
        c = x["culprits"][0]
        assert (c["rank"], c["stage"], c["phase"], c["significant"]) == (2, "down", "compute", True)
        assert c["excess_us"] == pytest.approx(6.0, abs=0.5)  # the injected +6000 ns per task
        fidelity_us = x["fidelity"]["kernel_end_ns"] / 1e3
        assert all(r[0] == 2 and r[2] == "down" and r[5] == "staged→compute" for r in ex["evidence"]["rows"])

        # the culprit's stage at typical on its rank: each task's excess taken off
        fix = f"down.compute={-round(c['excess_us'] * 1000)}"
        wi, failed = ok("whatif", {"source": "RUN", "launch": slowest, "rank": [c["rank"]], "add": [fix]})
        assert not failed and f"--add {fix}" in wi["reproduce"] and "--rank 2" in wi["reproduce"]
        rank_alone = wi["launches"][0]
        assert rank_alone["saving_us"] > 0

        span, failed = ok("sql", {"source": "RUN", "query":
                                  "SELECT rank, min(least(start_ns, hint_ns, staged_ns, compute_ns, end_ns)) AS first, "
                                  "max(greatest(start_ns, hint_ns, staged_ns, compute_ns, end_ns)) AS last FROM tasks "
                                  "WHERE step = 1 AND layer = 1 GROUP BY rank ORDER BY rank"})
        assert not failed and [r[0] for r in span["rows"]] == [0, 1, 2, 3]
        first = min(r[1] for r in span["rows"])
        assert (max(r[2] for r in span["rows"]) - first) / 1e3 == pytest.approx(kernel_us, abs=1e-3)
        rank_first = next(r[1] for r in span["rows"] if r[0] == c["rank"])
        end = max([r[2] for r in span["rows"] if r[0] != c["rank"]] + [rank_first + rank_alone["predicted_us"] * 1e3])
        saving_us = kernel_us - (end - first) / 1e3
        assert saving_us == pytest.approx(c["saving_us"], abs=fidelity_us + 0.002)  # the µs rounding of the documents
