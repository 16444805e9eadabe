"""Fixtures shared by the test modules (helpers they share live in the *kit modules)."""

from __future__ import annotations

import pytest

from viewerkit import make_trace_dir


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    """``(trace directory, path of a trace outside it)``: ``viewerkit.make_trace_dir``;
    read only."""
    return make_trace_dir(tmp_path_factory.mktemp("viewer"))
