"""``timeline compare A B``: per stage, B against A, of any pair of trace files and
runs; with ``--fail-over`` the CI gate, which always ends in ``PASS:``, ``FAIL:`` or
``UNDECIDED:`` and exits 0, 1 or 3 (``timeline.query.compare``: the question; here the
printing)."""

from __future__ import annotations

import json

from timeline.cli.common import UsageError

UNDECIDED_EXIT = 3  # the gate could not tell (too few launches, sides that do not compare)


def cmd_compare(args) -> int:
    from timeline.analysis.launches import rows_table
    from timeline.cli.common import selection_of, source_of
    from timeline.cli.textout import format_table
    from timeline.query import compare as QC

    from timeline.cli.common import confidence_of

    if args.fail_over is not None or args.stage is not None:
        return cmd_gate(args)
    level = confidence_of(args)
    doc = QC.compare(source_of(args.a, args), source_of(args.b, args), selection_of(args), args.scope, level)
    if args.json:
        print(json.dumps(doc, ensure_ascii=False, indent=1))
        return 0
    typical = ("a typical launch of each (the median over its (rank, launch) pairs); rank: the rank whose span moved "
               "most (per rank, the median over launches)") if args.scope == "launch" else "each trace whole"
    k = doc["kernel_time"]
    kernel = k["says"] if k else "kernel time: the sides do not compare: " + "; ".join(doc["reasons"])
    print(f"A {args.a} ({doc['launches_a']} launches)\nB {args.b} ({doc['launches_b']} launches)\n{kernel}\n{typical}; "
          f"Δ = B - A of the typical launch, µs; shift: the stage span's shift over the launches, its {level:.0%} "
          "interval [shift low, shift high] (null where too few launches bound it)\n")
    print(format_table(rows_table(doc["rows"])) if doc["rows"] else "no stage in both")
    return 0


def cmd_gate(args) -> int:
    """``compare A B --fail-over PCT [--stage X]``: the gate's one line (on FAIL with the
    culprit explain names); exit 1 on FAIL, 3 UNDECIDED, 0 PASS."""
    from timeline.analysis import gate as GT
    from timeline.cli.common import selection_of, source_of
    from timeline.query import compare as QC

    from timeline.cli.common import confidence_of

    if args.fail_over is None:
        raise UsageError("--stage gates one stage: give --fail-over PCT too (e.g. --fail-over 5%)")
    threshold = GT.parse_threshold(args.fail_over)
    level = confidence_of(args)
    doc = QC.gate(source_of(args.a, args), source_of(args.b, args), threshold, sel=selection_of(args),
                  stage=args.stage, level=level)
    print(json.dumps(doc, ensure_ascii=False, default=str) if args.json else doc["verdict"])
    return 1 if doc["failed"] else UNDECIDED_EXIT if not doc["decided"] else 0


__all__ = ["UNDECIDED_EXIT", "cmd_compare", "cmd_gate"]
