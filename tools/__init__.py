"""Development tools that drive the installed packages from a checkout: the FlyDSL
compile-only ISA harness (``isa``), the headless-Chromium helpers (``browser``) and
the dashboard screenshot (``screenshot``). Not installed."""
