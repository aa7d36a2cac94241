"""The end of a sweep run, on run folders built by hand as the master's intake leaves them.

A sweep folder with a table (in the run's snapshot), the tries as lines of
``runs/<id>/sweep-attempts.tsv``, the task folders in ``runs/<id>/results/``; then the
real end step (:func:`cluster.master.end.sweepend.end_sweep`) and the sweep report, checked
against what each task's lines and files say: ``results.tsv`` parsed back row by row, the
collected files byte for byte, a ``resume`` run merging its predecessor's rows and folders,
a redo after a kill giving the same archive, and the report's sections.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.console import status, sweepdetail
from cluster.home import Home
from cluster.master.end import sweepend
from cluster.report import sweepreport
from cluster.runspec import RunSpec
from cluster.sweep import outcomes, spec
from cluster.sweep.attempts import Attempt, AttemptsWriter
from cluster.sweep.expand import Task, tasks
from cluster.sweep.joblog import JoblogRow, read_joblog
from cluster.wire.jobstart import JobStart

SWEEP_TOML = """\
command = "python3 model.py --a {a} --b {b}"
table = "params.csv"
retries = 1
[inputs]
"in.txt" = "a={a}\\n"
[results]
out = "out.txt"
log = "stdout"
[collect]
"all.txt" = { from = "out" }
"by-a/{a}.txt" = { from = "out" }
"logs.txt" = { from = "log" }
"""
#: Six rows; the value a/b must not make a folder in collected/ (it is encoded).
PARAMS = "a,b\nx,1\ny,2\nx,3\na/b,4\ny,5\nx,6\n"
RUN1 = "20260101120000-p0-aaaa"
RUN2 = "20260102120000-p0-bbbb"


def sweep_folder(home: Home, run_id: str, params: str = PARAMS) -> Path:
    """The run's snapshot of the pushed sweep folder; returns its sweep file."""
    folder = home.run_dir(run_id) / "source" / "sweep"
    folder.mkdir(parents=True)
    (folder / "sweep.toml").write_text(SWEEP_TOML)
    (folder / "params.csv").write_text(params)
    (folder / "model.py").write_text("print('never run here')\n")
    return folder / "sweep.toml"


def the_tasks(sweep_file: Path) -> list[Task]:
    return list(tasks(spec.load(sweep_file)))


def start_of(run_id: str) -> JobStart:
    return JobStart(id=run_id, priority=0, queue="user alice sweep", kind="user",
                    ref="alice", products=("sweep",), tree="sweep",
                    source=f"runs/{run_id}/source/sweep", build="true", tests="tests")


def write_tries(home: Home, run_id: str, tries: list[Attempt]) -> None:
    writer = AttemptsWriter(home.run_dir(run_id) / sweepend.ATTEMPTS_FILE)
    try:
        for attempt in tries:
            writer.write(attempt)
    finally:
        writer.close()


def write_files(home: Home, run_id: str, task: Task, out: str) -> None:
    folder = home.run_dir(run_id) / "results" / task.task_id
    folder.mkdir(parents=True)
    (folder / "out").write_text(out)
    (folder / "log").write_text(f"log of {task.number}\n")


def attempt(task: Task, node: str, start: float, status: str, number: int,
            final: bool = True, exit_status: int = 0) -> Attempt:
    return Attempt(task.task_id, node, start, 1.5 * task.number, exit_status, 10 + number,
                   status, number, final)


