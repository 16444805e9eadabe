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
