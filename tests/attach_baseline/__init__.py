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


def write_perfetto(att, path) -> int:
    """The merged ``.pftrace`` as the old ``write.write_perfetto`` wrote it; the
    timeline slices written."""
    from timeline.attach import write as AW
    from timeline.export import _common as XC
    from timeline.export.perfetto import write_perfetto as export_perfetto

    with open(path, "wb") as f:
        for r in sorted(att.frameworks):
            fw, shift = att.frameworks[r], att.axes[r].shift_ns
            prefix = f"rank {r} · " if len(att.frameworks) > 1 else ""
            f.write(perfetto_framework_bytes(fw.path, r, shift, prefix)[0] if fw.format == "kineto"
                    else AW._activity_packets(att, r))
        parents = {(m["rank"], m["launch"]): framework_tracks.thread_track(m["rank"], m["device"], m["stream"])
                   for m in att.matches.to_pylist()}
        return export_perfetto(att.trace, f, embed=XC.Embed(0, AW.PID_OFFSET, AW._names(att), parents))


def write_chrome(att, path) -> None:
    """The merged Chrome JSON (one rank, plain) as the old ``write.write_chrome`` wrote it."""
    from timeline.attach import write as AW
    from timeline.export import _common as XC
    from timeline.export.chrome import write_chrome as export_chrome

    (rank, fw), = att.frameworks.items()
    with jsonscan.open_bytes(fw.path) as src, open(path, "wb") as f:
        f.write(src.read(fw.json_end))
        export_chrome(att.trace.filter(ranks=[rank]), f, embed=XC.Embed(-att.axes[rank].shift_ns, AW.PID_OFFSET,
                                                                         AW._names(att)))
        f.write(b"\n" + src.read())
