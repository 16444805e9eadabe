"""The dashboard's colours: a stage's colour and each (stage, interval) class's shade,
one home for the Gantt's bars, its raster, the legend and the panels."""

from __future__ import annotations

import numpy as np

__all__ = ["LAST_DARKEN", "PALETTE", "WAIT_LIGHTEN", "class_rgb", "hex_rgb", "rgb_hex", "stage_colour"]

# Tableau-like qualitative palette: distinct on white, colour-blind friendlier than
# plotly's default; stage i takes colour i mod len.
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#17becf", "#bcbd22", "#7f7f7f",
)
WAIT_LIGHTEN = 0.62  # how much of white the producer-wait interval mixes in
LAST_DARKEN = 0.22  # how much of black the last interval (epilogue) mixes in


def hex_rgb(h: str) -> np.ndarray:
    """``#rrggbb`` as RGB floats in 0..1."""
    return np.array([int(h[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.float64) / 255.0


def rgb_hex(c) -> str:
    """RGB floats in 0..1 as ``#rrggbb`` (clipped)."""
    return "#" + "".join(f"{int(round(float(v) * 255)):02x}" for v in np.clip(c, 0, 1))


def stage_colour(i: int) -> str:
    """Stage ``i``'s colour: the palette's, cycling."""
    return PALETTE[i % len(PALETTE)]


def class_rgb(n_stages: int, n_intervals: int, wait_index=0) -> np.ndarray:
    """RGB (0..1) of every class ``stage * n_intervals + interval``: the stage's
    colour; the spec's declared wait for producers (interval ``wait_index``, None for
    none) mixed with white, the last interval (publishing) with black, the others
    alternately a little lighter so that phase boundaries show inside a bar."""
    n_i = max(n_intervals, 1)
    out = np.zeros((n_stages * n_i, 3))
    for s in range(n_stages):
        base = hex_rgb(stage_colour(s))
        for p in range(n_i):
            if p == wait_index and n_i > 1:
                c = base + (1 - base) * WAIT_LIGHTEN
            elif p == n_i - 1 and n_i > 1:
                c = base * (1 - LAST_DARKEN)
            elif p % 2 == 1:
                c = base + (1 - base) * 0.18
            else:
                c = base
            out[s * n_i + p] = c
    return out
