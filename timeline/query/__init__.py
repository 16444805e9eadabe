"""Questions asked of a trace file or a run alike, answered as versioned documents: a
``Source`` (``source``: its launches by key, a selection checked against what it has,
a launch's or a selection's ``Trace``), ``launches`` (the launches by kernel time and
their quantiles), ``explain`` (why a launch, or B against A, is slow) and ``compare``
(per stage and rank, and the regression gate). The ``timeline`` command, the dashboard
and the MCP server ask these and print, draw or return the answer: one home for each.
A wing after ``run``: it imports contract, core, analysis, ingest and run."""