def first_run(home: Home) -> list[Task]:
    """Run 1 as the intake leaves it: task 1 ok; 2 invalid, then ok on another node; 3
    failed twice; 4 timed out; 5 ok twice (a speculative copy: the first wins); 6 never
    tried.  Task folders for every task that sent files, and leftovers that must not
    move."""
    made = the_tasks(sweep_folder(home, RUN1))
    t1, t2, t3, t4, t5, _t6 = made
    write_tries(home, RUN1, [
        attempt(t1, "n1", 100.0, "ok", 1),
        attempt(t2, "n1", 101.0, "invalid: out is empty", 1, final=False),
        attempt(t3, "n2", 102.0, "failed: exit status 2", 1, final=False, exit_status=2),
        attempt(t2, "n2", 103.0, "ok", 2),
        attempt(t4, "n1", 104.0, "timeout", 1, exit_status=124),
        attempt(t3, "n1", 105.0, "failed: exit status 2", 2, exit_status=2),
        attempt(t5, "n2", 106.0, "ok", 1),
        attempt(t5, "n1", 107.0, "ok", 1),
    ])
    for task, out in ((t1, "one\n"), (t2, "two\n"), (t3, "three?\n"), (t5, "five\n")):
        write_files(home, RUN1, task, out)
    (home.run_dir(RUN1) / "results" / "incoming").mkdir()
    (home.run_dir(RUN1) / "results" / "incoming" / "n1.1.1.tar").write_bytes(b"x")
    return made


def row(task: Task, host: str, start: float, status: str, tries: int, exitval: int = 0,
        signal: int = 0, receive: int = 11) -> JoblogRow:
    params = tuple(zip(("a", "b"), task.row.values, strict=True))
    send = len(f"a={task.row.values[0]}\n".encode())
    runtime = 1.5 * task.number if host else 0.0
    return JoblogRow(task.number, host, start, runtime, send, receive, exitval, signal,
                     task.command, params, status, tries)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    made = Home(tmp_path / "home")
    made.create()
    return made


def test_results_tsv_has_one_row_per_task_from_its_standing_try(home: Home) -> None:
    t1, t2, t3, t4, t5, t6 = first_run(home)
    made = sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    assert made is not None and made.error == "" and made.tasks == 6
    archive = home.archive / RUN1
    assert list(read_joblog(archive / "results.tsv")) == [
        row(t1, "n1", 100.0, "ok", 1),
        row(t2, "n2", 103.0, "ok", 2, receive=12),
        row(t3, "n1", 105.0, "failed: exit status 2", 2, exitval=2, receive=12),
        row(t4, "n1", 104.0, "timeout", 1, exitval=-1, signal=15),
        row(t5, "n2", 106.0, "ok", 2),  # the first valid result wins
        row(t6, "", 0.0, outcomes.NOT_RUN, 0, exitval=-1, receive=0),
    ]
    header = (archive / "results.tsv").read_text().splitlines()[0].split("\t")
    assert header == ["Seq", "Host", "Starttime", "JobRuntime", "Send", "Receive", "Exitval",
                      "Signal", "Command", "a", "b", "status", "attempts"]
    # The task folders moved into the archive; the intake's leftovers did not.
    assert sorted(p.name for p in (archive / "results").iterdir()) == sorted(
        t.task_id for t in (t1, t2, t3, t5))
    assert (archive / "results" / t2.task_id / "out").read_text() == "two\n"
    assert not (home.run_dir(RUN1) / "results" / t1.task_id).exists()
    assert (home.run_dir(RUN1) / "results" / "incoming" / "n1.1.1.tar").exists()
    assert (archive / "sweep-attempts.tsv").read_bytes() == \
        (home.run_dir(RUN1) / "sweep-attempts.tsv").read_bytes()


def test_collected_files_are_the_valid_tasks_results_in_task_order(home: Home) -> None:
    first_run(home)
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    collected = home.archive / RUN1 / "collected"
    files = sorted(str(p.relative_to(collected)) for p in collected.rglob("*") if p.is_file())
    assert files == ["all.txt", "by-a/x.txt", "by-a/y.txt", "logs.txt"]
    assert (collected / "all.txt").read_text() == "one\ntwo\nfive\n"
    assert (collected / "by-a" / "x.txt").read_text() == "one\n"
    assert (collected / "by-a" / "y.txt").read_text() == "two\nfive\n"
    assert (collected / "logs.txt").read_text() == "log of 1\nlog of 2\nlog of 5\n"
    summary = sweepend.read_summary(home.archive / RUN1)
    assert summary is not None
    assert [(c["target"], c["files"], c["tasks"]) for c in summary.collect] == [
        ("all.txt", ["all.txt"], 3), ("by-a/{a}.txt", ["by-a/x.txt", "by-a/y.txt"], 3),
        ("logs.txt", ["logs.txt"], 3)]


