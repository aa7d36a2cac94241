"""Where a run's per-run options come from (docs/runoptions.md section 2) and
where they are shown: clusterpush.py --opt (checked before anything is pushed), a
jobdef.txt's line and a sweep file's [run] table (both into the auto run's queue line), and
``clusteradmin info`` / the status snapshot of the queued run.

The pushes are real (the built-in copy into a master home on disk); the dropping is turned
into the queue line by the master's own scan (cluster.triggers.droppings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.cli import clusteradmin, clusterpush
from cluster.config import Config
from cluster.console import runinfo, status
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import auto, droppings

SWEEP_TOML = ('command = "echo {a}"\n[axes]\na = [1, 2]\n'
              '[run]\njob_timeout = "2h"\nexclusive = true\n')


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    return h


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "tree"
    (t / "src").mkdir(parents=True)
    (t / "src" / "a.c").write_text("int a;\n")
    return t


def push(home: Home, *args: str) -> int:
    return clusterpush.main(["--home", str(home.root), "--user", "alice", "--copy", *args])


def queued(home: Home, priority: int = 0) -> list[str]:
    """The priority's queue after the master's scan of the droppings."""
    queue = QueueFile.for_priority(home, priority)
    if priority == 0:
        droppings.scan_user_droppings(home, Config(), queue)
    return [spec.line() for spec in queue.read()]


def test_opt_words_reach_the_queue_line(home: Home, tree: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert push(home, "--tree", str(tree), "--opt", "job_timeout=2h", "--opt", "exclusive",
                "--opt", "groups=win64,fast", "gs", "lowres") == 0
    line = "user alice gs exclusive groups=win64,fast job_timeout=2h lowres"
    assert f"queueing: {line}" in capsys.readouterr().out
    assert queued(home) == [line]


@pytest.mark.parametrize(("opt", "message"), [
    ("slots=4", "--opt slots=4: 'slots' is not a per-run option; expected one of "
                "job_timeout,"),
    ("job_timeout=-1", "--opt: option job_timeout=-1: expected a duration"),
    ("job_timeout=nan", "--opt: option job_timeout=nan: expected a duration"),
    ("max_worker_instances=0", "expected a whole number from 1 to"),
    ("exclusive=yes", "option exclusive is a flag; expected exclusive without '='"),
    ("groups=a/b", "bad entry 'a/b'"),
    ("job_timeout", "option job_timeout needs a value"),
    ("lowres", "'lowres' is not a per-run option"),
])
def test_a_bad_opt_is_refused_before_anything_is_pushed(
        home: Home, tree: Path, capsys: pytest.CaptureFixture[str], opt: str,
        message: str) -> None:
    assert push(home, "--tree", str(tree), "--opt", opt, "gs") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (home.users / "alice").exists()
    assert queued(home) == []


@pytest.mark.parametrize(("args", "message"), [
    (["--opt", "name=a", "--opt", "after=a"], "after=a names the run itself (name=a)"),
    (["--opt", "job_timeout=1h", "job_timeout=2h"],
     "option job_timeout is also given as 'job_timeout=2h'; expected it once"),
    (["--opt", "exclusive", "--opt", "exclusive"], "option exclusive is also given as"),
    (["--opt", "exclusive", "abort"], "abort removes your runs; it takes no --opt"),
])
def test_opts_are_checked_together(home: Home, tree: Path,
                                   capsys: pytest.CaptureFixture[str], args: list[str],
                                   message: str) -> None:
    assert push(home, "--tree", str(tree), *args, "gs") == 2
    assert message in capsys.readouterr().err
    assert not (home.users / "alice").exists()


def test_a_sweep_push_carries_its_run_table_and_an_opt_replaces_one_of_it(
        home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sweep.toml").write_text(SWEEP_TOML)
    assert push(home, "--sweep", str(folder / "sweep.toml"), "--opt", "job_timeout=3h") == 0
    line = "user alice sweep exclusive job_timeout=3h sweep=sweep.toml"
    assert f"queueing: {line}" in capsys.readouterr().out
    assert queued(home) == [line]


def test_a_bad_run_table_pushes_nothing(home: Home, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sweep.toml").write_text(SWEEP_TOML.replace('"2h"', '"soon"'))
    assert push(home, "--sweep", str(folder / "sweep.toml")) == 2
    assert "key run.job_timeout: option job_timeout=soon: expected a duration" \
        in capsys.readouterr().err
    assert not (home.users / "alice").exists()


def jobdef(home: Home, name: str, text: str) -> None:
    path = home.root / "auto" / "nightly" / name / "jobdef.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_jobdef_lines_and_a_sweep_jobdefs_run_table_reach_the_auto_queue(
        home: Home, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sweep.toml").write_text(SWEEP_TOML)
    jobdef(home, "gs", "gs,pdfwrite highres job_timeout=2h max_worker_instances=1\n")
    jobdef(home, "model", f"sweep {folder} job_timeout=4h no_reschedule\n")
    jobdef(home, "bad", "gs queue_timeout=0\n")
    added = [spec.line() for spec in auto.enqueue(home, "nightly")]
    assert added == [
        "auto nightly-gs gs,pdfwrite highres job_timeout=2h max_worker_instances=1",
        "auto nightly-model sweep exclusive job_timeout=4h no_reschedule sweep=sweep.toml"]
    assert queued(home, 2) == added
    assert "bad/jobdef.txt" in caplog.text and "option queue_timeout=0: expected more " \
        "than 0" in caplog.text


def test_clusteradmin_info_and_the_status_snapshot_show_a_queued_runs_options(
        home: Home, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert push(home, "--tree", str(tree), "--opt", "queue_timeout=15m", "--opt",
                "no_reschedule", "gs", "lowres") == 0
    queued(home)
    capsys.readouterr()
    assert clusteradmin.main(["--home", str(home.root), "info", "p0:1"]) == 0
    out = capsys.readouterr().out
    assert "  run_options: no_reschedule queue_timeout=15m\n" in out, out
    snap = status.StatusReader().snapshot(home, Config(home=home.root))
    [run] = snap["queues"][0]["runs"]
    assert run["run_options"] == ["no_reschedule", "queue_timeout=15m"]
    assert "lowres" in run["options"] and "lowres" not in run["run_options"]


def test_a_run_without_options_shows_none(home: Home, tree: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert push(home, "--tree", str(tree), "gs") == 0
    queued(home)
    capsys.readouterr()
    assert clusteradmin.main(["--home", str(home.root), "info", "p0:1"]) == 0
    assert "run_options" not in capsys.readouterr().out
    assert runinfo.run_options("user alice gs lowres") == []
    assert runinfo.run_options("not a queue line") == []
    assert runinfo.run_options("git 0123abc gs every_node exclude=n1") == [
        "every_node", "exclude=n1"]


def test_the_running_run_and_an_archived_one_show_their_options(tmp_path: Path) -> None:
    """The running run's options (from its job.start's queue line) are in the snapshot's
    running entry and in its run_detail; an archived run's in its run_detail."""
    from tests.unit.test_console_status import NOW, RUN, archive, make_home, start_of

    home, cfg = make_home(tmp_path)
    line = "git 0123abcd gs job_timeout=2h max_cluster_instances=4"
    QueueFile.for_priority(home, 1).append(RunSpec.parse(line))
    home.job_start(1).write_text(start_of(RUN, line, 1).format(with_secret=True))
    reader = status.StatusReader()
    [run] = reader.snapshot(home, cfg, NOW)["running"]
    assert run["run_options"] == ["job_timeout=2h", "max_cluster_instances=4"]
    assert reader.run_detail(home, RUN)["info"]["run_options"] == \
        "job_timeout=2h max_cluster_instances=4"
    old = "20270101000000-p2-0001"
    archive(home, old, "auto nightly-x gs exclusive", "done", rows=[])
    assert reader.run_detail(home, old)["info"]["run_options"] == "exclusive"


def test_the_status_page_draws_the_options_as_text() -> None:
    """The page's script puts each queued run's and the running run's run_options into the
    page as text (an Options column, a line on the run's card), never as HTML."""
    from cluster.console import page

    text = page.render()
    assert "<th>Options</th>" in text
    assert '(run.run_options || []).join(" ")' in text
    assert 'text: "options: " + r.run_options.join(" ")' in text
    assert 'fill("queue-rows", rows, "No run is queued.", 9)' in text  # 9 columns now
    assert "innerHTML" not in text
