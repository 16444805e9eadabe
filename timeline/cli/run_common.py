"""What the ``timeline`` commands of a run directory share (``run_commands``,
``timeline.query.source``): opening the run as the command line says and JSON output."""

from __future__ import annotations

import json
import sys


def open_selected(path, args):
    """The run at ``path``, opened as the command line says (``--skip-damaged``), its
    left-out parts named on stderr."""
    from timeline.run.read import open_run

    run = open_run(path, on_damage="skip" if getattr(args, "skip_damaged", False) else "raise")
    say_damaged(run)
    return run


def say_damaged(run) -> None:
    """One warning line per part left out as damaged."""
    for p, why in run.damaged:
        print(f"warning: part {p} left out: {why}", file=sys.stderr)


def progress(name: str, args, total=None):
    """A progress bar on stderr, unless ``--quiet``."""
    from timeline.cli.textout import Progress

    return Progress(name, total=total, enabled=not getattr(args, "quiet", False))


def json_out(doc) -> None:
    """``doc`` as indented JSON on stdout."""
    print(json.dumps(doc, ensure_ascii=False, indent=1, default=str))


__all__ = ["json_out", "open_selected", "progress", "say_damaged"]
