"""The Kineto reader and its Perfetto conversion as they were before issue 42's speed
work (main at ef9f72c), frozen: the reference the faster code must equal byte for byte
(tests/test_attach_same.py). Not installed, never imported by timeline/."""

from __future__ import annotations

from attach_baseline import framework_tracks, jsonscan, kineto

__all__ = ["framework_tracks", "jsonscan", "kineto", "perfetto_framework_bytes"]


def perfetto_framework_bytes(path, rank: int = 0, shift_ns: int = 0, prefix: str = "") -> tuple:
    """The framework part of the merged ``.pftrace`` as the old ``write_perfetto``
    wrote it (its two passes), and its ``Converted``."""
    meta = framework_tracks.flows_and_names(path, rank)
    gen = framework_tracks.packets(path, rank, shift_ns, meta, prefix)
    out = []
    while True:
        try:
            out.append(next(gen))
        except StopIteration as stop:
            return b"".join(out), stop.value
