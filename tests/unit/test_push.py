"""clusterpush's sync (cluster.triggers.push): what a tree sends, by rsync and by the copy.

The rsync tests run the real rsync (method="rsync"): where it is missing they fail with a
ClusterError saying so, rather than being skipped.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

import cluster.runtime.mirror as mirror_mod
import cluster.triggers.push as push_mod
from cluster.cli import clusterpush
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.runtime import proc
from cluster.triggers.droppings import DROPPING
from cluster.triggers.push import MAX_PUSH_BYTES, is_excluded, push_tree, rsync_excludes

METHODS = ["rsync", "copy"]
SPEC = RunSpec.parse("user alice gs lowres", source="test")
ODD_NAME = "-x file with spaces"  # would be an option if it ever reached a command line

#: What a push of the tree ``hostile_tree`` builds must hold (less the dropping).
EXPECTED = {
    "Makefile": "all:\n",
    "src/a.c": "int a;\n",
    "src/sub/b.h": "#define B\n",
    "binaries/readme": "not a build dir\n",  # "bin*" is not "bin"
    "doc/bin": "a file named bin is sent\n",  # bin/ is excluded only as a directory
    ODD_NAME: "odd\n",
    "weird[1]*name": "wildcards\n",
    "inside-link": "int a;\n",  # a link to a file inside the tree: sent as that file
    "exactly-the-cap": None,  # MAX_PUSH_BYTES bytes: rsync's --max-size sends it
}


def hostile_tree(root: Path, outside: Path) -> Path:
    """A developer tree with everything a push must leave out, and some near misses."""
    files = {
        "Makefile": "all:\n",
        "src/a.c": "int a;\n",
        "src/sub/b.h": "#define B\n",
        "binaries/readme": "not a build dir\n",
        "doc/bin": "a file named bin is sent\n",
        ODD_NAME: "odd\n",
        "weird[1]*name": "wildcards\n",
        # left out:
        ".git/HEAD": "ref: refs/heads/master\n",
        ".git/objects/pack/p.pack": "pack",
        "sub/.svn/entries": "svn",
        "bin/gs": "#!/bin/sh\n",  # a stale build: must never stand in for the node's build
        "obj/x.o": "obj",
        "src/bin/tool": "nested bin/",
        "src/y.o": "object",
        "gs-obj/z": "per-product obj dir",
        "mupdf/build/release/mutool": "mupdf build",
        "mupdf/generated/x.c": "generated",
        "config.log": "configure log",
        "out.png": "png", "out.ppm": "P6", "t/out.pbm": "P4", "t/x.tif": "II*",
        DROPPING: "user mallory gs\n",  # a stale dropping in the tree is never sent
        f"{DROPPING}.rejected": "old",
        ".deps/a.Po": "dep",
        "autom4te.cache/output.0": "autom4te",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # Sparse, so the test costs no disk: one over the cap, one exactly at it.
    subprocess.run(["truncate", "-s", str(MAX_PUSH_BYTES + 1), str(root / "huge.dat")],
                   check=True)
    subprocess.run(["truncate", "-s", str(MAX_PUSH_BYTES), str(root / "exactly-the-cap")],
                   check=True)
    outside.write_text("a secret outside the tree\n")
    (root / "outside-link").symlink_to(outside)
    (root / "l[in]k*").symlink_to(outside)  # rsync's wildcards in the name of a skipped link
    (root / "inside-link").symlink_to("src/a.c")
    (root / "dir-link").symlink_to("src")
    (root / "dangling").symlink_to("nowhere")
    return root


def snapshot(root: Path) -> dict[str, str | None]:
    """Every file under ``root`` (POSIX relative path) with its text; None for big files."""
    out: dict[str, str | None] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            assert not path.is_symlink(), f"{rel} is pushed as a symlink"
            out[rel] = None if path.stat().st_size > 1_000_000 else path.read_text()
    return out


def detailed(root: Path) -> dict[str, tuple[str, int, int, str | None]]:
    """Every entry under ``root``: kind, permission bits, size and (small) contents."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for name in dirs + names:
            path = Path(dirpath) / name
            st = path.lstat()
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if path.is_dir() else "file"
            text = path.read_text() if kind == "file" and st.st_size < 1_000_000 else None
            out[path.relative_to(root).as_posix()] = (kind, stat.S_IMODE(st.st_mode),
                                                      st.st_size, text)
    return out


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    return h


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return hostile_tree(tmp_path / "ghostpdl", tmp_path / "secret.txt")


