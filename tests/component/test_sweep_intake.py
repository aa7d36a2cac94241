"""The master's intake of a sweep's results: real tar bundles, a real check script, the
run state that schedules the retries, and sweep-attempts.tsv (docs/sweeps.md section 9)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from cluster.master.files import journal
from cluster.master.files.audit import AuditLog
from cluster.master.files.keycache import run_keys
from cluster.master.serve.handler import RequestHandler, RunSession
from cluster.master.serve.sweepbundle import own_bundle
from cluster.master.serve.sweepintake import (
    ATTEMPTS_FILE,
    FILES_MISSING,
    SweepIntake,
    files_md5,
)
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.records import Job
from cluster.sweep import spec as sweepspec
from cluster.sweep.attempts import Attempt, read_attempts
from cluster.wire import protocol, signing
from cluster.wire.protocol import Request
from tests.helpers import node_run_key

RUN = "run-1"
INSTANCE = "0123456789abcdef"
TASKS = [f"task{i:02d}" for i in range(4)]
CHECK = """#!/bin/sh
# valid when out.txt says "good"
grep -q good "$1/out" || { echo "no good in out"; exit 1; }
"""
SWEEP = """command = "echo {x} > out.txt"
timeout = 10
retries = 1
[axes]
x = [1, 2, 3, 4]
[results]
out = "out.txt"
log = "stdout"
[validate]
script = "check.sh"
"""


@pytest.fixture
def sweep_spec(tmp_path: Path) -> sweepspec.SweepSpec:
    folder = tmp_path / "snapshot" / "mysweep"
    folder.mkdir(parents=True)
    (folder / "check.sh").write_text(CHECK)
    (folder / "check.sh").chmod(0o755)
    (folder / "sweep.toml").write_text(SWEEP)
    return sweepspec.load(folder / "sweep.toml")


class Run:
    """A run state with nodes n1 and n2 past their build, and the intake of its run."""

    def __init__(self, root: Path, spec: sweepspec.SweepSpec, max_bytes: int = 1 << 20,
                 now: float = 0.0) -> None:
        self.root = root
        self.run_dir = root / "runs" / RUN
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        jobs = [Job(t, f"__temp__/{t}.log", "true") for t in TASKS]
        self.state = RunState(RUN, jobs, now, Settings(batch_per_slot=1, speculate_tail=False))
        self.intake = SweepIntake.open(self.run_dir, spec, max_bytes, self.state)
        self.incoming = self.run_dir / "results" / "incoming"
        self.count = 0

    def join(self, node: str, now: float = 0.0) -> list[str]:
        """``node`` joins and is ready: the tasks it is handed."""
        assert self.state.handle(Request(node=node, job_id=RUN, slots=1), now).reply.verb \
            == protocol.BUILD
        reply = self.state.handle(Request(node=node, job_id=RUN, slots=1, built=RUN), now)
        return [line.split(" ", 1)[0] for line in reply.reply.jobs]

    def bundle(self, node: str, tasks: Mapping[str, Mapping[str, bytes]], *,
               failed: Mapping[str, str] | None = None, exit_status: int | None = 0,
               extra: Iterable[tuple[tarfile.TarInfo, bytes]] = (),
               listed: Mapping[str, Mapping[str, bytes]] | None = None) -> str:
        """Upload a bundle of ``tasks`` (task -> result name -> bytes) as ``node`` would;
        ``extra`` members are added after the files; ``listed`` is what tasks.json says
        of the files when it differs from what is sent.  Its file name."""
        self.count += 1
        name = f"{node}.{INSTANCE}.{self.count}.tar"
        said = listed if listed is not None else tasks
        manifest = {"node": node, "tasks": [
            {"task": task, "start": 1700000000.0, "runtime": 0.5, "exit": exit_status,
             "files": {n: [len(b), hashlib.md5(b).hexdigest()] for n, b in files.items()},
             "failed": (failed or {}).get(task, "")}
            for task, files in said.items()]}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            add(tar, "tasks.json", json.dumps(manifest).encode())
            for task, files in tasks.items():
                for result, data in files.items():
                    add(tar, f"{task}/{result}", data)
            for info, data in extra:
                tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
        self.incoming.mkdir(parents=True, exist_ok=True)
        (self.incoming / name).write_bytes(buffer.getvalue())
        return name

    def folder_bundle(self, node: str, tasks: Mapping[str, Mapping[str, bytes]]) -> str:
        """Put a folder bundle of ``tasks`` in place as a node on the master home's file
        system does (tasks.json and a folder of files per task); its name."""
        self.count += 1
        name = f"{node}.{INSTANCE}.{self.count}.d"
        folder = self.incoming / name
        folder.mkdir(parents=True)
        manifest = {"node": node, "tasks": [
            {"task": task, "start": 1700000000.0, "runtime": 0.5, "exit": 0, "failed": "",
             "files": {n: [len(b), hashlib.md5(b).hexdigest()] for n, b in files.items()}}
            for task, files in tasks.items()]}
        (folder / "tasks.json").write_text(json.dumps(manifest))
        for task, files in tasks.items():
            if files:
                (folder / task).mkdir()
                for result, data in files.items():
                    (folder / task / result).write_bytes(data)
        return name

    def send(self, node: str, tasks: Iterable[str], bundle: str = "", error: int = 0,
             now: float = 1.0) -> tuple[Request, bytes]:
        """A call of ``node`` with results of ``tasks``, through the intake then the run
        state; the request as taken and the journal lines."""
        lines = tuple(f"{t} {error} 0.50 0.00 0.00 {'0' if error else 'f' * 32} sweep"
                      for t in tasks)
        req = Request(node=node, job_id=RUN, slots=1, built=RUN, result_lines=lines,
                      bundle=bundle)
        taken = self.intake.take(req, self.state)
        out = self.state.handle(taken, now)
        self.intake.done(taken)
        return taken, out.journal

    def attempts(self) -> list[Attempt]:
        return list(read_attempts(self.run_dir / ATTEMPTS_FILE))


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


GOOD = {"out": b"good 1\n", "log": b"printed\n"}
BAD = {"out": b"bad 1\n", "log": b"printed more\n"}


def test_a_valid_result_is_placed_recorded_and_logged(tmp_path: Path,
                                                      sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    name = run.bundle("n1", {"task00": GOOD})
    taken, journal = run.send("n1", ["task00"], name)
    folder = run.run_dir / "results" / "task00"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == GOOD
    md5s = {n: hashlib.md5(b).hexdigest() for n, b in GOOD.items()}
    assert journal.decode() == f"n1 result task00 0 0.50 0.00 0.00 {files_md5(md5s)} sweep\n"
    assert "task00" in run.state.results
    assert run.attempts() == [Attempt("task00", "n1", 1700000000.0, 0.5, 0,
                                      sum(map(len, GOOD.values())), "ok", 1, True)]
    assert not (run.incoming / name).exists()  # taken: removed
    assert not (run.run_dir / "results" / ".stage").exists()


def test_an_invalid_try_is_put_back_and_the_last_is_recorded_failed(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    assert run.join("n2") == ["task01"]
    taken, journal = run.send("n1", ["task00"], run.bundle("n1", {"task00": BAD}))
    assert taken.result_lines == () and journal == b""  # withheld
    assert "task00" not in run.state.results
    assert not (run.run_dir / "results" / "task00").exists()
    assert run.state.tried_by("task00") == {"n1"}
    assert run.state.pending[0] == "task00"
    # n1 asks for work: task00 waits for n2, which has not tried it.
    reply = run.state.handle(Request(node="n1", job_id=RUN, slots=1, built=RUN), 2.0)
    assert [j.split(" ", 1)[0] for j in reply.reply.jobs] == ["task02"]
    taken, journal = run.send("n2", ["task01"], run.bundle("n2", {"task01": GOOD}), now=3.0)
    assert journal
    assert list(run.state.nodes["n2"].held) == ["task00"]  # its reply handed it task00
    # n2's try is invalid too, and the last (retries = 1): recorded as a failure.
    taken, journal = run.send("n2", ["task00"], run.bundle("n2", {"task00": BAD}), now=4.0)
    assert journal.decode() == "n2 result task00 1 0.50 0.00 0.00 0 sweep\n"
    kept = run.run_dir / "results" / "task00"
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == BAD  # kept for reading
    statuses = [(a.task, a.node, a.status, a.attempt, a.final) for a in run.attempts()]
    why = "invalid: check.sh exited 1: no good in out"
    assert statuses == [("task00", "n1", why, 1, False), ("task01", "n2", "ok", 1, True),
                        ("task00", "n2", why, 2, True)]


def test_the_last_try_of_a_timeout_is_error_3_and_a_node_failure_keeps_its_reason(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    run.intake.tries_allowed = 1  # no retries: every try is the last
    assert run.join("n1") == ["task00"]
    taken, journal = run.send("n1", ["task00"], run.bundle("n1", {"task00": {}}), error=3)
    assert journal.decode() == "n1 result task00 3 0.50 0.00 0.00 0 sweep\n"
    reply = run.state.handle(Request(node="n1", job_id=RUN, slots=1, built=RUN), 2.0)
    assert [j.split(" ", 1)[0] for j in reply.reply.jobs] == ["task01"]
    name = run.bundle("n1", {"task01": {}},
                      failed={"task01": "results over max_result_bytes (99 bytes)"})
    taken, journal = run.send("n1", ["task01"], name, error=1)
    assert journal.decode() == "n1 result task01 1 0.50 0.00 0.00 0 sweep\n"
    assert [a.status for a in run.attempts()] == [
        "timeout", "failed: results over max_result_bytes (99 bytes)"]
    # A reason of blanks is no reason: the files are judged (here: valid).
    run.state.handle(Request(node="n1", job_id=RUN, slots=1, built=RUN), 3.0)
    taken, journal = run.send("n1", ["task02"],
                              run.bundle("n1", {"task02": GOOD}, failed={"task02": " \n"}))
    assert journal and run.attempts()[-1].status == "ok"

    # A task whose slot's shell died has no exit status ("exit": null): failed, not the
    # whole bundle refused.
    run.state.handle(Request(node="n1", job_id=RUN, slots=1, built=RUN), 4.0)
    taken, journal = run.send("n1", ["task03"],
                              run.bundle("n1", {"task03": GOOD}, exit_status=None), error=1)
    assert journal.decode() == "n1 result task03 1 0.50 0.00 0.00 0 sweep\n"
    last = run.attempts()[-1]
    assert (last.status, last.exit_status) == (
        "failed: the node's slot shell died while the task ran", -1)

def hostile(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"evil\n",
            link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.linkname = link
    return info, data


def test_hostile_members_are_refused_and_nothing_is_written_outside(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec,
        caplog: pytest.LogCaptureFixture) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    outside = tmp_path / "outside"
    outside.mkdir()
    # task00's files, listed in tasks.json, come as every kind of hostile member.
    members = [
        hostile("../escape"), hostile("task00/../../escape"), hostile(f"{outside}/abs"),
        hostile("/etc/cluster-intake-escape"),
        hostile("task00/out", tarfile.SYMTYPE, link=str(outside / "target")),
        hostile("task00/log", tarfile.LNKTYPE, link="tasks.json"),
        hostile("task00/out", tarfile.CHRTYPE), hostile("task00/log", tarfile.FIFOTYPE),
        hostile("task00/unknown"), hostile("task01/out"), hostile("task00"),
        hostile("task00/", tarfile.DIRTYPE),
    ]
    before = files_under(tmp_path)
    name = run.bundle("n1", {}, extra=members, listed={"task00": GOOD})
    with caplog.at_level("WARNING", logger="cluster.master"):
        taken, journal = run.send("n1", ["task00"], name)
    assert journal == b""  # withheld: one try is left
    assert not (tmp_path / "escape").exists() and not (run.run_dir / "escape").exists()
    assert not (outside / "abs").exists() and not (outside / "target").exists()
    # Nothing new (the bundle itself is removed once taken; the attempts log was there).
    assert files_under(tmp_path) == before
    assert [(a.status, a.final) for a in run.attempts()] == [(FILES_MISSING, False)]
    said = caplog.text
    assert "member '../escape' refused: expected '<task id>/<result name>'" in said
    assert "member 'task00/out' refused: expected a regular file" in said
    assert "'unknown' is not a result name of the sweep (log, out)" in said


def test_files_over_max_result_bytes_fail_the_task(tmp_path: Path,
                                                   sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec, max_bytes=10)
    assert run.join("n1") == ["task00"]
    big = {"out": b"good " + b"x" * 6, "log": b"12345"}
    taken, _ = run.send("n1", ["task00"], run.bundle("n1", {"task00": big}))
    assert [a.status for a in run.attempts()] == [
        "failed: results over max_result_bytes (16 bytes)"]
    assert not (run.run_dir / "results" / ".stage").exists()


def test_a_damaged_or_missing_file_is_files_missing(tmp_path: Path,
                                                    sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    run.intake.tries_allowed = 1
    assert run.join("n1") == ["task00"]
    damaged = run.bundle("n1", {"task00": {"out": b"good 2\n", "log": b"x"}},
                         listed={"task00": GOOD})
    run.send("n1", ["task00"], damaged)
    run.state.handle(Request(node="n1", job_id=RUN, slots=1, built=RUN), 2.0)
    only_out = run.bundle("n1", {"task01": {"out": GOOD["out"]}}, listed={"task01": GOOD})
    taken, journal = run.send("n1", ["task01"], only_out)
    assert journal.decode() == "n1 result task01 1 0.50 0.00 0.00 0 sweep\n"
    assert [a.status for a in run.attempts()] == [FILES_MISSING, FILES_MISSING]


@pytest.mark.parametrize("case", ["none", "absent", "other node's", "not a tar"])
def test_results_without_their_bundle_are_a_failed_try(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec, case: str) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    assert run.join("n2") == ["task01"]
    other = run.bundle("n2", {"task01": GOOD})
    name = {"none": "", "absent": f"n1.{INSTANCE}.99.tar", "other node's": other,
            "not a tar": f"n1.{INSTANCE}.98.tar"}[case]
    if case == "not a tar":
        (run.incoming / name).write_bytes(b"this is no tar file\n" * 50)
    taken, journal = run.send("n1", ["task00"], name)
    assert taken.result_lines == () and journal == b""
    assert [(a.node, a.status, a.final) for a in run.attempts()] == [
        ("n1", FILES_MISSING, False)]
    assert (run.incoming / other).exists()  # another node's bundle is never touched
    if case == "not a tar":
        assert not (run.incoming / name).exists()
    # ... and its own call takes it as usual.
    taken, journal = run.send("n2", ["task01"], other)
    assert journal and (run.run_dir / "results" / "task01").is_dir()


def test_a_node_whose_name_prefixes_another_cannot_name_its_bundle(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    assert own_bundle("n1", f"n1.{INSTANCE}.3.tar")
    assert not own_bundle("n1", f"n1.b.{INSTANCE}.3.tar")
    assert not own_bundle("n1", f"n10.{INSTANCE}.3.tar")
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    assert run.join("n1.b") == ["task01"]
    theirs = run.bundle("n1.b", {"task00": GOOD})
    run.send("n1", ["task00"], theirs)
    assert [a.status for a in run.attempts()] == [FILES_MISSING]
    assert (run.incoming / theirs).exists()


def test_a_call_made_again_with_the_same_bundle_counts_no_second_try(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    assert run.join("n2") == ["task01"]
    name = run.bundle("n1", {"task00": BAD})
    run.send("n1", ["task00"], name)
    taken, journal = run.send("n1", ["task00"], name)  # the node lost the first reply
    assert taken.result_lines == () and journal == b""
    assert len(run.attempts()) == 1


def test_a_result_for_a_settled_task_is_left_to_the_run_state(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    run.send("n1", ["task00"], run.bundle("n1", {"task00": GOOD}))
    first = (run.run_dir / "results" / "task00" / "out").read_bytes()
    taken, journal = run.send("n1", ["task00"], run.bundle("n1", {"task00": BAD}))
    assert journal == b"" and run.state.duplicates == 1
    assert (run.run_dir / "results" / "task00" / "out").read_bytes() == first
    assert len(run.attempts()) == 1
    assert os.listdir(run.incoming) == []  # a bundle of duplicates is removed too


def test_a_successor_reloads_the_tries_and_cleans_what_a_killed_master_left(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    run.send("n1", ["task00"], run.bundle("n1", {"task00": BAD}))
    run.intake.close()
    # What a master killed mid-request leaves: a stage folder, a stale result folder, an
    # unfinished upload; and a complete bundle whose node has not called yet.
    stage = run.run_dir / "results" / ".stage" / "task01"
    stage.mkdir(parents=True)
    (stage / "out").write_text("half")
    (run.incoming / f".n2.{INSTANCE}.1.tar.tmp").write_bytes(b"half an upload")
    waiting = run.bundle("n2", {"task01": GOOD})
    (run.run_dir / "results" / "task00").mkdir()
    (run.run_dir / "results" / "task00" / "out").write_text("stale")
    successor = Run(tmp_path, sweep_spec, now=100.0)  # a fresh run state, same run folder
    assert successor.intake.tries == {"task00": 1}
    assert successor.state.tried_by("task00") == {"n1"}
    assert not (run.run_dir / "results" / ".stage").exists()
    assert sorted(os.listdir(run.incoming)) == [waiting]
    # The successor hands task00 out again; the next invalid try is the last.
    assert successor.join("n2", now=100.0) == ["task00"]
    successor.count = run.count
    taken, journal = successor.send("n2", ["task00"],
                                    successor.bundle("n2", {"task00": BAD}), now=101.0)
    assert journal.decode() == "n2 result task00 1 0.50 0.00 0.00 0 sweep\n"
    assert (run.run_dir / "results" / "task00" / "out").read_bytes() == BAD["out"]
    assert [(a.node, a.attempt, a.final) for a in successor.attempts()] == [
        ("n1", 1, False), ("n2", 2, True)]


def test_the_handler_takes_a_signed_sweep_call_through_the_intake(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    """The wiring: a signed call with a bundle, through the master's real request handler
    bound with the intake; the journal syncs the attempts log."""
    run = Run(tmp_path, sweep_spec)
    home = tmp_path / "home"
    home.mkdir()
    key = node_run_key(home, "n1", RUN)
    jrnl = journal.Journal(tmp_path / "results", RUN)
    jrnl.attach(run.intake)
    handler = RequestHandler(4096, 1000, lambda: 1.0)
    handler.bind(run.state, jrnl, RunSession(run_keys(home, RUN, lambda: 1.0),
                                             signing.ReplayGuard(),
                                             AuditLog(tmp_path / "audit.log")), run.intake)
    nonces = signing.NonceSource()

    def call(*lines: str) -> protocol.Reply:
        nonce = nonces.next()
        body = "".join(f"{line}\n" for line in
                       ("node n1", f"id {RUN}", f"built {RUN}", "slots 1", "jobs 0 0", *lines))
        raw = handler(signing.sign_request((body + "OK\n").encode(), key, nonce), "peer:1")
        return protocol.parse_reply(signing.verify_reply(raw, key, nonce))

    assert call().verb == protocol.BUILD
    assert [j.split(" ", 1)[0] for j in call().jobs] == ["task00"]
    good = run.bundle("n1", {"task00": GOOD})
    reply = call(f"bundle {good}", f"result task00 0 0.50 0.00 0.00 {'f' * 32} sweep")
    assert [j.split(" ", 1)[0] for j in reply.jobs][0] == "task01"
    bad = run.bundle("n1", {"task01": BAD})
    reply = call(f"bundle {bad}", "result task01 1 0.50 0.00 0.00 0 sweep")
    assert "task01" not in run.state.results  # withheld for its retry
    assert run.intake.dirty
    jrnl.sync()
    assert not run.intake.dirty  # synced with the journal
    jrnl.close()
    lines = (tmp_path / "results").read_text().splitlines()
    assert lines[1:] == [f"n1 result task00 0 0.50 0.00 0.00 "
                         f"{files_md5({n: hashlib.md5(b).hexdigest() for n, b in GOOD.items()})}"
                         " sweep"]
    assert [(a.task, a.status.split(":")[0], a.final) for a in run.attempts()] == [
        ("task00", "ok", True), ("task01", "invalid", False)]
    assert os.listdir(run.incoming) == []


def test_a_folder_bundle_is_taken_where_it_lies_nothing_copied(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    name = run.folder_bundle("n1", {"task00": GOOD})
    inode = (run.incoming / name / "task00" / "out").stat().st_ino
    taken, journal = run.send("n1", ["task00"], name)
    folder = run.run_dir / "results" / "task00"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == GOOD
    assert (folder / "out").stat().st_ino == inode  # renamed into place, not copied
    md5s = {n: hashlib.md5(b).hexdigest() for n, b in GOOD.items()}
    assert journal.decode() == f"n1 result task00 0 0.50 0.00 0.00 {files_md5(md5s)} sweep\n"
    assert not (run.incoming / name).exists()  # taken: removed, with its tasks.json


def test_a_folder_bundles_foreign_entries_are_removed_and_its_files_count_missing(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    secret = tmp_path / "secret"
    secret.write_text("the master's\n")
    before = files_under(tmp_path)
    assert run.join("n1") == ["task00"]
    assert run.join("n2") == ["task01"]
    cases = {
        "task00": lambda d: (d / "log").symlink_to(secret),  # a link named as a result
        "task01": lambda d: os.link(secret, d / "log"),  # a hard link: another file
    }
    for task, node in (("task00", "n1"), ("task01", "n2")):
        name = run.folder_bundle(node, {task: {"out": GOOD["out"]}})
        folder = run.incoming / name / task
        cases[task](folder)
        (folder / "extra").write_text("not a result\n")
        (folder / "sub").mkdir()
        (folder / "sub" / "deep").write_text("x\n")
        taken, journal = run.send(node, [task], name)
        assert taken.result_lines == () and journal == b""  # withheld: tried again
        assert not (run.incoming / name).exists()
    assert [(a.task, a.status) for a in run.attempts()] == [
        ("task00", FILES_MISSING), ("task01", FILES_MISSING)]
    assert secret.read_text() == "the master's\n" and secret.stat().st_nlink == 1
    # Nothing was left anywhere (the bundles are gone, the secret was not touched).
    assert files_under(tmp_path) - before == set()


def test_a_folder_bundle_of_another_node_or_not_a_folder_is_refused(
        tmp_path: Path, sweep_spec: sweepspec.SweepSpec) -> None:
    run = Run(tmp_path, sweep_spec)
    assert run.join("n1") == ["task00"]
    assert not own_bundle("n1", f"n1.b.{INSTANCE}.1.d") and own_bundle("n1", f"n1.{INSTANCE}.1.d")
    theirs = run.folder_bundle("n2", {"task00": GOOD})
    taken, journal = run.send("n1", ["task00"], theirs)
    assert taken.result_lines == () and (run.incoming / theirs).is_dir()  # left alone
    # A file where the folder bundle should be: unreadable, the files missing.
    run.count += 1
    fake = f"n1.{INSTANCE}.{run.count}.d"
    (run.incoming / fake).write_text("not a folder\n")
    run.state.handle(Request(node="n1", job_id=RUN, slots=1, built=RUN), 2.0)
    run.send("n1", ["task00"], fake)
    assert [a.status for a in run.attempts()] == [FILES_MISSING, FILES_MISSING]
