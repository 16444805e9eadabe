"""The title lines above every report of a trace or a run: kernel, arch, clock, ranks
and launches, how the ranks were aligned, SYNTHETIC and the anomalies said."""

from __future__ import annotations

from timeline.contract import clocks as K


def title(trace) -> str:
    """The title of a report of ``trace``: its build, clock, ranks and launches (by key)."""
    from timeline.core import launchkey as KY

    sp = trace.spec
    mhz = sp.clock.hz / 1e6
    lines = [f"{sp.kernel} · {sp.arch} · clock {sp.clock.name} {mhz:g} MHz · ranks {trace.ranks} · "
             f"launches {KY.brief(trace.launch_keys.values())}"]
    if sp.cycles:
        lines.append(f"hybrid clock: phases on the {sp.cycles} cycle counter, placed on {sp.clock.name} "
                     "(timeline.ingest.hybrid)")
    if trace.synthetic:
        lines.append("SYNTHETIC trace (timeline.ingest.synth model): not measured on a GPU")
    if len(trace.ranks) > 1:
        aligned = K.alignment_of(trace)
        if all(a.measured for a in aligned):
            worst = max(a.uncertainty_ns for a in aligned)
            lines.append(f"ranks aligned by their measured clocks, each within ± {worst:,.0f} ns (`timeline info`)")
        else:
            lines.append(f"ranks aligned by {aligned[0].by}: ASSUMED, the skew between ranks is not measured "
                         "(`timeline info`)")
    n = trace.anomaly_count
    if n:
        lines.append(f"anomalies: {trace.anomaly_summary()} (see `timeline info`)")
    return "\n".join(lines)


def run_head(run) -> str:
    """The title of a report of a run: path, kernel, appends, rows; SYNTHETIC said."""
    n = run.launches().num_rows
    synth = any(r.get("synthetic") for r in run.records)
    kernel = run.build.get("kernel") if run.build else "(empty run)"
    return (f"run {run.path} · {kernel} · {len(run.records)} appends · {n} (rank, launch) rows"
            + ("\nSYNTHETIC data (timeline.ingest.synth model): not measured on a GPU" if synth else ""))


__all__ = ["run_head", "title"]
