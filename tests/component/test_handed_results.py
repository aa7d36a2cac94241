"""A result is taken only from the node process a job was handed to, in that process's
session: against a real clustermaster over real TCP, with nodes that sign with their own
keys (docs/security.md, "What a node may put into a run")."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.master.model.leases import LEASES_FILE
from cluster.records import Job
from cluster.report.tab import read_tab
from cluster.wire import protocol, signing
from tests.component import scripted_nodes
from tests.component.scripted_nodes import (
    CONFIGS,
    FILES,
    make_home,
    master_argv,
    request,
    run_to_the_end,
    signed_talk,
    wait_for_run,
)
from tests.helpers import free_port, reaped

GOOD = "0123456789abcdef0123456789abcdef"
FAKE = "deadbeefdeadbeefdeadbeefdeadbeef"
NAMES = sorted(f"ex__{f}.{c}" for f in FILES for c in CONFIGS)


def results(names: list[str], md5: str) -> list[str]:
    return [f"result {name} 0 0.10 0.00 0.00 {md5} gs" for name in names]


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[Home, int, subprocess.Popen[str]]]:
    """A real clustermaster serving an auto run of 6 jobs at priority 2."""
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    proc = subprocess.Popen(master_argv(home, port, "heartbeat_timeout=60"),
                            stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        yield home, port, proc


def test_results_sent_at_first_contact_for_jobs_never_handed_out_are_refused(
        master: tuple[Home, int, subprocess.Popen[str]]) -> None:
    """A node with its own valid key whose first request carries results for every job of
    the run, before any job was handed to anyone: nothing is recorded, and the run ends
    with the honest node's results."""
    home, port, proc = master
    run_id = wait_for_run(home, 2, port)
    assert signed_talk(port, request("forger", run_id, "slots 8", "jobs 0 0",
                                     *results(NAMES, FAKE))) == b"BUILD\n"
    # Built: still nothing of its own to report, and its forged results again refused.
    reply = protocol.parse_reply(signed_talk(port, request(
        "forger", run_id, "slots 1", "jobs 0 0", *results(NAMES, FAKE))))
    got = [Job.parse(line).name for line in reply.jobs]
    assert reply.verb == protocol.JOBS and len(got) < len(NAMES)
    assert signed_talk(port, request("honest", run_id)) == b"BUILD\n"
    reply = protocol.parse_reply(signed_talk(port, request("honest", run_id, "slots 8",
                                                           "jobs 0 0")))
    held = [Job.parse(line).name for line in reply.jobs]
    # The forger leaves with what it was handed put back (its results for them refused
    # too: a leaving node's results count only for jobs it holds, and it holds them... so
    # it reports nothing and leaves).
    out = protocol.parse_reply(signed_talk(port, request("forger", run_id, "jobs 0 0")
                                           .replace(b"\nOK\n", b"\nABORT\n")))
    assert out.verb == protocol.ABORT
    verbs = run_to_the_end(port, "honest", run_id, held, GOOD)
    assert verbs[-1] == protocol.ABORT
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None
    err = proc.stderr.read()
    (archive,) = home.archive.iterdir()
    table = read_tab(archive / f"{archive.name}.tab")
    assert sorted(table) == NAMES
    assert {row.md5 for row in table.values()} == {GOOD}, table
    assert {row.machine for row in table.values()} == {"honest"}
    assert f"node forger: refused {len(NAMES)} result(s) for jobs never handed to it" in err
    # Logged once per request, not once per result.
    assert err.count("node forger: refused") == 2


def test_a_successor_master_takes_the_results_of_jobs_its_predecessor_handed_out(
        master: tuple[Home, int, subprocess.Popen[str]]) -> None:
    """Leases survive the master: a node's results for jobs handed out by a master that
    died are taken by the master that takes the run over; another process under the same
    name (a new session) cannot deliver them."""
    home, port, proc = master
    run_id = wait_for_run(home, 2, port)
    assert signed_talk(port, request("n1", run_id)) == b"BUILD\n"
    reply = protocol.parse_reply(signed_talk(port, request("n1", run_id, "slots 8",
                                                           "jobs 0 0")))
    held = [Job.parse(line).name for line in reply.jobs]
    assert sorted(held) == NAMES
    assert (home.run_dir(run_id) / LEASES_FILE).read_text().split(" ")[0] == "n1"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Seed 000's rule for a master that died: the next invocation takes its PID file over,
    # waits (pid_wait, 0.2 s here) and exits; the one after it serves the run.
    subprocess.run(master_argv(home, port, "heartbeat_timeout=60"), timeout=60,
                   capture_output=True, check=False)
    successor = subprocess.Popen(master_argv(home, port, "heartbeat_timeout=60"),
                                 stderr=subprocess.PIPE, text=True)
    with reaped(successor):
        assert wait_for_run(home, 2, port) == run_id
        # Another process of n1 (its own session) says it has n1's first two results.
        other = signing.NonceSource()
        key = scripted_nodes.node_run_key(home, "n1", run_id)
        nonce = other.next()
        data = signing.sign_request(request("n1", run_id, "slots 8", "jobs 0 0",
                                            *results(held[:2], FAKE)), key, nonce)
        assert signing.verify_reply(scripted_nodes.talk(port, data), key, nonce) \
            == b"BUILD\n"
        # The process that was handed them (the scripted nodes' session) delivers all.
        verbs = run_to_the_end(port, "n1", run_id, held, GOOD)
        assert verbs[-1] == protocol.ABORT
        assert successor.wait(timeout=60) == 0
        assert successor.stderr is not None
        err = successor.stderr.read()
    assert "leases of earlier masters loaded" in err
    (archive,) = home.archive.iterdir()
    table = read_tab(archive / f"{archive.name}.tab")
    assert {row.md5 for row in table.values()} == {GOOD}, table
    assert sorted(table) == NAMES
