"""The ``timeline`` command's argument types (argparse ``type=``): plain Python, no
numpy or pyarrow, so that ``timeline --help`` starts fast."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list:
    """``"0,2,3"`` -> [0, 2, 3]; ``"0-3"`` -> [0, 1, 2, 3]."""
    out = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            a, dash, b = part.partition("-")
            out.extend(range(int(a), int(b) + 1) if dash else [int(a)])
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