@pytest.mark.parametrize("path", [
    ".git/", "sub/.svn/", "CVS/", ".hg/", ".deps/", "a/.libs/", "autom4te.cache/",
    "bin/", "obj/", "src/bin/", "debugobj/", "pgobj/", "sobin/", "soobj/", "gs-obj/",
    "pcl-bin/", "build/", "mupdf/build/", "debug/", "release/", "generated/",
    "config.log", "x.o", "a/b/y.o", "out.png", "a.ppm", "a.pkm", "a.pgm", "a.pbm", "a.pam",
    "a.tif", "a.bmp", DROPPING, f"{DROPPING}.rejected", "t/x.png/",
])
def test_excluded(path: str) -> None:
    """Build outputs, VCS, images and droppings are left out at any depth."""
    assert is_excluded(path)


@pytest.mark.parametrize("path", [
    "bin", "src/bin", "obj", "build", "binaries/", "objects/", "bin.c", "src/a.c",
    "Makefile", "x.o.c", "OUT.PNG", "gs-bin-notes.txt", ".gitignore", "git/", "base/",
    "cluster_command", "my.png.txt",
])
def test_not_excluded(path: str) -> None:
    """Near misses are sent: directory patterns spare files, names match whole."""
    assert not is_excluded(path)


def test_rsync_excludes_say_the_same() -> None:
    """Directory patterns carry rsync's trailing slash, name patterns none."""
    opts = rsync_excludes()
    assert "--exclude=bin/" in opts and "--exclude=.git/" in opts
    assert "--exclude=*-obj/" in opts and "--exclude=*.o" in opts
    assert f"--exclude={DROPPING}*" in opts
    assert "--exclude=bin" not in opts


