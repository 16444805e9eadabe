"""Fixed-width JSON text as uint8 matrices: the primitives the Chrome export builds
its rows from (``assemble`` lays the Perfetto export's byte columns out too). Numbers are right-aligned decimal digits (three a step, from lookup
tables), µs written exactly from integer ns, strings from a padded lookup table,
and ``assemble`` lays pieces side by side, one row per record. No per-value Python
formatting: every function works on whole columns."""

from __future__ import annotations

import numpy as np

SPACE = 32
BLOCK_BYTES = 1 << 18  # rows ``assemble`` fills at a time: a block this size stays in a core's cache


def _group_table() -> np.ndarray:
    """Rows 0..999: three digits zero-padded; 1000..1999: the same with leading zeros
    as spaces (a number's top group); 2000: three spaces (above a number's top)."""
    t = np.empty((2001, 3), dtype=np.uint8)
    for i in range(1000):
        t[i] = list(f"{i:03d}".encode())
        t[1000 + i] = list(f"{i:3d}".encode())
    t[2000] = SPACE
    return t


_GROUPS = _group_table()
_FRAC = np.array([list(f".{i:03d}".encode()) for i in range(1000)], dtype=np.uint8)  # (1000, 4)
_NULL = np.frombuffer(b"null", np.uint8)


# -- fixed-width text columns -------------------------------------------------
def _fill_digits(out: np.ndarray, a: np.ndarray) -> None:
    """Right-align the decimal digits of non-negative int64 ``a`` in ``out`` ``(n, w)``,
    spaces on the left; ``w`` must hold the widest. Three digits a step."""
    n, w = out.shape
    groups = -(-w // 3)
    buf = out if w == groups * 3 else np.empty((n, groups * 3), dtype=np.uint8)
    for g in range(groups):
        hi = (groups - g) * 3
        rest = a // 1000
        code = a % 1000 + 1000 * (rest == 0)
        if g:
            code[a == 0] = 2000
        buf[:, hi - 3:hi] = _GROUPS[code]
        a = rest
    if buf is not out:
        out[:] = buf[:, groups * 3 - w:]


def _width(a: np.ndarray) -> int:
    return len(str(int(a.max()))) if a.size else 1


def _sign(out: np.ndarray, a: np.ndarray, neg: np.ndarray) -> None:
    """Put ``-`` just left of the digits of ``a`` in the rows where ``neg``."""
    rows = np.flatnonzero(neg)
    nd = np.array([len(str(int(x))) for x in a[rows]], dtype=np.int64)  # only negative rows
    out[rows, out.shape[1] - nd - 1] = ord("-")


def digits(values, *, null=None) -> np.ndarray:
    """Decimal text of int64 ``values`` as a ``(n, w)`` uint8 matrix: right-aligned,
    left-padded with spaces, ``-`` before negative numbers, ``null`` where the
    ``null`` mask is set; ``w`` is the widest entry."""
    v = np.asarray(values, dtype=np.int64)
    neg = v < 0
    a = np.abs(v)
    has_neg, has_null = bool(neg.any()), null is not None and bool(null.any())
    w = _width(a) + has_neg
    if has_null:
        w = max(w, 4)
    out = np.empty((len(v), w), dtype=np.uint8)
    _fill_digits(out, a)
    if has_neg:
        _sign(out, a, neg)
    if has_null:
        out[null] = SPACE
        out[null, w - 4:] = _NULL
    return out


def micros(ns, *, null=None) -> np.ndarray:
    """Exact µs text of int64 ns: ``<ns // 1000>.<ns % 1000 in three digits>`` (sign
    in front), laid out as ``digits`` does; ``null`` where masked."""
    ns = np.asarray(ns, dtype=np.int64)
    neg = ns < 0
    a = np.abs(ns)
    ip = a // 1000
    has_neg, has_null = bool(neg.any()), null is not None and bool(null.any())
    wi = _width(ip) + has_neg
    out = np.empty((len(ns), wi + 4), dtype=np.uint8)
    _fill_digits(out[:, :wi], ip)
    out[:, wi:] = _FRAC[a % 1000]
    if has_neg:
        _sign(out[:, :wi], ip, neg)
    if has_null:
        out[null] = SPACE
        out[null, wi:] = _NULL
    return out


def strings(texts) -> np.ndarray:
    """A lookup table of UTF-8 ``texts`` as a ``(k, w)`` uint8 matrix, each padded
    with trailing spaces to the longest; index it with codes to get a column."""
    enc = [t.encode() for t in texts]
    w = max((len(e) for e in enc), default=0)
    return np.array([list(e.ljust(w, b" ")) for e in enc], dtype=np.uint8).reshape(len(enc), w)


def assemble(n: int, pieces) -> np.ndarray:
    """The ``(n, W)`` uint8 matrix of ``pieces`` side by side: a ``bytes`` piece is
    the same in every row, an array piece is ``(n, w)``. The constant bytes go in
    as one template row broadcast down the matrix, then each array piece is copied
    into its columns, a block of rows at a time (one pass a piece over the whole
    matrix would fetch every row's cache line again for each narrow piece)."""
    widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in pieces]
    template = np.zeros(sum(widths), dtype=np.uint8)
    at = 0
    for p, w in zip(pieces, widths):
        if isinstance(p, bytes):
            template[at:at + w] = np.frombuffer(p, np.uint8)
        at += w
    out = np.empty((n, len(template)), dtype=np.uint8)
    arrays, at = [], 0
    for p, w in zip(pieces, widths):
        if not isinstance(p, bytes):
            arrays.append((at, w, p))
        at += w
    step = max(1, BLOCK_BYTES // max(len(template), 1))
    for lo in range(0, n, step):  # a block of rows at a time stays in cache for all its pieces
        block = out[lo:lo + step]
        block[:] = template
        for at, w, p in arrays:
            block[:, at:at + w] = p[lo:lo + step]
    return out
