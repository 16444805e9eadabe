"""Server-side rasterization of the Gantt when more intervals are in view than a
browser can draw as bars: occupancy by stage per pixel row x pixel column, with
plain numpy binning, sent to the browser as one PNG.

The cell colour is the coverage-weighted mean of the colours of the intervals in
it (each interval's colour is its stage's, lighter for the producer wait), blended
over white by the cell's occupancy (busy time / (rows in the pixel row x column
time)), so an idle stretch is pale and a wait-dominated one light. Exact: an
interval contributes its overlap with each column (fractional at both ends), not
a point sample, so a narrow task is never lost and a long one never counted twice.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

MIN_ALPHA = 0.2  # the opacity of the faintest nonzero occupancy, so a lone task shows


def coverage(s: np.ndarray, e: np.ndarray, prow: np.ndarray, cls: np.ndarray, palette: np.ndarray,
             t0: float, t1: float, width: int, height: int) -> np.ndarray:
    """Per pixel (height x width) and channel (busy, r, g, b): the column-widths of
    time covered by the intervals ``[s, e)`` in pixel row ``prow``, and that
    coverage weighted by the colour ``palette[cls]`` (RGB floats 0..1) of each
    interval. Columns split ``[t0, t1]`` evenly; intervals are clipped to it.

    An interval adds its first column's share directly; one spanning several
    columns adds its last column's share directly too and its full middle columns
    as +1/-1 in a difference array summed along the row: O(n + pixels) whatever
    the intervals' lengths, one ``bincount`` over all intervals per channel."""
    out = np.zeros((4, height, width), dtype=np.float32)  # sums are float64; a pixel needs no more
    if s.size == 0 or t1 <= t0:
        return out
    scale = width / (t1 - t0)
    cs = np.clip((s - t0) * scale, 0.0, width)
    ce = np.clip((e - t0) * scale, 0.0, width)
    i0 = np.minimum(cs.astype(np.int64), width - 1)
    i1 = np.minimum(ce.astype(np.int64), width - 1)
    same = i0 == i1
    first = np.where(same, ce - cs, i0 + 1 - cs)  # 0 for an empty interval: adds nothing
    pix = prow.astype(np.int64) * width + i0
    multi = np.flatnonzero(~same)
    m_pix = prow[multi].astype(np.int64) * width + i1[multi]
    m_last = ce[multi] - i1[multi]
    span = multi[i1[multi] > i0[multi] + 1]
    dbase = prow[span].astype(np.int64) * (width + 1)
    didx = np.concatenate((dbase + i0[span] + 1, dbase + i1[span]))
    n_pix = height * width
    for c in range(4):
        w = None if c == 0 else palette[:, c - 1][cls]
        acc = np.bincount(pix, weights=first if w is None else first * w, minlength=n_pix)
        if multi.size:
            wm = None if w is None else w[multi]
            acc += np.bincount(m_pix, weights=m_last if wm is None else m_last * wm, minlength=n_pix)
        if span.size:
            ws = np.ones(span.size) if w is None else w[span]
            d = np.bincount(didx, weights=np.concatenate((ws, -ws)), minlength=height * (width + 1))
            acc += np.cumsum(d.reshape(height, width + 1), axis=1)[:, :width].reshape(-1)
        out[c] = acc.reshape(height, width)
    return out


def shade(cov: np.ndarray, rows_per_pixel: np.ndarray) -> np.ndarray:
    """Coverage channels (from ``coverage``) -> an RGB uint8 image (height x width x
    3): mean colour of the busy time, blended over white by occupancy (busy /
    rows in that pixel row), with a floor of ``MIN_ALPHA`` where anything ran."""
    busy = cov[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        img = cov[1:] / busy[None]  # the mean colour, then the pixel, in place (float32 like cov)
        occ = np.clip(busy / np.maximum(rows_per_pixel, 1).astype(np.float32)[:, None], 0.0, 1.0)
    np.nan_to_num(img, copy=False, nan=1.0)
    alpha = np.where(busy > 0, MIN_ALPHA + (1 - MIN_ALPHA) * occ, 0.0).astype(np.float32)
    del occ
    img -= 1.0
    img *= alpha[None]
    img += 1.0
    np.clip(img, 0, 1, out=img)
    img *= 255
    img += 0.5
    return np.ascontiguousarray(img.astype(np.uint8).transpose(1, 2, 0))


GAP = 0.2  # the share of a row's band left white between bars drawn as an image (as the WebGL bars' 80 %)


def bands(rgb: np.ndarray, height: int) -> np.ndarray:
    """An image of one pixel row per Gantt row (``n x width x 3``) stretched to
    ``height >= n`` pixel rows: each row its own band, with a white gap of ``GAP``
    of the band (centred) once bands are 3 or more pixels high, so bars read as bars."""
    n = rgb.shape[0]
    py = np.arange(height)
    row = py * n // height
    inside = np.ones(height, dtype=bool)
    if height >= 3 * n:
        frac = (py + 0.5) * n / height - row
        inside = (frac >= GAP / 2) & (frac < 1 - GAP / 2)
    out = rgb[row]
    out[~inside] = 255
    return out


def png_bytes(rgb: np.ndarray, level: int = 6) -> bytes:
    """An RGB uint8 image (height x width x 3) as PNG bytes (8-bit truecolour, the
    "Sub" filter on every line: the Gantt's long horizontal runs compress well)."""
    h, w, _ = rgb.shape
    rows = rgb.astype(np.int16)
    sub = rows.copy()
    sub[:, 1:] -= rows[:, :-1]
    lines = np.empty((h, 1 + 3 * w), dtype=np.uint8)
    lines[:, 0] = 1  # filter type Sub
    lines[:, 1:] = (sub & 0xFF).astype(np.uint8).reshape(h, 3 * w)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(lines.tobytes(), level)) + chunk(b"IEND", b""))
