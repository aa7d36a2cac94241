"""clusterscale.py, the provisioner's daemon: a real resource file, a real lock, a real
SIGTERM; the batch system is the scripted engine of test_scaler (swapped in through the
engine factory)."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from cluster.cli import clusterscale
from cluster.config import Config
from cluster.nodekeys import ensure_node_key, read_node_key
from cluster.provision.engine import EngineError, EngineJob
from cluster.provision.scaler import Provisioner, ScaleSettings
from cluster.runtime.clock import FakeClock
from cluster.runtime.service import StopFlag
from cluster.runtime.singleton import SingleInstance
from cluster.wire.provision import ProvisionJob, parse_status, read_status
from tests.helpers import REPO
from tests.unit.test_scaler import COMMAND, ScriptedEngine


def write_resources(path: Path, written: float, wanted: int) -> None:
    """A resource file as docs/provisioning.md shows it."""
    idle = {"status": "idle", "run": "", "jobs_left": 0, "jobs_running": 0, "nodes": 0,
            "nodes_wanted": 0}
    running = {"status": "running", "run": "20261126083743-p1-2bf4", "jobs_left": 4711,
               "jobs_running": 12, "nodes": 2, "nodes_wanted": wanted}
    path.write_text(json.dumps({
        "format": 1, "written": written,
        "master": {"host": "build1", "address": "10.0.0.5", "pid": 4242, "base_port": 9000,
                   "monitor_port": 9010},
        "priorities": {"0": idle, "1": running, "2": idle},
        "nodes_wanted": wanted,
        "node": {"command": list(COMMAND), "slots": 2, "prefix": "slurm", "idle_exit": 60},
    }), encoding="utf-8")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> ScriptedEngine:
    scripted = ScriptedEngine()
    made: list[Config] = []

    def factory(cfg: Config) -> ScriptedEngine:
        made.append(cfg)
        return scripted

    monkeypatch.setattr(clusterscale, "ENGINE_FACTORY", factory)
    return scripted


def test_one_look_submits_the_nodes_the_resource_file_wants(
        tmp_path: Path, engine: ScriptedEngine, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time() - 5, wanted=3)
    caplog.set_level(logging.INFO)
    assert clusterscale.main(["--home", str(tmp_path), "--once", "--set", "max_nodes=5",
                              "--set", "node_slots=4"], clock=clock) == 0
    # Each job runs the pilot: the node's command under this interpreter, its log in
    # <home>/log/pilots (docs/provisioning.md, "Pilots that cannot start").
    assert [(name, slots) for name, _argv, slots in engine.submits] == [("slurm-node", 4)] * 3
    for _name, argv, _slots in engine.submits:
        assert argv[:2] == ["/bin/sh", "-c"] and argv[-len(COMMAND):] == list(COMMAND)
        assert argv[3:8] == ["pilot", str(tmp_path / "log" / "pilots"), "slurm",
                             sys.executable, str(Path("clusterpull.py").resolve().parent)]
    assert "wanted 3 pending 0 running 0: submitted 3 (3 wanted beyond pending + running)" \
        in caplog.text


def test_each_submitted_job_gets_its_node_key_before_the_next_submit(
        tmp_path: Path, engine: ScriptedEngine, caplog: pytest.LogCaptureFixture) -> None:
    """node-keys/slurm-<job id>.key, 0600, made right after sbatch gave the id: the
    second submit already sees the first job's key."""
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=2)
    keys = tmp_path / "node-keys"
    seen_at_submit: list[list[str]] = []
    submit = engine.submit

    def submitting(name: str, argv: list[str], slots: int, *,
                   exclude: Sequence[str] = ()) -> str:
        seen_at_submit.append(sorted(p.name for p in keys.glob("*.key")))
        return submit(name, argv, slots, exclude=exclude)

    engine.submit = submitting  # type: ignore[method-assign]
    caplog.set_level(logging.INFO)
    assert clusterscale.main(["--home", str(tmp_path), "--once"], clock=clock) == 0
    assert seen_at_submit == [[], ["slurm-1001.key"]]
    made = sorted(p.name for p in keys.iterdir())
    assert made == ["slurm-1001.key", "slurm-1002.key"]
    for name in made:
        assert stat.S_IMODE((keys / name).stat().st_mode) == 0o600
        assert read_node_key(tmp_path, name.removesuffix(".key")) is not None
    assert f"made the key of node slurm-1001 (job 1001) at {keys / 'slurm-1001.key'}" \
        in caplog.text


