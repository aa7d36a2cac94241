"""The long-poll heartbeat (fast start): a real monitor on loopback, real clients,
real job.start files, and a real clusterpull loop with a stand-in run.py.

A heartbeat with ``wait`` is recorded at once and answered as soon as a run waits that it
does not skip, or when the wait ends; one without ``wait`` is answered at once, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.master.daemon.monitor import MonitorServer
from cluster.node import heartbeat as node_heartbeat
from cluster.node import pull
from cluster.node.heartbeat import HeartbeatStopped
from cluster.wire import signing
from tests.helpers import REPO, give_key, wait_for

RUN = "20190408115600"
OTHER = "user-bob-7"
#: The master home of the test under way (the ``home`` fixture sets it): the nodes that
#: heartbeat are given their own keys there.
KEYS_HOME: Path | None = None


def send_heartbeat(*args: Any, **kwargs: Any) -> list[tuple[int, str]]:
    """The heartbeat of node ``args[2]``, signed with its own key (given it in
    :data:`KEYS_HOME` if it has none)."""
    assert KEYS_HOME is not None, "the home fixture gives the nodes their keys"
    return node_heartbeat.send_heartbeat(*args, secret=give_key(KEYS_HOME, args[2]), **kwargs)


def _write_job_start(home: Home, priority: int, run_id: str) -> None:
    """As the master writes it: a whole file renamed into place."""
    path = home.job_start(priority)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"id {run_id}\nproduct gs\n")
    os.replace(tmp, path)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    monkeypatch.setattr(sys.modules[__name__], "KEYS_HOME", h.root)
    return h


@contextlib.contextmanager
def _serve(server: MonitorServer) -> Iterator[MonitorServer]:
    """``server`` answering from a background thread until the block ends."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def server(home: Home) -> Iterator[MonitorServer]:
    with _serve(MonitorServer(home, ("127.0.0.1", 0))) as srv:
        yield srv


def _port(server: MonitorServer) -> int:
    return server.server_address[1]


class _Call:
    """A heartbeat sent from a thread; ``result`` and ``elapsed`` once it returned."""

    def __init__(self, port: int, node: str, **kwargs: Any) -> None:
        self.result: object = None
        self.elapsed = -1.0
        self.start = time.monotonic()

        def go() -> None:
            try:
                self.result = send_heartbeat("127.0.0.1", port, node, **kwargs)
            except Exception as exc:  # recorded for the test to look at
                self.result = exc
            self.elapsed = time.monotonic() - self.start

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30) -> object:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the heartbeat did not return"
        return self.result


def test_held_heartbeat_returns_when_a_run_appears(server: MonitorServer, home: Home) -> None:
    """A heartbeat with wait is recorded at once, held while nothing waits, and answered
    within about a second of a job.start appearing."""
    call = _Call(_port(server), "n1", status="idle", wait=20)
    wait_for(lambda: (home.nodes / "n1.up").exists(), 10, "the heartbeat to be recorded")
    assert (home.nodes / "n1.status").read_text() == "idle\n"
    time.sleep(0.5)
    assert call.thread.is_alive(), "answered although nothing waits"
    appeared = time.monotonic()
    _write_job_start(home, 1, RUN)
    assert call.join() == [(1, RUN)]
    assert call.start + call.elapsed - appeared < 1.5


def test_skipped_run_holds_until_the_wait_ends(server: MonitorServer, home: Home) -> None:
    """A run the node skips does not end the hold; the answer still lists it."""
    _write_job_start(home, 0, RUN)
    call = _Call(_port(server), "n1", wait=1.5, skip={RUN})
    assert call.join() == [(0, RUN)]
    assert 1.3 < call.elapsed < 10


def test_a_run_not_skipped_ends_the_hold_at_once(server: MonitorServer, home: Home) -> None:
    """One waiting run skipped, another not: the answer comes at once with both."""
    _write_job_start(home, 0, RUN)
    _write_job_start(home, 2, OTHER)
    call = _Call(_port(server), "n1", wait=20, skip={RUN})
    assert call.join() == [(0, RUN), (2, OTHER)]
    assert call.elapsed < 5


def test_skipped_run_held_then_new_run_answers(server: MonitorServer, home: Home) -> None:
    """Held over a skipped run, the heartbeat is answered when another run appears."""
    _write_job_start(home, 0, RUN)
    call = _Call(_port(server), "n1", wait=20, skip={RUN})
    time.sleep(0.5)
    assert call.thread.is_alive()
    _write_job_start(home, 2, OTHER)
    assert call.join() == [(0, RUN), (2, OTHER)]
    assert call.elapsed < 5


def test_wait_without_a_run_ends_at_its_time(server: MonitorServer) -> None:
    """Nothing waits: the answer (empty) comes when the wait ends, not before."""
    call = _Call(_port(server), "n1", wait=1.0)
    assert call.join() == []
    assert 0.9 < call.elapsed < 10


