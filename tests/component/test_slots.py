"""The per-slot shells: jobs stay isolated, failures stay contained, timeouts kill trees."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.node.slots import Finished, SlotPool
from cluster.records import Job


@pytest.fixture
def pool() -> Iterator[SlotPool]:
    p = SlotPool(2, os.environ, timeout=30, kill_grace=0.3)
    yield p
    p.close()


def job(name: str) -> Job:
    return Job(name, f"__temp__/{name}.log", "true")


def run(pool: SlotPool, name: str, command: str, limit: float = 10) -> Finished:
    pool.start(job(name), command, time.monotonic())
    end = time.monotonic() + limit
    while time.monotonic() < end:
        pool.check_timeouts(time.monotonic())
        for done in pool.wait(0.05):
            return done
    raise AssertionError(f"{name} did not finish")


def test_exit_status_and_output(pool: SlotPool, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(pool, "a", f"echo 17 | md5sum > {out}").exit_status == 0
    assert out.read_text().startswith("4d095eeac8ed659b1ce69dcef32ed0dc")
    assert run(pool, "b", "exit 3").exit_status == 3


def test_a_syntax_error_fails_alone_and_the_slot_goes_on(pool: SlotPool) -> None:
    assert run(pool, "bad", "echo 'unbalanced").exit_status == 2
    assert run(pool, "bad2", "if then fi ) (").exit_status == 2
    assert run(pool, "good", "true").exit_status == 0


def test_jobs_do_not_leak_state_into_each_other(pool: SlotPool, tmp_path: Path) -> None:
    out = tmp_path / "o"
    for i in range(4):  # both slots, twice
        run(pool, f"set{i}", "cd / ; X=leaked ; export Y=leaked ; umask 077")
    run(pool, "look", f"echo \"$(pwd) ${{X:-clean}} ${{Y:-clean}}\" > {out}")
    assert out.read_text().split()[1:] == ["clean", "clean"]


def test_a_job_reading_stdin_gets_nothing(pool: SlotPool, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(pool, "cat", f"cat > {out}").exit_status == 0
    assert out.read_text() == ""
    assert run(pool, "after", "true").exit_status == 0  # the shell's own input is intact


def test_a_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    pool = SlotPool(1, os.environ, timeout=0.5, kill_grace=0.3)
    try:
        pidfile = tmp_path / "p"
        done = run(pool, "slow", f"sh -c 'trap \"\" HUP; sleep 60 & echo $! > {pidfile}; wait'")
        assert done.killed
        grandchild = int(pidfile.read_text())
        time.sleep(0.1)
        assert not psutil.pid_exists(grandchild) or \
            psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        assert run(pool, "next", "true").exit_status == 0  # a fresh shell took over
    finally:
        pool.close()


def test_a_shell_killed_from_outside_ends_its_job_and_is_replaced(pool: SlotPool) -> None:
    pool.start(job("victim"), "sleep 30", time.monotonic())
    (slot,) = [s for s in pool.slots if s.job is not None]
    os.killpg(slot.pid, signal.SIGKILL)
    end = time.monotonic() + 10
    done: list[Finished] = []
    while not done and time.monotonic() < end:
        done = pool.wait(0.1)
    assert done[0].job.name == "victim" and done[0].exit_status is None
    assert run(pool, "again", "true").exit_status == 0


def test_a_busy_slot_starts_the_next_job_without_waiting_for_the_node(tmp_path: Path) -> None:
    """Two jobs in one slot: the second starts the moment the first ends, while nobody
    reads the slot's events; both then end, in order, with their own statuses."""
    pool = SlotPool(1, os.environ, timeout=30, kill_grace=0.3)
    try:
        stamp = tmp_path / "second-started"
        assert pool.start(job("first"), "sleep 0.5; exit 4", time.monotonic())
        assert pool.start(job("second"), f"date +%s.%N > {stamp}", time.monotonic())
        assert pool.free() == 0 and pool.running() == 2
        assert not pool.start(job("third"), "true", time.monotonic())  # full: DEPTH 2
        # The node busy elsewhere: no wait() meanwhile.  The second job starts all the
        # same; were it waiting for the node to read the slot, its stamp would never come.
        deadline = time.monotonic() + 30
        while not stamp.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stamp.exists(), "the second job did not start while nobody read the slot"
        done: list[Finished] = []
        end = time.monotonic() + 10
        while len(done) < 2 and time.monotonic() < end:
            done += pool.wait(0.1)
        assert [(d.job.name, d.exit_status, d.killed) for d in done] == [
            ("first", 4, False), ("second", 0, False)]
        assert pool.take_returned() == [] and pool.running() == 0
    finally:
        pool.close()


