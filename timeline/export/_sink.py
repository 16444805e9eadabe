"""Where an export's bytes go: a file the export opens itself, written by a thread
of its own while the next chunk is made, or a file object the caller holds (binary
or text), written in the caller's thread.

Why a thread: copying a chunk into the page cache is kernel time the export would
otherwise wait out chunk by chunk; ``write`` releases the GIL, so the next chunk's
text is built meanwhile (``bench/export.py`` times both); it writes a chunk in pieces
of ``WRITE_PIECE`` bytes (``bench/export_ab.py`` measured whole chunks against
pieces: the kernel's time for the same bytes several times less). At most ``DEPTH`` chunks
wait in the queue, so memory stays bounded. A write that fails (a full disk, a
vanished directory) is raised in the export's thread as one ``ExportError`` line,
at the next write or at the end; nothing is left waiting.
"""

from __future__ import annotations

import io
import queue
import threading
from pathlib import Path

from timeline.export._common import ExportError

DEPTH = 1  # chunks waiting for the writer thread beside the one it writes
WRITE_PIECE = 1 << 20  # bytes a write call: a chunk (~14 MB) written whole cost the kernel several times more


class _Threaded:
    """A binary file written by a thread of its own, chunk by chunk, in order."""

    def __init__(self, f, name: str):
        self.f, self.name, self.error = f, name, None
        self.q = queue.Queue(maxsize=DEPTH)
        self.t = threading.Thread(target=self._run, name=f"export-writer {name}", daemon=True)
        self.t.start()

    def _run(self) -> None:
        while (b := self.q.get()) is not None:  # drains to the end even after an error: no put ever blocks
            if self.error is None:
                try:
                    chunk = memoryview(b).cast("B")
                    for at in range(0, len(chunk), WRITE_PIECE):
                        self.f.write(chunk[at:at + WRITE_PIECE])
                except Exception as e:  # noqa: BLE001 - handed to the export's thread by _raise
                    self.error = e

    def _raise(self) -> None:
        """The writer's error in the export's thread: an ``OSError`` as one ``ExportError``
        line, anything else (a bug) as it is."""
        e = self.error
        if isinstance(e, OSError):
            raise ExportError(f"cannot write {self.name!r}: {e.strerror or e}; free space there or give "
                              "another path") from None
        if e is not None:
            raise e

    def write(self, b) -> None:
        self._raise()
        self.q.put(b)

    def close(self) -> None:
        self.q.put(None)
        self.t.join()
        try:
            self.f.close()
        except OSError as e:
            self.error = self.error or e
        self._raise()


class _Direct:
    """A caller's binary file, written in the caller's thread; not closed here."""

    def __init__(self, f):
        self.f = f

    def write(self, b) -> None:
        self.f.write(b)

    def close(self) -> None:
        pass


class _Text(_Direct):
    """Bytes in, text out: lets a text file (``sys.stdout``, ``io.StringIO``) take the export."""

    def write(self, b) -> None:
        self.f.write(bytes(b).decode())


def open_sink(path_or_file, example: str, *, text: bool = True):
    """The export's destination for a path (opened here, written by a thread) or an
    open file (binary, or text where ``text``; written directly, left open); an
    ``ExportError`` for a directory, a path whose directory does not exist
    (``example``: a file name to suggest) or a text file where bytes must go.
    Close it when done: that waits for the last write."""
    if hasattr(path_or_file, "write"):
        if not isinstance(path_or_file, io.TextIOBase):
            return _Direct(path_or_file)
        if not text:
            raise ExportError(f"this export is binary: open the file with mode 'wb', or give a path such as {example}")
        return _Text(path_or_file)
    path = Path(path_or_file)
    if path.is_dir():
        raise ExportError(f"{str(path)!r} is a directory; give a file name such as {example}")
    if not path.parent.exists():
        raise ExportError(f"cannot write {str(path)!r}: directory {str(path.parent)!r} does not exist; "
                          f"give a file in an existing directory, e.g. {example}")
    try:
        f = open(path, "wb")
    except OSError as e:
        raise ExportError(f"cannot write {str(path)!r}: {e.strerror or e}; give a path you can write") from None
    return _Threaded(f, str(path))