def test_a_value_with_a_slash_is_collected_under_its_encoded_name(home: Home) -> None:
    made = the_tasks(sweep_folder(home, RUN1))
    t4 = made[3]
    assert t4.row.values[0] == "a/b"
    write_tries(home, RUN1, [attempt(t4, "n1", 1.0, "ok", 1)])
    write_files(home, RUN1, t4, "four\n")
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    collected = home.archive / RUN1 / "collected"
    assert (collected / "by-a" / "a%2Fb.txt").read_text() == "four\n"
    assert t4.collect_targets[1] == "by-a/a%2Fb.txt"  # submission names it the same
    assert not (collected / "by-a" / "a").exists()


def test_the_step_done_again_after_a_kill_gives_the_same_archive(home: Home) -> None:
    first_run(home)
    run = RunSpec.parse("user alice sweep")
    sweepend.end_sweep(home, start_of(RUN1), run)
    archive = home.archive / RUN1
    before = {str(p.relative_to(archive)): p.read_bytes()
              for p in archive.rglob("*") if p.is_file()}
    (archive / "collected" / "all.txt").unlink()  # killed half way through the collection
    (archive / "results.tsv").write_text("torn")
    sweepend.end_sweep(home, start_of(RUN1), run)
    after = {str(p.relative_to(archive)): p.read_bytes()
             for p in archive.rglob("*") if p.is_file()}
    assert after == before


def test_a_resume_run_takes_the_rows_and_folders_of_tasks_it_did_not_run(
        home: Home) -> None:
    t1, t2, t3, t4, t5, t6 = first_run(home)
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    first_rows = list(read_joblog(home.archive / RUN1 / "results.tsv"))
    # Run 2 resumes run 1: it runs the tasks without a valid result (3, 4, 6).
    sweep_file = sweep_folder(home, RUN2)
    write_tries(home, RUN2, [attempt(t3, "n2", 200.0, "ok", 1),
                             attempt(t4, "n1", 201.0, "ok", 1),
                             attempt(t6, "n2", 202.0, "invalid: no match", 1)])
    write_files(home, RUN2, t3, "three\n")
    write_files(home, RUN2, t4, "four\n")
    write_files(home, RUN2, t6, "six?\n")
    made = sweepend.archive_sweep(home, RUN2, sweep_file, resumed=RUN1)
    assert (made.resumed, made.taken, made.tasks) == (RUN1, 3, 6)
    archive = home.archive / RUN2
    rows = list(read_joblog(archive / "results.tsv"))
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0] == first_rows[0] and rows[1] == first_rows[1] and rows[4] == first_rows[4]
    assert rows[2] == row(t3, "n2", 200.0, "ok", 1)
    assert rows[3] == row(t4, "n1", 201.0, "ok", 1)
    assert rows[5] == row(t6, "n2", 202.0, "invalid: no match", 1)
    # The resumed tasks' folders are hard links of run 1's.
    for task in (t1, t2, t5):
        mine = archive / "results" / task.task_id / "out"
        theirs = home.archive / RUN1 / "results" / task.task_id / "out"
        assert os.stat(mine).st_ino == os.stat(theirs).st_ino
    collected = archive / "collected"
    assert (collected / "all.txt").read_text() == "one\ntwo\nthree\nfour\nfive\n"
    assert (collected / "by-a" / "x.txt").read_text() == "one\nthree\n"
    assert (collected / "by-a" / "a%2Fb.txt").read_text() == "four\n"


