"""Auto runs: jobdef.txt files become priority-2 queue lines, once each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.errors import ClusterError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
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


def test_bad_or_missing_jobdefs_are_logged_not_queued(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
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


def test_no_job_definitions_says_where_it_looked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
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


# ---------------------------------------------------------------------------- auto sweeps
def sweep_folder(folder: Path, command: str = "echo {a}", name: str = "sweep.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.csv").write_text("a\n1\n2\n3\n")
    (folder / name).write_text(f"command = {command!r}\ntable = 'params.csv'\n")
    return folder / name


def test_a_sweep_jobdef_is_checked_and_queued_as_that_schedules_sweep_run(
        tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    job = home.root / "auto" / "nightly" / "model"
    sweep_folder(job / "folder")                               # beside the jobdef
    sweep_folder(tmp_path / "elsewhere", name="big.toml")      # absolute, another file name
    jobdef(home, "nightly", "model", "# our model\nsweep folder relaxtimeout\n")
    jobdef(home, "nightly", "other", f"sweep {tmp_path}/elsewhere/big.toml\n")
    jobdef(home, "weekly", "up", "sweep ../../nightly/model/folder/\n")  # relative, with ..
    added = auto.enqueue(home, "nightly")
    assert [s.line() for s in added] == [
        "auto nightly-model sweep relaxtimeout sweep=sweep.toml",
        "auto nightly-other sweep sweep=big.toml"]
    assert [s.line() for s in auto.enqueue(home, "weekly")] == [
        "auto weekly-up sweep sweep=sweep.toml"]
    assert auto.enqueue(home, "nightly") == []  # already queued
    assert [s.line() for s in QueueFile(home.queue(2), home.queue_lock(2)).read()] == [
        "auto nightly-model sweep relaxtimeout sweep=sweep.toml",
        "auto nightly-other sweep sweep=big.toml", "auto weekly-up sweep sweep=sweep.toml"]


def test_a_bad_sweep_jobdef_is_logged_naming_it_and_not_queued(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home = Home(tmp_path / "home")
    home.create()
    job = home.root / "auto" / "nightly"
    sweep_folder(job / "typo" / "s", command="echo {alhpa}")
    jobdef(home, "nightly", "typo", "sweep s\n")
    jobdef(home, "nightly", "nofolder", "sweep\n")
    jobdef(home, "nightly", "option", "sweep relaxtimeout\n")
    jobdef(home, "nightly", "gone", "sweep /nonexistent/sweep\n")
    jobdef(home, "nightly", "badopt", "sweep s lowres\n")
    sweep_folder(job / "badopt" / "s")
    assert auto.enqueue(home, "nightly") == []
    text = caplog.text
    assert "typo/jobdef.txt: sweep.toml: key command: unknown placeholder {alhpa}" in text
    assert "nofolder/jobdef.txt" in text and "a sweep jobdef names its sweep folder" in text
    assert "'relaxtimeout' is neither a folder nor a file" in text
    assert "'/nonexistent/sweep' is neither a folder nor a file" in text
    assert "option 'lowres' does not go with product sweep" in text
    assert not home.queue(2).exists() or QueueFile(home.queue(2), home.queue_lock(2)).read() \
        == []


def test_snapshot_sweep_copies_the_folder_the_jobdef_names_as_a_push_sends_it(
        tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    folder = tmp_path / "team" / "model"
    sweep_folder(folder)
    (folder / "build").mkdir()
    (folder / "build" / "x.o").write_text("left out as a push leaves it out")
    (folder / "data").mkdir()
    (folder / "data" / "in.txt").write_text("data\n")
    jobdef(home, "weekly", "model", f"sweep {folder}\n")
    [spec] = auto.enqueue(home, "weekly")
    dest = home.run_dir("r1") / "source" / "sweep"
    assert auto.snapshot_sweep(home, spec, dest) == folder.resolve()
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "data", "data/in.txt", "params.csv", "sweep.toml"]
    assert [p.name for p in dest.parent.iterdir()] == ["sweep"]  # no temporary left
    with pytest.raises(ClusterError, match="exists; expected a new path"):
        auto.snapshot_sweep(home, spec, dest)
    # The jobdef changed to another kind of run meanwhile: said, naming the jobdef.
    jobdef(home, "weekly", "model", "gs\n")
    with pytest.raises(ClusterError, match=r"weekly/model/jobdef.txt no longer names a "
                       r"sweep of the sweep file sweep.toml"):
        auto.snapshot_sweep(home, spec, home.run_dir("r2") / "source" / "sweep")
    with pytest.raises(ValueError, match="is not an auto run of a jobdef"):
        auto.jobdef_of(home, RunSpec.parse("user bob sweep"))
