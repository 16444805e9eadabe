"""The launch key (``timeline.core.launchkey``): one printed form and one parser, for
trace files and runs alike. Property tests: every key prints to text that parses back
to it; every text the parser takes or refuses, it takes or refuses in one line."""

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.core import launchkey as KY

nums = st.integers(0, 10**9)
captures = st.text(string.ascii_letters + string.digits + "._-:+", min_size=1, max_size=24).filter(
    lambda s: not s.replace("-", "").isdigit() and not s.endswith(":") and not s.startswith(":") and "::" not in s
    and not KY._is_number(s.rpartition(":")[0] or "x") and not s.rpartition(":")[2].isdigit())
keys = st.one_of(st.builds(lambda s, y: KY.LaunchKey(s, y), nums, nums), st.builds(lambda c, s: KY.LaunchKey(capture=c, slot=s), captures, nums),
                 st.builds(lambda s: KY.LaunchKey(slot=s), nums))


@given(keys)
def test_every_key_prints_to_text_that_parses_back_to_it(key):
    assert KY.parse_keys(str(key)) == [key]


@given(st.lists(keys, min_size=1, max_size=6, unique=True))
def test_a_comma_list_parses_to_its_keys_in_order(ks):
    assert KY.parse_keys(",".join(map(str, ks))) == ks


def test_ranges_expand_in_both_positions():
    assert KY.parse_keys("4:0-2") == [KY.LaunchKey(4, 0), KY.LaunchKey(4, 1), KY.LaunchKey(4, 2)]
    assert KY.parse_keys("1-2:7") == [KY.LaunchKey(1, 7), KY.LaunchKey(2, 7)]
    assert KY.parse_keys("0-2") == [KY.LaunchKey(slot=i) for i in range(3)]
    assert KY.parse_keys("s5i.arrow:40-41") == [KY.LaunchKey(capture="s5i.arrow", slot=40),
                                                KY.LaunchKey(capture="s5i.arrow", slot=41)]
    # a capture name may hold ':' (run add --capture X of several files names them X:FILE)
    assert KY.parse_keys("x:r0.arrow:3") == [KY.LaunchKey(capture="x:r0.arrow", slot=3)]


def test_a_key_matches_the_launch_it_names():
    full = KY.LaunchKey(4, 3, "cap.arrow", 40)
    assert KY.LaunchKey(4, 3).matches(full) and not KY.LaunchKey(4, 2).matches(full)
    assert KY.LaunchKey(capture="cap.arrow", slot=40).matches(full)
    assert KY.LaunchKey(slot=40).matches(full) and not KY.LaunchKey(slot=41).matches(full)


@pytest.mark.parametrize("text", ["", " ", ",", "a", "-1", "3-1", "4:", ":4", "4:x", "x:", "1:2:3-", "0-99999999",
                                  "4:-1", "cap:2-1", "1.5", "nan", "4:3:2:1-0"])
def test_anything_else_is_one_line(text):
    with pytest.raises(KY.LaunchKeyError) as e:
        KY.parse_keys(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--launch ")


@settings(max_examples=300)
@given(st.text(max_size=30))
def test_any_text_parses_or_is_one_launch_key_error(text):
    try:
        out = KY.parse_keys(text)
    except KY.LaunchKeyError as e:
        assert "\n" not in str(e)
    else:
        assert out and all(isinstance(k, KY.LaunchKey) for k in out)
        assert all(str(k) for k in out)
