"""cluster.runtime.proc.spawn's parent watch, between real processes: a watched child gets
SIGTERM when its spawner dies, even by SIGKILL, and so does what it spawns in turn; without
the opt-in (a supervisor that cron started) the child outlives its spawner; a child spawned
from a thread other than the main thread is not watched (the kernel's signal follows the
forking thread, not the process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.runtime import proc
from tests.helpers import REPO, wait_for

#: A spawner: starts ``argv`` (JSON) through proc.spawn (watch_parent given by the second
#: argument: "yes", "no" or "env" -- as this process's environment says), from the main
#: thread or ("thread" third argument) from a thread that then ends, prints the child's pid
#: and waits to be killed (bounded: 120 s).
SPAWNER = """\
import json, sys, threading, time
from cluster.runtime import proc

argv = json.loads(sys.argv[1])
watch = {"yes": True, "no": False, "env": None}[sys.argv[2]]
children = []
def start():
    children.append(proc.spawn(argv, watch_parent=watch))
if sys.argv[3] == "thread":
    t = threading.Thread(target=start)
    t.start()
    t.join()
else:
    start()
print(children[0].pid, flush=True)
time.sleep(120)
"""
#: What the watched child runs: a sleeper, bounded.
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _spawner(tmp_path: Path, argv: list[str], watch: str, where: str = "main",
             env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    """Start the spawner (not watched itself) and return it with its child's pid."""
    import json

    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    base = {k: v for k, v in os.environ.items() if k != proc.PARENT_WATCH_ENV}
    spawner = subprocess.Popen([sys.executable, str(script), json.dumps(argv), watch, where],
                               stdout=subprocess.PIPE, text=True,
                               env={**base, "PYTHONPATH": str(REPO), **(env or {})})
    assert spawner.stdout is not None
    line = spawner.stdout.readline()
    assert line.strip().isdigit(), f"the spawner said {line!r}"
    return spawner, int(line)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids to kill after the test, whatever it asserted."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def _kill(spawner: subprocess.Popen[str]) -> None:
    spawner.kill()  # SIGKILL: no handler of its own runs
    spawner.wait(timeout=10)
    assert spawner.stdout is not None
    spawner.stdout.close()


def test_a_watched_child_leaves_when_its_spawner_is_killed(tmp_path: Path,
                                                           leftovers: list[int]) -> None:
    spawner, child = _spawner(tmp_path, SLEEPER, "yes")
    leftovers.append(child)
    assert _alive(child)
    assert psutil.Process(child).environ().get(proc.PARENT_WATCH_ENV) == "1"
    _kill(spawner)
    wait_for(lambda: not _alive(child), 15, "the watched child to leave")


def test_the_watch_goes_down_the_tree(tmp_path: Path, leftovers: list[int]) -> None:
    """The child, spawning with the default (its environment says so), watches its own
    child: killing the child ends the grandchild."""
    (tmp_path / "inner").mkdir()
    inner_script = tmp_path / "inner" / "spawner.py"
    inner_script.write_text(SPAWNER)
    import json

    inner = [sys.executable, str(inner_script), json.dumps(SLEEPER), "env", "main"]
    spawner, middle = _spawner(tmp_path, inner, "yes")
    leftovers.append(middle)
    grandchild = wait_for(lambda: [c.pid for c in psutil.Process(middle).children()
                                   if "time.sleep" in " ".join(c.cmdline())], 30,
                          "the grandchild")[0]
    leftovers.append(grandchild)
    os.kill(middle, signal.SIGKILL)
    wait_for(lambda: not _alive(grandchild), 15, "the grandchild to leave with its parent")
    _kill(spawner)


@pytest.mark.parametrize("watch, where, env", [
    ("no", "main", {}),
    ("env", "main", {}),  # no variable in the environment: a daemon cron started
    ("yes", "thread", {}),
    ("env", "thread", {proc.PARENT_WATCH_ENV: "1"}),
], ids=["not-asked", "not-opted-in", "from-a-thread", "env-from-a-thread"])
def test_an_unwatched_child_outlives_its_spawner(tmp_path: Path, leftovers: list[int],
                                                 watch: str, where: str,
                                                 env: dict[str, str]) -> None:
    spawner, child = _spawner(tmp_path, SLEEPER, watch, where, env)
    leftovers.append(child)
    _kill(spawner)
    # Its parent is gone (reaped by init or a subreaper); the child runs on.
    wait_for(lambda: psutil.Process(child).ppid() != spawner.pid, 15,
             "the child to be reparented")
    assert _alive(child)


def test_a_child_of_a_spawner_that_opted_in_is_watched(tmp_path: Path,
                                                        leftovers: list[int]) -> None:
    spawner, child = _spawner(tmp_path, SLEEPER, "env", "main",
                              {proc.PARENT_WATCH_ENV: "1"})
    leftovers.append(child)
    _kill(spawner)
    wait_for(lambda: not _alive(child), 15, "the watched child to leave")
