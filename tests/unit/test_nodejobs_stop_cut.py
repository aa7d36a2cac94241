"""A job cut by the signal that stops the whole node (a batch system's time limit or scancel
signals every process of the Slurm job, the node's jobs first as often as not) is given
back, not reported, even when its end is read a moment before the node's own signal
arrives: the node waits up to STOP_SETTLE for it.  A job that ended by itself is reported
at once (docs/provisioning.md; a pilot ended by its time limit reported a held job as error 10)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from cluster import configfile
from cluster.node.nodejobs import JOB_LOG, JOB_MD5, STOP_SETTLE, cut_from_outside
from cluster.node.noderun import RunLoop
from cluster.node.slots import Finished
from cluster.records import Job
from cluster.runtime.clock import FakeClock
from cluster.runtime.service import StopFlag
from tests.helpers import open_test_run

JOB = Job("t1.ps.ppmraw.72.0", "__temp__/t1.log", "true")


@pytest.mark.parametrize("status, killed, cut", [
    (None, False, True),  # its slot's shell died
    (128 + signal.SIGTERM, False, True),
    (128 + signal.SIGKILL, False, True),
    (128 + signal.SIGHUP, False, True),
    (128 + signal.SIGINT, False, True),
    (0, False, False),
    (1, False, False),
    (128 + signal.SIGSEGV, False, False),  # the program crashed: a result
    (128 + signal.SIGHUP, True, False),  # the node's own timeout kill
])
def test_which_ends_look_cut_from_outside(status: int | None, killed: bool, cut: bool) -> None:
    assert cut_from_outside(Finished(JOB, status, killed)) is cut


class SignalAfter(FakeClock):
    """A clock on which the node's stop signal arrives after ``delay`` seconds of sleep."""

    def __init__(self, stop: list[StopFlag], delay: float | None) -> None:
        super().__init__()
        self.stop = stop
        self.delay = delay

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.delay is not None and sum(self.sleeps) >= self.delay:
            self.stop[0].set()


class _IdlePool:
    """The slot pool, no job running in it (the jobs here have ended already)."""

    def running(self) -> int:
        return 0


def _node(tmp_path: Path, delay: float | None) -> tuple[RunLoop, Path, SignalAfter]:
    """A node in a run, its job JOB ended with its log and md5 files in its job folder
    (returned)."""
    cfg = configfile.load(None, {"node_name": "n1", "work_dir": str(tmp_path / "work"),
                             "master_home": str(tmp_path / "home")})
    holder: list[StopFlag] = []
    clock = SignalAfter(holder, delay)
    ctx = open_test_run(tmp_path / "home", cfg, clock=clock)
    holder.append(ctx.stop_flag)
    node = RunLoop(ctx, "", _IdlePool())  # type: ignore[arg-type]
    assert ctx.job_dirs is not None
    folder = Path(ctx.job_dirs.take(JOB))
    for suffix in (JOB_LOG, JOB_MD5):
        (folder / f"{JOB.name}{suffix}").write_text("cut\n")
    return node, folder, clock


def test_a_cut_job_whose_nodes_stop_signal_follows_is_given_back(tmp_path: Path) -> None:
    node, folder, clock = _node(tmp_path, delay=0.2)
    node.jobs.finish(Finished(JOB, None, False))
    assert node.jobs.unsent == []  # given back with the leaving call, not reported
    assert not list(folder.iterdir())  # its files removed
    assert 0.2 <= sum(clock.sleeps) <= STOP_SETTLE


def test_a_cut_job_without_a_stop_is_reported_after_the_settle(tmp_path: Path) -> None:
    node, _, clock = _node(tmp_path, delay=None)
    node.jobs.finish(Finished(JOB, 128 + signal.SIGTERM, False))
    assert [r.name for r in node.jobs.unsent] == [JOB.name]
    assert STOP_SETTLE <= sum(clock.sleeps) <= STOP_SETTLE + 0.1  # bounded


def test_a_job_that_ended_by_itself_is_reported_at_once(tmp_path: Path) -> None:
    node, _, clock = _node(tmp_path, delay=0.0)
    node.jobs.finish(Finished(JOB, 1, False))
    assert [r.name for r in node.jobs.unsent] == [JOB.name]
    assert clock.sleeps == []


def test_the_loop_waits_on_the_build_and_not_a_slice_past_its_end(tmp_path: Path) -> None:
    """With no job running and a BUILD in its thread, the node's wait ends when the build
    ends (its ``ended`` event), not at the end of a poll slice: an ended build costs no
    sleep at all, a running one the slice at most."""
    node, _, clock = _node(tmp_path, None)  # no job running yet
    release = threading.Event()

    def build() -> None:
        release.wait(30)

    node.background.start("build", build)
    assert node.background.current is not None
    bg = node.background.current
    node.wait(0.05)
    assert clock.sleeps == [0.05]  # still building: the slice
    release.set()
    bg.thread.join(30)
    assert bg.done and bg.ended.is_set()
    node.wait(0.05)
    assert clock.sleeps == [0.05]  # ended: no sleep