def test_an_adopted_job_without_a_key_gets_one_and_a_key_there_is_kept(
        tmp_path: Path, engine: ScriptedEngine) -> None:
    """A restarted provisioner finds jobs of its prefix submitted before: the one whose key
    is missing gets it, the one that has one keeps it, a job of another name gets none."""
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=2)
    without = engine.add("slurm-node", "running")
    with_key = engine.add("slurm-node", "pending")
    engine.add("other-node", "running")
    kept = ensure_node_key(tmp_path, f"slurm-{with_key}").read_text()
    assert clusterscale.main(["--home", str(tmp_path), "--once"], clock=clock) == 0
    assert engine.submits == []  # adopted: nothing submitted twice
    keys = tmp_path / "node-keys"
    assert sorted(p.name for p in keys.iterdir()) == sorted([f"slurm-{with_key}.key",
                                                             f"slurm-{without}.key"])
    assert (keys / f"slurm-{with_key}.key").read_text() == kept


def test_a_key_that_cannot_be_made_is_a_warning_naming_the_node_and_the_path(
        tmp_path: Path, engine: ScriptedEngine, caplog: pytest.LogCaptureFixture) -> None:
    """node-keys is a file, not a folder: every key fails; the look goes on (the jobs are
    submitted) and exits 0, each failure one WARNING line."""
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=2)
    (tmp_path / "node-keys").write_text("in the way\n", encoding="utf-8")
    caplog.set_level(logging.INFO)
    assert clusterscale.main(["--home", str(tmp_path), "--once"], clock=clock) == 0
    assert len(engine.submits) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    path = tmp_path / "node-keys" / "slurm-1001.key"
    assert any(w.startswith(f"cannot make the key of node slurm-1001 at {path}: ")
               and w.endswith("node slurm-1001 is not served until it exists (the next "
                              "look tries again)") for w in warnings), warnings
    assert sum("slurm-1002" in w for w in warnings) == 1


def test_a_resource_file_elsewhere_is_read_from_resource_file(
        tmp_path: Path, engine: ScriptedEngine) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "shared.json", clock.time(), wanted=2)
    assert clusterscale.main(["--home", str(tmp_path / "home"), "--once", "--set",
                              f"resource_file={tmp_path / 'shared.json'}"], clock=clock) == 0
    assert len(engine.submits) == 2


def test_a_stale_missing_or_broken_resource_file_means_the_master_is_gone(
        tmp_path: Path) -> None:
    path = tmp_path / "resources.json"
    missing = clusterscale.read_demand(path, 1e9, 10.0)
    assert (missing.wanted, missing.master_alive) == (0, False)
    assert missing.note == f"no resource file {path}"
    write_resources(path, 1e9 - 31, wanted=4)
    stale = clusterscale.read_demand(path, 1e9, 10.0)
    assert (stale.wanted, stale.master_alive) == (0, False)
    assert stale.note == f"resource file {path} written 31 s ago, more than 3 x 10 s"
    fresh = clusterscale.read_demand(path, 1e9 - 2, 10.0)
    assert (fresh.wanted, fresh.master_alive, fresh.command) == (4, True, COMMAND)
    path.write_text("{not json", encoding="utf-8")
    broken = clusterscale.read_demand(path, 1e9, 10.0)
    assert (broken.wanted, broken.master_alive) == (0, False) and str(path) in broken.note


def test_a_second_instance_exits_at_once_and_asks_the_engine_nothing(
        tmp_path: Path, engine: ScriptedEngine, caplog: pytest.LogCaptureFixture) -> None:
    write_resources(tmp_path / "resources.json", FakeClock().time(), wanted=3)
    caplog.set_level(logging.INFO)
    with SingleInstance(tmp_path / clusterscale.LOCK_NAME, "other"):
        assert clusterscale.main(["--home", str(tmp_path), "--once"], clock=FakeClock()) == 0
    assert engine.submits == []
    assert f"pid {os.getpid()}" in caplog.text and "exiting" in caplog.text


