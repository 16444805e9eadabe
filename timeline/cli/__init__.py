"""The ``timeline`` command: the parser and ``main`` (``parser``), the commands
(``commands``, ``graph_commands``, ``info_commands``) and their text output
(``textout``, ``argtypes``)."""

from timeline.cli.parser import main

__all__ = ["main"]
