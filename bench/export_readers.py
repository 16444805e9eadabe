"""What the real readers make of each Chrome JSON form, on the bundled real traces.

    python bench/export_readers.py

For each trace and each form (``complete=False``: B/E pairs, the default;
``complete=True``: X events), loads the export into Perfetto's trace processor,
Chrome DevTools' trace engine and speedscope (``tests/readers.py``; ``make test``
installs them) and prints, per reader, the threads whose events differ from the
trace (name, ns, depth; for DevTools and speedscope, which show spans only, the
events of nonzero length), and speedscope's stack-repair warnings.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import readers as RD  # noqa: E402
import test_export_readers  # noqa: E402
from timeline import load  # noqa: E402
from timeline.export import write_chrome  # noqa: E402


def shifted(view: dict, base: int) -> dict:
    return {k: [e._replace(ts=e.ts - base) for e in v] for k, v in view.items()}


def main() -> int:
    t0 = time.time()
    cases = [(name, load(ROOT / "traces" / name)) for name in test_export_readers.BUNDLED] + [("edge (hand-built)", test_export_readers.edge_trace())]
    print(f"{'trace':28s} {'form':4s} {'threads':>7s} {'perfetto':>9s} {'devtools':>9s} {'speedscope':>10s} {'warnings':>8s}")
    with tempfile.TemporaryDirectory() as d:
        for name, trace in cases:
            want = RD.expected(trace)
            for complete in (False, True):
                path = Path(d) / "t.json"
                write_chrome(trace, path, complete=complete)
                base = test_export_readers.origin_ns(path)
                tp = len(test_export_readers.mismatches(want, shifted(RD.perfetto_view(path), base)))
                dt = len(test_export_readers.mismatches(want, shifted(RD.devtools_view(path), base), spans_only=True))
                warnings, sv = RD.speedscope_view(path)
                ss = len(test_export_readers.mismatches(want, sv, spans_only=True, relative=True))
                print(f"{name:28s} {'X' if complete else 'B/E':4s} {len(want):7d} {tp:9d} {dt:9d} {ss:10d} {len(warnings):8d}")
    print(f"(threads with any difference; {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