def test_old_style_heartbeat_is_answered_at_once(server: MonitorServer, home: Home) -> None:
    """No wait header (an older node): answered at once even though nothing waits."""
    start = time.monotonic()
    key = signing.heartbeat_key(signing.parse_secret(give_key(home.root, "old")))
    nonce = signing.NonceSource().next()
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as sock:
        sock.sendall(signing.sign_request(b"node old\nstatus idle\nOK\n", key, nonce))
        reply = sock.recv(4096)
    assert reply == signing.sign_reply(b"END\n", key, nonce)
    assert time.monotonic() - start < 3


def test_the_monitor_caps_the_wait(home: Home) -> None:
    """A wait longer than the monitor's max_wait is cut to it."""
    with _serve(MonitorServer(home, ("127.0.0.1", 0), max_wait=0.5)) as srv:
        call = _Call(_port(srv), "n1", wait=25)
        assert call.join() == []
        assert call.elapsed < 10


def test_many_held_heartbeats_are_all_answered(server: MonitorServer, home: Home) -> None:
    """100 held heartbeats at once all learn of the run when it appears."""
    calls = [_Call(_port(server), f"n{i}", wait=20) for i in range(100)]
    wait_for(lambda: len(server.held) == 100, 20, "100 heartbeats to be held")
    _write_job_start(home, 0, RUN)
    assert all(call.join() == [(0, RUN)] for call in calls)
    assert len(list(home.nodes.glob("*.up"))) == 100


def test_stop_ends_a_held_heartbeat_and_the_monitor_forgets_it(server: MonitorServer) -> None:
    """The client's stop() ends the wait within a fraction of a second; the monitor drops
    the connection the node closed."""
    stop = threading.Event()
    call = _Call(_port(server), "n1", wait=20, stop=stop.is_set)
    wait_for(lambda: len(server.held) == 1, 10, "the heartbeat to be held")
    stopped = time.monotonic()
    stop.set()
    assert isinstance(call.join(), HeartbeatStopped)
    assert call.start + call.elapsed - stopped < 2
    wait_for(lambda: not server.held and not server.conns, 10,
             "the monitor to drop the closed connection")


