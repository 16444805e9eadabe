"""Process-wide settings our own commands (``timeline``, ``timeline-view``) run with:
numpy asks for no transparent huge pages and glibc keeps freed large blocks, so a
process that decodes or analyses once neither stalls on page compaction nor faults
fresh pages in (bench/collect.py measures both ways). A library caller's process is
left as it is: only the commands call ``tune_process``. Imports nothing at load."""

import os

__all__ = ["BLAS_THREADS", "keep_freed_pages", "no_hugepage_madvise", "one_blas_thread", "tune_process"]

BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def one_blas_thread(environ=os.environ) -> list:
    """Size the BLAS libraries' thread pools to our commands' work, which has no matrix
    product: one thread, where the caller's environment does not say otherwise. numpy's
    OpenBLAS starts a pool of a thread per core when numpy is imported, each spinning a
    while before it sleeps: on a 16-core host, 15 threads of CPU at every command's start
    for nothing (issue 51). Call it before numpy is imported (then the setting is read);
    worker processes inherit it. Returns the variables it set."""
    unset = [k for k in BLAS_THREADS if k not in environ]
    for k in unset:
        environ[k] = "1"
    return unset


def no_hugepage_madvise() -> bool:
    """Stop numpy from asking the kernel for transparent huge pages on large arrays,
    process-wide: for a process that decodes once (this command), its first large
    allocations then skip page compaction (bench/collect.py measures both ways).
    Returns whether it could."""
    import numpy as np

    try:
        np._core.multiarray._set_madvise_hugepage(False)
    except AttributeError:  # pragma: no cover - numpy < 2 keeps it in np.core
        try:
            np.core.multiarray._set_madvise_hugepage(False)
        except AttributeError:
            return False
    return True


def keep_freed_pages() -> bool:
    """Have glibc's allocator keep freed large blocks for reuse, process-wide (mmap
    threshold 32 MB, its largest; trim threshold 1 GiB): a decode or an analysis then
    writes its columns into pages the process already holds instead of faulting fresh
    ones in (bench/collect.py measures both ways). Returns whether it could (False
    off glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def tune_process() -> None:
    """The memory settings of our own commands (``timeline``, ``timeline-view``):
    ``no_hugepage_madvise`` and ``keep_freed_pages``."""
    no_hugepage_madvise()
    keep_freed_pages()
