"""Many single-bit flips of a trace file, beyond what the property test draws.

    python bench/trace_flips.py [--flips 6000] [--seed 1]

``tests/test_trace_file.py`` flips one bit 300 times a run (hypothesis). This draws
``--flips`` random (byte, bit) flips of each format's file of the same small
synthetic trace (2 ranks, 44 tasks) and loads each: a ``TraceFileError`` of one
line (``refused``), or exactly the saved timeline (``same``: padding, an unused
byte). Anything else (another exception, a different timeline, a refusal of more
than one line) is counted by kind with its first (format, byte, bit) printed, and
makes the exit status 1.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
from pathlib import Path

from timeline.contract import schema as S
from timeline.ingest import synth
from timeline.core.trace import TraceFileError, load

EXTS = (".arrow", ".parquet")


def outcome(path: Path, trace) -> str:
    """What loading ``path`` gives: ``refused``, ``same``, or the kind of fault."""
    try:
        back = load(path)
    except TraceFileError as e:
        return "refused" if "\n" not in str(e) else "refused in several lines"
    except Exception as e:  # noqa: BLE001 - what this bench looks for
        return f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    same = back.tasks.equals(trace.tasks) and back.specs == trace.specs and back.anomalies.equals(trace.anomalies)
    return "same" if same else "a different timeline"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flips", type=int, default=6000, help="flips of each format's file")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    trace = synth.synth_trace(S.Spec("k", [("a", 6), ("b", 5)], world=2, waves=2), grid=4, seed=3)
    rng = random.Random(a.seed)
    bad = False
    with tempfile.TemporaryDirectory() as d:
        for ext in EXTS:
            data = trace.save(Path(d) / f"t{ext}").read_bytes()
            flipped = Path(d) / f"flip{ext}"
            counts, first = collections.Counter(), {}
            for _ in range(a.flips):
                k, bit = rng.randrange(len(data)), rng.randrange(8)
                b = bytearray(data)
                b[k] ^= 1 << bit
                flipped.write_bytes(bytes(b))
                got = outcome(flipped, trace)
                counts[got] += 1
                first.setdefault(got, (k, bit))
            print(f"{ext}: {len(data)} bytes, {a.flips} flips (seed {a.seed}): "
                  + ", ".join(f"{n} {kind}" for kind, n in counts.most_common()))
            for kind, (k, bit) in first.items():
                if kind not in ("refused", "same"):
                    bad = True
                    print(f"  {kind}: first at byte {k} bit {bit}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