def test_a_resumed_row_whose_task_changed_is_not_taken(home: Home) -> None:
    first_run(home)
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    # Row 1 of the table now says x,10: another task, though at the same Seq.
    sweep_file = sweep_folder(home, RUN2, PARAMS.replace("x,1\n", "x,10\n"))
    made = sweepend.archive_sweep(home, RUN2, sweep_file, resumed=RUN1)
    assert made.taken == 5  # every row but the first: each is still the same task
    rows = list(read_joblog(home.archive / RUN2 / "results.tsv"))
    assert rows[0].status == outcomes.NOT_RUN and rows[0].params == (("a", "x"), ("b", "10"))
    assert [r.status for r in rows[1:]] == ["ok", "failed: exit status 2", "timeout", "ok",
                                            outcomes.NOT_RUN]


def test_a_sweep_file_that_is_gone_leaves_the_folders_archived_and_says_why(
        home: Home) -> None:
    t1, *_ = first_run(home)
    (home.run_dir(RUN1) / "source" / "sweep" / "sweep.toml").unlink()
    made = sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    assert made is not None and "cannot read the sweep file" in made.error
    assert (home.archive / RUN1 / "results" / t1.task_id / "out").read_text() == "one\n"
    assert sweepend.read_summary(home.archive / RUN1) == made


def test_a_run_of_tests_has_no_sweep_end(home: Home) -> None:
    assert sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice gs")) is None
    assert not (home.archive / RUN1).exists()


