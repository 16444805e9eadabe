"""``timeline changes RUN``: the steps from which a run got slower or faster, each
change point with its step's uncertainty, the layers and ranks it touches, the shift
with its interval and the culprit explain's A/B path names; slow drifts said as
drifts. Text, or the versioned JSON ``timeline.changes/1`` (docs/CHANGES.md); the
question is ``timeline.query.changes``, which the MCP tool ``changes`` asks too."""

from __future__ import annotations

import json
import shlex

from timeline.cli.argtypes import int_list

HELP = "the steps from which a run got slower or faster (change points), each explained to its culprit"
EPILOG = """examples:
  timeline changes RUN                     # change points over the run's steps, each explained
  timeline changes RUN --json              # the versioned document (docs/CHANGES.md)
  timeline changes RUN --rank 0,1 --no-explain   # the search and its statistics only

Per layer, the kernel time over steps, and per (rank, stage) the stage's span, are searched for
level shifts (ruptures' PELT over the l2 cost, each series in its own noise units, the penalty set so
that a run without a change reports one about 2% of the time), reading only the run's per-launch and
per-(rank, stage) summaries. Each change point: its step with a confidence set, the layers and ranks it
touches, the kernel time's shift with its interval (stats.shift), and explain's A/B path on the segment
after against the segment before (culprit, saving, replay fidelity). A slow drift is said once, as a
drift (docs/CHANGES.md)."""


def add_parser(subs, sub, json_option) -> None:
    """The ``changes`` subcommand on ``subs`` (``sub``, ``json_option``: the CLI's helpers)."""
    from timeline.cli.argtypes import confidence_option

    p = sub(subs, "changes", "timeline.cli.changes_commands:cmd_changes", HELP, EPILOG)
    p.add_argument("trace", metavar="RUN|TRACE", help="a run directory (or a trace file with slot headers)")
    p.add_argument("--rank", type=int_list, metavar="R[,R..]", help="only these ranks")
    p.add_argument("--no-explain", action="store_true", help="the search and its statistics only, no culprit")
    p.add_argument("--skip-damaged", action="store_true",
                   help="leave out a run's damaged parts, named on stderr, instead of stopping")
    confidence_option(p)
    json_option(p)


def _point_text(p: dict) -> list:
    """A change point's lines."""
    pct, sh = p["shift_pct"], p["shift"]
    ranks = f"; ranks {','.join(map(str, p['ranks']))}" if p["ranks"] else ""
    layers = ",".join(map(str, p["layers"]))
    out = [f"step {p['step']} (±{p['uncertainty_steps']}: {p['step_low']}..{p['step_high']}): {p['direction']} "
           f"{pct['estimate']:+.2f}% [{pct['low']}, {pct['high']}] = {sh['estimate_us']:+g} µs "
           f"[{sh['low_us']}, {sh['high_us']}] ({sh['level']:.0%}, by {sh['by']}); layers {layers}{ranks}",
           f"  before steps {p['before']['steps'][0]}-{p['before']['steps'][1]}: {p['before']['kernel_us']:g} µs; "
           f"after steps {p['after']['steps'][0]}-{p['after']['steps'][1]}: {p['after']['kernel_us']:g} µs",
           "  found in: " + ", ".join(p["found_in"])]
    if p["spans"]:
        out.append("  spans moved: " + "; ".join(f"rank {s['rank']} {s['stage']} {s['estimate_us']:+g} µs "
                                                f"[{s['low_us']}, {s['high_us']}]" for s in p["spans"]))
    c, x = p["culprit"], p["explained"]
    if c:
        fid = x.get("fidelity") if x else None
        fid = f" (replay fidelity: every task's end within {fid['task_end_ns']:g} ns)" if fid and c["from"] == "explain" \
            else ""
        save = f", saving {c['saving_us']:g} µs" if c.get("saving_us") is not None else ""
        out.append(f"  culprit ({x['what']}): {c['says']}{save}{fid}")
    elif x:
        out.append(f"  culprit: none significant ({x['verdict']})")
    out.append(f"  reproduce: {p['reproduce']}")
    if x and x.get("reproduce") != p["reproduce"]:
        out.append(f"  culprit's: {x['reproduce']}")
    return out


def text(doc: dict) -> str:
    """The document for reading."""
    lines = [f"{doc['kind']} {doc['source']} · {doc['kernel']}{' · SYNTHETIC' if doc['synthetic'] else ''} · "
             f"{doc['steps']} steps, {len(doc['layers'])} layer(s), {len(doc['ranks'])} rank(s)",
             f"search: {doc['search']['method']}; {doc['search']['series']} series"
             + (f", penalty {doc['search']['penalty']}" if doc["search"]["penalty"] is not None else ""),
             "", "verdict: " + doc["says"]]
    for p in doc["change_points"]:
        lines += [""] + _point_text(p)
    for d in doc["drifts"]:
        sh, pct = d["shift"], d["shift_pct"]
        lines += ["", f"drift from step {d['start_step']}: steps {d['to_steps'][0]}-{d['to_steps'][1]} against "
                      f"{d['from_steps'][0]}-{d['from_steps'][1]}: {pct['estimate']:+.2f}% [{pct['low']}, {pct['high']}] "
                      f"= {sh['estimate_us']:+g} µs [{sh['low_us']}, {sh['high_us']}]",
                  "  drifting: " + ", ".join(f"{s['series']} {s['per_step_ns']:+.1f} ns/step" if s["per_step_ns"] is not None
                                             else f"{s['series']} (its step the drift's)" for s in d["slopes"]),
                  f"  reproduce: {d['reproduce']}"]
    lines += ["", f"reproduce: {doc['reproduce']}"]
    return "\n".join(lines)


def cmd_changes(args) -> int:
    from timeline.analysis import stats as ST
    from timeline.cli.common import confidence_of, source_of
    from timeline.query import changes as QCH

    level = confidence_of(args)
    ST.prewarm()
    src = source_of(args.trace, args)
    doc = QCH.changes(src, args.rank, level=level, explain=not args.no_explain, source_text=shlex.quote(args.trace))
    print(json.dumps(doc, ensure_ascii=False, indent=1, default=str) if args.json else text(doc))
    return 0


__all__ = ["add_parser", "cmd_changes", "text"]
