"""The ``Trace`` (``trace``: its tables, ``save`` / ``load``), the rules every reader of
its tables applies (``rows``) and the grouped numpy primitives the analyses build on
(``grouped``). Imports only ``timeline.contract``."""
