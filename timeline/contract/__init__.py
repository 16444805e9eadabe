"""The contract every other part reads: what a timeline build records and where
(``schema``, with ``placement``, ``tables``, ``ticktime``), task graphs (``graph``),
device clocks against the host's (``clocks``) and known kernels' graphs (``presets``).
Imports nothing else of ``timeline``."""