def test_sigterm_ends_the_loop_after_the_current_look(
        tmp_path: Path, engine: ScriptedEngine, caplog: pytest.LogCaptureFixture) -> None:
    """The loop looks every resource_interval until a real SIGTERM reaches the process; it
    then returns 0, the lock is free and the jobs are left."""
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=2)
    listings: list[float] = []
    jobs = engine.jobs

    def listing(prefix: str) -> list[EngineJob]:
        listings.append(clock.monotonic())
        if len(listings) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return jobs(prefix)

    engine.jobs = listing  # type: ignore[method-assign]
    caplog.set_level(logging.INFO)
    previous = signal.getsignal(signal.SIGTERM)
    assert clusterscale.main(["--home", str(tmp_path)], clock=clock) == 0
    assert signal.getsignal(signal.SIGTERM) == previous
    assert listings == [0.0, 10.0, 20.0]
    assert len(engine.submits) == 2 and engine.cancels == []
    assert f"stopped by signal {int(signal.SIGTERM)}" in caplog.text
    SingleInstance(tmp_path / clusterscale.LOCK_NAME).acquire()  # free again


def test_an_engine_that_cannot_be_made_is_a_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def factory(cfg: Config) -> ScriptedEngine:
        raise EngineError("sbatch: not found on PATH")

    monkeypatch.setattr(clusterscale, "ENGINE_FACTORY", factory)
    assert clusterscale.main(["--home", str(tmp_path), "--once"], clock=FakeClock()) == 2
    assert capsys.readouterr().err == "clusterscale.py: sbatch: not found on PATH\n"


