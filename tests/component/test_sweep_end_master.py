"""The end of a sweep run in a real clustermaster: the sweep step, then the sweep report.

A real clustermaster (priority 0) runs two sweep runs of one user's pushed sweep folder;
build.py makes the jobs from the sweep file; a scripted node answers every task over real
TCP.  While the run is served, the test leaves in ``runs/<id>/`` what the master's intake
leaves there (each try's line, each task's result folder).  After the run: the archive holds
``results.tsv``, the task folders and the collected files, and the report is the sweep's
(counts, the failed parameter set, the node's tries, the collected files) instead of the
test report; the second run's report names the one task whose md5 changed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cluster.home import Home
from cluster.queue import QueueFile, RunSpec
from cluster.records import Job
from cluster.sweep import spec
from cluster.sweep.attempts import Attempt, format_attempt
from cluster.sweep.expand import tasks
from cluster.sweep.joblog import read_joblog
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    make_home,
    master_argv,
    request,
    signed_talk,
    wait_for_run,
)
from tests.helpers import free_port

SWEEP_TOML = """\
command = "echo {word}"
table = "params.csv"
[results]
log = "stdout"
[collect]
"all.txt" = { from = "log" }
"""
WORDS = ("alpha", "beta", "gamma", "delta")
MD5 = "0123456789abcdef0123456789abcdef"
OTHER_MD5 = "fedcba9876543210fedcba9876543210"


def push_sweep(home: Home) -> Path:
    """The user's pushed sweep folder; returns its sweep file."""
    folder = home.user_tree("alice", "sweep")
    folder.mkdir(parents=True)
    (folder / "sweep.toml").write_text(SWEEP_TOML)
    (folder / "params.csv").write_text("word\n" + "\n".join(WORDS) + "\n")
    return folder / "sweep.toml"


def serve(home: Home, port: int, sweep_file: Path, changed: str = "") -> str:
    """Serve one run as the intake and a node would; return its id.  Every task is ok but
    the last (invalid); ``changed``: a task id whose md5 differs from the others'."""
    run_id = wait_for_run(home, 0, port)
    made = list(tasks(spec.load(sweep_file)))
    run_dir = home.run_dir(run_id)
    with (run_dir / "sweep-attempts.tsv").open("w") as fh:
        for task in made:
            ok = task.number < len(made)
            fh.write(format_attempt(Attempt(task.task_id, "n1", 1000.0 + task.number, 0.5,
                                            0, 6, "ok" if ok else "invalid: no match", 1,
                                            True)))
            folder = run_dir / "results" / task.task_id
            folder.mkdir(parents=True)
            (folder / "log").write_text(task.row.values[0] + "\n")
    held: list[str] = []
    for _ in range(30):  # bounded: four tasks take a few calls
        lines = [f"result {name} 0 0.10 0.00 0.00 {OTHER_MD5 if name == changed else MD5} "
                 "sweep" for name in held]
        try:
            reply = protocol.parse_reply(signed_talk(
                port, request("n1", run_id, "slots 4", "jobs 0 0", *lines)))
        except OSError:
            break
        if reply.verb == protocol.ABORT:
            break
        held = [Job.parse(line).name for line in reply.jobs]
    return run_id


def run_once(home: Home, port: int, sweep_file: Path, changed: str = "") -> str:
    QueueFile.for_priority(home, 0).append(RunSpec.parse("user alice sweep"))
    master = subprocess.Popen(master_argv(home, port, "heartbeat_timeout=60", priority=0),
                              stderr=subprocess.PIPE)
    try:
        run_id = serve(home, port, sweep_file, changed)
        assert master.wait(timeout=60) == 0, master.stderr.read() if master.stderr else ""
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    return run_id


def test_a_sweep_runs_end_archives_its_results_and_reports_them(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", "user alice sweep", priority=0)
    QueueFile.for_priority(home, 0).remove(RunSpec.parse("user alice sweep"))
    sweep_file = push_sweep(home)
    port = free_port(1)
    first = run_once(home, port, sweep_file)
    archive = home.archive / first
    rows = list(read_joblog(archive / "results.tsv"))
    assert [(r.seq, r.params, r.status, r.host) for r in rows] == [
        (1, (("word", "alpha"),), "ok", "n1"), (2, (("word", "beta"),), "ok", "n1"),
        (3, (("word", "gamma"),), "ok", "n1"),
        (4, (("word", "delta"),), "invalid: no match", "n1")]
    assert (archive / "collected" / "all.txt").read_text() == "alpha\nbeta\ngamma\n"
    made = list(tasks(spec.load(sweep_file)))
    assert sorted(p.name for p in (archive / "results").iterdir()) == \
        sorted(t.task_id for t in made)
    report = (archive / "report.txt").read_text()
    assert report.startswith(f"Sweep: user alice sweep file sweep.toml options - run {first}\n")
    assert "Sweep sweep.toml: 4 tasks: 3 ok, 1 invalid, 0 failed, 0 timed out.\n" in report
    assert "Failed parameter sets (1):\n  #4 word=delta: invalid: no match\n" in report
    assert "Tasks per node:\n  n1: 4 tries, 2.0 seconds, 1 not ok\n" in report
    assert "Collected files (1, in collected/):\n  all.txt: 17 bytes\n" in report
    assert "No previous run of this sweep to compare with." in report
    assert "Source differences" not in report  # not the test report's wording
    info = (archive / "run.info").read_text()
    assert "errors 1\n" in info

    second = run_once(home, port, sweep_file, changed=made[1].task_id)
    report = (home.archive / second / "report.txt").read_text()
    assert "Changed since the previous run of this sweep (1):\n  #2 word=beta: ok\n" in report
    assert "differences 1\n" in (home.archive / second / "run.info").read_text()
