"""``timeline-view``, the Dash dashboard of mono-kernel timelines. ``app`` (the command
line), ``wiring`` (the Dash app: page, routes, callbacks), ``page`` (layout, CSS,
tables), ``state`` (the server's state and callback plumbing), ``ids`` (each
callback's outputs by name), ``client`` (what a request may carry; the view state),
``panels`` (each panel's logic), ``model`` (rows and window search over numpy
arrays), ``raster`` (server-side occupancy image), ``figures`` (figure builders),
``sources`` (which trace files a page may open). It reads trace files through
``timeline`` and is imported by nothing there."""
