"""FlyDSL demo kernels for the timeline build: ``flydsl_mono`` (a persistent
three-stage mono kernel with a torch reference and ``--check``), ``probes`` (small
kernels whose ISA the tests and ``bench/isa_cost.py`` read), and ``isa`` (compile a
kernel for gfx942 / gfx950 without a GPU and read its final ISA)."""
