"""The master's side of a remote push, its file moves: commit, abort, stale staged trees.

Real files in a temporary master home; the staged tree is made by hand, as
``receive_push`` leaves it once rsync's server is done (the transfer itself is tested over
a real sshd in tests/component/test_remote_push_*.py).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.triggers import pushreceive
from cluster.triggers.droppings import DROPPING
from cluster.triggers.pushreceive import PushAborted, abort_pushes, commit_push, staged_tree

SPEC = RunSpec.parse("user alice gs", source="test")
TOKEN = "0123456789abcdef"


def setup(tmp_path: Path) -> tuple[Home, Path, Path]:
    home = Home(tmp_path / "home")
    home.create()
    target = home.user_tree("alice", "ghostpdl")
    target.mkdir(parents=True)
    (target / "old.c").write_text("old\n")
    staged = staged_tree(home, "alice", "ghostpdl", TOKEN)
    staged.mkdir()
    (staged / "new.c").write_text("new\n")
    return home, target, staged


def test_commit_puts_the_staged_tree_in_place_and_writes_the_dropping(tmp_path: Path) -> None:
    home, target, staged = setup(tmp_path)
    pushed = commit_push(home, SPEC, TOKEN)
    assert pushed.target == target
    assert sorted(p.name for p in target.iterdir()) == [DROPPING, "new.c"]
    assert (target / DROPPING).read_text() == SPEC.line() + "\n"
    assert sorted(p.name for p in (home.users / "alice").iterdir()) \
        == [".ghostpdl.lock", "ghostpdl"]
    with pytest.raises(ClusterError, match="no staged tree"):
        commit_push(home, SPEC, TOKEN)  # once only


def test_abort_before_the_commit_queues_nothing(tmp_path: Path) -> None:
    home, target, staged = setup(tmp_path)
    (target / DROPPING).write_text("user alice gs\n")  # an earlier push, not yet scanned
    assert abort_pushes(home, "alice") == 2
    assert not staged.exists() and not (target / DROPPING).exists()
    with pytest.raises(PushAborted, match="aborted"):
        commit_push(home, SPEC, TOKEN)
    assert sorted(p.name for p in target.iterdir()) == ["old.c"]
    assert sorted(p.name for p in (home.users / "alice").iterdir()) \
        == [".ghostpdl.lock", "ghostpdl"]


def test_a_bad_token_is_refused(tmp_path: Path) -> None:
    home, _target, _staged = setup(tmp_path)
    with pytest.raises(ClusterError, match="16 lowercase hex digits"):
        commit_push(home, SPEC, "../../etc")


def test_stale_staged_trees_go_unless_a_transfer_holds_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, _target, staged = setup(tmp_path)
    held = staged_tree(home, "alice", "ghostpdl", "f" * 16)
    held.mkdir()
    other = staged_tree(home, "alice", "mupdf", "e" * 16)
    other.mkdir()
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        pushreceive._remove_stale(home, "alice", "ghostpdl")  # young: kept
        assert staged.exists() and held.exists()
        monkeypatch.setattr(pushreceive, "STALE_STAGED_AGE", 0.0)
        pushreceive._remove_stale(home, "alice", "ghostpdl")
        assert not staged.exists()  # abandoned: its client never committed
        assert held.exists()  # its transfer runs
        assert other.exists()  # another tree's
    finally:
        os.close(fd)
