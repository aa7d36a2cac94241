"""A run's snapshot of a pushed tree (snapshot_push): the source it builds and diffs, which a
later push never changes.  Real files, real rsync, real processes and a real SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.runtime.mirror import TEMP_PREFIX
from cluster.triggers import push
from cluster.triggers.droppings import DROPPING
from cluster.triggers.push import TreeBusy, push_tree, snapshot_push

SPEC = RunSpec.parse("user ann gs")


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    return h


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def contents(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its text and permission bits."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = (path.read_text(),
                                                      stat.S_IMODE(path.stat().st_mode))
    return out


def test_snapshot_links_the_pushed_files_and_leaves_out_droppings(home: Home,
                                                                  tmp_path: Path) -> None:
    dev = write(tmp_path / "dev", {"configure": "#!/bin/sh\n", "src/a.c": "int a;\n",
                                   "src/deep/b.h": "#define B\n"})
    (dev / "configure").chmod(0o755)
    target = push_tree(home, dev, SPEC, method="copy")
    # What else can sit in a pushed tree: droppings of every name, a copy in flight.
    for name in (f"{DROPPING}.rejected", "gs.run", "ghostscript.run",
                 f"{TEMP_PREFIX}abc", f"src/{TEMP_PREFIX}x"):
        (target / name).write_text("x\n")
    outside = tmp_path / "secret"
    outside.write_text("secret\n")
    (target / "out-link").symlink_to(outside)
    (target / "in-link").symlink_to("src/a.c")
    (target / "dir-link").symlink_to("src")
    (target / "src").chmod(0o750)
    dest = home.run_dir("r1") / "source" / "ghostpdl"
    snapshot_push(home, "ann", "ghostpdl", dest)
    assert contents(dest) == {"configure": ("#!/bin/sh\n", 0o755), "src/a.c": ("int a;\n", 0o644),
                              "src/deep/b.h": ("#define B\n", 0o644),
                              "in-link": ("int a;\n", 0o644)}
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert stat.S_IMODE((dest / "src").stat().st_mode) == 0o750
    # Hard links (cp -al): no data copied.
    assert (dest / "src/a.c").stat().st_ino == (target / "src/a.c").stat().st_ino
    assert sorted(p.name for p in dest.parent.iterdir()) == ["ghostpdl"]  # no temp left
    with pytest.raises(ClusterError, match="exists; expected a new path"):
        snapshot_push(home, "ann", "ghostpdl", dest)


@pytest.mark.parametrize("method", ["rsync", "copy"])
def test_a_later_push_never_changes_the_snapshot(home: Home, tmp_path: Path,
                                                 method: str) -> None:
    """New content, a deleted file, and a file whose mode alone changed (rsync changes that
    in place: push_tree unlinks it first) all leave the snapshot as it was."""
    dev = write(tmp_path / "dev", {"a.c": "old a\n", "b.c": "old b\n", "run.sh": "echo\n",
                                   "same.c": "same\n"})
    push_tree(home, dev, SPEC, method=method)
    dest = home.run_dir("r1") / "source" / "ghostpdl"
    snapshot_push(home, "ann", "ghostpdl", dest)
    before = contents(dest)
    (dev / "a.c").write_text("new a, longer\n")
    (dev / "b.c").unlink()
    (dev / "run.sh").chmod(0o755)  # same size, same mtime, new mode
    push_tree(home, dev, SPEC, method=method)
    assert contents(dest) == before
    pushed = contents(home.user_tree("ann", "ghostpdl"))
    assert pushed["a.c"] == ("new a, longer\n", 0o644) and "b.c" not in pushed
    if method == "rsync":  # the copy's quick check does not carry a mode-only change
        assert pushed["run.sh"] == ("echo\n", 0o755)
    # An unchanged file stays shared: the snapshot costs no copy.
    assert (dest / "same.c").stat().st_ino == \
        (home.user_tree("ann", "ghostpdl") / "same.c").stat().st_ino


@pytest.fixture
def other_device() -> Iterator[Path]:
    """A directory on another file system than the tests' (tmpfs /dev/shm)."""
    where = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_across_devices_the_snapshot_copies(home: Home, tmp_path: Path,
                                            other_device: Path) -> None:
    assert other_device.stat().st_dev != home.root.stat().st_dev
    dev = write(tmp_path / "dev", {"a.c": "a\n", "sub/b.c": "b\n"})
    push_tree(home, dev, SPEC, method="copy")
    dest = other_device / "source" / "ghostpdl"
    snapshot_push(home, "ann", "ghostpdl", dest)
    assert contents(dest) == {"a.c": ("a\n", 0o644), "sub/b.c": ("b\n", 0o644)}


