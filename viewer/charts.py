"""Figures of the panels below the Gantt, as plotly.js figure dicts: idle share per
CTA (a heat strip) and the compare tab's stage spans (overlaid bars). Pure functions
of analysis tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from timeline.core import rows


def idle_figure(table: pa.Table | None) -> dict:
    """Idle share of every CTA as a heat strip: x = CTA, y = rank · launch, colour =
    idle / (last end - first start), hover with busy / idle / largest gap (µs);
    from the ``idle_per_cta`` analysis table."""
    if table is None or table.num_rows == 0:
        return {"data": [], "layout": {"height": 120, "annotations": [{
            "text": "no idle-time data", "showarrow": False, "xref": "paper", "yref": "paper",
            "x": 0.5, "y": 0.5}], "xaxis": {"visible": False}, "yaxis": {"visible": False}}}
    rank = rows.numpy(table.column("rank")).astype(np.int64)
    launch = rows.numpy(table.column("launch")).astype(np.int64)
    cta = rows.numpy(table.column("cta")).astype(np.int64)
    share = rows.numpy(table.column("idle_share")).astype(np.float64)
    idle = rows.numpy(table.column("idle_ns")) / 1e3
    busy = rows.numpy(table.column("busy_ns")) / 1e3
    gap = rows.numpy(table.column("max_gap_ns")) / 1e3
    keys = sorted(set(zip(rank.tolist(), launch.tolist())))
    ki = {k: i for i, k in enumerate(keys)}
    y = np.array([ki[(r, la)] for r, la in zip(rank.tolist(), launch.tolist())], dtype=np.int64)
    n_cta = int(cta.max()) + 1 if cta.size else 1
    z = np.full((len(keys), n_cta), np.nan)
    cd = np.full((len(keys), n_cta, 3), np.nan)
    ok = cta >= 0
    z[y[ok], cta[ok]] = share[ok]
    cd[y[ok], cta[ok]] = np.stack([busy, idle, gap], axis=1)[ok]
    return {
        "data": [{"type": "heatmap", "z": z.tolist(), "x": list(range(n_cta)),
                  "y": [f"r{r} L{la}" for r, la in keys], "customdata": cd.round(3).tolist(),
                  "colorscale": "YlOrRd", "reversescale": True, "zmin": 0, "zmax": max(float(np.nanmax(share)), 1e-9),
                  "colorbar": {"title": {"text": "idle share"}},
                  "hovertemplate": ("%{y} CTA %{x}<br>idle share %{z:.1%}<br>busy %{customdata[0]} µs"
                                    "<br>idle %{customdata[1]} µs<br>largest gap %{customdata[2]} µs<extra></extra>")}],
        "layout": {"height": max(160, 26 * len(keys) + 90), "margin": {"l": 70, "r": 20, "t": 10, "b": 40},
                   "xaxis": {"title": {"text": "CTA"}}, "yaxis": {"autorange": "reversed"}},
    }


def stage_span_figure(spans: dict, stage_order) -> dict:
    """Compare: each stage's span (first start -> last end, µs) per trace as
    overlaid horizontal bars. ``spans``: ``{label: {stage: (first_start_us,
    last_end_us)}}``, in drawing order (the first is drawn wider, behind)."""
    data = []
    colours = ("#4e79a7", "#e15759", "#59a14f")
    for k, (label, per_stage) in enumerate(spans.items()):
        names = [s for s in stage_order if s in per_stage]
        base = [per_stage[s][0] for s in names]
        length = [per_stage[s][1] - per_stage[s][0] for s in names]
        data.append({"type": "bar", "orientation": "h", "y": names, "x": length, "base": base,
                     "name": label, "marker": {"color": colours[k % len(colours)], "opacity": 0.55},
                     "width": 0.8 if k == 0 else 0.45, "offsetgroup": "spans",
                     "hovertemplate": f"{label}<br>%{{y}}: from %{{base:.2f}} µs, span %{{x:.2f}} µs<extra></extra>"})
    return {"data": data, "layout": {
        "barmode": "overlay", "height": max(220, 28 * len(stage_order) + 90),
        "margin": {"l": 90, "r": 20, "t": 10, "b": 40}, "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        "xaxis": {"title": {"text": "µs from trace origin"}},
        "yaxis": {"autorange": "reversed", "categoryorder": "array", "categoryarray": list(stage_order)}}}
