"""A node that cannot fetch the corpus or the source reports failure 1, not -1:
-1 ends the run for every node, so only a build command that fails may send it.  Real node
runs (NodeRun, slot shells, a real transport) against a master on loopback."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from cluster.defaults import NODE_EXIT_ABORTED, NODE_EXIT_FAILED
from cluster.master.state.nodeinfo import NodeState
from cluster.master.state.runstate import RunState
from cluster.records import Job
from cluster.wire import protocol, signing
from cluster.wire.protocol import Request
from tests.component.test_node_run import (
    KEY,
    RUN,
    ScriptedMaster,
    make_node_home,
    node,
    script_once,
    write_start,
)


class RealMaster:
    """The master's real run state behind the socket: what it does with a node's failure."""

    def __init__(self) -> None:
        self.state = RunState(RUN, [Job("t0.ps.ppmraw.72.0", "__temp__/t0.log", "true")], 0)
        self.seen: list[Request] = []
        self.lock = threading.Lock()

    def handler(self, data: bytes, peer: str) -> bytes:
        _, nonce = signing.verify_request(data, KEY)
        req = protocol.parse_request(data)
        with self.lock:
            self.seen.append(req)
            reply = protocol.format_reply(self.state.handle(req, time.monotonic()).reply)
        return signing.sign_reply(reply, KEY, nonce)


def _break(home: Path, how: str) -> str:
    """Make the master home unfit to fetch from; return the tree that breaks."""
    if how == "source missing":
        shutil.rmtree(home / "src")
        return "src"
    if how == "source is a file":
        shutil.rmtree(home / "src")
        (home / "src").write_text("not a directory\n")
        return "src"
    if how == "corpus missing":
        shutil.rmtree(home / "tests")
        return "tests"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["source missing", "source is a file", "corpus missing"])
def test_a_failed_fetch_reports_failure_1_and_the_run_goes_on(tmp_path: Path, serve,
                                                              how: str) -> None:
    home = make_node_home(tmp_path)
    write_start(home)
    tree = _break(home, how)
    master = RealMaster()
    port = serve(master)
    assert node(home, tmp_path, port).run() == NODE_EXIT_FAILED
    failing = [r for r in master.seen if r.failure]
    assert failing, [r.status for r in master.seen]
    assert failing[0].failure == protocol.FAILURE_NETWORK == 1
    assert failing[0].failure_reason.startswith(f"fetch failed: fetch {tree}: ")
    # The master dropped this node only; the run is not aborted for the others.
    assert master.state.fatal == ""
    assert master.state.nodes["n1"].state is NodeState.GONE
    log = (home / "runs" / RUN / "logs" / "n1.build.log").read_text()
    assert f"fetch failed: fetch {tree}" in log


def test_a_failed_build_command_still_reports_minus_one(tmp_path: Path, serve) -> None:
    """The contrast: the build command itself failing is -1, and the run is aborted."""
    home = make_node_home(tmp_path)
    write_start(home, build="exit 7")
    master = RealMaster()
    port = serve(master)
    assert node(home, tmp_path, port).run() == NODE_EXIT_FAILED
    failing = [r for r in master.seen if r.failure]
    assert failing[0].failure == protocol.FAILURE_BUILD
    assert "exited with status 7" in failing[0].failure_reason
    assert master.state.fatal.startswith("node n1 failed with code -1")


def test_a_build_stopped_by_the_node_is_no_failure(tmp_path: Path, serve) -> None:
    """TERM during the build: the node leaves without a failure (a -1 would abort the run for
    every node because one node was stopped)."""
    home = make_node_home(tmp_path)
    write_start(home, build="sleep 60")
    master = ScriptedMaster(script_once("true"))
    port = serve(master)
    run = node(home, tmp_path, port)

    def stop_when_building() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(r.busy == "build" for r in list(master.seen)):
                time.sleep(0.3)  # the build command is running
                run.stop()
                return
            time.sleep(0.02)

    stopper = threading.Thread(target=stop_when_building, daemon=True)
    stopper.start()
    started = time.monotonic()
    code = run.run()
    stopper.join(5)
    assert code == NODE_EXIT_ABORTED
    assert time.monotonic() - started < 30  # the 60 s build was ended, not waited for
    assert all(r.failure == 0 for r in master.seen), [(r.failure, r.failure_reason)
                                                      for r in master.seen]
    assert master.seen[-1].leaving