def test_a_job_waiting_behind_a_timed_out_one_is_handed_back_unrun(tmp_path: Path) -> None:
    """The running job ignores SIGHUP and is killed with its shell after the grace; the
    job waiting in that shell's input never ran and comes back from take_returned()."""
    pool = SlotPool(1, os.environ, timeout=0.5, kill_grace=0.3)
    try:
        ran = tmp_path / "ran"
        pool.start(job("stuck"), "trap '' HUP; sleep 30", time.monotonic())
        pool.start(job("behind"), f"echo ran > {ran}", time.monotonic())
        done: list[Finished] = []
        end = time.monotonic() + 10
        while not done and time.monotonic() < end:
            pool.check_timeouts(time.monotonic())
            done = pool.wait(0.05)
        assert [(d.job.name, d.exit_status, d.killed) for d in done] == [
            ("stuck", None, True)]
        assert [j.name for j in pool.take_returned()] == ["behind"]
        assert pool.take_returned() == []  # handed back once
        assert not ran.exists()
        assert run(pool, "after", "true").exit_status == 0  # a fresh shell took over
    finally:
        pool.close()


def test_a_long_command_waits_for_an_idle_slot() -> None:
    """A command longer than PIPE_BUF is not queued behind a running job (writing it could
    block the node until that job ends); an idle slot takes it at once."""
    pool = SlotPool(2, os.environ, timeout=30, kill_grace=0.3)
    try:
        long_command = "true " + "x" * 8000
        assert pool.start(job("busy1"), "sleep 0.3", time.monotonic())
        assert pool.start(job("busy2"), "sleep 0.3", time.monotonic())
        assert pool.free() == 2  # room for one more in each shell's input...
        assert not pool.start(job("long"), long_command, time.monotonic())  # ...not this
        assert pool.start(job("short"), "true", time.monotonic())
        done: list[Finished] = []
        end = time.monotonic() + 10
        while len(done) < 3 and time.monotonic() < end:
            done += pool.wait(0.1)
        assert sorted(d.job.name for d in done) == ["busy1", "busy2", "short"]
        assert pool.start(job("long"), long_command, time.monotonic())
        done = []
        while not done and time.monotonic() < end:
            done = pool.wait(0.1)
        assert [(d.job.name, d.exit_status) for d in done] == [("long", 0)]
    finally:
        pool.close()


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def wait_for(path: Path, limit: float = 10) -> None:
    end = time.monotonic() + limit
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