def _slow_snapshot(root: str, dest: str, started: Any) -> None:
    real = push._link_or_copy

    def slow(src: Path, dst: Path) -> bool:
        started.set()
        time.sleep(0.05)
        return real(src, dst)

    push._link_or_copy = slow  # type: ignore[assignment]  # this child process only
    snapshot_push(Home(Path(root)), "ann", "ghostpdl", Path(dest))


def test_a_master_killed_mid_snapshot_leaves_no_half_snapshot(home: Home,
                                                              tmp_path: Path) -> None:
    dev = write(tmp_path / "dev", {f"f{i:03}.c": f"{i}\n" for i in range(200)})
    push_tree(home, dev, SPEC, method="copy")
    dest = home.run_dir("r1") / "source" / "ghostpdl"
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()
    child = ctx.Process(target=_slow_snapshot, args=(str(home.root), str(dest), started))
    child.start()
    assert started.wait(60)
    time.sleep(0.3)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert not dest.exists()
    leftovers = [p.name for p in dest.parent.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".ghostpdl.")
    # The takeover makes the snapshot again, and clears the dead one's leftovers.
    snapshot_push(home, "ann", "ghostpdl", dest)
    assert len(contents(dest)) == 200
    assert [p.name for p in dest.parent.iterdir()] == ["ghostpdl"]


def _hold_tree_lock(root: str, held: Any, release: Any) -> None:
    with push.tree_locked(Home(Path(root)), "ann", "ghostpdl", 10):
        held.set()
        release.wait(60)


def test_a_snapshot_waits_for_a_push_and_gives_up_after_its_timeout(home: Home,
                                                                    tmp_path: Path) -> None:
    dev = write(tmp_path / "dev", {"a.c": "a\n"})
    push_tree(home, dev, SPEC, method="copy")
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_tree_lock, args=(str(home.root), held, release))
    holder.start()
    try:
        assert held.wait(60)
        dest = home.run_dir("r1") / "source" / "ghostpdl"
        with pytest.raises(TreeBusy, match="locked"):
            snapshot_push(home, "ann", "ghostpdl", dest, timeout=0.3)
        assert not dest.exists()
    finally:
        release.set()
        holder.join(30)
    snapshot_push(home, "ann", "ghostpdl", dest)
    assert contents(dest) == {"a.c": ("a\n", 0o644)}


def _push_loop(root: str, trees: list[str], rounds: int) -> None:
    home = Home(Path(root))
    for i in range(rounds):
        push_tree(home, Path(trees[i % 2]), SPEC, method="rsync")


def test_a_snapshot_never_sees_half_a_push(home: Home, tmp_path: Path) -> None:
    """A real process pushes two trees alternately (rsync) while snapshots are taken: each
    snapshot holds one tree whole, never a mix."""
    names = [f"d{i // 50}/f{i:03}.c" for i in range(300)]
    old = write(tmp_path / "old", {n: "old\n" for n in names})
    new = write(tmp_path / "new", {n: "new, longer\n" for n in names})
    push_tree(home, old, SPEC, method="rsync")
    ctx = multiprocessing.get_context("fork")
    pusher = ctx.Process(target=_push_loop, args=(str(home.root), [str(new), str(old)], 6))
    pusher.start()
    seen = []
    try:
        for i in range(30):
            if not pusher.is_alive():
                break
            dest = home.run_dir(f"r{i}") / "source" / "ghostpdl"
            snapshot_push(home, "ann", "ghostpdl", dest, timeout=120)
            texts = {text for text, _mode in contents(dest).values()}
            assert len(texts) == 1 and len(contents(dest)) == 300, texts
            seen.append(texts.pop())
    finally:
        pusher.join(300)
    assert pusher.exitcode == 0
    assert seen


def test_then_runs_before_the_tree_lock_is_released(home: Home, tmp_path: Path) -> None:
    """The master writes job.start in ``then``: no push can land between the snapshot and
    job.start, so none is merged into a run that will not build it."""
    dev = write(tmp_path / "dev", {"a.c": "a\n"})
    push_tree(home, dev, SPEC, method="copy")
    dest = home.run_dir("r1") / "source" / "ghostpdl"
    seen: list[bool] = []

    def then() -> None:
        assert dest.is_dir()
        with pytest.raises(TreeBusy):
            with push.tree_locked(home, "ann", "ghostpdl", 0):
                pass
        seen.append(True)

    snapshot_push(home, "ann", "ghostpdl", dest, then=then)
    assert seen == [True]


def test_a_tree_never_pushed_is_named_in_the_error(home: Home) -> None:
    with pytest.raises(ClusterError, match=r"users/bob/ghostpdl does not exist \(.*users/bob "
                                           r"is missing\); expected a tree pushed"):
        snapshot_push(home, "bob", "ghostpdl", home.run_dir("r1") / "source" / "ghostpdl")
    assert not (home.users / "bob").exists()
