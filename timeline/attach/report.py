"""The alignment report ``timeline attach`` prints: per rank, how the launches were
paired, how many matched, the fitted offset and drift with its ± bound, the
calibration's check, the anomalies by name; how the ranks share the axis
(measured or ASSUMED, as ``merge`` states it). ``report_dict`` is the same as JSON."""

from __future__ import annotations

from timeline.attach.attach import Attached

__all__ = ["report_dict", "report_lines"]


def report_dict(att: Attached) -> dict:
    ranks = []
    m = att.matches
    for r in sorted(att.fits):
        f, ax = att.fits[r], att.axes[r]
        rows = [x for x in m.to_pylist() if x["rank"] == r]
        bad = [x for x in rows if x["anomaly"]]
        check = next((c for c in att.checks if c.rank == r), None)
        ranks.append({
            "rank": r, "framework": att.frameworks[r].path, "format": att.frameworks[r].format,
            "paired_by": att.how[r], "launches": len(rows), "matched": len(rows) - len(bad), "unmatched": 0,
            "offset_ns": f.offset_ns, "drift_ppm": f.drift_ppm if f.drift_fitted else None, "bound_ns": f.bound_ns,
            "max_outside_ns": max((x["outside_ns"] for x in rows if not x["anomaly"]), default=0),
            "anomalies": [{"launch": x["launch"], "step": x["step"], "layer": x["layer"], "outside_ns": x["outside_ns"],
                           "kernel_start_ns": x["kernel_start_ns"], "kernel_end_ns": x["kernel_end_ns"]} for x in bad],
            "axis": {"by": ax.by, "shift_ns": ax.shift_ns, "uncertainty_ns": ax.uncertainty_ns},
            "calibration": None if check is None else check._asdict()})
    return {"format": "timeline.attach/1", "kernel": att.trace.spec.kernel, "ranks": ranks}


MEASURED_DRIFT = "-4.06 ppm measured on an H200 over 60 s, bench/results/clocks_h200.txt"


def _drift_words(c: dict) -> str:
    """What the calibration check allowed for the clock's drift, and why."""
    since = f"{c['since_ns'] / 1e9:,.3f} s"
    if c["drift_ppm"] is None:
        return (f"drift: measured between the calibrations, ± its uncertainty over the {since} from the nearer one "
                "to the launches")
    return (f"drift: ± {c['drift_ns']:,.0f} ns of it, the one calibration {since} from the launches at the bound "
            f"of {c['drift_ppm']:g} ppm a device clock may drift from the host's ({MEASURED_DRIFT}); calibrate "
            "again beside the launches (instrument.calibrate) for a tighter check")


def report_lines(att: Attached) -> list:
    d = report_dict(att)
    out = [f"attach: {d['kernel']}"]
    for r in d["ranks"]:
        out.append(f"rank {r['rank']}: {r['framework']} ({r['format']}), paired by {r['paired_by']}")
        out.append(f"  launches {r['launches']}: {r['matched']} inside their kernel events, "
                   f"{len(r['anomalies'])} anomalies, 0 unmatched")
        drift = f", drift {r['drift_ppm']:+.3f} ppm" if r["drift_ppm"] is not None else ", drift not fitted (short span)"
        out.append(f"  device clock -> framework axis: offset {r['offset_ns']:+,} ns{drift}, ± {r['bound_ns']:,.0f} ns "
                   f"(measured: the launches' kernel events)")
        out.append(f"  every matched launch's stamps inside its kernel event within ± {r['bound_ns']:,.0f} ns "
                   f"(largest excursion {r['max_outside_ns']:,} ns)")
        for a in r["anomalies"]:
            sl = f" (step {a['step']}, layer {a['layer']})" if a["step"] is not None else ""
            out.append(f"  ANOMALY launch {a['launch']}{sl}: its stamps fall {a['outside_ns']:,} ns outside its "
                       "kernel event; left where the fit puts them")
        c = r["calibration"]
        if c is not None:
            if c["predicted_ns"] is None:
                out.append(f"  calibration: offset {c['calibration_ns']:+,} ns ± {c['calibration_uncertainty_ns']:,.0f} "
                           "against CLOCK_MONOTONIC; not compared (the framework clock's relation to CLOCK_MONOTONIC "
                           "was not given: --host-clock)")
            else:
                verdict = "agrees" if c["agrees"] else "DISAGREES"
                out.append(f"  calibration predicts offset {c['predicted_ns']:+,} ns: the fit is {c['difference_ns']:+,} ns "
                           f"from it, tolerance ± {c['tolerance_ns']:,.0f} ns: {verdict}")
                out.append(f"    {_drift_words(c)}")
        ax = r["axis"]
        u = "" if ax["uncertainty_ns"] is None else f" ± {ax['uncertainty_ns']:,.0f} ns"
        out.append(f"  axis: {ax['by']}, shift {ax['shift_ns']:+,} ns{u}")
    return out
