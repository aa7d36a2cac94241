"""Temporary files left by killed processes are cleaned at the next start (point 5).

Real writers in child processes: ``fsutil.atomic_write`` of a big file killed with SIGKILL in
the middle, a node's upload killed in the middle, the real ``clusterpull.py`` and ``run.py``
cleaning their work_dir at start.  What must hold: exactly the dead writers' temporary files
go; a live writer's stays (and its write still completes); nothing else is touched, not
through a symlink either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from cluster.runtime import fsutil
from tests.helpers import REPO

#: A child that replaces argv[1] with a big file through fsutil.atomic_write: 8 MiB at once,
#: then it creates argv[2] (it is now in the middle of the write) and goes on slowly, a KiB
#: every 0.1 s, for at most ten minutes (the tests kill it long before).
WRITER = """
import sys, time
from pathlib import Path
from cluster.runtime import fsutil
target, ready = Path(sys.argv[1]), Path(sys.argv[2])
def pieces():
    chunk = "x" * (1 << 20)
    for _ in range(8):
        yield chunk
    ready.write_text("writing")
    for _ in range(6000):
        time.sleep(0.1)
        yield chunk[:1024]
fsutil.atomic_write(target, pieces())
"""

#: A node process uploading argv[1] to argv[3] in the master home argv[2], whose writes may
#: not pass 1 MiB (RLIMIT_FSIZE): the kernel kills it with SIGXFSZ in the middle of the copy,
#: as a node killed mid-upload.  (Python ignores SIGXFSZ; the child restores the default.)
UPLOADER = """
import resource, signal, sys
from pathlib import Path
from cluster.node.transport import LocalTransport
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
LocalTransport(Path(sys.argv[2])).upload(Path(sys.argv[1]), sys.argv[3])
"""

#: Generous bound on any wait here [seconds]: other tests share the machine's two cores.
WAIT = 60.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


class Writers:
    """Starts WRITER children; kills whatever is left at the end."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self, target: Path, ready: Path) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(ready)],
                                 env=_env())
        self.children.append(child)
        _wait_for(f"writer {child.pid} reaching the middle of its write",
                  lambda: ready.exists() or child.poll() is not None)
        assert child.poll() is None, f"writer exited early with {child.returncode}"
        return child

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=WAIT)


@pytest.fixture
def writers() -> Iterator[Writers]:
    w = Writers()
    yield w
    w.close()


def _temp_of(pid: int, directory: Path) -> Path:
    found = [p for p in directory.iterdir()
             if (m := fsutil.TEMP_NAME.fullmatch(p.name)) and int(m["pid"]) == pid]
    assert len(found) == 1, f"expected one temp file of pid {pid} in {directory}: {found}"
    return found[0]


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under root (not following symlinks) with its kind."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            out[str(path.relative_to(root))] = kind
    return out