def test_a_wakeup_fd_ends_a_held_heartbeat_before_its_stop_slice(
        server: MonitorServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stop flag's wakeup fd, the stop is seen when the fd turns readable, not at
    the end of a STOP_POLL slice: with the slice made 60 s, the call still returns at once,
    and the fd is drained."""
    monkeypatch.setattr(node_heartbeat, "STOP_POLL", 60.0)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    stop = threading.Event()
    try:
        call = _Call(_port(server), "n1", wait=120, stop=stop.is_set, wakeup_fd=read_end)
        wait_for(lambda: len(server.held) == 1, 10, "the heartbeat to be held")
        stop.set()
        os.write(write_end, b"\x0f")  # what signal.set_wakeup_fd writes: the signal number
        assert isinstance(call.join(timeout=10), HeartbeatStopped)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 1)
    finally:
        os.close(read_end)
        os.close(write_end)


# ----------------------------------------------------------------------------------------------
# clusterpull's loop against a real monitor

#: A run.py that says it started by its arguments in a marker file, written whole (a temp
#: file renamed: the test reads the marker as soon as it exists, and once read it empty).
STAND_IN = """\
import os, pathlib, sys, time
pathlib.Path({marker!r} + ".tmp").write_text(" ".join(sys.argv[1:]))
os.replace({marker!r} + ".tmp", {marker!r})
time.sleep({seconds})
sys.exit({code})
"""


def _pull(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port: int, interval: float,
          seconds: float = 0.0, code: int = 0) -> tuple[pull.ClusterPull, Path]:
    marker = tmp_path / "started"
    script = tmp_path / "run_stand_in.py"
    script.write_text(STAND_IN.format(marker=str(marker), seconds=seconds, code=code))
    monkeypatch.setattr(pull, "RUN_SCRIPT", script)
    # pullnode's own key: made in tmp_path/home by its transport (local) on first use.
    cfg = Config().with_changes(master_host="127.0.0.1", monitor_port=port,
                                heartbeat_interval=interval, node_name="pullnode",
                                work_dir=tmp_path / "work", master_home=tmp_path / "home")
    return pull.ClusterPull(cfg, caps="os=Linux"), marker


def _run_in_thread(node: pull.ClusterPull) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(node.run()), daemon=True)
    thread.start()
    return thread, result


def test_clusterpull_learns_of_a_run_within_a_second(
        server: MonitorServer, home: Home, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle with a 10 s interval, the node starts run.py within about a second of the run
    appearing, sends no more heartbeats than one per interval meanwhile, heartbeats again
    at once when run.py exits (then skips the finished run), and stops promptly while a
    heartbeat is held."""
    node, marker = _pull(tmp_path, monkeypatch, _port(server), interval=10.0)
    thread, result = _run_in_thread(node)
    try:
        wait_for(lambda: len(server.held) == 1, 10, "the idle heartbeat to be held")
        time.sleep(1.0)
        assert node.heartbeats == 0  # still the one held heartbeat, not a poll loop
        appeared = time.monotonic()
        _write_job_start(home, 0, RUN)
        wait_for(marker.exists, 10, "run.py to start")
        assert time.monotonic() - appeared < 2.0
        assert marker.read_text() == "--priority 0"
        # run.py exits 0 at once: finished; the node says so at once and is held again,
        # skipping the run it finished although its job.start is still there.
        wait_for(lambda: RUN in node.finished and len(server.held) == 1, 10,
                 "the node to finish the run and heartbeat again")
        assert node.heartbeats == 1 and node.child is None  # answered: the first one
        assert (home.nodes / "pullnode.status").read_text() == "idle\n"
        stopped = time.monotonic()
        node.stop_flag.set()
        thread.join(10)
        assert not thread.is_alive() and result == [0]
        assert time.monotonic() - stopped < 2.0
    finally:
        node.stop_flag.set()
        thread.join(10)


def test_clusterpull_with_an_old_monitor_keeps_the_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a monitor that ignores wait (answers at once, unsigned: a failed call), the
    node still sends one heartbeat per interval, not a stream: its retries back off from
    FIRST_RETRY to the interval."""
    listener = socket.create_server(("127.0.0.1", 0))
    calls: list[float] = []
    done = threading.Event()

    def old_monitor() -> None:
        listener.settimeout(0.1)
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while not data.endswith(b"OK\n"):
                    data += conn.recv(4096)
                calls.append(time.monotonic())
                conn.sendall(b"END\n")

    server = threading.Thread(target=old_monitor, daemon=True)
    server.start()
    node, _ = _pull(tmp_path, monkeypatch, listener.getsockname()[1], interval=0.5)
    thread, result = _run_in_thread(node)
    try:
        time.sleep(3.2)
    finally:
        node.stop_flag.set()
        thread.join(10)
        done.set()
        server.join(5)
        listener.close()
    assert result == [0]
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # Pauses of 0.05, 0.1, 0.2, 0.4 s, then the interval: 9 calls in 3.2 s, never a stream,
    # and the last three a whole interval apart each (timed where the calls arrive, so one
    # call's lateness shortens the gap after it: the three together are compared).
    assert 5 <= len(calls) <= 10, gaps
    assert calls[-1] - calls[-4] >= 3 * 0.5 - 0.2, gaps


def test_clusterpull_rejoins_after_its_backoff(server: MonitorServer, home: Home,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py exits 3 (master unreachable): the node skips the run while backing off,
    with a hold that ends when the backoff does, then joins again."""
    node, marker = _pull(tmp_path, monkeypatch, _port(server), interval=10.0, code=3)
    node.rejoin_delay = 1.5
    _write_job_start(home, 0, RUN)
    thread, _ = _run_in_thread(node)
    try:
        wait_for(marker.exists, 10, "run.py to start")
        marker.unlink()
        wait_for(lambda: RUN in node.retry_after, 10, "run.py to exit 3")
        backoff_from = time.monotonic()
        wait_for(marker.exists, 15, "run.py to start again after the backoff")
        again = time.monotonic() - backoff_from
        assert 1.0 < again < 6.0, again
        assert RUN not in node.finished
    finally:
        node.stop_flag.set()
        thread.join(10)


def test_tick_without_hold_is_answered_at_once(server: MonitorServer, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """clusterpull.py --once calls tick() without hold: one plain heartbeat, no wait."""
    node, _ = _pull(tmp_path, monkeypatch, _port(server), interval=30.0)
    start = time.monotonic()
    next_at = node.tick(start)
    assert time.monotonic() - start < 5
    assert node.heartbeats == 1 and next_at == start + 30.0


def test_heartbeat_script_waits_and_skips(server: MonitorServer, home: Home) -> None:
    """heartbeat.py --wait/--skip: held over the skipped run, then exit 1 listing it."""
    _write_job_start(home, 0, RUN)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "heartbeat.py"),
                           "--set", f"monitor_port={_port(server)}",
                           "--set", "master_host=127.0.0.1", "--set", "node_name=sh-node",
                           "--set", f"master_home={home.root}",
                           "--wait", "1.5", "--skip", RUN],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert (done.returncode, done.stdout) == (1, f"0 {RUN}\n"), done.stderr
    assert elapsed > 1.3
    bad = subprocess.run([sys.executable, str(REPO / "heartbeat.py"), "--wait", "-1"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--wait" in bad.stderr
