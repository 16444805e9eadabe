"""The dashboard's panels, one module each: ``trace`` (which trace, its filters and
banners), ``gantt`` (the Gantt, its zoom and the pinned task), ``tables`` (stage
report, idle per CTA, compare, sorting), ``export`` (the Chrome-trace download).
Each takes the ``viewer.state.App`` as its first argument and returns what its
callback sets; ``viewer.wiring`` connects them to the page."""
