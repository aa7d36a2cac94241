"""buildtree.overlay: the build folder follows the mirror, keeps what the build made, and
gives changed files mtimes newer than the last build's outputs (real files in tmp_path)."""

from __future__ import annotations

import os
from pathlib import Path

from cluster.node.buildtree import overlay, remove_programs

OLD_NS = 1_000_000_000 * 1_000_000_000  # 2001-09-09: older than any build


def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    mirror, build = tmp_path / "mirror", tmp_path / "build"
    (mirror / "sub").mkdir(parents=True)
    for name, text in (("a.c", "a1"), ("sub/b.c", "b1"), ("gone.c", "g")):
        (mirror / name).write_text(text)
        os.utime(mirror / name, ns=(OLD_NS, OLD_NS))
    (mirror / "link").symlink_to("a.c")
    return mirror, build, tmp_path / ".build.manifest"


def test_first_overlay_copies_everything_with_the_masters_mtimes(tmp_path: Path) -> None:
    mirror, build, manifest = setup(tmp_path)
    done = overlay(mirror, build, manifest)
    assert (done.written, done.deleted) == (4, 0)
    assert (build / "sub" / "b.c").read_text() == "b1"
    assert (build / "a.c").stat().st_mtime_ns == OLD_NS
    assert os.readlink(build / "link") == "a.c"


def test_next_overlay_writes_only_changes_and_keeps_the_builds_files(tmp_path: Path) -> None:
    mirror, build, manifest = setup(tmp_path)
    overlay(mirror, build, manifest)
    (build / "a.o").write_text("object")  # what the build made
    (build / "Makefile").write_text("made by configure")
    before_a = (build / "a.c").stat().st_ino
    (mirror / "sub" / "b.c").write_text("b2")  # a change carrying an old mtime
    os.utime(mirror / "sub" / "b.c", ns=(OLD_NS - 10**9, OLD_NS - 10**9))
    (mirror / "gone.c").unlink()
    (mirror / "new.c").write_text("n")
    done = overlay(mirror, build, manifest)
    assert (done.written, done.deleted) == (2, 1)
    assert (build / "a.c").stat().st_ino == before_a  # unchanged: not touched
    assert (build / "a.o").read_text() == "object"
    assert (build / "Makefile").read_text() == "made by configure"
    assert not (build / "gone.c").exists()
    assert (build / "sub" / "b.c").read_text() == "b2"
    # Newer than the object made before the change, although the master's mtime is older.
    assert (build / "sub" / "b.c").stat().st_mtime_ns >= (build / "a.o").stat().st_mtime_ns
    assert overlay(mirror, build, manifest).written == 0


def test_without_its_manifest_the_build_folder_is_made_afresh(tmp_path: Path) -> None:
    mirror, build, manifest = setup(tmp_path)
    overlay(mirror, build, manifest)
    (build / "a.o").write_text("object")
    manifest.unlink()
    assert overlay(mirror, build, manifest).written == 4
    assert not (build / "a.o").exists()


def test_the_last_builds_programs_are_removed_but_not_the_trees_own(tmp_path: Path) -> None:
    bin_dir, source_bin = tmp_path / "build" / "bin", tmp_path / "mirror" / "bin"
    bin_dir.mkdir(parents=True)
    source_bin.mkdir(parents=True)
    for name, mode in (("gs", 0o755), ("gpcl6", 0o700), ("notes.txt", 0o644),
                       ("script", 0o755)):
        (bin_dir / name).write_text(name)
        (bin_dir / name).chmod(mode)
    (source_bin / "script").write_text("the tree's own")
    assert remove_programs(bin_dir, source_bin) == ["gpcl6", "gs"]
    assert sorted(p.name for p in bin_dir.iterdir()) == ["notes.txt", "script"]
    assert remove_programs(tmp_path / "absent", source_bin) == []
