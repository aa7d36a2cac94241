"""cluster.runtime.fsutil.swap_dir: a folder made under a temporary name put at its final
name, replacing what is there; and what a crash between its steps leaves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.runtime import fsutil


def _tree(path: Path, text: str) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "file").write_text(text)
    return path


def _text(path: Path) -> str:
    return (path / "sub" / "file").read_text()


def _names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_nothing_at_dest_is_one_rename(tmp_path: Path) -> None:
    new = _tree(tmp_path / ".new", "new")
    fsutil.swap_dir(new, tmp_path / "dest")
    assert _text(tmp_path / "dest") == "new" and _names(tmp_path) == ["dest"]


@pytest.mark.parametrize("old", ["folder", "file", "link", "dangling link"])
def test_whatever_is_at_dest_is_replaced_and_removed(tmp_path: Path, old: str) -> None:
    dest = tmp_path / "dest"
    target = _tree(tmp_path / "target", "kept")
    if old == "folder":
        _tree(dest, "old")
    elif old == "file":
        dest.write_text("old")
    elif old == "link":
        dest.symlink_to(target)
    else:
        dest.symlink_to(tmp_path / "nowhere")
    fsutil.swap_dir(_tree(tmp_path / ".new", "new"), dest)
    assert _text(dest) == "new" and not dest.is_symlink()
    assert _names(tmp_path) == ["dest", "target"]  # the old removed, nothing left aside
    assert _text(target) == "kept"  # a link's target is not the old tree


def test_a_named_aside_is_used_and_a_leftover_default_one_removed(tmp_path: Path) -> None:
    dest = _tree(tmp_path / "dest", "old")
    fsutil.swap_dir(_tree(tmp_path / ".new", "new"), dest, aside=tmp_path / ".dest.old.x")
    assert _text(dest) == "new" and _names(tmp_path) == ["dest"]
    _tree(tmp_path / f".dest.old.{os.getpid()}", "left by a crash")
    fsutil.swap_dir(_tree(tmp_path / ".newer", "newer"), dest)
    assert _text(dest) == "newer" and _names(tmp_path) == ["dest"]


def test_a_failed_rename_in_puts_the_old_back(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    dest = _tree(tmp_path / "dest", "old")
    new = _tree(tmp_path / ".new", "new")
    real = os.replace

    def failing(src: object, dst: object) -> None:
        if Path(str(src)) == new:
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space"):
        fsutil.swap_dir(new, dest)
    assert _text(dest) == "old" and _text(new) == "new"  # new is the caller's to remove
    assert _names(tmp_path) == [".new", "dest"]


class _Crash(BaseException):
    """A process killed at a step: nothing after it runs (not even an except OSError)."""


@pytest.mark.parametrize("steps_done, left", [
    # (renames done before the crash, what the folder then holds)
    (0, {"dest": "old", ".new": "new"}),
    (1, {".dest.old.PID": "old", ".new": "new"}),  # nothing at dest, both trees whole
    (2, {"dest": "new", ".dest.old.PID": "old"}),  # the old only waits for its removal
])
def test_what_a_crash_between_the_steps_leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               steps_done: int, left: dict[str, str]) -> None:
    dest = _tree(tmp_path / "dest", "old")
    new = _tree(tmp_path / ".new", "new")
    real = os.replace
    done: list[object] = []

    def crashing(src: object, dst: object) -> None:
        if len(done) == steps_done:
            raise _Crash
        real(src, dst)  # type: ignore[arg-type]
        done.append(dst)

    def no_removal(path: object, **_: object) -> None:
        raise _Crash
    monkeypatch.setattr(os, "replace", crashing)
    monkeypatch.setattr(fsutil.shutil, "rmtree", no_removal)
    with pytest.raises(_Crash):
        fsutil.swap_dir(new, dest)
    seen = {name.replace(str(os.getpid()), "PID"): _text(tmp_path / name)
            for name in _names(tmp_path)}
    assert seen == left
