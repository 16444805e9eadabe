"""Development tools that drive the installed packages from a checkout: the FlyDSL
compile-only ISA harness (``isa``), the headless-Chromium helpers (``browser``),
the dashboard screenshot (``screenshot``) and the SYNTHETIC GLM-5 kernel ``trace.pt`` of
traces/glm5_legacy_synthetic (``glm5_legacy_trace``). Not installed."""
