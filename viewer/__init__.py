"""``timeline-view``, the Dash dashboard of mono-kernel timelines: ``viewer.app`` (the
page and the command line), ``viewer.model`` (rows and window search over numpy
arrays), ``viewer.raster`` (server-side occupancy image), ``viewer.figures`` (figure
builders), ``viewer.sources`` (which trace files a page may open),
``viewer.browser`` / ``viewer.screenshot`` (headless Chromium for tests and docs).
It reads trace files through ``timeline`` and is imported by nothing there."""