def test_a_withdrawn_running_job_is_killed_at_once_and_the_job_behind_handed_back(
        tmp_path: Path) -> None:
    """Withdrawn (its result came from another node's copy): the running job's whole tree
    dies at once -- even a child ignoring SIGHUP, with no kill_grace wait -- it ends as
    withdrawn, the job waiting behind it never ran and is handed back, and a fresh shell
    runs the next job."""
    pool = SlotPool(1, os.environ, timeout=300, kill_grace=30)
    try:
        pidfile, ran = tmp_path / "p", tmp_path / "ran"
        assert pool.start(job("copy"), f"sh -c 'trap \"\" HUP; sleep 300 & echo $! > "
                          f"{pidfile}; wait'", time.monotonic())
        assert pool.start(job("behind"), f"echo ran > {ran}", time.monotonic())
        wait_for(pidfile)
        sleeper = int(pidfile.read_text())
        began = time.monotonic()
        done = pool.withdraw({"copy"}, time.monotonic())
        assert [(d.job.name, d.withdrawn) for d in done] == [("copy", True)]
        while not gone(sleeper) and time.monotonic() - began < 5:
            time.sleep(0.01)
        assert gone(sleeper) and time.monotonic() - began < 1.0
        assert [j.name for j in pool.take_returned()] == ["behind"] and not ran.exists()
        assert pool.running() == 0 and pool.free() == 2
        assert run(pool, "next", "true").exit_status == 0
    finally:
        pool.close()


def test_a_job_withdrawn_while_it_waits_is_killed_as_it_starts(tmp_path: Path) -> None:
    """A withdrawn job still in a shell's input behind a job that is not withdrawn: the
    running job goes on to its own end; the withdrawn one is killed as it starts (it writes
    nothing past its first command) and ends as withdrawn, never as a result."""
    pool = SlotPool(1, os.environ, timeout=300, kill_grace=30)
    try:
        started, finished = tmp_path / "started", tmp_path / "finished"
        assert pool.start(job("own"), "sleep 0.5; exit 3", time.monotonic())
        assert pool.start(job("copy"), f"touch {started}; sleep 2; touch {finished}",
                          time.monotonic())
        assert pool.withdraw({"copy"}, time.monotonic()) == []  # not running yet
        done: list[Finished] = []
        end = time.monotonic() + 10
        while len(done) < 2 and time.monotonic() < end:
            done += pool.wait(0.05)
        assert [(d.job.name, d.exit_status, d.withdrawn) for d in done] == [
            ("own", 3, False), ("copy", None, True)]
        assert pool.take_returned() == [] and pool.running() == 0
        time.sleep(2.5)
        assert not finished.exists()
        assert run(pool, "next", "true").exit_status == 0
    finally:
        pool.close()


def test_a_preempted_node_gives_back_the_jobs_waiting_in_its_shells(tmp_path: Path) -> None:
    """Preempted (docs/protocol.md, "Preemption at job boundaries"): the job running in a
    slot goes on to its end; the one waiting behind it in the shell's input is killed as it
    starts, ends as withdrawn (no result) and never does its work."""
    pool = SlotPool(2, os.environ, timeout=300, kill_grace=30)
    try:
        finished = tmp_path / "finished"
        now = time.monotonic()
        assert pool.start(job("a"), "sleep 0.4", now)
        assert pool.start(job("b"), "sleep 0.4", now)
        assert pool.start(job("a2"), f"sleep 1; touch {finished}", now)
        assert pool.doom_waiting() == ["a2"]
        done: list[Finished] = []
        end = time.monotonic() + 10
        while len(done) < 3 and time.monotonic() < end:
            done += pool.wait(0.05)
        assert sorted((d.job.name, d.exit_status, d.withdrawn) for d in done) == [
            ("a", 0, False), ("a2", None, True), ("b", 0, False)]
        assert pool.take_returned() == [] and pool.running() == 0
        time.sleep(1.2)
        assert not finished.exists()
    finally:
        pool.close()


def test_withdrawing_a_job_the_pool_does_not_hold_changes_nothing(pool: SlotPool) -> None:
    assert pool.start(job("mine"), "sleep 0.2", time.monotonic())
    assert pool.withdraw({"other"}, time.monotonic()) == []
    done: list[Finished] = []
    end = time.monotonic() + 10
    while not done and time.monotonic() < end:
        done = pool.wait(0.05)
    assert [(d.job.name, d.exit_status, d.withdrawn) for d in done] == [("mine", 0, False)]
