"""timeline.contract.clocks: the ping-pong calibration's arithmetic on rounds with a known
offset and random trips, drift from two calibrations, and bad input refused."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.contract import clocks as K


EPOCH = 10**12  # host ns where the synthetic device clock reads host + offset exactly


def rounds(offset_ns, ppm, n, seed, start=EPOCH):
    """Synthetic rounds from host time ``start``: the device read lands anywhere
    inside each trip; the device clock runs ``ppm`` fast from ``EPOCH``."""
    rng = np.random.default_rng(seed)
    sent = start + np.cumsum(rng.integers(1_000, 50_000, n))
    trip = rng.integers(800, 20_000, n)
    at = sent + (rng.random(n) * trip).astype(np.int64)
    device = at + offset_ns + ((at - EPOCH) * ppm / 1e6).astype(np.int64)
    return sent, device, sent + trip


@settings(max_examples=200, deadline=None)
@given(st.integers(-2 * 10**18, 2 * 10**18), st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_the_true_offset_lies_within_the_stated_uncertainty(offset, n, seed):
    sent, device, received = rounds(offset, 0.0, n, seed)
    c = K.estimate(sent, device, received, name="gpu0", step_ns=1)  # the synthetic readings are exact ns
    assert isinstance(c.offset_ns, int)  # device clocks read ~1.8e18 ns: a float would step by 256 ns
    assert abs(c.offset_ns - offset) <= c.uncertainty_ns + 0.5
    best = int(np.argmin(received - sent))
    # the rounds' intersection: never wider than the best round's half trip
    # (plus the ns a DRIFT_PPM_BOUND drift could move the best round's interval over the rounds)
    allowance = K.DRIFT_PPM_BOUND * 1e-6 * (int(received[-1]) - int(sent[0])) + 2  # + the ceil of each side
    assert c.uncertainty_ns <= (received[best] - sent[best]) / 2 + allowance and c.rounds == n and c.device == "gpu0"
    assert K.Calibration.from_dict(c.to_dict()) == c


def test_the_rounds_intersection_is_much_tighter_than_the_best_round():
    """Trips of 2.5 .. 3.5 µs (the H200's), the reply anywhere in each: the best round
    alone bounds the offset by ~1.25 µs, 500 rounds' intersection by a few ns; the
    device clock's 32 ns step is found and allowed for."""
    rng = np.random.default_rng(7)
    n, offset = 500, 1_796_306_626_214_423_397
    sent = EPOCH + np.cumsum(rng.integers(3_000, 6_000, n))
    trip = rng.integers(2_500, 3_500, n)
    at = sent + (rng.random(n) * trip).astype(np.int64)
    device = ((at + offset) // 32) * 32  # a 32 ns timer
    c = K.estimate(sent, device, sent + trip)
    assert abs(c.offset_ns - offset) <= c.uncertainty_ns
    assert c.uncertainty_ns < 40 < 1_250 <= trip.min() / 2
    mid = (int(sent[0]) + int(sent[-1] + trip[-1])) // 2
    for ppm in (10, -15):  # within DRIFT_PPM_BOUND while the rounds run: still sound
        moved = ((at + offset + (at - mid) * ppm // 1_000_000) // 32) * 32  # the timer itself runs off
        d = K.estimate(sent, moved, sent + trip)
        assert abs(d.offset_ns - offset) <= d.uncertainty_ns < 100
    far = K.estimate(sent, ((at + offset + (at - mid) * 2_000 // 1_000_000) // 32) * 32, sent + trip)  # 2000 ppm
    assert far.uncertainty_ns >= trip.min() / 2  # the best round's bound


def listen_rounds(offset_ns, n, seed, pollers=64):
    """Synthetic listen rounds: the host's post lands in host memory inside its
    fenced store (``sent`` .. ``received``), pollers issue loads at random phases,
    each served 400 .. 700 ns after issue and back 400 .. 700 ns later; the device
    bounds are the latest miss's issue and the earliest hit's return, on a 32 ns timer."""
    rng = np.random.default_rng(seed)
    sent = EPOCH + np.cumsum(rng.integers(5_000, 20_000, n))
    received = sent + rng.integers(150, 400, n)
    post = sent + (rng.random(n) * (received - sent)).astype(np.int64)
    lo, hi = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for k in range(n):
        issue = post[k] + rng.integers(-3_000, 3_000, pollers)
        served = issue + rng.integers(400, 700, pollers)
        back = served + rng.integers(400, 700, pollers)
        lo[k], hi[k] = issue[served < post[k]].max(), back[served >= post[k]].min()
    timer = lambda t: ((t + offset_ns) // 32) * 32  # noqa: E731
    return sent, timer(lo), received, timer(hi)


@settings(max_examples=50, deadline=None)
@given(st.integers(-2 * 10**18, 2 * 10**18), st.integers(1, 200), st.integers(0, 2**32 - 1))
def test_listen_rounds_bound_the_true_offset(offset, n, seed):
    """A listen round's device interval (latest miss .. earliest hit): the true offset
    within the stated uncertainty, never wider than the best round's, and 100 rounds
    near the limit the fastest trips leave ((400 + 400 + 150) / 2 ns)."""
    sent, lo, received, hi = listen_rounds(offset, n, seed)
    c = K.estimate(sent, lo, received, device_hi=hi)
    assert abs(c.offset_ns - offset) <= c.uncertainty_ns
    assert c.uncertainty_ns <= ((hi - lo) + (received - sent)).min() / 2 + 32 + 2
    if n >= 100:
        assert c.uncertainty_ns < 600


def test_drift_and_agreement():
    a = K.estimate(*rounds(5_000, 20.0, 200, 1))
    b = K.estimate(*rounds(5_000, 20.0, 200, 2, start=10**12 + 60 * 10**9))
    d = K.drift(a, b)
    assert d.seconds == pytest.approx(60, abs=0.1)
    assert abs(d.ppm - 20.0) <= d.uncertainty_ppm + 1e-3 and d.uncertainty_ppm < 0.5
    same = K.estimate(*rounds(5_000, 0.0, 200, 3))
    assert K.agree(a, same)
    assert not K.agree(a, same._replace(offset_ns=same.offset_ns + 10 * (a.uncertainty_ns + same.uncertainty_ns)))


def test_bad_calibrations_are_refused():
    with pytest.raises(K.ClockError, match="one length"):
        K.estimate([1, 2], [1], [3, 4])
    with pytest.raises(K.ClockError, match="one length"):
        K.estimate([], [], [])
    with pytest.raises(K.ClockError, match="round 1 was answered before it was sent"):
        K.estimate([1, 10], [5, 6], [3, 4])
    with pytest.raises(K.ClockError, match="round 1's device interval ends before it begins"):
        K.estimate([1, 2], [5, 6], [3, 4], device_hi=[5, 5])
    a = K.Calibration(0.0, 1.0, 100, 1, "gpu0")
    with pytest.raises(K.ClockError, match="two calibrations of one clock"):
        K.drift(a, a._replace(device="gpu1", host_ns=200))
    with pytest.raises(K.ClockError, match="after the first"):
        K.drift(a, a)
    with pytest.raises(K.ClockError, match="a calibration is"):
        K.Calibration.from_dict({"offset_ns": "x"})


def _two_ranks(clock_of_rank, events, cal_of_rank=None, graph=None):
    """Two ranks' traces of stage x (task 0, CTA 0) at the given host ns, each read on
    its own device clock ``host + clock_of_rank[r]`` (globaltimer ticks are ns)."""
    from bufkit import empty, put
    from timeline import collect
    from timeline.contract import schema as S

    spec = S.Spec("tp", [("x", 1), ("y", 1)], world=2, clock=S.CLOCKS["globaltimer"], graph=graph or {})
    out = []
    for r in (0, 1):
        sp = spec.replace(rank=r)
        if cal_of_rank and cal_of_rank.get(r):
            sp = K.with_calibrations(sp, cal_of_rank[r])
        buf = empty(sp)
        for stage, host in events[r]:
            put(buf, sp, stage=stage, task=0, ticks=[h + clock_of_rank[r] for h in host], cta=0)
        out.append(collect(buf, sp))
    return out


def test_calibrate_without_a_gpu_says_so_in_one_line():
    """``instrument.calibrate`` where torch sees no CUDA device (or is given a CPU one)
    is a ``ClockError``, not torch's AssertionError."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the GPU tests calibrate it")
    import instrument

    for device in ("cuda", "cuda:1", "cpu", None):
        with pytest.raises(K.ClockError, match="calibrate needs a CUDA device"):
            instrument.calibrate(device)


def test_a_calibrated_merge_keeps_the_skew_a_stage_alignment_erases():
    """Rank 1 starts x 3 µs after rank 0 (host time); their device clocks differ by
    ~5 ms. Calibrated: the merge shows the 3 µs within the stated bounds; aligned on
    x it shows 0 — and says that is assumed."""
    from timeline import merge

    clock = {0: 10**12, 1: 10**12 + 5_000_123}
    base = 10**9
    events = {0: [("x", [base + i * 100 for i in range(5)]), ("y", [base + 10_000 + i * 100 for i in range(5)])],
              1: [("x", [base + 3_000 + i * 100 for i in range(5)]),
                  ("y", [base + 12_000 + i * 100 for i in range(5)])]}
    cal = {r: [K.Calibration(clock[r] + (17 if r else -20), 50.0, base - 10**9, 100, f"gpu{r}"),
               K.Calibration(clock[r] + (-9 if r else 30), 50.0, base + 10**9, 100, f"gpu{r}")] for r in (0, 1)}
    m = merge(_two_ranks(clock, events, cal))

    def x_start(t, r):
        rows = [x for x in t.tasks.to_pylist() if x["rank"] == r and x["stage"] == "x"]
        return rows[0]["start_ns"]

    skew = x_start(m, 1) - x_start(m, 0)
    (u0, u1) = (m.specs[r].extra["alignment"]["uncertainty_ns"] for r in (0, 1))
    # the bound: the calibrations' 50 ns, widened by their drift's uncertainty over the 1 s to the nearer one
    assert abs(skew - 3_000) <= u0 + u1 and 50 < u0 <= 100 and 50 < u1 <= 100 and m.notes == ()
    assert m.specs[0].extra["alignment"]["by"] == "clocks"
    staged = merge(_two_ranks(clock, events, cal), align="x:start")
    assert x_start(staged, 1) - x_start(staged, 0) == 0  # the skew erased
    assert staged.specs[0].extra["alignment"] == {"by": "stage x:start", "uncertainty_ns": None}
    assert "assumed" in staged.notes[0]
    half = merge(_two_ranks(clock, events, {0: cal[0]}))
    assert "ranks [1] carry no clock calibration" in half.notes[0]
    assert half.specs[1].extra["alignment"]["by"] == "first stamp"


def test_a_rank_captured_twice_keeps_the_calibrations_of_both_captures():
    """Rank 1 captured twice (one device clock), only the second capture calibrated:
    the merge places rank 1 by that calibration, not as uncalibrated; both captures'
    calibrations, each once, ride in the merged rank's spec."""
    from timeline import merge

    clock = {0: 10**12, 1: 10**12 + 5_000_123}
    base = 10**9
    events = {0: [("x", [base]), ("y", [base + 10_000])], 1: [("x", [base + 3_000]), ("y", [base + 12_000])]}
    cal = {r: [K.Calibration(clock[r], 50.0, base - 10**9, 100, f"gpu{r}"),
               K.Calibration(clock[r], 50.0, base + 10**9, 100, f"gpu{r}")] for r in (0, 1)}
    r0, r1 = _two_ranks(clock, events, cal)
    _, r1_bare = _two_ranks(clock, events, {0: cal[0]})
    m = merge([r0, r1_bare, r1])
    assert m.notes == () and m.specs[1].extra["alignment"]["by"] == "clocks"
    assert K.calibrations_of(m.specs[1]) == cal[1]
    assert K.calibrations_of(merge([r0, r1, r1]).specs[1]) == cal[1]


def test_calibrations_travel_in_the_trace_file(tmp_path):
    from timeline import load, merge

    clock = {0: 10**12, 1: 2 * 10**12}
    events = {r: [("x", [10**9 + i for i in range(5)])] for r in (0, 1)}
    cal = {r: [K.Calibration(clock[r], 40.0, 10**9, 10, f"gpu{r}")] for r in (0, 1)}
    m = merge(_two_ranks(clock, events, cal))
    back = load(m.save(tmp_path / "m.arrow"))
    assert [K.calibrations_of(sp) for sp in back.specs] == [cal[0], cal[1]]
    assert back.offsets == m.offsets and back.tasks.equals(m.tasks)
    assert K.alignment_of(back) == K.alignment_of(m)


def test_the_cli_states_each_ranks_calibration_and_alignment(tmp_path, capsys):
    from timeline.cli import main

    clock = {0: 10**12, 1: 2 * 10**12}
    events = {r: [("x", [10**9 + i for i in range(5)])] for r in (0, 1)}
    cal = {0: [K.Calibration(clock[0], 40.0, 10**9, 10, "gpu0"), K.Calibration(clock[0] + 60, 30.0, 11 * 10**9, 10, "gpu0")],
           1: [K.Calibration(clock[1], 70.0, 10**9, 10, "gpu1")]}
    paths = [t.save(tmp_path / f"r{i}.arrow") for i, t in enumerate(_two_ranks(clock, events, cal))]
    assert main([*map(str, ["merge", *paths, "-o", tmp_path / "m.arrow", "-q"])]) == 0
    out = capsys.readouterr().out
    assert "rank 1: by measured clocks, offset" in out and "± 70 ns" in out
    assert main(["info", str(tmp_path / "m.arrow")]) == 0
    info = capsys.readouterr().out
    # rank 0: 60 ns gained over 10 s is +0.006 ppm, ± (40 + 30) ns / 10 s
    assert "clock      rank 0: 2 calibration(s) against the host, best ± 30 ns, drift +0.006 ± 0.007 ppm" in info
    assert "clock      rank 1: 1 calibration(s) against the host, best ± 70 ns" in info
    assert "aligned    rank 0: by measured clocks" in info and "aligned    rank 1: by measured clocks" in info
    assert main(["summary", str(tmp_path / "m.arrow")]) == 0
    assert "ranks aligned by their measured clocks, each within ± 70 ns" in capsys.readouterr().out
    assert main(["merge", str(paths[0]), str(paths[1]), "-o", str(tmp_path / "s.arrow"), "-q", "--align", "x"]) == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "s.arrow")]) == 0
    assert "ranks aligned by stage x: ASSUMED" in capsys.readouterr().out



def test_cross_rank_causality_is_checked_against_the_alignment_uncertainty():
    """y waits (start -> hint) for an all-reduce of x. In host time rank 1's x is ready
    200 ns before either y's wait ends. A rank-1 calibration that places it e ns late
    leaves a cross-rank violation exactly when e - 200 exceeds the two ranks' stated
    uncertainty (50 + 50 ns). Rank 1 began x 3 µs before rank 0 began: a merge by first
    stamps moves it 3 µs late and shows the violation too."""
    from timeline.analysis import edges as E
    from timeline.contract import graph as G
    from timeline import merge

    clock = {0: 10**12, 1: 10**12 + 7_000_000}
    b = 10**9
    five = lambda t0: [t0 + 100 * k for k in range(5)]  # noqa: E731  start, hint, staged, compute, end
    events = {0: [("x", five(b)), ("y", [b + 3000, b + 3500, b + 3600, b + 3700, b + 3800])],
              1: [("x", [b - 3000, b - 2900, b - 2800, b + 3300, b + 3400]), ("y", [b + 3000 + 400, b + 3500, b + 3600, b + 3700, b + 3800])]}
    graph = {"y": [G.allreduce("x")]}

    def merged(error_ns):
        cal = {0: [K.Calibration(clock[0], 50.0, b, 100, "gpu0")],
               1: [K.Calibration(clock[1] - error_ns, 50.0, b, 100, "gpu1")]}
        return merge(_two_ranks(clock, events, cal, graph))

    def cross(t):
        return t.anomaly_summary().get("cross_rank_causality", 0)

    assert E.edges(merged(0)).violations.size == 0 and cross(merged(0)) == 0
    assert cross(merged(290)) == 0  # 90 ns past ready: within the 100 ns the two ranks may be off
    late = merged(310)
    assert cross(late) == 1 and "causality" not in late.anomaly_summary()
    row = [r for r in late.anomalies.to_pylist() if r["kind"] == "cross_rank_causality"]
    assert [(r["rank"], r["stage"], r["count"]) for r in row] == [(0, "y", 1)]
    assert [a.by for a in K.alignment_of(late)] == ["clocks", "clocks"]
    assert [a.uncertainty_ns for a in K.alignment_of(late)] == [50.0, 50.0]
    first = merge(_two_ranks(clock, events, None, graph))  # each rank's 0 is its first stamp
    assert cross(first) >= 1 and not any(a.measured for a in K.alignment_of(first))


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(-10**18, 10**18), drift_ns=st.integers(-5_000, 5_000), u=st.floats(0, 1e4),
       base=st.integers(10**15, 10**18), reads=st.lists(st.integers(-10**12, 10**12), min_size=1, max_size=20),
       two=st.booleans())
def test_on_host_many_is_on_host_value_for_value(offset, drift_ns, u, base, reads, two):
    """A run places thousands of launch starts at once (``on_host_many``): each exactly
    where ``on_host`` places it alone, one calibration or two (a drift between them)."""
    cals = [K.Calibration(offset, u, base, 10, "gpu")]
    if two:
        cals.append(K.Calibration(offset + drift_ns, u / 2, base + 10**10, 10, "gpu"))
    dev = [base + offset + r for r in reads]
    host, pm = K.on_host_many(cals, np.array(dev, dtype=np.int64))
    for i, x in enumerate(dev):
        one = K.on_host(cals, x)
        assert int(host[i]) == one.host_ns
        assert float(pm[i]) == pytest.approx(one.uncertainty_ns, rel=1e-9, abs=1e-9)
