"""Small helpers shared by the component and end-to-end tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cluster.runtime.ports import free_port  # noqa: F401 -- re-exported for the tests
from cluster.runtime.service import StopFlag

if TYPE_CHECKING:
    from cluster.config import Config
    from cluster.node.runcontext import RunContext
    from cluster.runtime.clock import Clock
    from cluster.wire.jobstart import JobStart

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "corpus" / "ghostpdl-examples"

T = TypeVar("T")
A = TypeVar("A", str, bytes)


def copy_code(dest: Path) -> Path:
    """The repo's package and top-level scripts (not .git, tests, corpus, bytecode) under
    ``dest``: a master's checkout of this code, for publishing and updating tests."""
    shutil.copytree(REPO / "cluster", dest / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for script in REPO.glob("*.py"):
        shutil.copy2(script, dest / script.name)
    return dest


@contextmanager
def reaped(proc: subprocess.Popen[A]) -> Iterator[subprocess.Popen[A]]:
    """``proc`` for the ``with`` block; afterwards killed if it still runs, waited for, and
    its stderr pipe (if any) closed: a fixture's process never outlives its test."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@dataclass
class WakeupPipe:
    """A StopFlag with a wakeup fd as :func:`cluster.runtime.service.install_signal_handlers`
    gives it (``read_end``, non-blocking), and the pipe's other end, which a signal's byte
    would go to."""

    flag: StopFlag
    read_end: int
    write_end: int


@contextmanager
def wakeup_pipe() -> Iterator[WakeupPipe]:
    """A :class:`WakeupPipe`, without touching the process's signal handlers; the pipe is
    closed after the block.  :func:`stop_as_a_signal_does` stops a loop with it."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    flag = StopFlag()
    flag.wakeup_fd = read_end
    try:
        yield WakeupPipe(flag, read_end, write_end)
    finally:
        os.close(read_end)
        os.close(write_end)


def stop_as_a_signal_does(pipe: WakeupPipe, thread: threading.Thread, what: str) -> None:
    """Stop the loop running in ``thread`` as SIGTERM does (the flag set, a byte on the
    wakeup pipe); assert it ended within 15 s, so its wait ended at the byte (the callers
    make their polls far longer), and that it drained the pipe."""
    time.sleep(0.2)  # in its wait now
    pipe.flag.set(signal.SIGTERM)
    os.write(pipe.write_end, bytes([signal.SIGTERM]))
    thread.join(15)
    assert not thread.is_alive(), f"{what} did not stop at the wakeup"
    try:
        os.read(pipe.read_end, 1)
    except BlockingIOError:
        return
    raise AssertionError(f"{what} left the wakeup pipe undrained")


def stop_supervisor(sup: subprocess.Popen[A], home_root: Path, timeout: float = 30.0,
                    wait: float = 60.0) -> None:
    """Stop a supervisor (run_clustermaster.py) a test started, as a local cluster stops
    its own (docs/architecture.md, "Stopping"): first wait up to ``timeout`` seconds for
    each of its clustermasters that serves no run (its priority's job.start is gone: it is
    ending a run, or looking for work) to exit, then SIGTERM the supervisor (a master still
    serving leaves its run to the next one) and wait up to ``wait`` seconds for it."""
    from cluster.home import Home
    from cluster.localprocs import supervisor_masters, wait_for_masters
    from cluster.runtime.clock import SystemClock

    clock = SystemClock()
    wait_for_masters(Home(home_root), supervisor_masters(sup.pid),
                     clock.monotonic() + timeout, clock)
    if sup.poll() is None:
        sup.send_signal(signal.SIGTERM)
    sup.wait(timeout=wait)


def talk(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` to the master on ``port`` and read its reply to EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def wait_for(predicate: Callable[[], T], timeout: float, what: str,
             interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something true; fail naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


#: Settings that make a local cluster react in fractions of a second (the e2e tests).
#: The supervisor's tick stays at the cluster's own 10 s: new work wakes it at once anyway
#: (discovery.WorkWatcher), the tick only paces takeovers, commit polls and node code
#: publishing, and each tick started three clustermaster processes (about 0.14 CPU seconds
#: each; now only those that may have work). At 3 s those spawns were a quarter of the
#: whole suite's CPU (356 s instead of 435 s for the README's test command); at
#: 1 s they took nearly half of this 2-core machine from every test.
FAST = {
    "supervisor_interval": "10", "heartbeat_interval": "0.5", "poll_interval": "0.5",
    "pid_wait": "1", "pid_check_interval": "0.5", "connect_retry_delay": "0.5",
    "connect_retries": "60", "linger": "3", "heartbeat_timeout": "6",
    # The result cache (docs/results.md) is off in the e2e tests unless one turns it on (as
    # test_result_cache does): many push the same tree twice to act in the middle of the
    # second run, or count the nodes that ran each row, and a reused run has no middle.
    "result_cache": "no",
}


#: What a job of a slow demo tree waits before it runs [seconds] (see slow_demo_tree).
JOB_DELAY = 0.1


def slow_demo_tree(dest: Path, product: str, options: list[str],
                   delay: float = JOB_DELAY) -> Path:
    """:func:`~cluster.demotree.write_demo_tree`, whose built program sleeps ``delay``
    seconds before each run: a run that lasts long enough for a test to act in its middle
    (kill a node, push again, abort) by a stated margin, whatever the speed of gs and of
    the machine (300 dpi renders did it before, by how slow gs happened to be)."""
    from cluster.demotree import write_demo_tree

    tree = write_demo_tree(dest, product, options)
    script = tree / "make_wrapper.sh"
    text = script.read_text(encoding="utf-8")
    slowed = text.replace("printf '#!/bin/sh\\n", f"printf '#!/bin/sh\\nsleep {delay}\\n", 1)
    assert slowed != text, f"{script}: no wrapper line to slow down"
    script.write_text(slowed, encoding="utf-8")
    return tree


#: The own key test nodes are given (:func:`give_key`): 64 hex digits, as nodekeys makes.
NODE_SECRET = "5e" * 32


def give_key(home_root: Path, node: str, text: str = NODE_SECRET) -> str:
    """Give node ``node`` the own key ``text`` in the master home ``home_root`` (written
    mode 0600 in ``node-keys/``, as bootstrap_node.py makes it), unless it has one; return
    the key's text (what the node signs with)."""
    from cluster import nodekeys

    path = nodekeys.key_path(home_root, node)
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(text + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def command(name: str) -> list[str]:
    """The argv start of the command ``name`` as the README tells people to type it: the
    entry point ``pip install`` put on PATH (pyproject's ``[project.scripts]``).  Fails the
    test, naming the remedy, when it is not there."""
    import shutil

    import pytest

    found = shutil.which(name)
    if found is None:
        pytest.fail(f"the command {name} is not on PATH: install the project with "
                    "`python3 -m pip install -e '.[test]'` (it puts the commands there)")
    return [found]


def node_run_key(home_root: Path, node: str, run_id: str) -> bytes:
    """Node ``node``'s key in run ``run_id``, derived as a real node derives it from its own
    key in the master home ``home_root`` (made now if it has none: a scripted node is set up
    as it first talks)."""
    from cluster import nodekeys
    from cluster.wire import signing

    nodekeys.ensure_node_key(home_root, node)
    text = nodekeys.read_node_key(home_root, node)
    assert text is not None
    return signing.run_key(signing.parse_secret(text), run_id)


def open_test_run(home_root: Path, cfg: Config, start: JobStart | None = None,
                  clock: Clock | None = None) -> RunContext:
    """A node's run opened as run.py opens it (:func:`cluster.node.runcontext.open_run`,
    priority 0) from a master home ``home_root`` holding ``start`` as its job.start (by
    default a user run of the tree ``src``) and the node's own key; no slot shell started.
    The caller closes its ``node_log``."""
    from cluster.node import workdir
    from cluster.node.runcontext import open_run
    from cluster.node.transport import LocalTransport
    from cluster.runtime.clock import SystemClock
    from cluster.wire.jobstart import JobStart

    start = start or JobStart(id="run-1", priority=0, queue="user t gs", kind="user", ref="t",
                              products=("gs",), tree="ghostpdl", source="src", build="true",
                              tests="tests")
    home_root.mkdir(parents=True, exist_ok=True)
    (home_root / "job.start").write_text(start.format())
    give_key(home_root, cfg.effective_node_name())
    return open_run(cfg, LocalTransport(home_root), 0, clock or SystemClock(), StopFlag(),
                    workdir.UseHold())


#: The JUnit XML schema the cluster's junit.xml is checked against (tests/schemas/).
JUNIT_XSD = Path(__file__).parent / "schemas" / "jenkins-junit.xsd"


def assert_valid_junit(path: Path) -> None:
    """``path`` validates against :data:`JUNIT_XSD` by ``xmllint`` (Debian's libxml2-utils;
    a missing xmllint fails the test)."""
    done = subprocess.run(["xmllint", "-noout", "-schema", str(JUNIT_XSD), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{path} is not valid JUnit XML: {done.stderr[-2000:]}"
