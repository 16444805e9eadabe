"""The calibration check allows for the device clock's drift (issue 48): one
calibration is one point of a clock that drifts (-4.06 ppm measured on an H200,
bench/results/clocks_h200.txt), so a calibration taken 20 s before the profiled
launches predicts an offset up to 20 ppm x 20 s = 400 µs away from where the launches
put it. The check's tolerance grows by ``clocks.DRIFT_PPM_BOUND`` over the host time
between the calibration and the launches, and the report says which bound and why;
a clock drifting past that bound still DISAGREES."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kinetokit as KK
from timeline import Trace, load
from timeline.attach import match as MA
from timeline.attach import read_framework
from timeline.attach import report as AR
from timeline.attach.attach import attach, attach_files
from timeline.contract import clocks as K

TRACES = Path(__file__).resolve().parents[1] / "traces"
D = TRACES / "h200_attach"
KERNEL = "mono_ffn_kernel"
GAP_NS = 20_000_000_000  # the calibration 20 s before the launches (the H100 run)


def calibrated(t: Trace, cal: K.Calibration) -> Trace:
    return Trace(t.tasks, [K.with_calibrations(t.spec, [cal])], t.anomalies, origins=t.origins, offsets=t.offsets)


def earlier(cal: K.Calibration, gap_ns: int, ppm: float) -> K.Calibration:
    """``cal`` as the same clock would have been calibrated ``gap_ns`` earlier, drifting
    ``ppm`` against the host's (device = host + offset: the offset then was
    ``ppm * gap`` less)."""
    return cal._replace(offset_ns=cal.offset_ns - round(ppm * 1e-6 * gap_ns), host_ns=cal.host_ns - gap_ns)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The H200 demo's 16 launches in a torch.profiler trace (Kineto's schema) at a
    known offset, and a calibration at the launches that predicts it exactly."""
    d = tmp_path_factory.mktemp("cal")
    base = KK.torch_trace(d / "cpu.json", marks=False)
    demo = load(TRACES / "h200_mono_demo.arrow")
    placed = KK.gpu_trace(base, d / "g.json", demo)
    first = int(MA.launches(demo).column("device_first_ns")[0].as_py())
    return demo, read_framework(d / "g.json"), placed, K.Calibration(0, 500.0, first, 200, "cuda:0")


@pytest.mark.parametrize("ppm, agrees", [(-4.06, True), (4.4, True), (-19.0, True), (25.0, False), (-30.0, False)])
def test_a_calibration_20_s_before_the_launches_allows_for_drift(synthetic, ppm, agrees):
    demo, fw, placed, at_launches = synthetic
    att = attach(calibrated(demo, earlier(at_launches, GAP_NS, ppm)), fw, kernel=KERNEL,
                 host_clock=(placed.offset_ns, 0))
    c = att.checks[0]
    assert c.drift_ppm == K.DRIFT_PPM_BOUND == 20.0 and abs(c.since_ns - GAP_NS) < 2_000_000
    assert c.drift_ns == pytest.approx(20e-6 * c.since_ns)
    assert abs(c.difference_ns + ppm * 1e-6 * GAP_NS) <= att.fits[0].bound_ns + 500 + 1  # what the clock drifted
    assert c.agrees is agrees
    assert abs(c.difference_ns) > c.tolerance_ns - c.drift_ns  # without the allowance, each would disagree
    text = "\n".join(AR.report_lines(att))
    assert ("agrees" if agrees else "DISAGREES") in text
    assert (f"drift: ± {c.drift_ns:,.0f} ns of it, the one calibration {c.since_ns / 1e9:.3f} s from the launches at the bound of "
            "20 ppm a device clock may drift from the host's (-4.06 ppm measured on an H200") in text


def test_a_calibration_beside_the_launches_keeps_a_tight_check(synthetic):
    demo, fw, placed, at_launches = synthetic
    att = attach(calibrated(demo, at_launches), fw, kernel=KERNEL, host_clock=(placed.offset_ns, 0))
    c = att.checks[0]
    assert c.agrees and c.since_ns < 1_000_000 and c.drift_ns < 20  # under 1 ms: under 20 ns of drift
    off = attach(calibrated(demo, at_launches._replace(offset_ns=5_000)), fw, kernel=KERNEL,
                 host_clock=(placed.offset_ns, 0))
    assert not off.checks[0].agrees  # 5 µs off at the launches is not drift


def test_two_calibrations_use_their_measured_drift(synthetic):
    """Before and after: the drift between them is measured; no bound is added."""
    demo, fw, placed, at_launches = synthetic
    before, after = earlier(at_launches, GAP_NS, -4.06), earlier(at_launches, -GAP_NS, -4.06)
    att = attach(Trace(demo.tasks, [K.with_calibrations(demo.spec, [before, after])], demo.anomalies,
                       origins=demo.origins, offsets=demo.offsets), fw, kernel=KERNEL, host_clock=(placed.offset_ns, 0))
    c = att.checks[0]
    assert c.drift_ppm is None and c.drift_ns == 0 and c.agrees and abs(c.difference_ns) <= 1_000
    assert "drift: measured between the calibrations" in "\n".join(AR.report_lines(att))


@pytest.mark.parametrize("ppm, agrees", [(0.0, True), (-4.06, True), (25.0, False)])
def test_the_bundled_h200_capture_with_its_calibration_moved_20_s_earlier(ppm, agrees):
    """The real H200 capture (traces/h200_attach: 24 launches, its torch.profiler trace,
    its calibration 9 ms before the launches, the host's clock relation) with its
    calibration moved 20 s earlier along a drift: the issue's H100 case (its files are
    not bundled) on real launches and a real profiler trace."""
    host = tuple(json.loads((D / "host_clock.json").read_text()))
    graph = load(D / "graph.arrow")
    real = K.calibrations_of(graph.spec)[0]
    att = attach_files(calibrated(graph, earlier(real, GAP_NS, ppm)), [D / "graph.pt.trace.json.gz"], kernel=KERNEL,
                       host_clock=host, step_offset=0)
    c, f = att.checks[0], att.fits[0]
    assert f.bound_ns <= 1_000 and att.matches.num_rows == 24
    assert abs(c.since_ns - GAP_NS) < 50_000_000 and c.agrees is agrees
    assert abs(c.difference_ns - (-117 - ppm * 1e-6 * GAP_NS)) <= 2  # the real check's -117 ns, less the drift


def test_the_docs_quote_the_bundled_check_as_printed(capsys):
    """docs/ATTACH.md's two lines of the check, as `timeline attach` prints them on the
    bundled H200 capture with its host relation."""
    from timeline.cli.parser import main

    host = "%d:%g" % tuple(json.loads((D / "host_clock.json").read_text()))
    assert main(["attach", str(D / "graph.arrow"), str(D / "graph.pt.trace.json.gz"), "--kernel", KERNEL,
                 "--host-clock", host]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  calibration predicts"))
    doc = (Path(__file__).resolve().parents[1] / "docs" / "ATTACH.md").read_text()
    assert lines[at] in doc and lines[at + 1] in doc and "drift: ± 184 ns of it" in lines[at + 1]
