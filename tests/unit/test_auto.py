"""Auto runs: jobdef.txt files become priority-2 queue lines, once each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.triggers import auto
from tests.helpers import REPO


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


def test_no_job_definitions_says_where_it_looked(tmp_path: Path, caplog) -> None:
    home = Home(tmp_path)
    home.create()
    assert auto.enqueue(home, "weekly") == []
    assert f"no weekly auto jobs to queue: looked for {tmp_path}/auto/weekly/*/jobdef.txt" \
        in caplog.text
    assert f"{tmp_path}/auto/weekly does not exist" in caplog.text
    caplog.clear()
    (tmp_path / "auto" / "weekly" / "empty").mkdir(parents=True)
    auto.enqueue(home, "weekly")
    assert "auto/weekly holds no <name>/jobdef.txt" in caplog.text


@pytest.mark.parametrize("options, source", [
    (["--home", "{home}"], "the --home option"),
    (["--set", "home={home}"], "a --set home=... option"),
])
def test_the_command_line_fails_and_names_the_home_and_its_source(
        tmp_path: Path, options: list[str], source: str) -> None:
    """Run as cron runs it (--quiet): the message still reaches cron's mail; exit 1."""
    argv = [o.format(home=tmp_path) for o in options]
    done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), *argv, "--quiet",
                           "nightly"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    assert f"looked for {tmp_path}/auto/nightly/*/jobdef.txt" in done.stderr
    assert f"the master home {tmp_path} comes from {source}" in done.stderr
    assert done.stdout == ""
