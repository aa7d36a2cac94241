"""Sweeps (docs/sweeps.md) on a real cluster on this machine: a master and two real nodes.

One cluster (``max_result_bytes`` 1 MiB) serves the module, its cases in order:

1. the sweep of :mod:`tests.sweepcase` (a real Python program over a 54-row table, an input
   file, a text and a binary result file and stdout, ``[validate]`` with every rule and a
   check script that rejects each ninth row, ``retries = 1``, a plain and a blockwise
   ``[collect]``): ``results.tsv``, every valid task's files and the collected files are
   exactly what running the same commands one by one by hand gives; the rejected rows are
   reported invalid with the check's reason after two tries, one on each node, and the
   report lists them and what each node did;
2. ``clusterpush.py --sweep F --resume`` once the check accepts every row: only the rejected
   tasks run again (counted), and the resumed run's archive covers every task;
3. bad input at run time: commands writing far more than ``max_result_bytes`` (into a
   result file, into stdout, into a file that is no result) are failed with that reason
   and nothing of them is kept, while the other tasks are fine; a check script that hangs
   is ended by the sweep's ``timeout``, and so is a command that hangs; a result file that
   is a symbolic link is not taken; a hostile result name is refused at submission.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.sweep.attempts import Attempt, read_attempts
from cluster.sweep.expand import Task, tasks
from cluster.sweep.joblog import JoblogRow, read_joblog
from cluster.sweep.spec import load
from tests import sweepcase
from tests.helpers import FAST, REPO, free_port

pytestmark = pytest.mark.e2e

ROWS = 54
#: The rows the check script rejects in the first run.
REJECTED = tuple(range(9, ROWS + 1, 9))
USER = "alice"
MAX_RESULT_BYTES = 1 << 20
RUN_TIMEOUT = 120.0


@dataclass
class Swept:
    """The first run of the sweep and what running its tasks by hand gave."""

    cluster: LocalCluster
    sweep: Path
    archive: Path
    tasks: list[Task]
    by_hand: dict[str, dict[str, bytes]]  # task id -> result name -> bytes

    def rows(self, archive: Path | None = None) -> list[JoblogRow]:
        return list(read_joblog((archive or self.archive) / "results.tsv"))


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swept]:
    root = tmp_path_factory.mktemp("sweep-cluster")
    settings = {**FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": "0", "max_result_bytes": str(MAX_RESULT_BYTES)}
    cluster = LocalCluster(root / "home", 2, overrides=settings)
    cluster.prepare()
    sweep = sweepcase.write_sweep(root / "sweep", ROWS, REJECTED)
    everything = list(tasks(load(sweep)))
    expected = {t.task_id: sweepcase.by_hand(t, sweep.parent, root / "hand" / t.task_id)
                for t in everything}
    try:
        cluster.start()
        archive = sweepcase.submit(cluster, sweep, USER, timeout=RUN_TIMEOUT)
        yield Swept(cluster, sweep, archive, everything, expected)
    finally:
        cluster.stop(grace=10)


def test_results_tsv_has_each_tasks_row_params_status_and_tries(swept: Swept) -> None:
    rows = swept.rows()
    assert [r.seq for r in rows] == list(range(1, ROWS + 1))  # task order, each once
    for row, task in zip(rows, swept.tasks, strict=True):
        k = int(task.row.values[0])
        assert row.params == (("k", str(k)), ("group", f"g{k % 3}"),
                              ("label", sweepcase.label(k))), row
        assert row.command == task.command
        assert row.host in ("node1", "node2"), row
        if k in REJECTED:
            assert (row.status, row.attempts) == (
                f"invalid: check.sh exited 1: rejected k={k}", 2), row
        else:
            assert (row.status, row.attempts) == ("ok", 1), row
        # Exit status 3 is allowed by the sweep: its row says 3 and ok.
        assert (row.exitval, row.signal) == (3 if k % 10 == 0 else 0, 0), row
        # Send: the bytes of the task's input files; Receive: of its result files that came
        # home (GNU parallel's Receive: stdout and the files it returns).
        assert row.send == sum(len(text.encode()) for _, text in task.inputs)
        assert row.receive == sum(map(len, swept.by_hand[task.task_id].values()))
    # The label went to the program as one argument, unexpanded ("$(echo no)" stays).
    out = swept.by_hand[swept.tasks[0].task_id]["out"]
    assert out == b"k=1 seq=1 label=w1 x;y $(echo no) square=1\n"
    # The run's table: one row per task, valid ones error 0 (an allowed exit 3 included).
    table = read_tab(swept.archive / f"{swept.archive.name}.tab")
    assert sorted(table) == sorted(t.task_id for t in swept.tasks)
    assert {t.task_id for t in swept.tasks if table[t.task_id].error == 0} == {
        t.task_id for t in swept.tasks if int(t.row.values[0]) not in REJECTED}


def test_every_valid_tasks_files_are_byte_for_byte_those_made_by_hand(swept: Swept) -> None:
    results = swept.archive / "results"
    for task in swept.tasks:
        folder = results / task.task_id
        kept = {p.name: p.read_bytes() for p in folder.iterdir()}
        if int(task.row.values[0]) in REJECTED:
            # The last try's files stay, for reading.
            assert sorted(kept) == ["data", "log", "out"], folder
            continue
        assert kept == swept.by_hand[task.task_id], task
        # The binary result came through whole: every byte value, then k.
        assert kept["data"] == bytes(range(256)) + int(task.row.values[0]).to_bytes(2, "big")
    assert {p.name for p in results.iterdir()} == {t.task_id for t in swept.tasks}


def test_the_collected_files_are_the_valid_results_concatenated_in_task_order(
        swept: Swept) -> None:
    valid = [(t, swept.by_hand[t.task_id]) for t in swept.tasks
             if int(t.row.values[0]) not in REJECTED]
    expected = sweepcase.collected(valid)
    assert sorted(expected) == ["all.txt", "by-group/g0.bin", "by-group/g1.bin",
                                "by-group/g2.bin"]
    assert sweepcase.files_under(swept.archive / "collected") == expected


def test_a_rejected_task_was_tried_on_both_nodes_every_other_once(swept: Swept) -> None:
    tries: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in read_attempts(swept.archive / "sweep-attempts.tsv"):
        tries[attempt.task].append(attempt)
    assert sorted(tries) == sorted(t.task_id for t in swept.tasks)
    for task in swept.tasks:
        k = int(task.row.values[0])
        mine = tries[task.task_id]
        if k in REJECTED:
            reason = f"invalid: check.sh exited 1: rejected k={k}"
            assert [(a.attempt, a.status, a.final) for a in mine] == [
                (1, reason, False), (2, reason, True)], mine
            assert {a.node for a in mine} == {"node1", "node2"}, mine
        else:
            assert [(a.attempt, a.status, a.final) for a in mine] == [(1, "ok", True)], mine
    # The rows name the node of the try that stands for the task.
    rows = {r.seq: r for r in swept.rows()}
    for task in swept.tasks:
        assert rows[task.number].host == tries[task.task_id][-1].node


def test_the_report_lists_the_failed_parameter_sets_and_each_nodes_tries(
        swept: Swept) -> None:
    text = (swept.archive / "report.txt").read_text(encoding="utf-8")
    ok = ROWS - len(REJECTED)
    assert (f"Sweep sweep.toml: {ROWS} tasks: {ok} ok, {len(REJECTED)} invalid, 0 failed, "
            "0 timed out.") in text
    failed = [f"  #{k} k={k} group=g{k % 3} label={sweepcase.label(k)!r}: invalid: check.sh "
              f"exited 1: rejected k={k}" for k in REJECTED]
    assert f"Failed parameter sets ({len(REJECTED)}):\n" + "\n".join(failed) + "\n" in text
    tries = Counter(a.node for a in read_attempts(swept.archive / "sweep-attempts.tsv"))
    not_ok = Counter(a.node for a in read_attempts(swept.archive / "sweep-attempts.tsv")
                     if not a.ok)
    assert sum(tries.values()) == ROWS + len(REJECTED)
    assert sum(not_ok.values()) == 2 * len(REJECTED)
    for node in ("node1", "node2"):
        assert tries[node] > 0, tries
        assert re.search(rf"^  {node}: {tries[node]} tries, [0-9.]+ seconds, "
                         rf"{not_ok[node]} not ok$", text, re.MULTILINE), text
    sizes = {path: len(data) for path, data in
             sweepcase.files_under(swept.archive / "collected").items()}
    for path, size in sizes.items():
        assert f"  {path}: {size} bytes\n" in text


def test_resume_after_the_check_is_fixed_runs_only_the_failed_tasks(swept: Swept) -> None:
    cluster = swept.cluster
    sweepcase.set_rejected(swept.sweep.parent, ())
    before = cluster.archives()
    pushed = subprocess.run(
        [sys.executable, str(REPO / "clusterpush.py"), *cluster.config_args(), "--user", USER,
         "--sweep", str(swept.sweep), "--resume"],
        cwd=swept.sweep.parent, capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 0, pushed.stderr
    first = swept.archive.name
    line = f"user {USER} sweep resume={first} sweep=sweep.toml"
    assert f"queueing: {line}" in pushed.stdout
    archive = cluster.wait_for_run(RunSpec.parse(line), before, RUN_TIMEOUT)
    # Counted: the run had F jobs, the failed tasks, and the master says so.
    table = read_tab(archive / f"{archive.name}.tab")
    redone = sorted(t.task_id for t in swept.tasks if int(t.row.values[0]) in REJECTED)
    assert sorted(table) == redone
    assert all(row.error == 0 for row in table.values())
    log = (cluster.home.log_dir / "clustermaster.log").read_text(errors="replace")
    assert (f"resume: {len(REJECTED)} of {ROWS} tasks to run, {ROWS - len(REJECTED)} valid "
            f"in run {first}") in log
    tries = list(read_attempts(archive / "sweep-attempts.tsv"))
    assert sorted(a.task for a in tries) == redone
    # The resumed run's archive covers every task: all ok, every file, all collected.
    rows = list(read_joblog(archive / "results.tsv"))
    assert [r.seq for r in rows] == list(range(1, ROWS + 1))
    assert [r.status for r in rows] == ["ok"] * ROWS
    for task in swept.tasks:
        folder = archive / "results" / task.task_id
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == \
            swept.by_hand[task.task_id], task
    expected = sweepcase.collected((t, swept.by_hand[t.task_id]) for t in swept.tasks)
    assert sweepcase.files_under(archive / "collected") == expected
    text = (archive / "report.txt").read_text(encoding="utf-8")
    assert f"Sweep sweep.toml: {ROWS} tasks: {ROWS} ok, 0 invalid, 0 failed" in text
    assert (f"Resumed run {first}: the results of {ROWS - len(REJECTED)} tasks were taken "
            "from it.") in text
    # The sweep's own table holds every task, the resumed ones' rows kept, and the
    # baseline of pushed trees and commits was never touched.
    stream = read_tab(cluster.home.tables / f"sweep.user.{USER}.sweep.toml.tab")
    assert sorted(stream) == sorted(t.task_id for t in swept.tasks)
    assert not (cluster.home.tables / "current.tab").exists()

    # Resuming a sweep that is complete runs nothing, and still archives every task.
    before = cluster.archives()
    again = subprocess.run(
        [sys.executable, str(REPO / "clusterpush.py"), *cluster.config_args(), "--user", USER,
         "--sweep", str(swept.sweep), "--resume"],
        cwd=swept.sweep.parent, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    line = f"user {USER} sweep resume={archive.name} sweep=sweep.toml"
    assert f"queueing: {line}" in again.stdout
    third = cluster.wait_for_run(RunSpec.parse(line), before, RUN_TIMEOUT)
    assert (third / f"{third.name}.tab").read_text() == ""
    assert [r.status for r in read_joblog(third / "results.tsv")] == ["ok"] * ROWS
    assert sweepcase.files_under(third / "collected") == expected
    assert sorted(p.name for p in (third / "results").iterdir()) == sorted(
        t.task_id for t in swept.tasks)
    log = (cluster.home.log_dir / "clustermaster.log").read_text(errors="replace")
    assert f"resume: 0 of {ROWS} tasks to run, {ROWS} valid in run {archive.name}" in log


#: The bad-input sweep: each row's ``what`` says what its command does (work.sh).
HOSTILE_WORK = """\
#!/bin/sh
echo "fine $1" > out.txt
echo "done $1"
case "$1" in
    bigfile) exec head -c 3000000 /dev/zero > out.txt ;;
    bigstdout) exec head -c 3000000 /dev/zero ;;
    bigother) exec head -c 3000000 /dev/zero > scratch.dat ;;
    slow) exec sleep 20 ;;
    symlink) rm out.txt; exec ln -s /etc/os-release out.txt ;;