@pytest.mark.parametrize("method", METHODS)
def test_push_sends_exactly_the_expected_files(home: Home, tree: Path, method: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Excluded entries, oversized files and links out of the tree stay behind; the
    dropping is the push's own line."""
    caplog.set_level(logging.WARNING)
    target = push_tree(home, tree, SPEC, method=method)
    assert target == home.users / "alice" / "ghostpdl"
    got = snapshot(target)
    assert got.pop(DROPPING) == "user alice gs lowres\n"
    assert got == EXPECTED
    assert (target / "exactly-the-cap").stat().st_size == MAX_PUSH_BYTES
    assert sorted(p.name for p in target.iterdir() if p.is_dir()) == \
        ["binaries", "doc", "mupdf", "src", "sub", "t"]  # emptied but kept, as rsync does
    # The developer is told what was too big, with its size.
    assert f"huge.dat: {MAX_PUSH_BYTES + 1} bytes" in caplog.text
    assert "outside-link" in caplog.text


@pytest.mark.parametrize("method", METHODS)
def test_second_push_deletes_removed_and_excluded_files(home: Home, tree: Path,
                                                        method: str) -> None:
    """--delete and --delete-excluded: a file gone from the tree, and excluded files (or a
    stale oversized copy) found in the target, go; the new dropping stays."""
    target = push_tree(home, tree, SPEC, method=method)
    (tree / "src/sub/b.h").unlink()
    (tree / "new.c").write_text("new\n")
    (target / "bin").mkdir()
    (target / "bin/gs").write_text("stale build")
    (target / "src/z.o").write_text("stale object")
    (target / "render.png").write_text("png")
    (target / "huge.dat").write_text("an old, small version")
    (target / f"{DROPPING}.rejected").write_text("set aside")
    spec2 = RunSpec.parse("user alice gs highres", source="test")
    push_tree(home, tree, spec2, method=method)
    got = snapshot(target)
    assert got.pop(DROPPING) == "user alice gs highres\n"
    expected = {k: v for k, v in EXPECTED.items() if k != "src/sub/b.h"}
    assert got == {**expected, "new.c": "new\n"}


def test_both_methods_give_identical_results(tmp_path: Path, tree: Path) -> None:
    """rsync and the copy agree on every entry: kind, mode, size and contents; and either
    one finds nothing to change in what the other pushed."""
    (tree / "src/a.c").chmod(0o600)
    (tree / "configure").write_text("#!/bin/sh\n")
    (tree / "configure").chmod(0o755)
    (tree / "empty").mkdir()
    targets = {}
    for method in METHODS:
        h = Home(tmp_path / f"home-{method}")
        h.create()
        targets[method] = push_tree(h, tree, SPEC, method=method)
    by_rsync, by_copy = (detailed(targets[m]) for m in METHODS)
    assert by_rsync == by_copy
    assert by_rsync["empty"][0] == "dir" and by_rsync["configure"][1] == 0o755
    push_tree(Home(tmp_path / "home-rsync"), tree, SPEC, method="copy")
    push_tree(Home(tmp_path / "home-copy"), tree, SPEC, method="rsync")
    assert detailed(targets["rsync"]) == detailed(targets["copy"]) == by_copy


def test_a_mode_changed_alone_is_pushed_by_both_methods(tmp_path: Path, tree: Path) -> None:
    """chmod +x alone (same size, same mtime) reaches the pushed tree by either method, as
    rsync -a carries it; a run's snapshot hard-linked to the old file keeps its mode."""
    script = tree / "configure"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    for method in METHODS:
        h = Home(tmp_path / f"home-{method}")
        h.create()
        pushed = push_tree(h, tree, SPEC, method=method)
        snapshot_copy = tmp_path / f"snapshot-{method}"
        os.link(pushed / "configure", snapshot_copy)
        mtime = script.stat().st_mtime_ns
        script.chmod(0o755)
        os.utime(script, ns=(mtime, mtime))
        push_tree(h, tree, SPEC, method=method)
        assert stat.S_IMODE((pushed / "configure").stat().st_mode) == 0o755, method
        assert stat.S_IMODE(snapshot_copy.stat().st_mode) == 0o644, method
        script.chmod(0o644)


def test_auto_uses_rsync_when_on_path(home: Home, tree: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """method="auto" runs rsync when PATH has it and the tree is not small (and the copy is
    not used)."""
    called: list[list[str]] = []
    real = proc.run

    def spy(argv: list[str], **kw: Any) -> proc.Result:
        called.append(argv)
        return real(argv, **kw)

    monkeypatch.setattr(proc, "run", spy)
    monkeypatch.setattr(mirror_mod, "AUTO_COPY_ENTRIES", 2)
    push_tree(home, tree, SPEC)
    assert len(called) == 1 and Path(called[0][0]).name == "rsync"
    assert called[0][-2:] == [f"{tree.resolve()}/", f"{home.users / 'alice' / 'ghostpdl'}/"]
    assert "--delete-excluded" in called[0] and f"--max-size={MAX_PUSH_BYTES}" in called[0]


def test_auto_copies_a_small_tree_without_starting_rsync(home: Home, tree: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A tree of at most AUTO_COPY_ENTRIES entries is mirrored by the copy even where rsync
    is on PATH (rsync's start costs more than such a copy), with the same result."""
    def no_rsync(*_a: object, **_k: object) -> None:
        raise AssertionError("a small tree must not start rsync")

    assert mirror_mod._at_most(tree, mirror_mod.AUTO_COPY_ENTRIES)
    monkeypatch.setattr(mirror_mod, "_rsync", no_rsync)
    got = snapshot(push_tree(home, tree, SPEC))
    got.pop(DROPPING)
    assert got == EXPECTED


def test_without_rsync_auto_copies_and_rsync_is_an_error(home: Home, tree: Path,
                                                         tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """No rsync on PATH: "auto" falls back to the copy, "rsync" is a ClusterError."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ClusterError, match="rsync was asked for but is not on PATH"):
        push_tree(home, tree, SPEC, method="rsync")
    assert not (home.users / "alice").exists() or \
        not (home.users / "alice" / "ghostpdl" / DROPPING).exists()
    target = push_tree(home, tree, SPEC, method="auto")
    got = snapshot(target)
    got.pop(DROPPING)
    assert got == EXPECTED
    with pytest.raises(ValueError, match="push method 'scp'"):
        push_tree(home, tree, SPEC, method="scp")


def test_failed_rsync_is_an_error_and_leaves_no_dropping(home: Home, tree: Path,
                                                         tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """rsync's failure (not 0, not 24 'vanished') is a ClusterError with its message."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    script = fake / "rsync"
    script.write_text("#!/bin/sh\ncat >/dev/null\necho 'rsync: disk full (28)' >&2\nexit 23\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ClusterError, match=r"exit status 23\):\nrsync: disk full"):
        push_tree(home, tree, SPEC, method="rsync")
    assert not (home.users / "alice" / "ghostpdl" / DROPPING).exists()


def test_cli_copy_flag(home: Home, tree: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    """clusterpush.py --copy pushes with the copy (rsync is never run) and queues."""
    def no_rsync(*_a: object, **_k: object) -> None:
        raise AssertionError("--copy must not run rsync")

    monkeypatch.setattr(mirror_mod, "_rsync", no_rsync)
    rc = clusterpush.main(["--home", str(home.root), "--tree", str(tree), "--user", "alice",
                           "--copy", "gs", "lowres"])
    assert rc == 0
    assert "queueing: user alice gs lowres" in capsys.readouterr().out
    got = snapshot(home.users / "alice" / "ghostpdl")
    assert got.pop(DROPPING) == "user alice gs lowres\n"
    assert got == EXPECTED


def test_cli_default_uses_rsync(home: Home, tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --copy the CLI asks for "auto" (rsync here, since it is installed)."""
    seen: list[str] = []
    real = push_mod.submit_push

    def spy(h: Home, t: Path, spec: RunSpec, method: str = "auto") -> push_mod.Pushed:
        seen.append(method)
        return real(h, t, spec, method=method)

    monkeypatch.setattr(clusterpush, "submit_push", spy)
    assert clusterpush.main(["--home", str(home.root), "--tree", str(tree), "--user",
                             "alice", "gs"]) == 0
    assert seen == ["auto"]
    assert (home.users / "alice" / "ghostpdl" / "src/a.c").is_file()
