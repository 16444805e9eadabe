"""``timeline chip TRACE|RUN``: where on the chip a launch's time went, per hardware unit at
every level its placement has (XCD / SE / CU, or SM; wave slots), the imbalance of each
level, the grid's tail, each stage's span against its busiest unit, the slow unit named
with its interval and what rebalancing would give back (``timeline.query.chip``; the
document ``timeline.chip/1``, docs/CLI.md)."""

from __future__ import annotations

import sys

from timeline.cli.argtypes import integer

SWITCH_S = 1e-4  # the thread switch interval while scipy.stats imports beside the reading (the default: 5 ms)
HELP = "where on the chip time went: per XCD / SE / CU or SM busy, waiting, idle; imbalance; the tail; the slow unit"
EPILOG = ("examples:\n"
          "  timeline chip run.arrow                       # the typical and the slowest launch, and the units slow across launches\n"
          "  timeline chip RUN --launch 3:12 --units       # one launch, with every unit's row\n"
          "  timeline chip run.arrow --json                # the document timeline.chip/1 (docs/CLI.md)\n\n"
          "busy = a unit's own phases (its tasks' phases but the wait), waiting = the task graph's wait for\n"
          "producers, idle = no task; the tail starts when 90 % of the launch's tasks have ended. The slow unit\n"
          "is tested against its level's other units (Mann-Whitney, Benjamini-Hochberg over the level), and\n"
          "the what-if replay over the task graph says what running it at the typical speed, or the tail's\n"
          "stage spread evenly, would save (beside the replay's fidelity).")


def add_parser(subs, sub, json_option, selection_options) -> None:
    """The ``chip`` subcommand on ``subs`` (``sub``, ``json_option``, ``selection_options``:
    the CLI's own helpers)."""
    from timeline.query.chip_defaults import ACROSS

    p = sub(subs, "chip", "timeline.cli.chip_commands:cmd_chip", HELP, EPILOG)
    p.add_argument("trace", metavar="TRACE|RUN", help="a trace file, or a run directory")
    p.add_argument("--across", type=integer(0, 1 << 16), default=None, metavar="N",
                   help=f"read N launches (evenly spread) for the units slow across launches (default {ACROSS}; 0: none)")
    p.add_argument("--units", action="store_true", help="every unit's busy / waiting / idle row too")
    from timeline.cli.argtypes import confidence_option

    confidence_option(p)
    json_option(p)
    selection_options(p)


def _print_launch(d: dict) -> None:
    """One launch's part of the text report."""
    from timeline.cli.textout import format_table
    from timeline.analysis import launches as LA

    print(f"\nlaunch {d['launch']} ({d['why']}): kernel {d['kernel_us']} µs; levels {' > '.join(d['levels'])}")
    for r in d["ranks"]:
        w = r["window_us"] or 1
        print(f"  rank {r['rank']}: {r['tail']['says']} (from {r['tail']['from_us']} µs, when 90 % of its "
              f"{r['tail']['tasks']} tasks had ended); unit time busy {r['busy_us'] / w:.1f}, waiting "
              f"{r['wait_us'] / w:.1f}, idle {r['idle_us'] / w:.1f} units' worth")
        print(format_table(LA.rows_table(r["levels"])))
        print(format_table(LA.rows_table(r["stages"])))
        if "units" in r:
            print(format_table(LA.rows_table(r["units"])))
    c = d["culprit"]
    print(f"  slow unit: {c['says']}" if c else "  slow unit: none significant at any level (" + ", ".join(
        f"{s['level']} {s['unit']} q={s['q_value']:.3g}" for s in d["suspects"]) + ")")
    if d["culprit_peers"]:
        print("  slow on other ranks too (Hodges-Lehmann estimates): " + ", ".join(
            f"{p['unit']} {(p['slowdown'] - 1) * 100:+.1f} %" for p in d["culprit_peers"]))
    for s in d["rebalance"]:
        print(f"  rebalancing, {s['what']}: saves {s['saving_us']:.3f} µs ({s['measured_us']:.3f} -> "
              f"{s['predicted_us']:.3f}; replay fidelity ±{s['fidelity_us']:.3f} µs); {s['how']}")
    if d["rebalance_note"]:
        print(f"  note: {d['rebalance_note']}")
    print(f"  reproduce: {d['reproduce']}")


