"""runtime/logonce.py: one line per period across processes, remembered in a stamp file
(real files; times set with os.utime)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cluster.runtime import logonce


def test_the_same_line_is_due_once_per_period(tmp_path: Path) -> None:
    stamp = tmp_path / "x.stamp"
    assert logonce.due(stamp, "port taken", 60) is True
    assert logonce.due(stamp, "port taken", 60) is False
    assert logonce.due(stamp, "another problem", 60) is True  # a new line is said at once
    assert logonce.due(stamp, "another problem", 60) is False
    old = time.time() - 61
    os.utime(stamp, (old, old))
    assert logonce.due(stamp, "another problem", 60) is True


def test_a_stamp_from_the_future_counts_as_old(tmp_path: Path) -> None:
    """The wall clock stepped back: one extra line, not a silence as long as the step."""
    stamp = tmp_path / "x.stamp"
    assert logonce.due(stamp, "k", 60)
    future = time.time() + 3600
    os.utime(stamp, (future, future))
    assert logonce.due(stamp, "k", 60) is True
    assert logonce.due(stamp, "k", 60) is False


def test_a_stamp_that_cannot_be_written_leaves_the_line_due(tmp_path: Path) -> None:
    stamp = tmp_path / "missing-dir" / "x.stamp"
    assert logonce.due(stamp, "k", 60) is True
    assert logonce.due(stamp, "k", 60) is True
