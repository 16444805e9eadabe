"""timeline.core.grouped's fast paths (runs, dense tables, bitmaps, packed sorts) against
the obvious definitions, on rows in every kind of order: runs as the collector
writes them, shuffled, with ties."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.core import grouped as GR


def _rows(draw, n, hi):
    runs = draw(st.booleans())
    g = draw(st.lists(st.integers(0, hi), min_size=n, max_size=n))
    return np.sort(np.array(g, dtype=np.int64)) if runs else np.array(g, dtype=np.int64)


@st.composite
def tables(draw):
    n = draw(st.integers(0, 60))
    gid = _rows(draw, n, draw(st.integers(0, 6)))
    start = np.array(draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)), dtype=np.int64)
    end = start + np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    return gid, start, end


@settings(max_examples=200, deadline=None)
@given(tables())
def test_group_order_and_sweep_order(tb):
    gid, start, end = tb
    assert np.array_equal(GR.group_order(gid), np.argsort(gid, kind="stable"))
    assert np.array_equal(GR._order_by_group_then(gid, start, end), np.lexsort((end, start, gid)))


def _group_ids_by_sorting(*cols):
    keys = list(zip(*[c.tolist() for c in cols]))
    uniq = sorted(set(keys))
    index = {k: i for i, k in enumerate(uniq)}
    return np.array([index[k] for k in keys], dtype=np.int64), len(uniq), uniq


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.integers(1, 3), st.sampled_from([np.int16, np.int32, np.int64]),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_group_ids_dense_and_general(n, k, dtype, wide, seed):
    """The dense-table path (small ranges) and the re-ranking path (``wide``: a range
    past ``_DENSE_MAX``) number tuples in lexicographic order and give back their values."""
    rng = np.random.default_rng(seed)
    cols = [rng.integers(-4, 9, n).astype(dtype) for _ in range(k)]
    if wide:
        cols[0] = cols[0].astype(np.int64) * (GR._DENSE_MAX + 1)
    gid, ng, tuples = GR.group_ids(*cols)
    want_gid, want_ng, uniq = _group_ids_by_sorting(*cols)
    assert np.array_equal(gid, want_gid) and ng == want_ng
    assert [tuple(int(t[i]) for t in tuples) for i in range(ng)] == uniq
    assert all(t.dtype == c.dtype for t, c in zip(tuples, cols))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 5), st.booleans(), st.integers(0, 2**32 - 1))
def test_distinct_count_bitmap_sort_and_lexsort(n, ng, huge, seed):
    rng = np.random.default_rng(seed)
    gid = rng.integers(0, ng, n)
    a, b = rng.integers(0, 4, n), rng.integers(0, 3, n)
    if huge:  # past the bitmap: one sort of the packed tuples
        a = a * (GR._BITMAP_MAX + 7)
    want = np.array([len(set(zip(a[gid == g].tolist(), b[gid == g].tolist()))) for g in range(ng)])
    assert np.array_equal(GR.distinct_count(gid, ng, a, b), want)
    neg = a - 1  # a negative key: the lexsort path
    want_neg = np.array([len(set(zip(neg[gid == g].tolist(), b[gid == g].tolist()))) for g in range(ng)])
    assert np.array_equal(GR.distinct_count(gid, ng, neg, b), want_neg)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 80), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_group_quantiles_are_numpy_quantiles(n, ng, seed):
    rng = np.random.default_rng(seed)
    gid = np.repeat(rng.integers(0, ng, max(1, n // 5)), 5)[:n]
    values = rng.integers(0, 1000, gid.size)
    got = GR.group_quantiles(gid, ng, values, (0.5, 0.9))
    for g in range(ng):
        v = values[gid == g]
        want = np.quantile(v, [0.5, 0.9]) if v.size else [np.nan, np.nan]
        assert np.allclose(got[:, g], want, equal_nan=True)


QS = (0.0, 0.5, 0.9, 0.99, 1.0)


def assert_linear_quantiles(got, gid, values, ng):
    """Each group's ``QS`` quantiles in ``got`` equal the linear rule over that group's
    sorted values, bit for bit (NaN for an empty group)."""
    for g in range(ng):
        v = np.sort(values[gid == g]).astype(np.float64)
        for i, q in enumerate(QS):
            if not v.size:
                assert np.isnan(got[i, g])
                continue
            pos = (v.size - 1) * q
            lo = int(np.floor(pos))
            hi = min(lo + 1, v.size - 1)
            assert got[i, g] == v[lo] + (pos - lo) * (v[hi] - v[lo])


def both_paths(counts, values) -> list:
    """``grouped_quantiles`` by the groups' sizes (its matrix of each size's groups, where they come in
    few) and with that path off (``_sorted_packed``: one sort of every value)."""
    out = [GR.grouped_quantiles(counts, values, QS)]
    classes, GR._SIZE_CLASSES = GR._SIZE_CLASSES, 0
    try:
        out.append(GR.grouped_quantiles(counts, values, QS))
    finally:
        GR._SIZE_CLASSES = classes
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.integers(1, 6), st.sampled_from(["small", "wide", "float"]), st.integers(0, 2**32 - 1))
def test_grouped_quantiles_equal_numpy_exactly_on_each_path(n, ng, kind, seed):
    """The packed-key sort (integers of a small range), the lexsort (a range too wide to
    pack, negative values) and floats: every quantile equal to numpy's, bit for bit."""
    rng = np.random.default_rng(seed)
    gid = np.sort(rng.integers(0, ng, n))
    values = {"small": lambda: rng.integers(-50, 1000, n),
              "wide": lambda: rng.integers(-2**62, 2**62, n),
              "float": lambda: rng.normal(size=n)}[kind]()
    counts = np.bincount(gid, minlength=ng)
    for got in both_paths(counts, values):
        assert_linear_quantiles(got, gid, values, ng)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.sampled_from([3, 20, 28, 30, 31, 40]), st.integers(0, 2**32 - 1))
def test_grouped_quantiles_int32_chunks_and_int64_keys(n, ng, bits, seed):
    """Values of every range width around the int32 key's limits (a chunk of a few
    groups per int32 sort at 28-30 bits, the int64 key past 30, offset far from zero):
    each group's quantiles equal the linear rule over that group's sorted values, bit for bit."""
    rng = np.random.default_rng(seed)
    gid = np.sort(rng.integers(0, ng, n))
    values = rng.integers(0, 1 << bits, n) + (1 << 40)
    values[rng.integers(0, n)] = (1 << 40) + (1 << bits) - 1  # the full range present
    counts = np.bincount(gid, minlength=ng)
    for got in both_paths(counts, values):
        assert_linear_quantiles(got, gid, values, ng)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=90), st.sampled_from(["small", "float"]),
       st.integers(0, 2**32 - 1))
def test_grouped_quantiles_by_size_classes_and_past_them(sizes, kind, seed):
    """Groups of a few sizes (the rows of grouped_quantiles' matrices, empty groups among
    them) and of more sizes than ``_SIZE_CLASSES`` allows (then one sort of every value):
    each group's quantiles the linear rule over its sorted values, bit for bit."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(sizes if len(set(sizes)) <= 4 or rng.random() < 0.5 else
                        [s + 13 * i for i, s in enumerate(sizes)], dtype=np.int64)  # 90 sizes: past the classes
    gid = np.repeat(np.arange(counts.size), counts)
    values = rng.integers(-50, 1000, gid.size) if kind == "small" else rng.normal(size=gid.size)
    for got in both_paths(counts, values):
        assert_linear_quantiles(got, gid, values, counts.size)
