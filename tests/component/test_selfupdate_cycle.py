"""Self-updating nodes with real processes: the master's supervisor publishes its node code
(run_clustermaster.py --once, run from a temporary copy of the repo: the "master"), a real
clusterpull.py cycle (--once, from the installed repo: the node owner's copy) heartbeats to
a real monitor on loopback, fetches the published version into work_dir/code/<md5>/ and
starts run.py from it -- seen in /proc/<pid>/cmdline and environ, and in the node's log.

A node-side change on the master reaches the node at its next cycle while a run.py already
under way keeps its version; a corrupt published file is refused and the last good version
used; with self_update off the installed run.py starts, as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.home import Home
from cluster.master.daemon.monitor import MonitorServer
from cluster.node import code
from cluster.wire.jobstart import JobStart
from tests.helpers import REPO, free_port, wait_for

RUN = "20261123140000"
WAIT = 120.0
MAIN = "def main(argv: list[str] | None = None) -> int:\n"


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[Path, Home, int]]:
    """The master: a copy of the repo, its home with a waiting run (priority 0, a master
    port nobody listens on, so run.py keeps trying to connect), and a monitor answering
    heartbeats on loopback.  Yields (repo copy, home, monitor port)."""
    repo = tmp_path / "master-repo"
    shutil.copytree(REPO / "cluster", repo / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for script in REPO.glob("*.py"):
        shutil.copy2(script, repo / script.name)
    home = Home(tmp_path / "home")
    home.create()
    start = JobStart(RUN, 0, "queue.lst", "user", "x", ("gs",), "t", "src", "build", "tests",
                     secret="ab" * 32)
    home.job_start(0).write_text(start.format(with_secret=True))
    os.chmod(home.job_start(0), 0o600)
    server = MonitorServer(home, ("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield repo, home, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def run_pys(tmp_path: Path) -> Iterator[None]:
    """Afterwards, end the run.py processes the test's clusterpulls started (found by their
    command line, which names the test's work_dir or code dirs) and their process groups."""
    yield
    for proc in _run_pys(tmp_path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(_run_pys(tmp_path), timeout=30)


def _run_pys(tmp_path: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(arg.endswith("/run.py") for arg in cmdline) and \
                any(str(tmp_path) in arg for arg in cmdline):
            found.append(proc)
    return found


def _mark(repo: Path, marker: str) -> None:
    """A node-side change on the master: run.py's command line prints ``marker`` and the
    file it runs from, first thing."""
    path = repo / "cluster/cli/run.py"
    text = path.read_text()
    assert MAIN in text
    text = text.replace(MAIN, MAIN + f"    print({marker!r}, __file__, file=sys.stderr, "
                                     "flush=True)\n", 1)
    path.write_text(text)


def _supervisor_once(repo: Path, home: Home) -> None:
    """The master's supervisor, one round, from the master's checkout (publishes)."""
    done = subprocess.run([sys.executable, str(repo / "run_clustermaster.py"), "--once",
                           "--home", str(home.root), "-q", "--set", f"base_port={free_port(5)}"],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr


def _clusterpull_once(tmp_path: Path, port: int, *sets: str) -> str:
    """One clusterpull cycle of node n1 from the installed repo; returns its log."""
    work = tmp_path / "work"
    argv = [sys.executable, str(REPO / "clusterpull.py"), "--once",
            "--set", f"master_home={tmp_path / 'home'}", "--set", f"work_dir={work}",
            "--set", f"monitor_port={port}", "--set", "node_name=n1",
            "--set", f"base_port={free_port()}", "--set", "connect_retries=1000",
            "--set", "connect_retry_delay=0.2", *sets]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    return (work / "log" / "clusterpull.log").read_text()


def _started(tmp_path: Path, script: Path, skip: set[int]) -> psutil.Process:
    """The run.py running ``script`` that is not one of ``skip``."""
    def find() -> psutil.Process | None:
        for proc in _run_pys(tmp_path):
            if proc.pid not in skip and str(script) in (proc.info.get("cmdline") or []):
                return proc
        return None
    found = wait_for(find, WAIT, f"a run.py running {script}")
    assert found is not None
    return found


def _version(home: Home) -> str:
    return code.manifest_version((home.node_code / code.MANIFEST).read_text())


def test_a_change_on_the_master_reaches_the_node_at_its_next_cycle(
        master: tuple[Path, Home, int], tmp_path: Path, run_pys: None) -> None:
    repo, home, port = master
    work = tmp_path / "work"
    _mark(repo, "MARKER-ONE")
    _supervisor_once(repo, home)
    one = _version(home)
    selfupdate_dir = work.absolute() / "code" / one
    _clusterpull_once(tmp_path, port)

    first = _started(tmp_path, selfupdate_dir / "run.py", set())
    # /proc: the copy's run.py, with the copy first on PYTHONPATH (the slot shells'
    # `python3 -m cluster.bmpcmp` imports from it too).
    cmdline = Path(f"/proc/{first.pid}/cmdline").read_bytes().split(b"\0")
    assert str(selfupdate_dir / "run.py").encode() in cmdline
    environ = dict(item.split(b"=", 1) for item in
                   Path(f"/proc/{first.pid}/environ").read_bytes().split(b"\0") if b"=" in item)
    assert environ[b"PYTHONPATH"].split(b":")[0] == str(selfupdate_dir).encode()
    run_log = work / "log" / "run.log"
    wait_for(lambda: f"MARKER-ONE {selfupdate_dir / 'cluster/cli/run.py'}"
             in run_log.read_text(), WAIT, "run.py's marker in the node's log")

    # The master changes the module again: the next cycle runs the new version, while the
    # first run.py, still under way, keeps its own.
    _mark(repo, "MARKER-TWO")
    _supervisor_once(repo, home)
    two = _version(home)
    assert two != one
    log = _clusterpull_once(tmp_path, port)
    assert f"fetched version {two}" in log
    second = _started(tmp_path, work.absolute() / "code" / two / "run.py", {first.pid})
    wait_for(lambda: "MARKER-TWO" in run_log.read_text(), WAIT, "the second marker")
    assert first.is_running() and str(selfupdate_dir / "run.py") in first.cmdline()
    assert (selfupdate_dir / "run.py").is_file(), "a version in use must not be removed"
    assert second.pid != first.pid


def test_a_corrupt_published_file_is_refused(master: tuple[Path, Home, int], tmp_path: Path,
                                             run_pys: None) -> None:
    repo, home, port = master
    work = tmp_path / "work"
    _supervisor_once(repo, home)
    good = _version(home)
    _clusterpull_once(tmp_path, port)
    first = _started(tmp_path, work.absolute() / "code" / good / "run.py", set())

    # A new version is published, then one of its files is damaged on the master.
    _mark(repo, "MARKER-BAD")
    _supervisor_once(repo, home)
    bad = _version(home)
    damaged = home.node_code / "cluster/cli/run.py"
    damaged.write_text(damaged.read_text() + "\nraise SystemExit('tampered')\n")
    log = _clusterpull_once(tmp_path, port)
    assert f"refusing the fetched version {bad}" in log
    assert "cluster/cli/run.py: md5" in log
    assert not (work / "code" / bad).exists()
    # The run.py of this cycle runs the last good version.
    _started(tmp_path, work.absolute() / "code" / good / "run.py", {first.pid})
    assert (work / "code" / "CURRENT").read_text() == good + "\n"


def test_self_update_off_starts_the_installed_run_py(master: tuple[Path, Home, int],
                                                     tmp_path: Path, run_pys: None) -> None:
    repo, home, port = master
    _supervisor_once(repo, home)
    _clusterpull_once(tmp_path, port, "--set", "self_update=no")
    proc = _started(tmp_path, REPO / "run.py", set())
    assert not (tmp_path / "work" / "code").exists()
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    assert f"PYTHONPATH={tmp_path}".encode() not in environ
