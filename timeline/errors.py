"""The root of the library's documented errors.

Every error a user can cause (a bad buffer, spec, file, selection, command line or
request) is a ``TimelineError`` subclass defined beside the concept it is about
(``SpecError`` in ``contract.schema``, ``CollectError`` in ``ingest``,
``AnalysisError`` in ``analysis``, ...; docs/CODE.md lists them). Its message is one
line: what is wrong, where, and how to fix it. The ``timeline`` command and the
dashboard print such an error as that line (``isinstance(e, TimelineError)``);
anything else is a bug and keeps its traceback. It is a ``ValueError``, as every
documented error always was, so code that caught those keeps working."""

__all__ = ["TimelineError"]


class TimelineError(ValueError):
    """Input the library refuses, with a message that says what, where and how to fix it."""
