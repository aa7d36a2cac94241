"""The master's writer of the resource file (cluster.master.files.resources), from a home's files:
idle, a queued run, a starting run, a served run's counts, a run being ended, finished; the
file is world-readable, holds no secret, and max_nodes bounds what it wants."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest

from cluster.cli import common
from cluster.config import Config
from cluster.configfile import load
from cluster.home import Home
from cluster.master.files import resources as writer
from cluster.master.files.ending import EndRecord, Outcome
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime.clock import FakeClock
from cluster.wire.jobstart import JobStart
from cluster.wire.resources import Resources, read_resources

RUN = "20261126083743-p1-2bf4"
LINE = "auto nightly gs"
SECRET = "ab" * 32


def config(root: Path, *settings: str) -> Config:
    overrides = dict(s.split("=", 1) for s in settings)
    cfg = load(None, {"home": str(root / "home"), **overrides})
    Home(cfg.home).create()
    return cfg


def start(priority: int = 1, run: str = RUN) -> JobStart:
    return JobStart(id=run, priority=priority, queue=LINE, kind="auto", ref="nightly",
                    products=("gs",), tree="ghostpdl", source="ghostpdl", build="make",
                    tests="tests", secret=SECRET)


def queue(cfg: Config, priority: int = 1, line: str = LINE) -> None:
    home = Home(cfg.home)
    QueueFile(home.queue(priority), home.queue_lock(priority)).append(
        RunSpec.parse(line), duplicate=True)


def write_start(cfg: Config, job: JobStart) -> None:
    Home(cfg.home).job_start(job.priority).write_text(job.format(with_secret=True))


def write_live(cfg: Config, priority: int = 1, run: str = RUN, left: int = 100,
               running: int = 8, **extra: object) -> None:
    live = {"version": 1, "run": run, "priority": priority,
            "jobs": {"total": left + running + 5, "done": 5, "running": running,
                     "left": left},
            "nodes": {"n1": {"state": "ready"}, "n2": {"state": "gone"},
                      "n3": {"state": "building"}},
            "fatal": "", "stopping": "", **extra}
    Home(cfg.home).live(priority).write_text(json.dumps(live))


def written(cfg: Config) -> Resources:
    """Write the file, read it back as a provisioner would."""
    writer.write_resources(cfg, FakeClock(start=1000.0))
    back = read_resources(writer.resource_path(cfg), 1000.0, cfg.resource_interval)
    assert not back.stale
    return back


def test_an_empty_home_is_idle_everywhere(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    facts = written(cfg)
    assert [info.status for info in facts.priorities.values()] == ["idle"] * 3
    assert facts.nodes_wanted == 0
    path = cfg.home / "resources.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # anyone may read it: no secret


def test_resource_file_setting_relative_to_the_home(tmp_path: Path) -> None:
    cfg = config(tmp_path, "resource_file=shared/res.json")
    (cfg.home / "shared").mkdir()
    writer.write_resources(cfg)
    assert (cfg.home / "shared" / "res.json").is_file()
    assert not (cfg.home / "resources.json").exists()


def test_a_queued_run_wants_one_node_before_it_starts(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    queue(cfg)
    one = written(cfg).priorities[1]
    assert (one.status, one.run, one.nodes_wanted) == ("running", "", 1)


def test_a_starting_run_without_live_file_wants_one_node(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    queue(cfg)
    write_start(cfg, start())
    write_live(cfg, run="another-run")  # a killed master's leftover: not this run's counts
    one = written(cfg).priorities[1]
    assert (one.status, one.run, one.jobs_left, one.nodes_wanted) == (
        "running", RUN, 0, 1)


def test_a_served_run_gives_its_counts_and_nodes_wanted(tmp_path: Path) -> None:
    cfg = config(tmp_path, "max_nodes=10", "node_slots=2")
    queue(cfg)
    write_start(cfg, start())
    write_live(cfg, left=100, running=8)
    facts = written(cfg)
    one = facts.priorities[1]
    assert (one.status, one.run, one.jobs_left, one.jobs_running, one.nodes,
            one.nodes_wanted) == ("running", RUN, 100, 8, 2, 3)
    assert facts.nodes_wanted == 3
    text = writer.resource_path(cfg).read_text()
    assert SECRET not in text


def test_the_sum_over_priorities_is_bounded_by_max_nodes(tmp_path: Path) -> None:
    cfg = config(tmp_path, "max_nodes=4", "node_slots=1")
    for p, run in ((1, RUN), (2, "20261126083743-p2-0001")):
        queue(cfg, p)
        write_start(cfg, start(p, run))
        write_live(cfg, p, run, left=60)
    facts = written(cfg)
    assert facts.priorities[1].nodes_wanted == 3 and facts.priorities[2].nodes_wanted == 3
    assert facts.nodes_wanted == 4


def test_priority_0_counts_the_runs_of_all_its_lanes(tmp_path: Path) -> None:
    """Two users' pushes side by side (lane 0 and user lane 3, docs/runoptions.md, "Fair
    share"): priority 0's counts are their sums, its run lane 0's; the format unchanged."""
    cfg = config(tmp_path, "max_nodes=10", "node_slots=1")
    home = Home(cfg.home)
    push = "20261126090000-p0-0001"
    other = "20261126090100-p0-0002"
    home.job_start(0).write_text(start(0, push).format(with_secret=True))
    write_live(cfg, 0, push, left=100, running=8)  # 6 nodes' worth at 20 jobs a slot
    lane3 = JobStart(id=other, priority=0, queue="user bob gs", kind="user", ref="bob",
                     products=("gs",), tree="bob", source="bob", build="make",
                     tests="tests", lane_number=3)
    home.job_start(3).write_text(lane3.format())
    zero = written(cfg).priorities[0]
    # Lane 3's list is being made: no counts yet, one node wanted.
    assert (zero.status, zero.run, zero.jobs_left, zero.jobs_running, zero.nodes,
            zero.nodes_wanted) == ("running", push, 100, 8, 2, 5 + 1)
    write_live(cfg, 3, other, left=60, running=2)
    facts = written(cfg)
    zero = facts.priorities[0]
    assert (zero.jobs_left, zero.jobs_running, zero.nodes, zero.nodes_wanted) == (
        160, 10, 4, 8)  # 5 + 3 nodes wanted
    assert facts.nodes_wanted == 8
    home.job_start(0).unlink()  # lane 0's run over: the user lane's alone
    alone = written(cfg).priorities[0]
    assert (alone.run, alone.jobs_left, alone.nodes_wanted) == (other, 60, 3)
    # Bounded by max_nodes as one run's count is.
    cfg = cfg.with_changes(max_nodes=4)
    home.job_start(0).write_text(start(0, push).format(with_secret=True))
    assert written(cfg).priorities[0].nodes_wanted == 4


