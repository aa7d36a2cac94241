"""The resource file with real processes (docs/provisioning.md, "The resource file"): a real
supervisor (run_clustermaster.py) and the clustermasters it starts, and a scripted node over
real TCP (tests/component/scripted_nodes.py).

* With ``resource_interval`` an hour, every change after the supervisor's first write is the
  clustermaster's own: the file says ``running`` with the run's id, its jobs left and the
  nodes wanted as soon as the run is served, and ``finished`` with that id, nothing wanted,
  once it has ended -- the other priorities ``idle`` throughout.
* With a short ``resource_interval`` and nothing queued, the supervisor alone writes the file
  (every priority ``idle``) and rewrites it on its schedule.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cluster.home import Home
from cluster.records import Job
from cluster.runtime import proc
from cluster.wire import protocol
from cluster.wire.resources import Resources, nodes_wanted, read_resources
from tests.component.scripted_nodes import (
    make_home,
    master_argv,
    request,
    run_to_the_end,
    signed_talk,
    wait_for_run,
)
from tests.helpers import REPO, free_port, stop_supervisor, wait_for

MD5 = "0123456789abcdef0123456789abcdef"
PRIORITY = 2


def supervisor(home: Home, port: int, *settings: str) -> subprocess.Popen[bytes]:
    """run_clustermaster.py serving ``home`` with the scripted runs' settings (those of
    :func:`master_argv`: base_port is ``port - 2``) and ``settings``."""
    words = master_argv(home, port, "pid_check_interval=0.2", "supervisor_interval=0.5",
                        "heartbeat_timeout=60", f"monitor_port={free_port()}", *settings)
    sets = words[words.index("--home"):]
    log = open(home.root / "supervisor.out", "ab")  # noqa: SIM115 -- closed with the test
    try:
        return proc.spawn([sys.executable, str(REPO / "run_clustermaster.py"), "-q",
                           "--kill-children", *sets], stdout=log, stderr=log)
    finally:
        log.close()


def stop(sup: subprocess.Popen[bytes], home: Home) -> None:
    stop_supervisor(sup, home.root)


def resources_when(home: Home, check: Callable[[Resources], bool], what: str,
                   timeout: float = 30.0) -> Resources:
    """The resource file once ``check`` holds for it (read as a provisioner would)."""
    path = home.root / "resources.json"

    def look() -> Resources | None:
        try:
            res = read_resources(path, 0.0, 1e9)
        except FileNotFoundError:
            return None
        return res if check(res) else None

    found = wait_for(look, timeout, what)
    assert found is not None
    return found


def test_the_file_follows_a_run_from_served_to_finished(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", priority=PRIORITY)
    port = free_port(5) + PRIORITY
    sup = supervisor(home, port, "resource_interval=3600", "max_nodes=5", "node_slots=2")
    try:
        run_id = wait_for_run(home, PRIORITY, port)
        served = resources_when(home, lambda r: r.priorities[PRIORITY].run == run_id,
                                "the resource file to name the served run")
        two = served.priorities[PRIORITY]
        assert two.status == "running"
        assert two.jobs_left > 0 and two.jobs_running == 0 and two.nodes == 0
        assert two.nodes_wanted == nodes_wanted(two.jobs_left, 2, 5) == 1
        assert served.nodes_wanted == 1
        assert [served.priorities[p].status for p in (0, 1)] == ["idle", "idle"]
        assert served.master.base_port == port - PRIORITY

        # A node serves the run to its end.
        assert protocol.parse_reply(signed_talk(port, request(
            "n1", run_id, "slots 8", "jobs 0 0"))).verb == protocol.BUILD
        reply = protocol.parse_reply(signed_talk(port, request(
            "n1", run_id, "slots 8", "jobs 0 0")))
        held = [Job.parse(line).name for line in reply.jobs]
        assert held
        run_to_the_end(port, "n1", run_id, held, MD5)

        done = resources_when(home, lambda r: r.priorities[PRIORITY].status == "finished",
                              "the resource file to say finished")
        two = done.priorities[PRIORITY]
        assert (two.run, two.jobs_left, two.jobs_running, two.nodes_wanted) == (
            run_id, 0, 0, 0)
        assert done.nodes_wanted == 0 and done.finished
        assert [done.priorities[p].status for p in (0, 1)] == ["idle", "idle"]
        # Still finished once the run's end steps are all done (the queue is empty).
        wait_for(lambda: (home.archive / run_id / "run.info").exists(), 30,
                 "the run's archive")
        wait_for(lambda: not home.run_dir(run_id).exists(), 30, "the run's end steps")
    finally:
        stop(sup, home)
    last = read_resources(home.root / "resources.json", 0.0, 1e9)
    assert (last.priorities[PRIORITY].status, last.priorities[PRIORITY].run) == (
        "finished", run_id)


def test_the_supervisor_rewrites_the_file_every_interval(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    sup = supervisor(home, free_port(5) + PRIORITY, "resource_interval=0.3")
    try:
        first = resources_when(home, lambda r: True, "the resource file to appear")
        assert all(info.status == "idle" for info in first.priorities.values())
        assert first.nodes_wanted == 0 and first.finished
        later = resources_when(home, lambda r: r.written >= first.written + 0.5,
                               "the resource file to be rewritten", timeout=10)
        assert later.master.pid == sup.pid  # the supervisor wrote it
    finally:
        stop(sup, home)
