"""End to end: a build that never ends is killed at build_timeout and fails its run.

A local cluster (master, monitor, one node) gets a pushed product tree whose Makefile sleeps
"forever".  The node's build step must be killed with its whole process tree once
``build_timeout`` seconds have passed, and the run must end like any failed build: the
failure report names the node and says the build timed out after that many seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import FAST, wait_for

pytestmark = pytest.mark.e2e

#: The build's time limit in this test [seconds]: long enough that the build has surely
#: started (mirroring the corpus and the tree takes well under a second here), short enough
#: to keep the test quick.
BUILD_TIMEOUT = 3
#: What may pass between the build's timeout and the run's archive on top of one poll
#: interval [seconds]: the SIGTERM to the build's group (``sleep`` dies at once), the node's
#: upload of its logs and its failure call, the master's ABORT, its failure report and
#: archive, and wait_for_run's own 0.2 s polling.  Measured: the archive was there 3.04 s
#: after the sleep started (0.04 s past the timeout) on a 2-core VM shared with other work;
#: 10 s leaves room for a loaded CI machine without hiding a build that runs on to the
#: default timeout (an hour).
FINISH_SLACK = 10.0


def _sleeps(argument: str) -> list[psutil.Process]:
    """The live ``sleep <argument>`` processes (the hung build's)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["cmdline"] == ["sleep", argument] and \
                    process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_a_hung_build_is_killed_at_build_timeout_and_fails_the_run(make_cluster) -> None:
    cluster = make_cluster(nodes=1, gs_configs="ppmraw.72.0",
                           build_timeout=str(BUILD_TIMEOUT))
    cluster.start()
    # A sleep argument no other process on the machine has: the pid of this test makes it
    # unique, so the psutil search below finds only this build's sleep.
    argument = f"{100000 + os.getpid()}"
    tree: Path = cluster.home_dir / "hung"
    tree.mkdir()
    (tree / "Makefile").write_text(f"all:\n\tsleep {argument}\n")
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])

    wait_for(lambda: _sleeps(argument), 120, "the node's build to start its sleep")
    build_started = time.monotonic()
    archive = cluster.wait_for_run(spec, before, 120)
    finished = time.monotonic() - build_started

    text = (archive / "report.txt").read_text()
    assert "An error occurred that prevented the local cluster run from finishing" in text
    assert "node node1 failed with code -1" in text
    assert f"timed out after {BUILD_TIMEOUT} s (build_timeout)" in text
    assert not (archive / f"{archive.name}.tab").exists()
    # The whole build tree was killed: make and its sleep are gone, not orphaned.
    assert _sleeps(argument) == []
    poll = float(FAST["poll_interval"])
    assert BUILD_TIMEOUT <= finished + 0.5  # never killed early (0.5 s: polling of wait_for)
    assert finished < BUILD_TIMEOUT + poll + FINISH_SLACK, (
        f"the run ended {finished:.1f} s after its build started")