def test_the_report_states_counts_failures_nodes_collected_and_changes(
        home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    t1, t2, t3, t4, t5, t6 = first_run(home)
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    archive = home.archive / RUN1
    summary = sweepend.read_summary(archive)
    assert summary is not None
    monkeypatch.setattr(sweepreport, "MAX_LISTED", 2)
    facts = sweepreport.SweepFacts("sweep.toml", seconds=12.3, nodes=2,
                                   collect=summary.collect, changed=[t5.task_id, t2.task_id])
    text, counted = sweepreport.render(
        "User regression: user alice products sweep", facts, archive / "results.tsv",
        archive / "sweep-attempts.tsv", archive / "collected")
    assert (counted.tasks, counted.ok, counted.invalid, counted.failed, counted.timeout,
            counted.not_run) == (6, 3, 0, 2, 1, 1)
    assert text == "\n".join([
        "User regression: user alice products sweep",
        "",
        "Sweep sweep.toml: 6 tasks: 3 ok, 0 invalid, 2 failed, 1 timed out (1 of the "
        "failed not run).",
        "Ran for 12 seconds on 2 nodes.",
        f"Each task's row is in {archive}/results.tsv, its files in {archive}/results/<task "
        "id>/.",
        "",
        "Failed parameter sets (3):",
        "  #3 a=x b=3: failed: exit status 2",
        "  #4 a=a/b b=4: timeout",
        "  ... and 1 more (see results.tsv)",
        "",
        "Tasks per node:",
        "  n1: 5 tries, 22.5 seconds, 3 not ok",
        "  n2: 3 tries, 15.0 seconds, 1 not ok",
        "",
        "Collected files (4, in collected/):",
        "  all.txt: 13 bytes",
        "  by-a/x.txt: 4 bytes",
        "  ... and 2 more",
        "",
        "Changed since the previous run of this sweep (2):",
        "  #2 a=y b=2: ok",
        "  #5 a=y b=5: ok",
        "",
    ]) + "\n"
    assert t1 and t3 and t4 and t6


def test_the_report_without_a_previous_run_and_with_a_refused_target(home: Home) -> None:
    first_run(home)
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    archive = home.archive / RUN1
    refused = {"target": "by/{a}.txt", "source": "out", "files": [],
               "error": "more than 10000 files"}
    text, _ = sweepreport.render("H", sweepreport.SweepFacts("sweep.toml", collect=[refused]),
                                 archive / "results.tsv", archive / "sweep-attempts.tsv",
                                 archive / "collected")
    assert "  collect 'by/{a}.txt' from out: not made: more than 10000 files\n" in text
    assert text.endswith("No previous run of this sweep to compare with.\n\n")


# ------------------------------------------------------------------------ the status page
def archived_run(home: Home) -> None:
    """Run 1 ended: its sweep step done and its run.info written (what makes it archived)."""
    first_run(home)
    sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    (home.archive / RUN1 / "run.info").write_text(
        start_of(RUN1).format() + "elapsed 12.0\noutcome done\nnodes 2\n")


def test_the_per_run_view_of_an_archived_sweep_lists_its_failed_parameter_sets(
        home: Home) -> None:
    archived_run(home)
    sweep = status.run_detail(home, RUN1)["sweep"]
    assert sweep == {
        "source": "results.tsv", "tasks": 6, "ok": 3, "invalid": 0, "failed": 2,
        "timeout": 1, "not_ok": 3, "note": "",
        "failed_sets": [
            {"seq": 3, "task": "", "params": {"a": "x", "b": "3"},
             "status": "failed: exit status 2", "host": "n1"},
            {"seq": 4, "task": "", "params": {"a": "a/b", "b": "4"}, "status": "timeout",
             "host": "n1"},
            {"seq": 6, "task": "", "params": {"a": "x", "b": "6"},
             "status": outcomes.NOT_RUN, "host": ""}]}


def test_the_per_run_view_of_a_running_sweep_lists_its_failed_tries_so_far(
        home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    t1, t2, t3, t4, t5, _t6 = first_run(home)
    home.job_start(0).write_text(start_of(RUN1).format())
    detail = status.run_detail(home, RUN1)
    assert detail["state"] == "running"
    sweep = detail["sweep"]
    assert (sweep["source"], sweep["ok"], sweep["failed"], sweep["timeout"],
            sweep["not_ok"]) == ("sweep-attempts.tsv", 3, 1, 1, 2)
    assert sweep["failed_sets"] == [  # in the order the tasks were first tried
        {"seq": None, "task": t3.task_id, "params": {}, "status": "failed: exit status 2",
         "host": "n1"},
        {"seq": None, "task": t4.task_id, "params": {}, "status": "timeout", "host": "n1"}]
    # A big tries file is not read at each request.
    monkeypatch.setattr(sweepdetail, "LIVE_READ_BYTES", 100)
    sweep = status.run_detail(home, RUN1)["sweep"]
    assert sweep["failed_sets"] == [] and "listed when the run has ended" in sweep["note"]
    assert t1 and t2 and t5


def test_a_test_runs_view_has_no_sweep_part(home: Home) -> None:
    (home.archive / RUN1).mkdir(parents=True)
    (home.archive / RUN1 / "run.info").write_text(
        start_of(RUN1).format() + "elapsed 1.0\noutcome done\n")
    assert "sweep" not in status.run_detail(home, RUN1)


def test_the_report_is_made_when_results_tsv_is_missing_and_the_tries_are_torn(
        home: Home) -> None:
    """A report is made once and must be made: a missing results.tsv or a bad line of
    tries is said, not raised."""
    t1, *_ = first_run(home)
    archive = home.archive / RUN1
    archive.mkdir(parents=True)
    tries = home.run_dir(RUN1) / "sweep-attempts.tsv"
    tries.write_text(tries.read_text().replace("\tfinal\n", "\tsomething\n", 1))
    facts = sweepreport.SweepFacts("sweep.toml", changed=[t1.task_id])
    text, counted = sweepreport.render("H", facts, archive / "results.tsv", tries,
                                       archive / "collected")
    assert counted.tasks == 0
    assert "Sweep sweep.toml: results.tsv is unreadable: " in text
    assert "No task was tried in this run." in text
    assert "Changed since the previous run of this sweep (1):\n  ... and 1 more\n" in text


def test_the_reports_run_time_says_one_second_and_one_node_in_the_singular(
        tmp_path: Path) -> None:
    """A short run on one node: "Ran for 1 second on 1 node." (0.6 s rounds to 1)."""
    facts = sweepreport.SweepFacts("sweep.toml", seconds=0.6, nodes=1)
    text, _ = sweepreport.render("header", facts, tmp_path / "results.tsv",
                                 tmp_path / "sweep-attempts.tsv", tmp_path / "collected")
    assert "\nRan for 1 second on 1 node.\n" in text
