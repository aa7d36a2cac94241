"""clusterpush never follows a symlink at users/<user>/....

The break: a symlink planted at users/<user>/<tree> made that user's push run
`rsync --delete` through it and delete files outside the home.  Each test plants a link to
a directory outside the home holding a canary, pushes with the real rsync or the copy (and
the real clusterpush.py), and checks that the push is refused, naming the path, and that
nothing outside the home changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import droppings
from cluster.triggers.push import SymlinkInHome, push_tree, snapshot_push
from tests.helpers import REPO

SPEC = RunSpec.parse("user ann gs")


def listing(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*")
            if p.is_file()}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Home, Path, Path]:
    """A home, a developer tree, and a directory outside the home with a canary."""
    home = Home(tmp_path / "home")
    home.create()
    dev = tmp_path / "dev" / "ghostpdl"
    dev.mkdir(parents=True)
    (dev / "a.c").write_text("int a;\n")
    outside = tmp_path / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "canary").write_text("alive\n")
    (outside / "sub" / "data").write_text("keep me\n")
    return home, dev, outside


def plant(home: Home, where: str, outside: Path) -> Path:
    """Replace ``where`` (relative to the home) by a symlink to ``outside``."""
    link = home.root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_dir() and not link.is_symlink():
        link.rmdir()
    link.symlink_to(outside)
    return link


@pytest.mark.parametrize("method", ["rsync", "copy"])
@pytest.mark.parametrize("where", ["users/ann/ghostpdl", "users/ann", "users"])
def test_a_planted_symlink_refuses_the_push_and_touches_nothing(
        setup: tuple[Home, Path, Path], method: str, where: str) -> None:
    home, dev, outside = setup
    before = listing(outside)
    link = plant(home, where, outside)
    with pytest.raises(SymlinkInHome) as caught:
        push_tree(home, dev, SPEC, method=method)
    text = str(caught.value)
    assert str(link) in text and "symlink" in text
    assert "where a directory was expected" in text
    assert listing(outside) == before
    assert sorted(p.name for p in outside.iterdir()) == ["canary", "sub"]  # no lock, no dropping


def test_the_command_line_says_so_and_exits_2(setup: tuple[Home, Path, Path]) -> None:
    home, dev, outside = setup
    plant(home, "users/ann/ghostpdl", outside)
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", "ann", "gs"], cwd=dev,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "users/ann/ghostpdl: a symlink (to " in done.stderr
    assert "nothing was synced" in done.stderr
    assert (outside / "canary").read_text() == "alive\n"


def test_a_symlink_inside_the_pushed_tree_is_replaced_not_followed(
        setup: tuple[Home, Path, Path]) -> None:
    """Below the tree's top the mirror itself replaces a link by what the source has."""
    home, dev, outside = setup
    (dev / "sub").mkdir()
    (dev / "sub" / "x.c").write_text("x\n")
    target = push_tree(home, dev, SPEC, method="rsync")
    (target / "sub" / "x.c").unlink()
    (target / "sub").rmdir()
    (target / "sub").symlink_to(outside)
    for method in ("rsync", "copy"):
        push_tree(home, dev, SPEC, method=method)
        assert not (target / "sub").is_symlink()
        assert (target / "sub" / "x.c").read_text() == "x\n"
        assert listing(outside) == {"canary": "alive\n", "sub/data": "keep me\n"}


def test_a_symlink_at_the_lock_name_is_refused(setup: tuple[Home, Path, Path]) -> None:
    home, dev, outside = setup
    (home.users / "ann").mkdir()
    home.user_tree_lock("ann", "ghostpdl").symlink_to(outside / "lock")
    with pytest.raises(Exception, match="cannot lock .*expected a regular lock file"):
        push_tree(home, dev, SPEC, method="copy")
    assert not (outside / "lock").exists()


def test_the_snapshot_refuses_too(setup: tuple[Home, Path, Path]) -> None:
    home, _dev, outside = setup
    plant(home, "users/ann/ghostpdl", outside)
    with pytest.raises(SymlinkInHome):
        snapshot_push(home, "ann", "ghostpdl", home.run_dir("r1") / "source" / "ghostpdl")
    assert not (home.run_dir("r1") / "source" / "ghostpdl").exists()


def test_the_scan_does_not_look_behind_a_symlinked_user(setup: tuple[Home, Path, Path]) -> None:
    """A dropping reached through a symlink is neither queued nor renamed (the rename would
    write outside the home)."""
    home, _dev, outside = setup
    (outside / "ghostpdl").mkdir()
    (outside / "ghostpdl" / droppings.DROPPING).write_text("user ann gs\n")
    (outside / "gs.run").write_text("")
    plant(home, "users/ann", outside)
    queue = QueueFile.for_priority(home, 0)
    assert droppings.waiting(home) == []
    assert droppings.scan_user_droppings(home, Config(), queue) == []
    assert queue.read() == []
    assert sorted(os.listdir(outside / "ghostpdl")) == [droppings.DROPPING]
    assert (outside / "gs.run").exists()
