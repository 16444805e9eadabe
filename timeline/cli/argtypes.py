"""The ``timeline`` command's argument types (argparse ``type=``): plain Python, no
numpy or pyarrow, so that ``timeline --help`` starts fast."""

from __future__ import annotations

import argparse


MAX_VALUES = 1 << 20  # what one list option may name: past every rank, launch or CTA count a trace has


def int_list(text: str) -> list:
    """``"0,2,3"`` -> [0, 2, 3]; ``"0-3"`` -> [0, 1, 2, 3]; at most ``MAX_VALUES`` values
    (a range is expanded: ``0-100000000`` would take seconds and gigabytes)."""
    out = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            a, dash, b = part.partition("-")
            lo, hi = (int(a), int(b)) if dash else (int(a), int(a))
            if hi - lo + 1 > MAX_VALUES - len(out):
                raise argparse.ArgumentTypeError(
                    f"{text!r} names more than {MAX_VALUES:,} values; name the ones to show")
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of integers (e.g. 0 or 0,2 or 0-3)") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names no integer")
    return out


def str_list(text: str) -> list:
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing")
    return out


def launch_keys(text: str) -> list:
    """``--launch``'s value: ``[LaunchKey]`` (``timeline.core.launchkey.parse_keys``:
    ``STEP:LAYER``, ``CAPTURE:SLOT`` or ``N``, comma-separated, numbers as ranges)."""
    from timeline.core.launchkey import LaunchKeyError, parse_keys

    try:
        return parse_keys(text)
    except LaunchKeyError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--launch {text!r}: ") or str(e)) from None


def integer(low: int = 0, high: int = 1 << 62):
    """An argparse type: an integer in ``[low, high]``, named in its error."""
    def parse(text: str) -> int:
        try:
            v = int(text.strip())
        except (ValueError, AttributeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is out of range: give an integer from {low:,} to {high:,}")
        return v

    parse.__name__ = "integer"
    return parse


def number(low: float = 0.0, high: float = 1e18, *, open_low: bool = False):
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` with ``open_low``)."""
    def parse(text: str) -> float:
        try:
            v = float(text.strip())
        except (ValueError, AttributeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if v != v or v in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if v < low or (open_low and v == low) or v > high:
            lo = f"above {low:g}" if open_low else f"from {low:g}"
            raise argparse.ArgumentTypeError(f"{v:g} is out of range: give a number {lo} to {high:g}")
        return v

    parse.__name__ = "number"
    return parse


def confidence_option(p) -> None:
    """``--confidence PCT`` on parser ``p``: the level of every interval and test a command
    prints (read by ``common.confidence_of``, ``gate.parse_confidence``'s grammar)."""
    p.add_argument("--confidence", metavar="PCT", default=None,
                   help="the confidence level of every interval and test (default 95%%; 95%% or 0.95)")
