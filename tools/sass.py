"""NVIDIA SASS on a machine without a GPU: the instructions of a cubin (e.g.
``instrument.triton.compile_launch(...).asm["cubin"]``) through the ``nvdisasm``
that Triton ships. Not installed; the tests and the GPU benches' CPU checks use it."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path


def nvdisasm() -> Path:
    """Triton's own ``nvdisasm``."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"


def instructions(cubin: bytes) -> list:
    """The instructions of ``cubin`` in order, as text without addresses and ``;``."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([str(nvdisasm()), "-c", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("*/", 1)[1].split(";")[0].strip() for line in text.splitlines()
            if re.search(r"/\*[0-9a-f]{4}\*/", line)]