def test_sigkill_mid_write_leaves_a_temp_that_only_the_dead_writers_goes(
        tmp_path: Path, writers: Writers) -> None:
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    target = home / "jobs"
    target.write_text("the previous job list\n")

    dead = writers.start(target, tmp_path / "dead.ready")
    live = writers.start(target, tmp_path / "live.ready")
    dead_temp = _temp_of(dead.pid, home)
    live_temp = _temp_of(live.pid, home)
    assert dead_temp.name.startswith(f".jobs.{dead.pid}.")
    assert dead_temp.stat().st_size >= 8 << 20  # a big file, cut in the middle
    dead.send_signal(signal.SIGKILL)
    assert dead.wait(timeout=WAIT) == -signal.SIGKILL
    assert target.read_text() == "the previous job list\n"  # never torn
    gone = dead.pid  # reaped: no process has this pid now

    # Everything else a clean-up must leave alone, most named almost like a dead temp.
    near_misses = [".jobs.tmp", f".jobs.{gone}.tmp", f"jobs.{gone}.abcdefgh.tmp",
                   f".jobs.{gone}.abcdefgh.tmp.bak", f".jobs.{gone}.ABCDEFGH.tmp",
                   f".jobs.{gone}.abcdefg.tmp", ".jobs.0.abcdefgh.tmp", "results",
                   ".jobs.1.abcdefgh.tmp"]  # pid 1 is alive (an unrelated process)
    for name in near_misses:
        (home / name).write_text("keep")
    (outside / f".f.{gone}.abcdefgh.tmp").write_text("outside, via a symlink")
    (home / f".link.{gone}.abcdefgh.tmp").symlink_to(outside / f".f.{gone}.abcdefgh.tmp")
    (home / "outside-dir").symlink_to(outside)
    (home / f".dir.{gone}.abcdefgh.tmp").mkdir()
    (home / f".dir.{gone}.abcdefgh.tmp" / "inside").write_text("keep")
    (home / "runs" / "r1").mkdir(parents=True)
    deep_temp = home / "runs" / "r1" / f".node1.log.{gone}.abcdefgh.tmp"
    deep_temp.write_text("half a log")
    before = _snapshot(home)
    outside_before = _snapshot(outside)

    assert fsutil.remove_dead_temps(home) == [dead_temp]
    assert _snapshot(home) == {k: v for k, v in before.items() if k != dead_temp.name}
    assert live_temp.exists() and deep_temp.exists()

    # Recursive: the dead temp below goes too; the symlinked directory is not entered.
    assert fsutil.remove_dead_temps(home, recursive=True) == [deep_temp]
    assert _snapshot(outside) == outside_before
    assert live_temp.exists()

    # The live writer was never disturbed: killed now, its temp goes at the next clean-up.
    assert live.poll() is None
    live.send_signal(signal.SIGKILL)
    live.wait(timeout=WAIT)
    assert fsutil.remove_dead_temps(home, recursive=True) == [live_temp]
    assert target.read_text() == "the previous job list\n"
    assert fsutil.remove_dead_temps(home, recursive=True) == []


