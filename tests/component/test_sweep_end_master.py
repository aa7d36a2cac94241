"""The end of a sweep run in a real clustermaster: the sweep step, then the sweep report.

A real clustermaster (priority 0) runs two sweep runs of one user's pushed sweep folder;
build.py makes the jobs from the sweep file; a scripted node answers every task over real
TCP, uploading each call's results bundle as a node's transport does; the master's intake
judges and places them.  After the run: the archive holds
``results.tsv``, the task folders and the collected files, and the report is the sweep's
(counts, the failed parameter set, the node's tries, the collected files) instead of the
test report; the second run's report names the one task whose md5 changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.runspec import RunSpec
from cluster.sweep import spec
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
[validate]
match = { log = "^(alpha|beta|gamma)" }
[collect]
"all.txt" = { from = "log" }
"""
WORDS = ("alpha", "beta", "gamma", "delta")
MD5 = "0123456789abcdef0123456789abcdef"  # what the node says; the master computes its own
INSTANCE = "0123456789abcdef"
NO_MATCH = "result log has no match for '^(alpha|beta|gamma)'"


def push_sweep(home: Home) -> Path:
    """The user's pushed sweep folder; returns its sweep file."""
    folder = home.user_tree("alice", "sweep")
    folder.mkdir(parents=True)
    (folder / "sweep.toml").write_text(SWEEP_TOML)
    (folder / "params.csv").write_text("word\n" + "\n".join(WORDS) + "\n")
    return folder / "sweep.toml"


def bundle(home: Home, run_id: str, count: int, outputs: dict[str, bytes]) -> str:
    """Upload the bundle of ``outputs`` (task id -> its stdout) as node n1's ``count``-th,
    as a node's transport does (a temporary name, then a rename); return its name."""
    name = f"n1.{INSTANCE}.{count}.tar"
    manifest = {"node": "n1", "tasks": [
        {"task": t, "start": 1000.0 + count, "runtime": 0.5, "exit": 0, "failed": "",
         "files": {"log": [len(data), hashlib.md5(data).hexdigest()]}}
        for t, data in outputs.items()]}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in [("tasks.json", json.dumps(manifest).encode()),
                             *((f"{t}/log", d) for t, d in outputs.items())]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    incoming = home.run_dir(run_id) / "results" / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    (incoming / f".{name}.tmp").write_bytes(buffer.getvalue())
    os.rename(incoming / f".{name}.tmp", incoming / name)
    return name


def serve(home: Home, port: int, sweep_file: Path, changed: str = "") -> str:
    """Serve one run as a node would, with bundles of each task's stdout; return its id.
    Every task is valid but the last (its word fails the sweep's ``match``); ``changed``:
    a task id whose stdout differs from its word's."""
    run_id = wait_for_run(home, 0, port)
    words = {task.task_id: task.row.values[0] for task in tasks(spec.load(sweep_file))}
    held: list[str] = []
    for count in range(1, 31):  # bounded: four tasks take a few calls
        lines = [f"result {name} 0 0.10 0.00 0.00 {MD5} sweep" for name in held]
        if held:
            outputs = {name: (words[name] + ("-changed" if name == changed else "") + "\n")
                       .encode() for name in held}
            lines.insert(0, f"bundle {bundle(home, run_id, count, outputs)}")
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
        (4, (("word", "delta"),), f"invalid: {NO_MATCH}", "n1")]
    assert (archive / "collected" / "all.txt").read_text() == "alpha\nbeta\ngamma\n"
    made = list(tasks(spec.load(sweep_file)))
    assert sorted(p.name for p in (archive / "results").iterdir()) == \
        sorted(t.task_id for t in made)
    report = (archive / "report.txt").read_text()
    assert report.startswith(f"Sweep: user alice sweep file sweep.toml options - run {first}\n")
    assert "Sweep sweep.toml: 4 tasks: 3 ok, 1 invalid, 0 failed, 0 timed out.\n" in report
    assert f"Failed parameter sets (1):\n  #4 word=delta: invalid: {NO_MATCH}\n" in report
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
