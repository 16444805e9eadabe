"""Analyses of a ``Trace``, Arrow tables in and out; every one named here, imported
on first use:

- ``stages``: stage report, stage concurrency, idle per CTA, idle gaps, overlaps;
- ``critical``: the critical path, the one entry point (exact along the task graph
  when the trace has one, else a labelled heuristic);
- ``edges``: the trace against its task graph (gating edges, causality, the exact
  path and its hand-offs);
- ``whatif``: the replay of changed stage times over the task graph;
- ``compare``: a typical launch and the per-stage delta of two traces;
- ``legacy_reports``: the GLM-5 kernel's own host reports."""

from timeline.errors import TimelineError


class AnalysisError(TimelineError):
    """An analysis asked of a trace that cannot answer it (phases the analysis needs,
    an empty time window, no single rank or launch to report). A selection the trace
    does not have is ``timeline.core.rows.SelectionError``."""


# name -> the module that defines it (imported on first use)
_FACE = {
    **dict.fromkeys(["stage_report", "concurrency", "idle_per_cta", "idle_gaps", "overlapping_tasks",
                     "coarsen"], "timeline.analysis.stages"),
    **dict.fromkeys(["critical_path", "CRITICAL_PATH_SCHEMA", "heuristic_path", "path_method", "path_us"],
                    "timeline.analysis.critical"),
    **dict.fromkeys(["causality_anomalies", "edges_table", "exact_path", "handoffs", "path_shares", "path_steps"],
                    "timeline.analysis.edges"),
    **dict.fromkeys(["Change", "parse_change", "replay", "predict", "fidelity"], "timeline.analysis.whatif"),
    **dict.fromkeys(["median_per_stage", "median_launch", "typical_launch", "compare_table"],
                    "timeline.analysis.compare"),
    **dict.fromkeys(["legacy_report", "legacy_text", "profile_summary", "profile_csv"],
                    "timeline.analysis.legacy_reports"),
}

__all__ = ["AnalysisError", *_FACE]


def __getattr__(name):
    """``timeline.analysis.stage_report`` and the others of ``_FACE``, on first use."""
    if name not in _FACE:
        raise AttributeError(f"module 'timeline.analysis' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_FACE[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_FACE))
