"""Scripted nodes: the node side of the protocol spoken by the test itself, over real TCP.

For tests of the master's run loop that need nodes doing exact things at exact times
(finishing, going silent, holding jobs) rather than running gs.

They sign as real nodes do (docs/protocol.md, "Signed messages"): :func:`known_run` (and
:func:`wait_for_run`) read a run's id and home from its job.start, and :func:`signed_talk`
signs a request of a known run with the run key of the node it names (its own key in the
home, made if missing), sends it and returns the reply without its ``sig`` line once that
verified (a reply with no ``sig`` line, a refusal, comes back as it is).
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.runspec import RunSpec
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart
from tests import helpers
from tests.helpers import CORPUS, REPO, talk, wait_for

FILES = ("golfer.eps", "tiger.eps", "spots2.pdf")
#: The key of each run whose job.start was read (by run id), and the scripted nodes' nonces.
HOMES: dict[str, Home] = {}


def node_run_key(home: Home, node: str, run_id: str) -> bytes:
    """Node ``node``'s key in run ``run_id`` (:func:`tests.helpers.node_run_key`)."""
    return helpers.node_run_key(home.root, node, run_id)
NONCES = signing.NonceSource()
CONFIGS = ("ppmraw.72.0", "pbmraw.72.0")


def make_home(root: Path, line: str = "auto nightly gs", priority: int = 2) -> Home:
    """A home with a corpus of 3 files, a clean ghostpdl tree and ``line`` queued."""
    home = Home(root)
    home.create()
    tests = home.root / "tests" / "ex"
    tests.mkdir(parents=True)
    for name in FILES:
        shutil.copy(CORPUS / name, tests / name)
    (home.root / "ghostpdl").mkdir()
    QueueFile(home.queue(priority), home.queue_lock(priority)).append(RunSpec.parse(line))
    return home


def master_argv(home: Home, port: int, *settings: str, priority: int = 2,
                suffixed: bool = False) -> list[str]:
    """The command line of a real clustermaster of ``priority`` serving ``home``'s runs on
    ``port`` (base_port is ``port - priority``), with the settings of scripted runs (the
    two CONFIGS, a one-second linger, a short PID wait), then ``settings`` ("key=value",
    which win over those).  ``suffixed``: started as ``clustermaster<priority>.py``, as
    the supervisor starts it, instead of with ``--priority``."""
    script = [str(REPO / f"clustermaster{priority}.py")] if suffixed else \
        [str(REPO / "clustermaster.py"), "--priority", str(priority)]
    argv = [sys.executable, *script, "--home", str(home.root)]
    for setting in (f"base_port={port - priority}", "gs_configs=" + " ".join(CONFIGS),
                    "linger=1", "pid_wait=0.2", *settings):
        argv += ["--set", setting]
    return argv


def request(node: str, run_id: str, *extra: str) -> bytes:
    """A node request: name, run id (built for it: a scripted node has nothing to build),
    caps, ``extra`` lines, the OK terminator."""
    return ("\n".join([f"node {node}", f"id {run_id}", f"built {run_id}", "caps tools=md5sum",
                       *extra, "OK"])
            + "\n").encode()


def known_run(home: Home, priority: int) -> str:
    """The id of the run in ``home``'s job.start of ``priority``; its secret is kept for
    :func:`signed_talk`."""
    start = JobStart.parse(home.job_start(priority).read_text())
    HOMES[start.id] = home
    return start.id


def signed_talk(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """:func:`tests.helpers.talk` for a node: ``data`` signed with its run's key (if the run
    is known), and the reply verified and returned without its sig line."""
    home = HOMES.get(signing.header_value(data, b"id"))
    if home is None:
        return talk(port, data, timeout)
    key = node_run_key(home, signing.header_value(data, b"node"),
                       signing.header_value(data, b"id"))
    nonce = NONCES.next()
    reply = talk(port, signing.sign_request(data, key, nonce), timeout)
    if not reply.rstrip(b"\n").rsplit(b"\n", 1)[-1].startswith(signing.SIG_LINE):
        return reply  # unsigned: a refusal
    return signing.verify_reply(reply, key, nonce)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for_run(home: Home, priority: int, port: int, timeout: float = 30) -> str:
    """Wait for a run's job.start and its master's port; return the run id."""
    wait_for(lambda: home.job_start(priority).exists(), timeout, "job.start")
    wait_for(lambda: listening(port), timeout, "the master to listen")
    return known_run(home, priority)


def run_to_the_end(port: int, node: str, run_id: str, held: list[str], md5: str,
                   calls: int = 60) -> list[str]:
    """Report ``held`` with ``md5``, take and report every later batch, upload, until the
    master says ABORT or is gone; return the verbs heard.  At most ``calls`` calls."""
    verbs: list[str] = []
    for _ in range(calls):
        lines = [f"result {name} 0 0.10 0.00 0.00 {md5} gs" for name in held]
        try:
            data = signed_talk(port, request(node, run_id, "slots 8", "jobs 0 0", *lines))
        except OSError:
            break  # the master is gone
        reply = protocol.parse_reply(data)
        verbs.append(reply.verb)
        if reply.verb == protocol.ABORT:
            break
        held = [Job.parse(line).name for line in reply.jobs]
    return verbs