def test_the_top_level_script_runs_and_explains_itself() -> None:
    done = subprocess.run([sys.executable, str(REPO / "clusterscale.py"), "--help"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: clusterscale.py")
    assert "--once" in done.stdout


class RewritingClock(FakeClock):
    """A fake clock during whose sleeps the master rewrites the resource file once, at
    ``at`` seconds (monotonic)."""

    def __init__(self, path: Path, at: float) -> None:
        super().__init__(start=1_800_000_000.0)
        self.path, self.at, self.rewritten = path, at, False

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if not self.rewritten and self.monotonic() >= self.at:
            self.rewritten = True
            fresh = self.path.with_suffix(".new")
            write_resources(fresh, self.time(), wanted=2)
            fresh.replace(self.path)  # as the master writes it: a new file renamed over


def test_a_rewrite_of_the_resource_file_brings_the_next_look_forward(tmp_path: Path) -> None:
    """Between looks the provisioner waits resource_interval, but a rewrite (a run that
    starts) ends the wait within WATCH_POLL: a push's first node is not kept waiting."""
    path = tmp_path / "resources.json"
    write_resources(path, 1_800_000_000.0, wanted=0)
    clock = RewritingClock(path, at=3.0)
    seen = clusterscale.file_stamp(path)
    clusterscale.wait_for_change(path, seen, 30.0, clusterscale.StopFlag(), clock)
    assert clock.rewritten and 3.0 <= clock.monotonic() <= 3.0 + clusterscale.WATCH_POLL
    # Unchanged, it waits the whole time; stopped, not at all.
    seen = clusterscale.file_stamp(path)
    began = clock.monotonic()
    clusterscale.wait_for_change(path, seen, 30.0, clusterscale.StopFlag(), clock)
    assert clock.monotonic() - began == pytest.approx(30.0)
    stopped = clusterscale.StopFlag()
    stopped.set()
    clusterscale.wait_for_change(path, seen, 30.0, stopped, clock)
    assert clock.monotonic() - began == pytest.approx(30.0)
    assert clusterscale.file_stamp(tmp_path / "absent.json") is None


def test_each_look_writes_the_status_file_the_console_reads(
        tmp_path: Path, engine: ScriptedEngine) -> None:
    """provision.json after a look: the counts the log line has, each job with its node's
    name, a pending job's reason, mode 0644; a second look sees the submitted job listed."""
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=3)
    engine.add("slurm-node", "pending", "PartitionDown")  # adopted: job 1001
    engine.add("other-node", "running")                   # not ours: not shown
    argv = ["--home", str(tmp_path), "--once", "--set", "max_nodes=2"]
    assert clusterscale.main(argv, clock=clock) == 0
    path = tmp_path / "provision.json"
    assert path.stat().st_mode & 0o777 == 0o644
    first = read_status(path, clock.time())
    assert (first.engine, first.wanted, first.pending, first.running) == ("Slurm", 2, 1, 0)
    assert (first.pid, first.interval, first.trouble, first.stale) == (os.getpid(), 10.0, "",
                                                                       False)
    assert first.written == clock.time()
    assert first.action == ("wanted 2 pending 1 running 0: submitted 1 (1 wanted beyond "
                            "pending + running); pending: 1 PartitionDown")
    assert first.jobs == (ProvisionJob("1001", "slurm-node", "slurm-1001", "pending",
                                       "PartitionDown"),
                          ProvisionJob("1003", "slurm-node", "slurm-1003", "submitted"))
    clock.advance(10)
    assert clusterscale.main(argv, clock=clock) == 0
    second = read_status(path, clock.time())
    assert (second.pending, second.running, second.written) == (1, 1, clock.time())
    assert [(j.node, j.state) for j in second.jobs] == [("slurm-1001", "pending"),
                                                         ("slurm-1003", "running")]
    assert not parse_status(path.read_text(), clock.time() + 30).stale
    assert parse_status(path.read_text(), clock.time() + 31).stale  # 3 x resource_interval


def test_a_refused_submit_and_an_unreachable_controller_land_in_trouble(
        tmp_path: Path, engine: ScriptedEngine) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=2)
    engine.fail_submit = ("exit status 1: sbatch: error: Batch job submission failed: "
                          "Invalid partition name specified")
    argv = ["--home", str(tmp_path), "--once"]
    assert clusterscale.main(argv, clock=clock) == 0
    refused = read_status(tmp_path / "provision.json", clock.time())
    assert refused.trouble == ("sbatch: exit status 1: sbatch: error: Batch job submission "
                               "failed: Invalid partition name specified")
    assert (refused.wanted, refused.pending, refused.running, refused.jobs) == (2, 0, 0, ())
    assert "submit failed: " + refused.trouble in refused.action
    engine.fail_list = "exit status 1: slurm_load_jobs error: Unable to contact slurm controller"
    assert clusterscale.main(argv, clock=clock) == 0
    down = read_status(tmp_path / "provision.json", clock.time())
    assert (down.pending, down.running, down.wanted) == (None, None, 2)
    assert down.trouble == ("squeue: exit status 1: slurm_load_jobs error: Unable to contact "
                            "slurm controller")
    engine.fail_list = engine.fail_submit = ""
    assert clusterscale.main(argv, clock=clock) == 0
    well = read_status(tmp_path / "provision.json", clock.time())
    assert well.trouble == "" and [j.state for j in well.jobs] == ["submitted", "submitted"]


def test_a_status_file_that_cannot_be_written_is_said_once_and_the_looks_go_on(
        tmp_path: Path, engine: ScriptedEngine, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    write_resources(tmp_path / "resources.json", clock.time(), wanted=1)
    (tmp_path / "provision.json").mkdir()  # a folder where the file goes: every write fails
    writer = clusterscale.StatusWriter(tmp_path / "provision.json")
    provisioner = Provisioner(engine, ScaleSettings(max_nodes=4, submit_rate=30,
                                                    prefix="slurm", slots=1), clock)
    caplog.set_level(logging.INFO)
    for _ in range(3):
        clusterscale.serve(provisioner, tmp_path / "resources.json", 10.0,
                           StopFlag(), clock, once=True, status=writer)
    assert caplog.text.count("cannot write the status file") == 1
    assert len(engine.submits) == 1  # the looks went on
    (tmp_path / "provision.json").rmdir()
    clusterscale.serve(provisioner, tmp_path / "resources.json", 10.0,
                       StopFlag(), clock, once=True, status=writer)
    assert "is written again" in caplog.text
    assert read_status(tmp_path / "provision.json", clock.time()).running == 1
