"""Component tests of the heartbeat monitor: a real server on 127.0.0.1 port 0, real clients.

Covers cluster.wire.heartbeat (the format), cluster.master.daemon.monitor (the server),
cluster.node.heartbeat (the client) and the heartbeat.py / monitor_port.py scripts.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import AlreadyRunning, ProtocolError
from cluster.home import Home
from cluster.master.daemon import monitor
from cluster.master.daemon.monitor import MonitorServer, acquire_lock
from cluster.master.files.nodefiles import nodes_seen
from cluster.node import heartbeat as node_heartbeat
from cluster.node.heartbeat import HeartbeatError
from cluster.wire import signing
from cluster.wire.heartbeat import (
    Heartbeat,
    format_heartbeat,
    format_reply,
    parse_heartbeat,
    parse_reply,
)
from tests.helpers import (
    NODE_SECRET,
    REPO,
    give_key,
    reaped,
    stop_as_a_signal_does,
    wait_for,
    wakeup_pipe,
)

JOB0 = "20190408115600"
JOB2 = "user-alice-1"
#: The master home of the test under way (the ``home`` fixture sets it): the nodes that
#: heartbeat are given their own keys there.
KEYS_HOME: Path | None = None


def send_heartbeat(*args: Any, **kwargs: Any) -> list[tuple[int, str]]:
    """The heartbeat of node ``args[2]``, signed with its own key (given it in
    :data:`KEYS_HOME` if it has none)."""
    assert KEYS_HOME is not None, "the home fixture gives the nodes their keys"
    return node_heartbeat.send_heartbeat(*args, secret=give_key(KEYS_HOME, args[2]), **kwargs)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    h.job_start(0).write_text(f"id {JOB0}\nproduct gs\n")
    h.job_start(2).write_text(f"id {JOB2}\nuser alice\n")
    monkeypatch.setattr(sys.modules[__name__], "KEYS_HOME", h.root)
    return h


def _serve(server: MonitorServer) -> Iterator[MonitorServer]:
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
    yield from _serve(MonitorServer(home, ("127.0.0.1", 0)))


def _port(server: MonitorServer) -> int:
    return int(server.server_address[1])


def _raw(server: MonitorServer, data: bytes, half_close: bool = False) -> bytes:
    """Send ``data`` on a fresh connection and return everything the server answers."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before reading everything we send
        chunks = []
        while True:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------------------------
# Wire format

def test_heartbeat_round_trip() -> None:
    """format_heartbeat and parse_heartbeat are inverses; absent headers stay None."""
    for hb in (Heartbeat("node7"), Heartbeat("n-1.x_y", "12 tests done", "os=Linux cpus=2"),
               Heartbeat("a", status="")):
        assert parse_heartbeat(format_heartbeat(hb)) == hb


def test_parse_heartbeat_ignores_unknown_headers() -> None:
    """Headers the monitor does not know are ignored (the format is meant to grow)."""
    assert parse_heartbeat(b"node a\nfuture stuff\n\nOK\n") == Heartbeat("a")


@pytest.mark.parametrize(("data", "problem"), [
    (b"node bad/name\nOK\n", "node name"),
    (b"status x\nOK\n", "no 'node"),
    (b"node a\n", "OK"),
    (b"node a\nABORT\n", "OK"),
    (b"node a\nnode b\nOK\n", "two different"),
    (b"node a\nstatus \x01\nOK\n", "control character"),
    (b"node \xff\nOK\n", "UTF-8"),
    (b"node a\n" + b"x\n" * 16 + b"OK\n", "more than 16"),
])
def test_parse_heartbeat_rejects(data: bytes, problem: str) -> None:
    """Malformed requests raise ProtocolError saying what is wrong."""
    with pytest.raises(ProtocolError, match=problem):
        parse_heartbeat(data)


