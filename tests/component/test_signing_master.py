"""Signed node messages against real processes on loopback (docs/protocol.md, "Signed messages").

* A real clustermaster: a client that knows the run id but not the secret gets no jobs and
  puts nothing in the .tab (its forged results and its ``failure -1`` are refused, logged
  and written to the audit trail); a signed request replayed is refused; a signed node's
  result for a job handed to another node is refused while the rest of its request goes on.
* A real run.py against a fake master whose JOBS reply is badly signed: the node runs
  nothing from it and exits as for an unreachable master.
* A node whose run has ended (job.start gone or naming another run) leaves at the first
  unverified reply or refused connection; while job.start names its run, it retries.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE, NODE_EXIT_UNREACHABLE
from cluster.home import Home
from cluster.node.noderun import NodeRun
from cluster.node.transport import LocalTransport
from cluster.records import Job
from cluster.report.tab import read_tab
from cluster.runtime.peers import PEER_LINES
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart
from tests.component.scripted_nodes import (
    CONFIGS,
    FILES,
    NONCES,
    make_home,
    master_argv,
    node_run_key,
    request,
    run_to_the_end,
    signed_talk,
    wait_for_run,
)
from tests.helpers import REPO, free_port, reaped, talk

GOOD = "0123456789abcdef0123456789abcdef"
FAKE = "deadbeefdeadbeefdeadbeefdeadbeef"
NAMES = sorted(f"ex__{f}.{c}" for f in FILES for c in CONFIGS)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[Home, int, subprocess.Popen[str]]]:
    """A real clustermaster serving an auto run of 6 jobs at priority 2."""
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    argv = master_argv(home, port, "connection_deadline=5", "heartbeat_timeout=60")
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        yield home, port, proc


def forged(run_id: str, node: str, *extra: str, sig: str = "") -> bytes:
    """A request of someone who knows the run id but not the secret."""
    lines = [f"node {node}", f"id {run_id}", "caps tools=md5sum", "slots 8", "jobs 0 0",
             *extra]
    if sig:
        lines += [f"nonce {'0' * 32}", f"sig {sig}"]
    return ("\n".join([*lines, "OK"]) + "\n").encode()


def test_a_client_without_the_secret_gets_no_jobs_and_puts_nothing_in_the_tab(
        master: tuple[Home, int, subprocess.Popen[str]]) -> None:
    home, port, proc = master
    run_id = wait_for_run(home, 2, port)
    assert (home.job_start(2).stat().st_mode & 0o777) == 0o600  # it holds the secret
    n1_key = node_run_key(home, "n1", run_id)  # n1 and n2 are set up: each has its key
    node_run_key(home, "n2", run_id)
    fake_results = [f"result {name} 0 0.10 0.00 0.00 {FAKE} gs" for name in NAMES]
    # The stranger, posing as a node that will take part, and as a new one: every form
    # of its request is refused, unsigned.
    refusals = [
        talk(port, forged(run_id, "n1")),
        talk(port, forged(run_id, "evil", *fake_results)),
        talk(port, forged(run_id, "evil", "failure -1 forged build failure")),
        talk(port, forged(run_id, "n1", *fake_results, sig="0" * 64)),
        talk(port, signing.sign_request(forged(run_id, "evil", *fake_results),
                                        signing.parse_secret(signing.new_secret()),
                                        NONCES.next())),
    ]
    for reply in refusals:
        assert reply.startswith(b"ABORT ") and b"\nsig " not in reply, reply
        assert b"JOBS" not in reply
    assert b"unsigned" in refusals[0] and b"bad signature" in refusals[3]
    assert b"unknown node" in refusals[4]  # no key was ever made for "evil"

    # The honest node n1 builds and takes every job.
    assert signed_talk(port, request("n1", run_id)) == b"BUILD\n"
    # A signed request replayed as it was recorded: refused the second time.
    nonce = NONCES.next()
    recorded = signing.sign_request(request("n1", run_id, "busy build"), n1_key, nonce)
    first = talk(port, recorded)
    assert signing.verify_reply(first, n1_key, nonce) == b"CONTINUE\n"
    replayed = talk(port, recorded)
    assert replayed.startswith(b"ABORT replayed nonce")
    reply = protocol.parse_reply(signed_talk(port, request("n1", run_id, "slots 8",
                                                           "jobs 0 0")))
    held = [Job.parse(line).name for line in reply.jobs]
    assert sorted(held) == NAMES

    # n2 has a key of its own but was handed none of these jobs: its results are refused,
    # the rest of its request (its first contact) goes on.
    stray = [f"result {name} 0 0.10 0.00 0.00 {FAKE} gs" for name in held[:2]]
    assert signed_talk(port, request("n2", run_id, *stray)) == b"BUILD\n"
    # A holder of n1's key cannot speak for n2 (nor abort the run in its name),
    # and a signed failure -1 from a node that is not building in this run is refused.
    posing = talk(port, signing.sign_request(
        request("n2", run_id, "failure -1 posing as n2", *stray), n1_key, NONCES.next()))
    assert posing.startswith(b"ABORT bad signature") and b"\nsig " not in posing
    not_building = protocol.parse_reply(signed_talk(
        port, request("n3", run_id, "failure -1 a build never asked for")))
    assert not_building.verb == protocol.ABORT and "refused" in not_building.reason

    verbs = run_to_the_end(port, "n1", run_id, held, GOOD)
    assert verbs[-1] == protocol.ABORT and protocol.UPLOAD in verbs
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None
    err = proc.stderr.read()

    (archive,) = home.archive.iterdir()
    table = read_tab(archive / f"{archive.name}.tab")
    assert sorted(table) == NAMES
    assert {row.md5 for row in table.values()} == {GOOD}
    assert {row.machine for row in table.values()} == {"n1"}
    report = (archive / "report.txt").read_text()
    assert "forged" not in report and "aborted" not in report.lower()
    assert "run.info" in {p.name for p in archive.iterdir()}
    assert "secret" not in (archive / "run.info").read_text()

    # The refusals of one host: the first PEER_LINES logged in full, naming the peer and
    # the node it claimed; the rest (the replay, n1's key posing as n2) counted in one
    # summary line (a host's refusals are bounded in the log).
    refused = [ln for ln in err.splitlines()
               if "): refused:" in ln and "more refusals" not in ln]
    # (The server's own refusals of the host, such as a probe's connection closed early,
    # count in the same burst.)
    assert 0 < len(refused) <= PEER_LINES
    assert all(re.search(r"peer 127\.0\.0\.1:\d+ \(claims node (n1|n2|evil)\)", ln)
               for ln in refused), refused
    summary = r"peer 127\.0\.0\.1: (\d+) more refusals in the last \d+ s, not logged one by " \
        r"one; the last: peer 127\.0\.0\.1:\d+ \(claims node \S+\): refused: "
    found = re.search(summary, err)
    assert found and len(refused) + int(found.group(1)) >= 7, err[-3000:]
    assert "failure -1 refused: node n3 is not building" in err
    assert "refused 2 result(s) for jobs never handed to it" in err

    # The audit trail, archived: every connection and every refusal with its reason.
    audit = (archive / "audit.log").read_text().splitlines()
    assert not home.audit_log(archive.name).exists()  # the run's folder is gone, archived
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z 127\.0\.0\.1(:\d+)? "  # a summary: the host
    assert all(re.match(stamp, line) for line in audit), audit
    refusal_lines = [line for line in audit if " refused " in line.split(" node ", 1)[1][:80]
                     and " reported " not in line]
    reasons = [line.split(" refused ", 1)[1] for line in refusal_lines]
    # Each of the seven refusals had one of these reasons; those logged in full are in the
    # trail one by one, the others in the burst's summary line.
    expected = Counter({"unsigned request": 1, "unknown node": 3, "bad signature": 2,
                        "replayed nonce": 1})
    full = Counter(k for r in reasons for k in expected if r.startswith(k))
    assert sum(full.values()) == len(refused) and not full - expected, reasons
    assert any(re.search(summary, line) for line in audit), audit
    assert not [line for line in audit if " node evil " in line and " given " in line]
    n2 = [line for line in audit if " node n2 reported " in line]
    assert n2 and "results 2 refused 2 " in n2[0] and n2[0].endswith("given BUILD")
    given_jobs = [line for line in audit if " node n1 " in line and " given JOBS " in line]
    assert given_jobs and given_jobs[0].endswith("given JOBS 6")
    assert any(" node n1 reported results 6 " in line for line in audit)
    assert any(line.endswith("given ABORT: run complete") for line in audit)
    assert not any(NAMES[0] in line for line in audit)  # counts, never job lines


# ----------------------------------------------------------------------------------------------
# A node against a master that cannot sign

class FakeMaster:
    """A plain socket server answering every request with the same reply (a thread)."""

    def __init__(self, reply: bytes, on_request: Callable[[], None] = lambda: None) -> None:
        self.reply = reply
        self.on_request = on_request  # runs before each reply is sent
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while not data.endswith((b"OK\n", b"ABORT\n")):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                self.on_request()
                conn.sendall(self.reply)

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        self.listener.close()


NODE_RUN = "20261123000000-p0-f00d"


def node_home(root: Path, secret: str) -> Path:
    """A master home whose job.start describes run NODE_RUN, and in which node ``victim``'s
    own key is ``secret``."""
    (root / "tests" / "t").mkdir(parents=True)
    (root / "tests" / "t" / "f.ps").write_text("showpage\n")
    (root / "src").mkdir()
    start = JobStart(id=NODE_RUN, priority=0, queue="user t gs", kind="user",
                     ref="t", products=("gs",), tree="ghostpdl", source="src", build="true",
                     tests="tests")
    (root / "job.start").write_text(start.format())
    key = nodekeys.key_path(root, "victim")
    key.parent.mkdir(mode=0o700)
    key.write_text(secret + "\n")
    key.chmod(0o600)
    return root


def run_node(tmp_path: Path, home: Path, port: int) -> subprocess.CompletedProcess[str]:
    """run.py for priority 0 of ``home`` against the master at ``port``: three tries."""
    return subprocess.run(
        [sys.executable, str(REPO / "run.py"), "--priority", "0",
         "--set", f"master_home={home}", "--set", "master_host=127.0.0.1",
         "--set", f"base_port={port}", "--set", "node_name=victim",
         "--set", f"work_dir={tmp_path / 'work'}", "--set", "connect_retries=3",
         "--set", "connect_retry_delay=0.2", "--set", "io_timeout=5", "--set", "slots=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("how", ["bad signature", "unsigned", "signed with another key",
                                 "an unsigned ABORT"])
def test_a_node_runs_nothing_from_a_reply_it_cannot_verify(tmp_path: Path, how: str) -> None:
    secret = signing.new_secret()
    home = node_home(tmp_path / "home", secret)
    pwned = tmp_path / "pwned"
    job = Job("t__f.ps.ppmraw.72.0", "__temp__/t.log", f"touch {pwned}").line
    body = protocol.format_reply(protocol.Reply(protocol.JOBS, (job,)))
    if how == "bad signature":
        reply = body + b"sig " + b"0" * 64 + b"\n"
    elif how == "unsigned":
        reply = body
    elif how == "an unsigned ABORT":  # job.start still names the run: it goes on
        reply = protocol.format_reply(protocol.Reply(protocol.ABORT, reason="run complete"))
    else:  # correct form, any nonce: a key other than the run's
        reply = signing.sign_reply(body, signing.parse_secret(signing.new_secret()),
                                   "0" * 32)
    fake = FakeMaster(reply)
    try:
        done = run_node(tmp_path, home, fake.port)
    finally:
        fake.close()
    assert done.returncode == NODE_EXIT_UNREACHABLE, done.stderr
    assert not pwned.exists()
    assert len(fake.requests) == 3  # tried connect_retries times, as for a network failure
    assert "leaving run" not in done.stderr
    # Each request was signed with the node's run key (the node does its part).
    for data in fake.requests:
        signing.verify_request(data, signing.run_key(signing.parse_secret(secret), NODE_RUN))
    assert "failure -1" not in b"".join(fake.requests).decode()
    assert done.stderr.count("refused, nothing of it run") == 3


@pytest.mark.parametrize("then", ["job.start removed", "job.start of the next run"])
def test_a_node_whose_run_has_ended_leaves_at_the_first_unsigned_refusal(
        tmp_path: Path, then: str) -> None:
    # What a node cut off while its run ended meets when the link comes back: the port's
    # master serves another run (or none) and refuses this run's id unsigned.  job.start,
    # read through the transport, tells the node its run is over; the reply is not trusted.
    home = node_home(tmp_path / "home", signing.new_secret())
    job_start = home / "job.start"

    def run_ends() -> None:
        if then == "job.start removed":
            job_start.unlink(missing_ok=True)
        else:
            start = JobStart.parse(job_start.read_text())
            following = dataclasses.replace(start, id="20261123000100-p0-beef",
                                            secret=signing.new_secret())
            job_start.write_text(following.format(with_secret=True))

    refusal = protocol.format_reply(protocol.Reply(
        protocol.ABORT, reason="wrong job id, running 20261123000100-p0-beef"))
    fake = FakeMaster(refusal, on_request=run_ends)
    try:
        done = run_node(tmp_path, home, fake.port)
    finally:
        fake.close()
    assert done.returncode == NODE_EXIT_DONE, done.stderr
    assert len(fake.requests) == 1  # no retries: the run is over
    assert "refused, nothing of it run" in done.stderr
    expected = ("job.start is gone from the master" if then == "job.start removed" else
                "job.start now describes run 20261123000100-p0-beef")
    assert f"leaving run 20261123000000-p0-f00d: {expected}" in done.stderr


@pytest.mark.parametrize("job_start", ["gone", "still there"])
def test_a_node_whose_master_has_gone_leaves_only_once_job_start_is_gone(
        tmp_path: Path, job_start: str) -> None:
    # The run ended while the node was cut off and its master has exited: nothing listens
    # on the port (a real refused connection).  job.start decides whether to retry.
    home = node_home(tmp_path / "home", signing.new_secret())
    cfg = Config(node_name="victim", work_dir=tmp_path / "work", master_host="127.0.0.1",
                 base_port=free_port(), connect_retries=3, slots=1)
    node = NodeRun(cfg, LocalTransport(home), 0, "tools=md5sum").open()
    try:
        if job_start == "gone":
            (home / "job.start").unlink()
            assert node.contact.call(0.0) == NODE_EXIT_DONE
            assert node.contact.consecutive_failures == 0
        else:
            assert node.contact.call(0.0) is None  # retried later
            assert node.contact.consecutive_failures == 1
            assert node.ctx.status.next_contact == cfg.connect_retry_delay
    finally:
        node.jobs.pool.close()
        node.ctx.node_log.close()
