"""Bytes a worker of ``pool.map_pieces`` writes to a file instead of sending them back
through the pool's pipe (a piece's Perfetto packets and texts are about its own size:
unpickling them cost the writer more than converting them): ``spill`` appends them to
the process's own file in a folder and says where they are (``Spilled``); the writer
copies a range into its output with ``os.sendfile`` or reads it back (``Spilled.read``,
``load``). ``Folder``: a folder of spill files removed when nothing holds it."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import weakref
from typing import NamedTuple

__all__ = ["Folder", "Spilled", "load", "spill"]


class Spilled(NamedTuple):
    """Where spilled bytes are: a file, an offset, a length."""

    path: str
    offset: int
    length: int

    def read(self) -> bytes:
        """The bytes, read back from their file."""
        with open(self.path, "rb") as f:
            return os.pread(f.fileno(), self.length, self.offset)


def spill(folder: str, blobs: list) -> list:
    """``blobs`` (bytes) appended to this process's spill file in ``folder``: their
    ``Spilled`` places."""
    path = os.path.join(folder, f"{os.getpid()}.spill")
    out = []
    with open(path, "ab") as f:
        at = f.tell()
        for b in blobs:
            f.write(b)
            out.append(Spilled(path, at, len(b)))
            at += len(b)
    return out


def load(place: Spilled):
    """An object ``spill`` wrote pickled."""
    return pickle.loads(place.read())


class Folder:
    """A temporary folder for spill files (``path``), removed with everything in it
    when this object is collected or the process exits."""

    def __init__(self, parent: str | None = None):
        self.path = tempfile.mkdtemp(prefix=".timeline-attach-", suffix=".spill", dir=parent)
        self._gone = weakref.finalize(self, shutil.rmtree, self.path, True)
