"""The exit rules, name and folder of an ephemeral node (cluster.node.ephemeral), as pure
logic: a real ClusterPull whose state is set by hand, the resource file given as an Offer,
time stepped by hand.  The real processes are in tests/e2e/test_ephemeral_node.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import PRIORITIES
from cluster.errors import ConfigError
from cluster.node import ephemeral
from cluster.node.ephemeral import EphemeralSession
from cluster.node.pull import Child, ClusterPull
from cluster.node.transport import LocalTransport
from cluster.wire.resources import (
    MasterInfo,
    NodeLaunch,
    PriorityInfo,
    Resources,
    format_resources,
    parse_resources,
)

NOW = 1_800_000_000.0


def _resources(written: float = NOW, **statuses: str) -> Resources:
    """A resource file as the master writes it, read back: priority p in ``statuses[p]``
    (default idle); a running or finished one names the run ``run<p>``."""
    priorities = {}
    for p in PRIORITIES:
        status = statuses.get(str(p), "idle")
        priorities[p] = PriorityInfo(status, "" if status == "idle" else f"run{p}")
    text = format_resources(Resources(
        written=written, master=MasterInfo("m", "127.0.0.1", 1, 9000, 9010),
        priorities=priorities, nodes_wanted=0,
        node=NodeLaunch(("clusterpull.py", "--ephemeral"), 1, "pilot", 60.0)))
    return parse_resources(text, written, 10.0)


def test_a_fresh_file_of_idle_and_finished_priorities_is_all_done_a_stale_one_is_not() -> None:
    done = _resources(**{"0": "idle", "1": "finished", "2": "idle"})
    assert ephemeral.all_done(done, NOW + 30, interval=10)
    assert not ephemeral.all_done(done, NOW + 30.5, interval=10)  # 3 intervals: master dead
    running = _resources(**{"0": "idle", "1": "running"})
    assert not ephemeral.all_done(running, NOW, interval=10)
    assert ephemeral.runs_on(running, NOW, 10, finished=set())
    assert not ephemeral.runs_on(running, NOW, 10, finished={"run1"})
    assert not ephemeral.runs_on(running, NOW + 31, 10, finished=set())


def test_a_missing_or_malformed_file_reads_as_none(tmp_path: Path) -> None:
    transport = LocalTransport(tmp_path)
    assert ephemeral.load_resources(transport, "resources.json", NOW, 10) is None
    (tmp_path / "resources.json").write_text("{", encoding="utf-8")
    assert ephemeral.load_resources(transport, "resources.json", NOW, 10) is None
    good = format_resources(_resources())
    (tmp_path / "resources.json").write_text(good, encoding="utf-8")
    read = ephemeral.load_resources(transport, "resources.json", NOW, 10)
    assert read is not None and read.node.prefix == "pilot"


def test_the_name_is_the_given_one_else_prefix_and_slurm_job_id() -> None:
    assert ephemeral.ephemeral_name("e1", {"SLURM_JOB_ID": "9"}, "slurm") == "e1"
    assert ephemeral.ephemeral_name(None, {"SLURM_JOB_ID": "9"}, "slurm") == "slurm-9"
    with pytest.raises(ConfigError, match="SLURM_JOB_ID"):
        ephemeral.ephemeral_name(None, {}, "slurm")
    with pytest.raises(ConfigError, match="letters, digits"):
        ephemeral.ephemeral_name("../x", {}, "slurm")


def test_the_work_folder_is_the_given_one_else_tmpdir_slash_name(tmp_path: Path) -> None:
    assert ephemeral.work_folder(tmp_path / "w", {}, "e1") == tmp_path / "w"
    assert ephemeral.work_folder(None, {"TMPDIR": str(tmp_path)}, "e1") == tmp_path / "e1"


def test_the_session_takes_slurms_cpus_as_slots_only_when_slots_is_the_cpu_count() -> None:
    env = {"SLURM_CPUS_ON_NODE": "3"}
    work = Path("/w")
    assert ephemeral.session_settings(Config(), "e1", work, env) == {
        "node_name": "e1", "work_dir": "/w", "slots": "3"}
    assert "slots" not in ephemeral.session_settings(Config(slots=2), "e1", work, env)
    assert "slots" not in ephemeral.session_settings(Config(), "e1", work, {})


def test_the_resource_file_is_resources_json_or_a_path_inside_the_master_home() -> None:
    assert ephemeral.resource_rel(Config()) == "resources.json"
    assert ephemeral.resource_rel(Config(resource_file="state/r.json")) == "state/r.json"
    home = Path("/srv/home")
    assert ephemeral.resource_rel(Config(master_home=home,
                                         resource_file="/srv/home/r.json")) == "r.json"
    with pytest.raises(ConfigError, match="inside the master home"):
        ephemeral.resource_rel(Config(master_home=home, resource_file="/etc/r.json"))


class Session:
    """An EphemeralSession over a real ClusterPull, with the resource file and the wall
    clock in the test's hands."""

    def __init__(self, **settings: object) -> None:
        cfg = Config(ephemeral_idle=60.0, resource_interval=10.0, connect_retries=3,
                     connect_retry_delay=5.0, node_name="e1", **settings)  # type: ignore[arg-type]
        self.pull = ClusterPull(cfg, caps="")
        self.resources: Resources | None = None
        self.wall = NOW
        self.loads = 0
        self.session = EphemeralSession(self.pull, self._load, lambda: self.wall)

    def _load(self, now: float) -> Resources | None:
        assert now == self.wall
        self.loads += 1
        return self.resources


