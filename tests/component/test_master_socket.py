"""A real clustermaster process on loopback, driven by scripted node clients."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.wire import protocol, signing
from tests.component.scripted_nodes import (
    NONCES,
    known_run,
    listening,
    master_argv,
    node_run_key,
    request,
    signed_talk,
)
from tests.helpers import CORPUS, REPO, free_port, reaped, talk, wait_for

MD5 = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[Home, int, subprocess.Popen[bytes]]]:
    """A home with one queued user run over 3 corpus files, and its clustermaster."""
    with _master(tmp_path) as started:
        yield started


@contextlib.contextmanager
def _master(tmp_path: Path, *settings: str
            ) -> Iterator[tuple[Home, int, subprocess.Popen[bytes]]]:
    """As the ``master`` fixture, with extra ``key=value`` settings."""
    home = Home(tmp_path / "home")
    home.create()
    tests = home.root / "tests" / "ex"
    tests.mkdir(parents=True)
    for name in ("golfer.eps", "tiger.eps", "spots2.pdf"):
        shutil.copy(CORPUS / name, tests / name)
    (home.users / "ann" / "ghostpdl").mkdir(parents=True)  # the pushed tree
    QueueFile(home.queue(0), home.queue_lock(0)).append(RunSpec.parse("user ann gs"))
    port = free_port()
    argv = master_argv(home, port, "connection_deadline=3", "linger=2", "heartbeat_timeout=60",
                       *settings, priority=0)
    with reaped(subprocess.Popen(argv, stderr=subprocess.PIPE)) as proc:
        wait_for(lambda: home.job_start(0).exists(), 20, "job.start")
        wait_for(lambda: listening(port), 20, "the master to listen")
        yield home, port, proc


def test_scripted_nodes_run_a_whole_run(master: tuple[Home, int, subprocess.Popen[bytes]]
                                        ) -> None:
    """Two scripted nodes follow BUILD, JOBS, UPLOAD, ABORT; the run is archived."""
    home, port, proc = master
    run_id = known_run(home, 0)
    for node in ("n1", "n2"):
        assert signed_talk(port, request(node, run_id)) == b"BUILD\n"
        assert signed_talk(port, request(node, run_id, "busy build")) == b"CONTINUE\n"
    held: dict[str, list[str]] = {"n1": [], "n2": []}
    results: dict[str, list[str]] = {"n1": [], "n2": []}
    done: set[str] = set()
    for _ in range(40):
        for node in ("n1", "n2"):
            if results[node][-1:] == [protocol.ABORT]:
                continue  # told to leave: a real node would be gone
            lines = [f"result {name} 0 0.10 0.00 0.00 {MD5} gs" for name in held[node]]
            done.update(held[node])
            reply = protocol.parse_reply(signed_talk(port, request(node, run_id, "slots 2",
                                                            "jobs 0 0", *lines)))
            held[node] = [Job.parse(line).name for line in reply.jobs]
            results[node].append(reply.verb)
        if all(r[-1] == protocol.ABORT for r in results.values()):
            break
    assert len(done) == 6  # 3 files x 2 configs, each once
    for node in ("n1", "n2"):
        assert protocol.UPLOAD in results[node] and results[node][-1] == protocol.ABORT
    assert proc.wait(timeout=30) == 0
    (archive,) = home.archive.iterdir()
    table = read_tab(archive / f"{archive.name}.tab")
    assert sorted(table) == sorted(done)
    assert "ran 6 tests" in (archive / "report.txt").read_text()
    assert not home.job_start(0).exists() and not home.results(0).exists()
    assert QueueFile(home.queue(0), home.queue_lock(0)).read() == []


def test_silent_client_does_not_stall_the_others(
        master: tuple[Home, int, subprocess.Popen[bytes]]) -> None:
    """A client that connects and says nothing costs the others nothing."""
    home, port, proc = master
    run_id = known_run(home, 0)
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"node slow\nid ")  # half a request, then nothing
    try:
        started = time.monotonic()
        for i in range(20):
            assert signed_talk(port, request(f"quick{i}", run_id), timeout=2) == b"BUILD\n"
        assert time.monotonic() - started < 2.0  # the deadline is 3 s
        # After its deadline the half-request is told what went wrong, and closed.
        half.settimeout(10)
        assert half.recv(1000).startswith(b"ABORT bad request: no complete request")
    finally:
        for s in silent + [half]:
            s.close()
    assert proc.poll() is None


@pytest.mark.parametrize(("data", "reason"), [
    (b"garbage\nOK\n", b"unknown node"),  # no node name: no key can verify it
    (b"node evil;rm\nOK\n", b"unknown node"),  # not a node name: no key file is its
    (b"\xff\xfe\xfd\nOK\n", b"unknown node"),
    (b"node a\nstatus " + b"x" * 70000 + b"\nOK\n", b"bad request: line 3: line longer than"),
    (b"node a\njobs x y\nOK\n", b"bad request: line 3: header 'jobs' takes 2 integer(s)"),
])
def test_malformed_requests_get_abort_and_the_master_keeps_serving(
        master: tuple[Home, int, subprocess.Popen[bytes]], data: bytes, reason: bytes) -> None:
    """Signed with node a's run key: a request naming a node with a key is parsed, and a
    malformed one gets a signed ABORT naming the problem; one naming no node with a key is
    refused unparsed (a stranger's never get further: unsigned, below)."""
    home, port, proc = master
    run_id = known_run(home, 0)
    data = f"id {run_id}\n".encode() + data
    nonce = NONCES.next()
    reply = talk(port, signing.sign_request(data, node_run_key(home, "a", run_id), nonce))
    assert reply.startswith(b"ABORT ") and reason in reply, reply[:300]
    unsigned = talk(port, data)
    assert unsigned.startswith(b"ABORT") and (b"unsigned" in unsigned or reason in unsigned)
    assert signed_talk(port, request("good", run_id)) == b"BUILD\n"
    assert proc.poll() is None


def test_wrong_job_id_gets_abort(master: tuple[Home, int, subprocess.Popen[bytes]]) -> None:
    home, port, _ = master
    assert signed_talk(port, request("n1", "19990101000000-p0-dead")).startswith(
        b"ABORT wrong job id")


def test_a_run_whose_job_list_cannot_be_made_is_reported_and_dequeued(tmp_path: Path) -> None:
    """No corpus: build.py fails; the run must not block its queue forever."""
    home = Home(tmp_path / "home")
    home.create()
    queue = QueueFile(home.queue(0), home.queue_lock(0))
    for user in ("ann", "bob"):
        (home.users / user / "ghostpdl").mkdir(parents=True)  # their pushed trees
    queue.append(RunSpec.parse("user ann gs"))
    queue.append(RunSpec.parse("user bob gs"))
    done = subprocess.run([sys.executable, str(REPO / "clustermaster.py"), "--home",
                           str(home.root), "--set", f"base_port={free_port()}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (archive,) = home.archive.iterdir()
    text = (archive / "report.txt").read_text()
    assert "could not start" in text and "build.py failed" in text
    assert [s.line() for s in queue.read()] == ["user bob gs"]
    assert not home.job_start(0).exists()


def test_a_huge_request_is_refused_and_memory_stays_flat(tmp_path: Path) -> None:
    """One 480 MB request once took the master from 27 MB to 1.86 GB.  With
    max_request_bytes at 1 MiB, senders of 100 MB each are refused after about 1 MiB with
    one log line each, the master's memory barely moves, and nodes are still served."""
    with _master(tmp_path, f"max_request_bytes={1024 * 1024}",
                                    f"max_buffered_bytes={4 * 1024 * 1024}") as started:
        home, port, proc = started
        run_id = known_run(home, 0)
        assert signed_talk(port, request("n1", run_id)) == b"BUILD\n"
        rss = psutil.Process(proc.pid).memory_info().rss
        peak = rss
        line = b"result " + b"r" * 60000 + b"\n"
        chunk = line * 16  # ~1 MB, one buffer reused: the test itself stays small
        for _ in range(3):
            sent = 0
            with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
                try:
                    sock.sendall(request("n2", run_id)[:-3])  # everything but OK
                    while sent < 100 * 1024 * 1024:
                        sock.sendall(chunk)
                        sent += len(chunk)
                except OSError:
                    pass  # refused and closed under us: expected
            assert sent < 50 * 1024 * 1024, "the master kept reading past max_request_bytes"
            assert signed_talk(port, request("n1", run_id, "busy build")) == b"CONTINUE\n"
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        assert peak - rss < 40 * 1024 * 1024, (rss, peak)
        assert proc.poll() is None
        proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        refused = [ln for ln in err.splitlines() if "refused after" in ln]
        assert len(refused) == 3, err[-3000:]
        assert all("1048576 bytes (max_request_bytes)" in ln and "peer 127.0.0.1:" in ln
                   for ln in refused)