esac
"""
HOSTILE_CHECK = """\
#!/bin/sh
# Hangs for the row 'hang' (the sweep's timeout must end it), accepts every other.
if grep -qx 'fine hang' "$1/out"; then sleep 60; fi
exit 0
"""
HOSTILE_SWEEP = """\
command = "sh work.sh {what}"
table = "what.csv"
timeout = 3
retries = 0

[results]
out = "out.txt"
log = "stdout"

[validate]
script = "check.sh"
"""
HOSTILE_ROWS = ("fine1", "bigfile", "bigstdout", "bigother", "hang", "slow", "symlink",
                "fine2")


def test_a_task_over_max_result_bytes_is_failed_and_a_hanging_check_times_out(
        swept: Swept, tmp_path: Path) -> None:
    """Each row of HOSTILE_ROWS does one bad thing (work.sh); the run states each with its
    reason, keeps nothing of the big writes anywhere and the good rows' files whole."""
    folder = tmp_path / "hostile"
    folder.mkdir()
    (folder / "work.sh").write_text(HOSTILE_WORK)
    (folder / "check.sh").write_text(HOSTILE_CHECK)
    (folder / "check.sh").chmod(0o755)
    (folder / "what.csv").write_text("what\n" + "\n".join(HOSTILE_ROWS) + "\n")
    (folder / "sweep.toml").write_text(HOSTILE_SWEEP)
    archive = sweepcase.submit(swept.cluster, folder / "sweep.toml", "mallory",
                               timeout=RUN_TIMEOUT)
    rows = list(read_joblog(archive / "results.tsv"))
    status = {r.params[0][1]: (r.status, r.attempts, r.exitval, r.signal) for r in rows}
    over = f"failed: results over max_result_bytes ({MAX_RESULT_BYTES} bytes)"
    assert status == {
        "fine1": ("ok", 1, 0, 0),
        # Stopped by the file-size limit (128 + SIGXFSZ) once past max_result_bytes.
        "bigfile": (over, 1, 153, 0), "bigstdout": (over, 1, 153, 0),
        "bigother": (over, 1, 153, 0),
        "hang": ("invalid: check.sh timed out after 3 s", 1, 0, 0),
        # The task's own timeout: GNU parallel's way of writing a job it timed out.
        "slow": ("timeout", 1, -1, 15),
        # A result file that is a link (here to a file of the node's system) is not taken.
        "symlink": ("invalid: result out is missing", 1, 0, 0),
        "fine2": ("ok", 1, 0, 0)}
    assert [r.seq for r in rows] == list(range(1, len(HOSTILE_ROWS) + 1))
    report = (archive / "report.txt").read_text(encoding="utf-8")
    assert "Sweep sweep.toml: 8 tasks: 2 ok, 2 invalid, 3 failed, 1 timed out." in report
    assert f"  #2 what=bigfile: {over}\n" in report
    ids = {t.row.values[0]: t.task_id for t in tasks(load(folder / "sweep.toml"))}
    for what in ("fine1", "fine2", "hang"):
        kept = archive / "results" / ids[what]
        assert (kept / "out").read_bytes() == f"fine {what}\n".encode()
        assert (kept / "log").read_bytes() == f"done {what}\n".encode()
    linked = archive / "results" / ids["symlink"]
    assert sorted(p.name for p in linked.iterdir()) == ["log"]
    assert not (linked / "log").is_symlink()
    for what in ("bigfile", "bigstdout", "bigother"):
        kept = archive / "results" / ids[what]
        assert not kept.exists() or not any(kept.iterdir()), list(kept.iterdir())
    # Nothing of the big writes is kept anywhere: not on the master, not on the nodes.
    home = swept.cluster.home_dir
    big = [p for p in home.rglob("*") if p.is_file() and p.stat().st_size > MAX_RESULT_BYTES]
    assert big == []


def test_a_hostile_result_name_is_refused_at_submission_nothing_pushed(
        swept: Swept, tmp_path: Path) -> None:
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "t.csv").write_text("a\n1\n")
    (folder / "sweep.toml").write_text(
        "command = 'echo {a}'\ntable = 't.csv'\n[results]\nout = '../../x'\n")
    pushed = subprocess.run(
        [sys.executable, str(REPO / "clusterpush.py"), *swept.cluster.config_args(),
         "--user", "eve", "--sweep", str(folder / "sweep.toml")],
        cwd=folder, capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 2
    assert "sweep.toml: key results.out: " in pushed.stderr and "'..'" in pushed.stderr, \
        pushed.stderr
    assert not (swept.cluster.home.users / "eve").exists()
