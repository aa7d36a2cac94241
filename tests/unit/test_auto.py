"""Auto runs: jobdef.txt files become priority-2 queue lines, once each."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.triggers import auto


def jobdef(home: Home, schedule: str, name: str, text: str) -> None:
    path = home.root / "auto" / schedule / name / "jobdef.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_jobdefs_are_queued_at_priority_2_once(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.create()
    jobdef(home, "nightly", "smoke", "# the nightly smoke test\ngs,pdfwrite lowres\n")
    jobdef(home, "nightly", "mu", "mupdf\n")
    jobdef(home, "weekly", "full", "gs\n")
    added = auto.enqueue(home, "nightly")
    assert [s.line() for s in added] == ["auto nightly-mu mupdf",
                                         "auto nightly-smoke gs,pdfwrite lowres"]
    assert auto.enqueue(home, "nightly") == []  # already queued
    queue = QueueFile(home.queue(2), home.queue_lock(2))
    assert [s.line() for s in queue.read()] == [s.line() for s in added]
    assert [s.line() for s in auto.enqueue(home, "weekly", ["full"])] == ["auto weekly-full gs"]


def test_bad_or_missing_jobdefs_are_logged_not_queued(tmp_path: Path, caplog) -> None:
    home = Home(tmp_path)
    home.create()
    jobdef(home, "nightly", "bad", "gs;reboot\n")
    jobdef(home, "nightly", "empty", "# nothing\n")
    jobdef(home, "nightly", "good", "gs\n")
    added = auto.enqueue(home, "nightly", ["bad", "empty", "good", "absent"])
    assert [s.line() for s in added] == ["auto nightly-good gs"]
    assert "bad/jobdef.txt" in caplog.text and "empty; expected" in caplog.text
    assert "no auto job nightly/absent/jobdef.txt" in caplog.text
    with pytest.raises(ValueError, match="nightly, weekly"):
        auto.enqueue(home, "hourly")