def test_the_session_retries_a_failed_heartbeat_at_connect_retry_delay() -> None:
    assert Session().pull.retry_delay == 5.0


def test_idle_for_ephemeral_idle_exits_0_and_work_resets_the_timer() -> None:
    s = Session()
    assert s.session.verdict(0.0) is None
    assert s.session.verdict(59.9) is None
    s.pull.waiting = [(1, "runA")]  # the monitor says a run waits: wanted
    assert s.session.verdict(61.0) is None
    s.pull.finished.add("runA")  # done with it: idle again, from now
    assert s.session.verdict(62.0) is None
    assert s.session.verdict(121.9) is None
    assert s.session.verdict(122.0) == 0


def test_a_running_run_py_is_work() -> None:
    s = Session()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        s.pull.child = Child(0, "runA", sleeper)
        assert s.session.verdict(0.0) is None
        assert s.session.verdict(1000.0) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_connect_retries_failed_heartbeats_in_a_row_exit_3_even_while_working() -> None:
    s = Session()
    s.pull.waiting = [(0, "runA")]
    s.pull.failures = 2
    assert s.session.verdict(0.0) is None
    s.pull.failures = 3
    assert s.session.verdict(1.0) == 3


def test_a_fresh_file_saying_all_idle_or_finished_exits_0_read_at_most_every_interval() -> None:
    s = Session()
    s.resources = _resources(**{"0": "running", "1": "idle"})
    assert s.session.verdict(0.0) is None
    s.resources = _resources(**{"0": "finished", "1": "idle"})
    assert s.session.verdict(9.9) is None  # not read again before resource_interval
    assert s.loads == 1
    assert s.session.verdict(10.0) == 0
    assert s.loads == 2


def test_a_run_on_in_the_file_keeps_the_node_past_ephemeral_idle_until_it_is_stale() -> None:
    s = Session()
    s.resources = _resources(**{"0": "running", "1": "idle"})  # queued, master not yet up
    for now in (0.0, 30.0, 61.0, 90.0):
        assert s.session.verdict(now) is None
    s.wall = NOW + 31  # no newer file: the master is dead, the file is not believed
    assert s.session.verdict(91.0) is None  # the idle timer starts now
    assert s.session.verdict(151.0) == 0


def test_a_run_on_that_the_node_finished_does_not_keep_it() -> None:
    s = Session()
    s.resources = _resources(**{"0": "running"})
    s.pull.finished.add("run0")  # e.g. it was unsuitable for it
    assert s.session.verdict(0.0) is None
    assert s.session.verdict(60.0) == 0


def test_a_node_that_worked_waits_out_ephemeral_idle_when_every_run_is_over() -> None:
    # A run queued while it waits takes it without a new batch job (docs/provisioning.md).
    s = Session()
    s.session.worked = True
    s.resources = _resources(**{"0": "finished", "1": "idle"})
    assert s.session.verdict(0.0) is None  # the idle timer starts
    assert s.session.verdict(59.0) is None
    assert s.session.verdict(60.0) == 0
