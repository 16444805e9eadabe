"""Demo mono kernels: small persistent kernels with the structure of the real ones
(stages, rotation task assignment, tagged-pair mailboxes) and a timeline build,
so the whole pipeline runs on real stamps. Each backend's demo imports its own
compiler lazily; this package imports nothing."""