def test_reply_round_trip_and_errors() -> None:
    """parse_reply reads format_reply's lines; ERROR, a cut reply and junk are errors."""
    jobs = [(0, JOB0), (2, JOB2)]
    assert parse_reply(format_reply(jobs)) == jobs
    assert parse_reply(b"END\n") == []
    with pytest.raises(ProtocolError, match="refused the heartbeat: bad name"):
        parse_reply(b"ERROR bad name\n")
    with pytest.raises(ProtocolError, match="END"):
        parse_reply(b"job 0 x\n")
    with pytest.raises(ProtocolError, match="job <lane 0-9>"):
        parse_reply(b"job 12 x\nEND\n")
    assert parse_reply(b"job 7 x\nEND\n") == [(7, "x")]  # a user lane (cluster.lanes)


# ----------------------------------------------------------------------------------------------
# Server and client

def test_heartbeat_gets_waiting_jobs_and_records_node(server: MonitorServer,
                                                      home: Home) -> None:
    """A heartbeat learns every waiting run and leaves .up, .status and .caps behind."""
    before = time.time()
    jobs = send_heartbeat("127.0.0.1", _port(server), "node7", status="Building gs",
                          caps="os=Linux cpus=2")
    assert jobs == [(0, JOB0), (2, JOB2)]
    assert (home.nodes / "node7.status").read_text() == "Building gs\n"
    assert (home.nodes / "node7.caps").read_text() == "os=Linux cpus=2\n"
    assert (home.nodes / "node7.up").stat().st_mtime >= before - 1
    assert not [p for p in home.nodes.iterdir() if p.name.startswith(".")]  # no temp files
    seen = nodes_seen(home)
    assert list(seen) == ["node7"]
    age, status = seen["node7"]
    assert 0 <= age < 5 and status == "Building gs"


def test_heartbeat_without_status_keeps_the_old_one(server: MonitorServer, home: Home) -> None:
    """A heartbeat that sends no status leaves the stored one alone but renews .up."""
    send_heartbeat("127.0.0.1", _port(server), "n1", status="idle")
    up = home.nodes / "n1.up"
    os.utime(up, (1000, 1000))
    send_heartbeat("127.0.0.1", _port(server), "n1")
    assert (home.nodes / "n1.status").read_text() == "idle\n"
    assert up.stat().st_mtime > 1000
    assert nodes_seen(home, now=up.stat().st_mtime + 42)["n1"] == (42.0, "idle")


def test_no_job_start_means_no_jobs(server: MonitorServer, home: Home) -> None:
    """Without job.start files the answer is empty; a job.start without an id is skipped."""
    home.job_start(0).unlink()
    home.job_start(2).write_text("product gs\n")
    home.job_start(1).write_text("id second-run\n")
    assert send_heartbeat("127.0.0.1", _port(server), "n1") == [(1, "second-run")]
    home.job_start(1).unlink()
    assert send_heartbeat("127.0.0.1", _port(server), "n1") == []