def test_a_live_writer_finishes_after_a_clean_up(tmp_path: Path) -> None:
    """The clean-up never breaks a write in progress: the writer renames its temp as usual."""
    target = tmp_path / "table"
    script = ("import sys, time\nfrom cluster.runtime import fsutil\n"
              "def pieces():\n    yield 'a' * 4096\n    open(sys.argv[2], 'w').close()\n"
              "    time.sleep(1)\n    yield 'b\\n'\n"
              "fsutil.atomic_write(sys.argv[1], pieces())\n")
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", script, str(target), str(ready)],
                             env=_env())
    try:
        _wait_for("the writer's first piece", lambda: ready.exists() or child.poll() is not None)
        assert fsutil.remove_dead_temps(tmp_path) == []
        assert child.wait(timeout=WAIT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert target.read_text() == "a" * 4096 + "b\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_zombie_writer_counts_as_dead(tmp_path: Path, writers: Writers) -> None:
    """Killed but not yet reaped by its parent: it can never write again."""
    child = writers.start(tmp_path / "status", tmp_path / "ready")
    temp = _temp_of(child.pid, tmp_path)
    child.send_signal(signal.SIGKILL)
    _wait_for("the killed writer to become a zombie",
              lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
    assert not fsutil.writer_alive(child.pid)
    assert fsutil.remove_dead_temps(tmp_path) == [temp]


def test_writer_alive() -> None:
    assert fsutil.writer_alive(os.getpid())
    assert fsutil.writer_alive(1)  # another process (another user's is alive as well)
    assert not fsutil.writer_alive(2 ** 40)  # out of any pid range


def test_min_age_spares_a_fresh_temp_whatever_its_pid(tmp_path: Path) -> None:
    """For directories that writers on other machines share: their pids mean nothing here."""
    temp = tmp_path / ".node7.log.999999999.abcdefgh.tmp"
    temp.write_text("an upload from another machine, in progress")
    assert fsutil.remove_dead_temps(tmp_path, min_age=3600) == []
    old = time.time() - 7200
    os.utime(temp, (old, old))
    assert fsutil.remove_dead_temps(tmp_path, min_age=3600) == [temp]


def test_missing_directory_is_nothing_to_clean(tmp_path: Path) -> None:
    assert fsutil.remove_dead_temps(tmp_path / "missing", recursive=True) == []


def test_a_node_killed_mid_upload_leaves_no_final_name_and_a_cleanable_temp(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "runs" / "r1" / "logs").mkdir(parents=True)
    src = tmp_path / "node1.log"
    src.write_bytes(os.urandom(4 << 20))
    child = subprocess.run([sys.executable, "-c", UPLOADER, str(src), str(home),
                            "runs/r1/logs/node1.log"], env=_env(), timeout=WAIT, check=False)
    assert child.returncode == -signal.SIGXFSZ, "the uploader was meant to die mid-copy"
    logs = home / "runs" / "r1" / "logs"
    assert not (logs / "node1.log").exists()  # a half upload never has the final name
    (temp,) = list(logs.iterdir())
    match = fsutil.TEMP_NAME.fullmatch(temp.name)
    assert match and match["target"] == "node1.log"
    assert 0 < temp.stat().st_size < src.stat().st_size
    assert fsutil.remove_dead_temps(home / "runs", recursive=True) == [temp]
    assert list(logs.iterdir()) == []


def test_atomic_copy_copies_content_mode_and_times(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"\x00data" * 1000)
    src.chmod(0o640)
    os.utime(src, ns=(1_000_000_000, 2_000_000_000))
    dst = tmp_path / "dst"
    dst.write_text("old")
    fsutil.atomic_copy(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_mode & 0o777 == 0o640
    assert dst.stat().st_mtime_ns == 2_000_000_000
    with pytest.raises(FileNotFoundError):
        fsutil.atomic_copy(tmp_path / "missing", dst)
    with pytest.raises(OSError, match="not a regular file"):
        fsutil.atomic_copy(tmp_path, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]  # no temp left


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=WAIT)
    return child.pid


def test_clusterpull_cleans_its_work_dir_at_start(tmp_path: Path) -> None:
    """The real clusterpull.py --once: dead temps anywhere under work_dir go, nothing else."""
    work = tmp_path / "work"
    gone = _dead_pid()
    deep = work / "runs" / "r1" / "temp" / "bmpcmp"
    deep.mkdir(parents=True)
    (work / "baseline").mkdir()
    dead = [deep / f".a.png.{gone}.abcdefgh.tmp",
            work / "baseline" / f"..gs.stamp.{gone}.x1y2z3w4.tmp"]
    kept = [deep / "a.png", work / f".x.{os.getpid()}.abcdefgh.tmp", deep / f".b.{gone}.tmp"]
    for path in dead + kept:
        path.write_text("x")
    done = subprocess.run([sys.executable, str(REPO / "clusterpull.py"), "--once",
                           "--set", f"work_dir={work}", "--set", f"master_home={tmp_path}",
                           "--set", "monitor_port=1", "--set", "node_name=n1"],
                          capture_output=True, timeout=WAIT, check=False)
    assert all(not p.exists() for p in dead), done.stderr.decode()
    assert all(p.exists() for p in kept)


def test_run_py_cleans_work_dir_and_baseline_at_start(tmp_path: Path) -> None:
    """The real run.py (no run waiting: it exits at once after its clean-up)."""
    work = tmp_path / "work"
    (work / "baseline").mkdir(parents=True)
    (work / "runs").mkdir()
    gone = _dead_pid()
    dead = [work / f".caps.{gone}.abcdefgh.tmp",
            work / "baseline" / f"..gs.stamp.{gone}.abcdefgh.tmp"]
    kept = [work / "runs" / f".x.{gone}.abcdefgh.tmp", work / "baseline" / "gs"]
    for path in dead + kept:
        path.write_text("x")
    done = subprocess.run([sys.executable, str(REPO / "run.py"),
                           "--set", f"work_dir={work}", "--set", f"master_home={tmp_path}",
                           "--set", "node_name=n1"],
                          capture_output=True, timeout=WAIT, check=False)
    assert all(not p.exists() for p in dead), done.stderr.decode()
    assert all(p.exists() for p in kept)
