"""``timeline synth --change`` / ``--drift``: the changes across steps
(``timeline.ingest.synth_changes``) read off the command line, checked against the run,
calibrated on the model, and turned into each step's injections. ``cmd_synth`` asks
``plan`` once and ``extra`` for each trace it makes."""

from __future__ import annotations

from typing import NamedTuple


def add_options(p) -> None:
    """``--change`` and ``--drift`` on ``synth``'s parser ``p``."""
    from timeline.ingest.synth_forms import CHANGE_FORM, DRIFT_FORM

    p.add_argument("--change", action="append", metavar="STEP:RANK:STAGE:TASK:PHASE:±AMOUNT[@LAYER]",
                   help=f"(with --steps) a change from a step on: {CHANGE_FORM.replace('%', '%%')}; implies --profile "
                        "glm5; repeatable")
    p.add_argument("--drift", action="append", metavar="STEP:RANK:STAGE:TASK:PHASE:+AMOUNT[@LAYER]",
                   help=f"(with --steps) a slow drift: {DRIFT_FORM.replace('%', '%%')}; implies --profile glm5; "
                        "repeatable")


class Plan(NamedTuple):
    """The parsed ``changes`` and each one's amount in ``ns`` (calibrated)."""

    changes: list
    ns: list

    def extra(self, first_step: int, count: int, layers: int, steps: int) -> list:
        """The injections of the ``count`` steps from ``first_step`` (launch numbers of a
        trace holding those steps)."""
        from timeline.ingest import synth_changes as SYC

        return SYC.injections(self.changes, self.ns, first_step, count, layers, steps) if self.changes else []

    def said(self) -> str:
        """What the command's last line adds: each change and its ns."""
        from timeline.ingest import synth_changes as SYC

        return SYC.said(list(zip(self.changes, self.ns)))


def asked(args) -> bool:
    """Whether the command line asks for changes across steps."""
    return bool(getattr(args, "change", None) or getattr(args, "drift", None))


def plan(args, trial) -> Plan:
    """The command line's changes, checked against ``--steps`` x ``--launches`` and
    calibrated: ``trial(step, injections)`` runs that step of the model (its layers'
    launches) and gives each launch's kernel time."""
    from timeline.ingest import synth_changes as SYC

    if not asked(args):
        return Plan([], [])
    if args.steps is None:
        from timeline.cli.common import UsageError

        raise UsageError("--change / --drift act from a step on: give --steps N (and -o DIR/ for a run)")
    changes = [SYC.parse_change(t) for t in args.change or []] + [SYC.parse_change(t, True) for t in args.drift or []]
    SYC.check_changes(changes, args.steps, args.launches)
    return Plan(changes, [SYC.calibrate(c, trial, args.launches, args.steps) for c in changes])


def kernel_times(trace):
    """Each launch's kernel time (ns) of ``trace``, in launch order."""
    from timeline.analysis import launches as LA

    return LA.kernel(LA.launch_times(LA.rank_rows(trace)))


__all__ = ["Plan", "add_options", "asked", "kernel_times", "plan"]