def _import_stats() -> None:
    """``import scipy.stats``; a failure is left for the command's own import to say."""
    import importlib

    try:
        importlib.import_module("scipy.stats")
    except Exception:  # noqa: BLE001 - the main thread's import raises it where it is used
        pass


def stats_ahead():
    """Start importing scipy.stats (its tests: half a second, the longest single part
    of ``timeline chip`` on a 10 M-interval trace) on a thread while this one reads the
    source; the interpreter switches threads every 0.1 ms meanwhile, so the reader,
    back from Arrow's and numpy's work outside the GIL, waits that long for it, not 5
    ms. Returns the function that waits for the import and restores the interval
    (nothing to wait for where scipy.stats is imported already)."""
    import threading

    if "scipy.stats" in sys.modules:
        return lambda: None
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    t = threading.Thread(target=_import_stats, name="import scipy.stats")
    t.start()

    def done() -> None:
        """Wait for the import; the switch interval as it was."""
        t.join()
        sys.setswitchinterval(interval)
    return done


def cmd_chip(args) -> int:
    """``timeline chip SRC``: the chip document, as JSON or text."""
    from timeline.cli.common import confidence_of, selection_of, source_of
    from timeline.cli.summary_commands import dump, source_cmd
    from timeline.query import chip as QCP

    done = stats_ahead()
    try:
        src = source_of(args.trace, args)
        ask = QCP.Ask(launches=args.launch, across=args.across, level=confidence_of(args), units=args.units)
        doc = QCP.chip(src, selection_of(args, launches=False), ask, source_text=source_cmd(args))
    finally:
        done()
    if args.json:
        dump(doc)
        return 0
    print(src.head())
    if doc["synthetic"]:
        print("SYNTHETIC: not measured on a GPU")
    for d in doc["launches"]:
        _print_launch(d)
    su = doc["slow_units"]
    if su:
        named = "; ".join(f"{u['unit']} in {u['launches']} of {u['of']} ({u['says']}; on ranks "
                          f"{', '.join(map(str, u['ranks']))})" for u in su["units"]) or "none"
        print(f"\nunits named slow across {su['launches']} launches: {named}")
    print(f"reproduce: {doc['reproduce']}")
    return 0


def synth_options(p) -> None:
    """``timeline synth``'s chip options (``timeline.ingest.synth_chip``)."""
    p.add_argument("--chip", action="store_true",
                   help="place the CTAs on the whole chip of --arch (gfx942: 8 XCDs x 38 CUs, gfx950: 8 x 32, sm_90: "
                        "132 SMs), one CTA a unit unless --grid; implies --profile glm5")
    p.add_argument("--slow-unit", action="append", metavar="UNIT:+PCT%",
                   help="a unit whose tasks' own phases take PCT %% longer: xcdN, xcdN.seM, xcdN.seM.cuK, cuN (the "
                        "N-th CU in chip order) or smN, e.g. xcd3:+20%%; implies --chip; repeatable")


def synth_chip(args):
    """``(grid, chip)`` for ``synth_graph.graph_trace`` from ``--chip`` / ``--slow-unit``
    (``grid``: --grid, else one CTA a unit), or None without them."""
    if not (getattr(args, "chip", False) or getattr(args, "slow_unit", None)):
        return None
    from timeline.ingest import synth_chip as SCH

    return SCH.chip(args.arch, args.grid, args.waves, [SCH.parse_slow(t) for t in args.slow_unit or []])


__all__ = ["EPILOG", "HELP", "SWITCH_S", "add_parser", "cmd_chip", "stats_ahead", "synth_chip", "synth_options"]
