"""A node's work folder kept in bounds (cluster.node.workdir), on real folders with real
locks held by other processes: at most ``build_keep`` build folders, the least recently built
removed with their mirrors, never one a run uses; earlier layouts' leftovers in ``src/``
removed; and a whole BUILD of run.py against a scripted master saying so in its build log."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cluster.defaults import NODE_EXIT_DONE
from cluster.node import workdir
from cluster.node.workdir import UseHold, side_file, tidy
from tests.component.test_node_run import (
    RUN,
    ScriptedMaster,
    make_node_home,
    node,
    script_once,
    write_start,
)
from tests.helpers import REPO

#: A leftover of the layout before build folders: a run's snapshot built in src/ itself.
OLD_LAYOUT = "runs__20240101T000000-0__source__ghostpdl"


def make_key(work: Path, key: str, built_ago: float) -> None:
    """A key as BUILD leaves it: mirror, build folder (with a 'binary'), manifest, lock and
    use files; built ``built_ago`` seconds ago (the manifest's mtime)."""
    (work / "src" / key / "base").mkdir(parents=True)
    (work / "src" / key / "base" / "gx.c").write_text("int x;\n")
    (work / "build" / key / "bin").mkdir(parents=True)
    (work / "build" / key / "bin" / "gs").write_text("#!/bin/sh\n")
    manifest = side_file(work / "build", key, workdir.MANIFEST)
    manifest.write_text("{}\n")
    side_file(work / "build", key, workdir.LOCK).touch()
    side_file(work / "build", key, workdir.USE).touch()
    when = time.time() - built_ago
    os.utime(manifest, (when, when))


def keys_left(work: Path) -> tuple[list[str], list[str], list[str]]:
    """(src/ entries, build/ folders, build/ dot files), sorted."""
    build = sorted(os.listdir(work / "build")) if (work / "build").exists() else []
    src = sorted(os.listdir(work / "src")) if (work / "src").exists() else []
    return src, [n for n in build if not n.startswith(".")], \
        [n for n in build if n.startswith(".")]


@contextmanager
def held_by_another_process(work: Path, key: str) -> Iterator[None]:
    """A second process holding ``key`` as a running run.py does (UseHold), until the end."""
    code = ("import sys; from pathlib import Path; from cluster.node.workdir import UseHold; "
            "h = UseHold(); h.take(Path(sys.argv[1]), sys.argv[2]); print('held', flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(work / "build"), key],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_the_least_recently_built_beyond_build_keep_go_with_their_mirrors(
        tmp_path: Path) -> None:
    work = tmp_path / "work"
    for i, key in enumerate(["user__ann__ghostpdl", "user__bob__ghostpdl", "git__ghostpdl",
                             "user__cy__mupdf", "ghostpdl"]):
        make_key(work, key, built_ago=100 * (i + 1))  # ann's built last, "ghostpdl" first
    # The run's own key counts among the kept even when it is the oldest.
    done = tidy(work, "ghostpdl", keep=3)
    assert done.removed == ["user__cy__mupdf", "git__ghostpdl"]
    assert (done.leftovers, done.busy, done.failed) == ([], [], [])
    src, builds, dots = keys_left(work)
    kept = ["ghostpdl", "user__ann__ghostpdl", "user__bob__ghostpdl"]
    assert src == builds == kept
    assert dots == sorted(f".{k}{s}" for k in kept
                          for s in (workdir.MANIFEST, workdir.LOCK, workdir.USE))
    assert done.lines() == ["removed the least recently built build folder(s) (build_keep 3) "
                            "and their mirrors: user__cy__mupdf git__ghostpdl"]
    # Within the bound nothing happens, and nothing is said.
    again = tidy(work, "ghostpdl", keep=3)
    assert again.lines() == [] and keys_left(work)[1] == kept


def test_earlier_layouts_leftovers_in_src_go_whatever_build_keep_says(tmp_path: Path) -> None:
    work = tmp_path / "work"
    make_key(work, "user__ann__ghostpdl", built_ago=10)
    (work / "src" / OLD_LAYOUT / "bin").mkdir(parents=True)  # built in place, long ago
    (work / "src" / OLD_LAYOUT / "bin" / "gs").write_text("#!/bin/sh\n")
    (work / "src" / "stray-file").write_text("x")
    (work / "src" / "git__ghostpdl").mkdir()  # the run's own mirror, not built yet
    done = tidy(work, "git__ghostpdl", keep=0)  # 0: every build folder is kept
    assert done.removed == [] and done.leftovers == [OLD_LAYOUT, "stray-file"]
    assert keys_left(work)[:2] == (["git__ghostpdl", "user__ann__ghostpdl"],
                                   ["user__ann__ghostpdl"])
    assert done.lines() == ["removed what an earlier layout of the work folder left in src/: "
                            f"{OLD_LAYOUT} stray-file"]
    # Their use files are not left behind either.
    assert not side_file(work / "build", OLD_LAYOUT, workdir.USE).exists()


def test_a_key_another_run_uses_is_kept_and_said_to_be(tmp_path: Path) -> None:
    work = tmp_path / "work"
    make_key(work, "user__old__ghostpdl", built_ago=1000)
    make_key(work, "user__new__ghostpdl", built_ago=10)
    (work / "src" / OLD_LAYOUT).mkdir()
    with held_by_another_process(work, "user__old__ghostpdl"), \
            held_by_another_process(work, OLD_LAYOUT):
        done = tidy(work, "user__new__ghostpdl", keep=1)
        assert done.removed == [] and done.leftovers == []
        assert done.busy == ["user__old__ghostpdl", OLD_LAYOUT]
        assert "kept, in use by another run: user__old__ghostpdl " + OLD_LAYOUT in done.lines()
        assert (work / "build" / "user__old__ghostpdl" / "bin" / "gs").is_file()
    # Once that run has ended, the next tidy removes them.
    done = tidy(work, "user__new__ghostpdl", keep=1)
    assert (done.removed, done.leftovers) == (["user__old__ghostpdl"], [OLD_LAYOUT])
    assert keys_left(work)[:2] == (["user__new__ghostpdl"], ["user__new__ghostpdl"])


def test_a_run_starting_while_its_key_is_removed_waits_then_holds_the_new_use_file(
        tmp_path: Path) -> None:
    """UseHold waits for a tidy that holds the key, and then holds the file at the path, not
    the one the tidy removed (a lock on a removed file would guard nothing)."""
    import fcntl

    build = tmp_path / "work" / "build"
    use = side_file(build, "k", workdir.USE)
    build.mkdir(parents=True)
    tidy_fd = os.open(use, os.O_RDWR | os.O_CREAT)
    fcntl.flock(tidy_fd, fcntl.LOCK_EX)  # a tidy removing k
    hold = UseHold()
    taken = threading.Event()
    taker = threading.Thread(target=lambda: (hold.take(build, "k"), taken.set()))
    taker.start()
    try:
        assert not taken.wait(0.3)  # waiting for the tidy
        use.unlink()
        os.close(tidy_fd)  # the tidy is done
        assert taken.wait(10)
        assert use.exists()
        # The hold is on the file at the path: a tidy cannot take it now.
        assert workdir._lock(use, fcntl.LOCK_EX | fcntl.LOCK_NB) is None
    finally:
        taker.join(10)
        hold.release()
    fd = workdir._lock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert fd is not None
    os.close(fd)


def test_a_build_tidies_the_work_folder_and_says_so_in_its_build_log(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    """run.py's BUILD with build_keep 2: of three other keys the most recently built stays
    beside the run's own (``src``), the old layout's snapshot goes; the build log says so,
    and the run's own build is there and was used."""
    home = make_node_home(tmp_path)
    write_start(home)
    work = tmp_path / "work"
    for i, key in enumerate(["user__a__ghostpdl", "user__b__ghostpdl", "user__c__ghostpdl"]):
        make_key(work, key, built_ago=100 * (i + 1))
    (work / "src" / OLD_LAYOUT).mkdir()
    master = ScriptedMaster(script_once("echo gs > __temp__/t0.ps.ppmraw.72.0.log ; "
                                        "echo 0123456789abcdef0123456789abcdef "
                                        "> __temp__/t0.ps.ppmraw.72.0.md5"))
    assert node(home, tmp_path, serve(master), build_keep=2).run() == NODE_EXIT_DONE
    log = (work / "runs" / RUN / "n1.build.log").read_text()
    assert ("node n1: removed the least recently built build folder(s) (build_keep 2) and "
            "their mirrors: user__c__ghostpdl user__b__ghostpdl\n") in log, log
    assert ("node n1: removed what an earlier layout of the work folder left in src/: "
            f"{OLD_LAYOUT}\n") in log, log
    assert log.index("removed the least") < log.index("build folder ")  # before the fetch
    assert keys_left(work)[:2] == (["src", "user__a__ghostpdl"], ["src", "user__a__ghostpdl"])
    # The run let its key go when it ended: a tidy may remove it now.
    assert tidy(work, "user__a__ghostpdl", keep=1).removed == ["src"]
