"""Following a pushed run to its archive (cluster.cli.pushwait) and clusterpush --wait's
usage checks."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.cli import clusterpush, pushwait
from cluster.home import Home
from cluster.sweep import joblog


def archive_run(home: Home, name: str, queue: str, outcome: str = "done",
                changed: int | None = 0, differences: int | None = None) -> Path:
    folder = home.archive / name
    folder.mkdir(parents=True)
    (folder / "report.txt").write_text("report\n")
    if changed is not None:
        (folder / "result.json").write_text(json.dumps({"changed": changed}))
    info = f"queue {queue}\noutcome {outcome}\n"
    if differences is not None:
        info += f"differences {differences}\n"
    (folder / "run.info").write_text(info)
    return folder


def test_the_new_archive_of_the_queue_line_is_found(tmp_path: Path) -> None:
    home = Home(tmp_path)
    archive_run(home, "old", "user alice gs")
    before = pushwait.archived(home)
    polls: list[int] = []

    def on_poll() -> None:
        polls.append(1)
        if len(polls) == 2:
            archive_run(home, "other", "user bob gs")
            archive_run(home, "new", "user alice gs")

    folder = pushwait.wait_for_archive(home, "user alice gs", before, 60, on_poll=on_poll,
                                       sleep=lambda s: None)
    assert folder == home.archive / "new"


def test_the_wait_gives_up_after_its_timeout(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert pushwait.wait_for_archive(Home(tmp_path), "user alice gs", set(), 5,
                                     clock=lambda: now[0], sleep=sleep) is None
    assert now[0] >= 5


def test_the_verdict_is_0_unchanged_1_changed_3_incomplete(tmp_path: Path) -> None:
    home = Home(tmp_path)
    assert pushwait.verdict(archive_run(home, "a", "q", changed=0)) == 0
    assert pushwait.verdict(archive_run(home, "b", "q", changed=3)) == 1
    assert pushwait.verdict(archive_run(home, "c", "q", outcome="failed", changed=0)) == 3
    # Without the CI result (a sweep run): run.info's differences.
    assert pushwait.verdict(archive_run(home, "d", "q", changed=None, differences=2)) == 1
    assert pushwait.verdict(archive_run(home, "e", "q", changed=None)) == 0


def test_a_sweep_with_tasks_not_ok_is_1_and_all_ok_is_0(tmp_path: Path) -> None:
    home = Home(tmp_path)
    header = ("x",)
    for name, statuses in (("ok", ["ok", "ok"]), ("bad", ["ok", "invalid: no"]),
                           ("timed", ["timeout", "ok"])):
        folder = archive_run(home, name, "user alice sweep", changed=None)
        (folder / "sweep.json").write_text("{}")
        with joblog.open_joblog(folder / "results.tsv", header) as log:
            for seq, status in enumerate(statuses, 1):
                log.write(joblog.JoblogRow(seq, "n1", 1.0, 0.1, 0, 0, 0, 0, "true",
                                           (("x", str(seq)),), status, 1))
    assert pushwait.verdict(home.archive / "ok") == 0
    assert pushwait.verdict(home.archive / "bad") == 1
    assert pushwait.verdict(home.archive / "timed") == 1
    # A sweep run whose end step wrote no results.tsv: nothing says its tasks are ok.
    (home.archive / "ok" / "results.tsv").unlink()
    assert pushwait.verdict(home.archive / "ok") == 1


def test_wait_options_are_checked_before_anything_is_pushed(tmp_path: Path, capsys) -> None:
    base = ["--home", str(tmp_path / "home"), "--user", "alice", "--tree", str(tmp_path)]
    assert clusterpush.main([*base, "--junit", str(tmp_path / "j.xml")]) == 2
    assert "go with --wait" in capsys.readouterr().err
    assert clusterpush.main([*base, "--wait", "abort"]) == 2
    assert clusterpush.main([*base, "--wait", "--wait-timeout", "0"]) == 2
    # --fetch, --stop and --rerun go alone (checked before ssh is tried).
    assert clusterpush.main(["--master", "host", "--user", "alice", "--fetch", "r1",
                             "--wait"]) == 2
    assert "--fetch RUN goes alone" in capsys.readouterr().err
    assert clusterpush.main([*base, "--stop", "r1", "--rerun", "r2"]) == 2
    assert clusterpush.main([*base, "--dest", str(tmp_path), "gs"]) == 2
    assert "--dest says where --fetch" in capsys.readouterr().err
    assert not (tmp_path / "home" / "queue").exists() and not (tmp_path / "j.xml").exists()


def test_a_remote_wait_takes_only_a_run_started_after_the_commit(tmp_path: Path) -> None:
    """Over ssh the client knows when the master committed the push, not the archive
    before it: a run of the same line that started earlier (it ran while the push was
    queued behind it) is not the pushed one."""
    home = Home(tmp_path)
    commit = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    polls: list[int] = []

    def on_poll() -> None:
        polls.append(1)
        if len(polls) == 2:
            archive_run(home, "20270115075959-p0-aaaa", "user alice gs")
            archive_run(home, "20270115080000-p0-bbbb", "user alice gs")

    folder = pushwait.wait_for_archive(home, "user alice gs", set(), 60, on_poll=on_poll,
                                       since=commit, sleep=lambda s: None)
    assert folder == home.archive / "20270115080000-p0-bbbb"
