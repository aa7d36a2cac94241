"""clusterpush --master killed, interrupted or aborted mid-transfer: nothing is queued.

A real private sshd on 127.0.0.1 plays the master and the real ``clusterpush.py`` runs as a
process of its own.  Its rsync (the real one, through a wrapper first on the client's PATH
that adds ``--bwlimit``) needs about :data:`TRANSFER` seconds for the tree, so a signal or
an abort lands mid-transfer.  Each test then waits past the moment the transfer would have
ended and checks that no dropping was written, the queue is empty, no rsync (nor the
master's side) is left, and the master's staged tree is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.home import Home
from cluster.runtime.sshd import PrivateSshd
from cluster.triggers.droppings import DROPPING
from cluster.triggers.remotepush import remote_abort
from tests.component.test_remote_push_ssh import (
    cache_of,
    cli,
    make_home,
    push,
    receiving,
    target_of,
)
from tests.helpers import REPO, wait_for

#: The throttled transfer's size [bytes] and rate [KiB/s]: about 8 s.
TREE_BYTES = 1_600_000
BWLIMIT = 200
TRANSFER = TREE_BYTES / (BWLIMIT * 1024)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def big_tree(root: Path) -> Path:
    """A tree of incompressible files, :data:`TREE_BYTES` in all."""
    (root / "src").mkdir(parents=True)
    (root / "Makefile").write_text("all:\n")
    for i in range(16):
        (root / "src" / f"blob{i}.dat").write_bytes(os.urandom(TREE_BYTES // 16))
    return root


def slow_rsync(tmp_path: Path) -> Path:
    """A directory whose ``rsync`` is the real one, throttled."""
    where = tmp_path / "slowbin"
    where.mkdir()
    real = "/usr/bin/rsync"
    assert os.access(real, os.X_OK)
    wrapper = where / "rsync"
    wrapper.write_text(f'#!/bin/sh\nexec {real} --bwlimit={BWLIMIT} "$@"\n')
    wrapper.chmod(0o755)
    return where


def _as_from_a_terminal() -> None:
    """In the child: ^C's default action, as a push typed at a terminal has it.  A test run
    started in the background by a non-interactive shell inherits SIGINT ignored (POSIX:
    asynchronous commands), and Python keeps a signal ignored at its start: the push would
    not be interrupted at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_push(sshd: PrivateSshd, home: Home, tree: Path,
               tmp_path: Path) -> subprocess.Popen[str]:
    """The real clusterpush.py --master, throttled; returns once its transfer runs."""
    env = {**os.environ, "PATH": f"{slow_rsync(tmp_path)}:{os.environ['PATH']}"}
    child = subprocess.Popen(
        [sys.executable, str(REPO / "clusterpush.py"),
         *cli(sshd, f"{sshd.address}:{home.root}", tree, "gs")],
        cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal)
    wait_for(lambda: receiving(home) or child.poll() is not None, 60,
             "the master's side of the push")
    assert child.poll() is None, child.communicate()
    time.sleep(1.5)  # into the data: the transfer takes TRANSFER s
    assert child.poll() is None, child.communicate()
    return child


def leftovers(home: Home, tree: Path) -> list[str]:
    """The push's processes still alive: the client's rsync (its command line names the
    tree), its ssh, rsync's server (working in the home) and the master's side."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            line = " ".join(cmd)
            if p.info["name"] == "rsync" and (str(tree) in line
                                              or p.cwd().startswith(str(home.root))):
                found.append(f"{p.pid} {line}")
            elif "receive" in cmd and f"--home={home.root}" in cmd:
                found.append(f"{p.pid} {line}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def assert_nothing_queued(home: Home, tree: Path, started: float) -> None:
    """No process left at once, then, once the transfer would have ended, no dropping, no
    queue entry, no staged tree."""
    wait_for(lambda: not leftovers(home, tree), 5.0, "the push's processes to end")
    time.sleep(max(0.0, started + TRANSFER + 4.0 - time.monotonic()))
    assert not leftovers(home, tree)
    user_dir = home.users / "alice"
    assert not (user_dir / "ghostpdl" / DROPPING).exists()
    assert not home.queue(0).exists() or home.queue(0).read_text().strip() == ""
    staged = [p.name for p in user_dir.iterdir() if ".incoming." in p.name
              or ".aborted." in p.name] if user_dir.exists() else []
    assert staged == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_remote_push_killed_mid_transfer_queues_nothing(sshd: PrivateSshd, tmp_path: Path,
                                                        sig: signal.Signals) -> None:
    tree, home = big_tree(tmp_path / "tree"), make_home(tmp_path)
    started = time.monotonic()
    child = start_push(sshd, home, tree, tmp_path)
    child.send_signal(sig)
    _out, err = child.communicate(timeout=30)
    if sig == signal.SIGTERM:
        assert child.returncode == 128 + signal.SIGTERM, err
        assert "Traceback" not in err
    else:
        assert child.returncode == -signal.SIGKILL
    assert_nothing_queued(home, tree, started)


def test_remote_push_ctrl_c_says_one_line_and_queues_nothing(sshd: PrivateSshd,
                                                            tmp_path: Path) -> None:
    tree, home = big_tree(tmp_path / "tree"), make_home(tmp_path)
    started = time.monotonic()
    child = start_push(sshd, home, tree, tmp_path)
    child.send_signal(signal.SIGINT)
    _out, err = child.communicate(timeout=30)
    assert child.returncode == 128 + signal.SIGINT, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "interrupted" in lines[0] and "nothing was queued" in lines[0]
    assert_nothing_queued(home, tree, started)


def test_remote_push_aborted_mid_transfer_queues_nothing(sshd: PrivateSshd,
                                                        tmp_path: Path) -> None:
    tree, home = big_tree(tmp_path / "tree"), make_home(tmp_path)
    started = time.monotonic()
    child = start_push(sshd, home, tree, tmp_path)
    aborted = remote_abort(target_of(sshd), str(home.root), "alice", cache=cache_of(sshd))
    assert (aborted.removed, aborted.running) == (0, None)
    _out, err = child.communicate(timeout=30)
    assert child.returncode == 2, err
    assert "aborted" in err and "nothing was queued" in err
    assert_nothing_queued(home, tree, started)
    # The next push is not hindered by the aborted one.
    pushed = push(sshd, home, tree)
    assert (Path(pushed.target) / DROPPING).exists()
    assert (Path(pushed.target) / "src" / "blob3.dat").read_bytes() \
        == (tree / "src" / "blob3.dat").read_bytes()


def test_remote_abort_withdraws_a_push_not_yet_queued(sshd: PrivateSshd,
                                                     tmp_path: Path) -> None:
    """A push committed but not yet taken by the scan (its dropping waits) is withdrawn by
    abort, as a queued run is."""
    tree, home = big_tree(tmp_path / "tree"), make_home(tmp_path)
    pushed = push(sshd, home, tree)
    assert (Path(pushed.target) / DROPPING).exists()
    aborted = remote_abort(target_of(sshd), str(home.root), "alice", cache=cache_of(sshd))
    assert not (Path(pushed.target) / DROPPING).exists()
    assert aborted.stopped == 1
