"""timeline.clocks: the ping-pong calibration's arithmetic on rounds with a known
offset and random trips, drift from two calibrations, and bad input refused."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline import clocks as K


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
@given(st.integers(-10**15, 10**15), st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_the_true_offset_lies_within_the_stated_uncertainty(offset, n, seed):
    sent, device, received = rounds(offset, 0.0, n, seed)
    c = K.estimate(sent, device, received, name="gpu0")
    assert abs(c.offset_ns - offset) <= c.uncertainty_ns + 0.5
    best = int(np.argmin(received - sent))
    assert c.uncertainty_ns == (received[best] - sent[best]) / 2 and c.rounds == n and c.device == "gpu0"
    assert K.Calibration.from_dict(c.to_dict()) == c


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
    a = K.Calibration(0.0, 1.0, 100, 1, "gpu0")
    with pytest.raises(K.ClockError, match="two calibrations of one clock"):
        K.drift(a, a._replace(device="gpu1", host_ns=200))
    with pytest.raises(K.ClockError, match="after the first"):
        K.drift(a, a)
    with pytest.raises(K.ClockError, match="a calibration is"):
        K.Calibration.from_dict({"offset_ns": "x"})