@pytest.mark.parametrize(("data", "half_close", "problem"), [
    # No key can exist for a name that is no node name: refused before it is parsed.
    (b"node ../../etc\nOK\n", False, b"unknown node"),
    (b"node a\nstatus x\n", True, b"closed before the OK"),
    (b"node a\nstatus " + b"x" * 5000 + b"\nOK\n", False, b"longer than 4096"),
    (b"\x00\xff\xfe garbage \x80\nOK\n", False, b"ERROR"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", True, b"ERROR"),  # a TLS hello
    (b"node a\n" + b"x y\n" * 40 + b"OK\n", False, b"more than 16"),
])
def test_malformed_request_gets_error_and_server_keeps_serving(
        server: MonitorServer, home: Home, data: bytes, half_close: bool, problem: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    """A malformed request is answered ERROR and logged with the peer; the next client is
    served normally."""
    caplog.set_level("WARNING", logger="cluster.monitor")
    if data.endswith(b"OK\n"):  # signed: a stranger's never get this far (unsigned)
        key = signing.heartbeat_key(signing.parse_secret(give_key(home.root, "a")))
        data = signing.sign_request(data, key, signing.NonceSource().next())
    reply = _raw(server, data, half_close)
    assert reply.startswith(b"ERROR ") and reply.endswith(b"\n") and problem in reply
    assert any("peer 127.0.0.1:" in r.getMessage() for r in caplog.records)
    assert send_heartbeat("127.0.0.1", _port(server), "good") == [(0, JOB0), (2, JOB2)]
    assert not (home.nodes / "a.up").exists()


def test_silent_client_does_not_delay_others(server: MonitorServer) -> None:
    """While one client sits silent, another heartbeat completes well within the deadline."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10):
        time.sleep(0.1)  # the server has accepted it and is waiting for its request
        start = time.monotonic()
        jobs = send_heartbeat("127.0.0.1", _port(server), "busy-node", timeout=4)
        elapsed = time.monotonic() - start
    assert jobs == [(0, JOB0), (2, JOB2)]
    assert elapsed < 1.0, elapsed


def test_silent_client_is_dropped_at_the_deadline(home: Home) -> None:
    """A client that sends nothing gets ERROR once the per-connection deadline passes."""
    for srv in _serve(MonitorServer(home, ("127.0.0.1", 0), deadline=0.3)):
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", _port(srv)), timeout=10) as sock:
            sock.sendall(b"node slow\n")
            reply = sock.recv(4096)
        assert reply.startswith(b"ERROR no complete request within 0.3 s")
        assert time.monotonic() - start < 3


def test_connection_limit_refuses_extra_clients(home: Home) -> None:
    """Beyond max_connections a client is told ERROR at once instead of waiting."""
    for srv in _serve(MonitorServer(home, ("127.0.0.1", 0), max_connections=1)):
        with socket.create_connection(("127.0.0.1", _port(srv)), timeout=10):
            time.sleep(0.1)
            with pytest.raises(HeartbeatError, match="busy"):
                send_heartbeat("127.0.0.1", _port(srv), "n1", timeout=4)
        # The silent one closed; its slot comes back.
        deadline = time.monotonic() + 5
        while True:
            try:
                assert send_heartbeat("127.0.0.1", _port(srv), "n1") == [(0, JOB0), (2, JOB2)]
                break
            except HeartbeatError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_client_errors_name_the_monitor(server: MonitorServer) -> None:
    """Refused connections and bad names raise HeartbeatError naming host and port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(HeartbeatError, match=f"127.0.0.1:{free}: connection refused"):
        send_heartbeat("127.0.0.1", free, "n1", timeout=2)
    with pytest.raises(HeartbeatError, match="node name"):  # refused before it is signed
        node_heartbeat.send_heartbeat("127.0.0.1", _port(server), "bad name",
                                      secret=NODE_SECRET)


# ----------------------------------------------------------------------------------------------
# Single instance

def test_second_instance_refuses(home: Home) -> None:
    """While one holder has the lock, another acquire fails and run() exits 0 at once."""
    with acquire_lock(home):
        with pytest.raises(AlreadyRunning, match=r"monitor_port\.lock"):
            acquire_lock(home)
        assert monitor.run(home, ("127.0.0.1", 0), should_stop=lambda: False) == 0
    with acquire_lock(home):  # released, so it can be taken again
        pass


def test_run_serves_until_stopped(home: Home) -> None:
    """run() listens, answers heartbeats and returns 0 when should_stop() turns true."""
    ready: list[MonitorServer] = []
    stop = threading.Event()
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(
        monitor.run(home, ("127.0.0.1", 0), stop.is_set, poll=0.05, on_ready=ready.append)))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not ready and time.monotonic() < deadline:
            time.sleep(0.02)
        assert send_heartbeat("127.0.0.1", _port(ready[0]), "n9") == [(0, JOB0), (2, JOB2)]
    finally:
        stop.set()
        t.join(5)
    assert result == [0]


def test_a_stop_ends_the_monitor_at_once_whatever_its_poll(home: Home) -> None:
    """localcluster.py waits for the monitor at each exit: a stop must not wait out a long
    ``poll`` (here 5 s): the loop looks at its stop flag every STOP_SLICE."""
    ready: list[MonitorServer] = []
    stop = threading.Event()
    t = threading.Thread(target=monitor.run, args=(home, ("127.0.0.1", 0), stop.is_set),
                         kwargs={"poll": 5.0, "on_ready": ready.append}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not ready and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready, "the monitor did not listen within 10 s"
    time.sleep(0.2)  # in its select now
    began = time.monotonic()
    stop.set()
    t.join(15)
    took = time.monotonic() - began
    assert not t.is_alive()
    assert took < 1.0, f"the monitor took {took:.2f} s to stop (its poll is 5 s)"


def test_a_stop_flags_wakeup_fd_ends_the_monitors_wait_at_the_signal(
        home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a StopFlag whose wakeup fd turns readable (a signal's byte), the monitor stops
    without waiting out its slice: with STOP_SLICE and poll made 60 s it still stops at
    once, and the fd is drained."""
    monkeypatch.setattr(monitor, "STOP_SLICE", 60.0)
    ready: list[MonitorServer] = []
    with wakeup_pipe() as pipe:
        t = threading.Thread(target=monitor.run,
                             args=(home, ("127.0.0.1", 0), pipe.flag.is_set),
                             kwargs={"poll": 60.0, "on_ready": ready.append,
                                     "wakeup_fd": pipe.read_end}, daemon=True)
        t.start()
        wait_for(lambda: bool(ready), 10, "the monitor to listen")
        stop_as_a_signal_does(pipe, t, "the monitor")


# ----------------------------------------------------------------------------------------------
# The scripts

def _script(name: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / name), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_heartbeat_script_exit_codes(server: MonitorServer, home: Home) -> None:
    """heartbeat.py prints waiting runs and exits 1; 0 when none waits; 2 on error."""
    port = str(_port(server))
    sets = ["--set", f"monitor_port={port}", "--set", "master_host=127.0.0.1",
            "--set", "node_name=script-node", "--set", f"master_home={home.root}"]
    proc = _script("heartbeat.py", *sets, "--status", "idle")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == f"0 {JOB0}\n2 {JOB2}\n"
    assert (home.nodes / "script-node.status").read_text() == "idle\n"
    home.job_start(0).unlink()
    home.job_start(2).unlink()
    proc = _script("heartbeat.py", *sets)
    assert (proc.returncode, proc.stdout) == (0, "")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    proc = _script("heartbeat.py", *sets, "--set", f"monitor_port={free}")
    assert proc.returncode == 2
    assert "connection refused" in proc.stderr
    proc = _script("heartbeat.py", "--set", "no_such_key=1")
    assert proc.returncode == 2 and "no_such_key" in proc.stderr


def test_monitor_port_script_serves_and_refuses_a_second_instance(home: Home) -> None:
    """monitor_port.py serves heartbeats, a second copy exits 0 saying 'already running',
    and SIGTERM stops the first cleanly."""
    sets = ["--set", f"home={home.root}", "--set", "monitor_port=0"]
    with reaped(subprocess.Popen([sys.executable, str(REPO / "monitor_port.py"), *sets],
                                 cwd=REPO, stderr=subprocess.PIPE, text=True)) as first:
        assert first.stderr is not None
        port = None
        deadline = time.monotonic() + 20
        while port is None and time.monotonic() < deadline:
            ready, _, _ = select.select([first.stderr], [], [], 0.5)
            if ready:
                line = first.stderr.readline()
                match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
                if match:
                    port = int(match.group(1))
        assert port, "monitor_port.py did not report its port"
        assert send_heartbeat("127.0.0.1", port, "n1", status="hello") == [(0, JOB0), (2, JOB2)]
        second = _script("monitor_port.py", *sets)
        assert second.returncode == 0
        assert "already running" in second.stderr
        quiet = _script("monitor_port.py", *sets, "--quiet")  # as its crontab line runs it
        assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
        log = (home.log_dir / "monitor_port.log").read_text()
        assert log.count("already running") == 2 and "listening on 127.0.0.1:" in log
        nodes = _script("monitor_port.py", *sets, "--nodes")
        assert nodes.returncode == 0 and re.fullmatch(r"n1 \d+ hello\n", nodes.stdout)
        first.send_signal(signal.SIGTERM)
        assert first.wait(10) == 0


def test_send_caps_script_prints_the_caps_line() -> None:
    """send_caps.py prints one key=value line that carries this machine's OS."""
    proc = _script("send_caps.py")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    assert re.match(r"os=\S+ arch=\S+ bits=(32|64) cc=\S+ cpus=\d+ ram_mb=\d+ tools=\S+$",
                    lines[0])