def test_max_nodes_zero_wants_none(tmp_path: Path) -> None:
    cfg = config(tmp_path, "max_nodes=0")
    queue(cfg, 0)
    queue(cfg)
    write_start(cfg, start())
    write_live(cfg, left=10_000)
    facts = written(cfg)
    assert facts.priorities[0].nodes_wanted == 0 and facts.priorities[1].nodes_wanted == 0
    assert facts.priorities[1].status == "running"
    assert facts.nodes_wanted == 0


def test_a_stopping_run_wants_no_node(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    write_start(cfg, start())
    write_live(cfg, stopping="stopped by admin")
    assert written(cfg).priorities[1].nodes_wanted == 0


def test_a_run_being_ended_is_finished_then_stays_finished(tmp_path: Path) -> None:
    """Between job.start's removal and the dequeue its queue line does not count as a run
    waiting; once its end is done the previous file keeps it finished."""
    cfg = config(tmp_path)
    home = Home(cfg.home)
    queue(cfg)
    write_start(cfg, start())
    write_live(cfg)
    assert written(cfg).priorities[1].status == "running"
    EndRecord.create(home.run_dir(RUN), start(), Outcome.DONE)
    home.job_start(1).unlink()
    one = written(cfg).priorities[1]
    assert (one.status, one.run, one.nodes_wanted) == ("finished", RUN, 0)
    QueueFile(home.queue(1), home.queue_lock(1)).remove(RunSpec.parse(LINE))
    (home.run_dir(RUN) / "end").unlink()
    one = written(cfg).priorities[1]
    assert (one.status, one.run) == ("finished", RUN)
    assert written(cfg).priorities[0].status == "idle"


def test_another_run_queued_behind_an_ending_one_is_waiting(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    home = Home(cfg.home)
    queue(cfg)
    queue(cfg, line="auto weekly gs")
    EndRecord.create(home.run_dir(RUN), start(), Outcome.DONE)
    one = written(cfg).priorities[1]
    assert (one.status, one.run, one.nodes_wanted) == ("running", "", 1)


def test_the_node_command_points_at_this_master(tmp_path: Path) -> None:
    cfg = config(tmp_path, "base_port=9100", "monitor_port=9110", "node_slots=3",
                 "node_prefix=pilot", "ephemeral_idle=45", "resource_interval=7",
                 "resource_file=state/res.json")
    writer.write_resources(cfg)
    back = read_resources(writer.resource_path(cfg), 0.0, 1e9)
    command = back.node.command
    assert command[0].endswith("clusterpull.py") and command[1] == "--ephemeral"
    for setting in ("master_host=127.0.0.1", "base_port=9100", "monitor_port=9110",
                    f"master_home={cfg.home.resolve()}", "slots=3", "node_prefix=pilot",
                    "ephemeral_idle=45", "resource_interval=7",
                    f"resource_file={(cfg.home / 'state' / 'res.json').resolve()}"):
        assert setting in command
    assert (back.node.slots, back.node.prefix, back.node.idle_exit) == (3, "pilot", 45.0)
    assert (back.master.base_port, back.master.monitor_port) == (9100, 9110)


def test_without_node_config_the_node_command_names_no_config(tmp_path: Path) -> None:
    command = writer.node_launch(config(tmp_path)).command
    assert "--config" not in command


def test_node_config_starts_the_node_with_that_file_and_this_masters_settings_over_it(
        tmp_path: Path) -> None:
    """The batch nodes' node.conf gives the transport and the ssh login; the --set words
    after it point the node at this master whatever that file says of it."""
    node_conf = tmp_path / "batch" / "node.conf"
    node_conf.parent.mkdir()
    node_conf.write_text("[node]\ntransport = ssh\nssh_user = pilot\n"
                         "master_host = old-master\nmaster_home = /elsewhere\n",
                         encoding="utf-8")
    cfg = config(tmp_path, f"node_config={node_conf}", "base_port=9100")
    command = writer.node_launch(cfg).command
    assert list(command[1:4]) == ["--ephemeral", "--config", str(node_conf)]
    parser = argparse.ArgumentParser()
    common.add_config_options(parser)
    parser.add_argument("--ephemeral", action="store_true")
    parsed = common.parse_with_config(parser, list(command[1:]), "clusterpull.py")
    assert not isinstance(parsed, int)
    node = parsed[1]
    assert (node.transport, node.ssh_user) == ("ssh", "pilot")  # from the node.conf
    assert (node.master_host, node.master_home, node.base_port) == (
        "127.0.0.1", cfg.home.resolve(), 9100)  # this master's, over the file's


def test_the_periodic_writer_logs_a_failure_once(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # A file where the resource file's folder must be: it cannot be written.
    (tmp_path / "blocked").write_text("in the way\n")
    cfg = config(tmp_path, f"resource_file={tmp_path / 'blocked' / 'r.json'}")
    hook = writer.ResourceWriter(cfg)
    assert hook() is False and hook() is False
    assert caplog.text.count("cannot write the resource file") == 1
    (tmp_path / "blocked").unlink()  # the folder is made when it can be
    assert hook() is True
