"""Unit tests of cluster.node.transport (the node's view of the master home)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import cluster.runtime.mirror as mirror_mod
from cluster.config import Config
from cluster.errors import ConfigError, TransportError
from cluster.node.sshtransport import SshTransport
from cluster.node.transport import LocalTransport, Transport, check_rel
from cluster.node.transports import make_transport
from cluster.runtime.ssh import SshTarget


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = path.read_text()
    return out


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    root.mkdir()
    return root


@pytest.fixture
def t(home: Path) -> LocalTransport:
    return LocalTransport(home)


def test_local_transport_satisfies_the_protocol(t: LocalTransport) -> None:
    """LocalTransport is usable where a Transport is expected."""
    as_protocol: Transport = t
    assert as_protocol is t


def test_read_text(home: Path, t: LocalTransport) -> None:
    """read_text gives the file's text, None for a missing file, an error for a directory."""
    _tree(home, {"job.start": "id 20190408115600\nproduct gs\n"})
    assert t.read_text("job.start") == "id 20190408115600\nproduct gs\n"
    assert t.read_text("job.1.start") is None
    assert t.read_text("no/such/dir/file") is None
    (home / "dir").mkdir()
    with pytest.raises(TransportError, match="directory"):
        t.read_text("dir")


def test_read_text_rejects_non_utf8(home: Path, t: LocalTransport) -> None:
    """A binary file is an error naming the path, not a crash."""
    (home / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(TransportError, match="bin: not UTF-8"):
        t.read_text("bin")


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "a/..", "..", "x\0y", "",
                                 ".", "./"])
def test_paths_escaping_the_home_are_rejected(t: LocalTransport, tmp_path: Path,
                                              rel: str) -> None:
    """Absolute paths, '..' components, NUL bytes and the home itself are refused."""
    src = tmp_path / "src.txt"
    src.write_text("x")
    with pytest.raises(TransportError) as info:
        t.read_text(rel)
    assert repr(rel) in str(info.value) or rel in str(info.value)
    with pytest.raises(TransportError):
        t.fetch_tree(rel, tmp_path / "dest")
    with pytest.raises(TransportError):
        t.upload(src, rel)
    assert not (tmp_path / "x").exists()


def test_check_rel_messages_name_the_rule() -> None:
    """Each refusal says which rule was broken."""
    with pytest.raises(TransportError, match="absolute"):
        check_rel("/etc/passwd")
    with pytest.raises(TransportError, match=r"'\.\.'"):
        check_rel("a/../../b")
    with pytest.raises(TransportError, match="NUL"):
        check_rel("a\0b")
    assert check_rel("./tests//a.ps").as_posix() == "tests/a.ps"


def test_fetch_tree_mirrors_nested_dirs(home: Path, t: LocalTransport, tmp_path: Path) -> None:
    """fetch_tree copies every file of nested directories with its mtime."""
    files = {"tests/a.ps": "A", "tests/sub/b.pdf": "B", "tests/sub/deeper/c.xps": "C",
             "other/ignored": "no"}
    _tree(home, files)
    (home / "tests" / "empty").mkdir()
    dest = tmp_path / "node" / "tests"
    t.fetch_tree("tests", dest)
    assert _snapshot(dest) == {"a.ps": "A", "sub/b.pdf": "B", "sub/deeper/c.xps": "C"}
    assert (dest / "empty").is_dir()
    src_st = (home / "tests/sub/b.pdf").stat()
    assert (dest / "sub/b.pdf").stat().st_mtime_ns == src_st.st_mtime_ns


def test_fetch_tree_deletes_extras_and_follows_changes(home: Path, t: LocalTransport,
                                                       tmp_path: Path) -> None:
    """Files and directories gone from the master go from dest; kind changes are handled."""
    _tree(home, {"tests/keep": "1", "tests/gone": "2", "tests/dir/x": "3", "tests/flip": "4"})
    dest = tmp_path / "dest"
    t.fetch_tree("tests", dest)
    (home / "tests/gone").unlink()
    (home / "tests/dir/x").unlink()
    (home / "tests/dir").rmdir()
    (home / "tests/flip").unlink()
    _tree(home, {"tests/flip/inside": "5", "tests/new": "6"})
    (dest / "local-extra").write_text("junk")
    (dest / "extra-dir").mkdir()
    (dest / "extra-dir" / "f").write_text("junk")
    t.fetch_tree("tests", dest)
    assert _snapshot(dest) == {"keep": "1", "flip/inside": "5", "new": "6"}
    assert sorted(p.name for p in dest.iterdir()) == ["flip", "keep", "new"]


def test_fetch_tree_skips_unchanged_files(home: Path, t: LocalTransport, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A second fetch copies only the files whose size or mtime changed."""
    _tree(home, {"tests/a": "aaa", "tests/b": "bbb", "tests/s/c": "ccc"})
    dest = tmp_path / "dest"
    t.fetch_tree("tests", dest)
    copied: list[str] = []
    real = mirror_mod.copy_file

    def spy(src: Path, dst: Path) -> bool:
        copied.append(src.name)
        return real(src, dst)

    monkeypatch.setattr(mirror_mod, "copy_file", spy)
    t.fetch_tree("tests", dest)
    assert copied == []
    (home / "tests/b").write_text("bbbb")  # size changes
    st = (home / "tests/s/c").stat()
    (home / "tests/s/c").write_text("CCC")  # same size, new mtime
    os.utime(home / "tests/s/c", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    t.fetch_tree("tests", dest)
    assert sorted(copied) == ["b", "c"]
    assert _snapshot(dest) == {"a": "aaa", "b": "bbbb", "s/c": "CCC"}


def test_fetch_tree_leaves_no_temp_file_on_failure(home: Path, t: LocalTransport,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that fails midway leaves neither a half file nor a temp file in dest."""
    _tree(home, {"tests/a": "new contents"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a").write_text("old")

    def broken_copy(fd_in: int, fd_out: int, st: os.stat_result) -> None:
        os.write(fd_out, b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mirror_mod.fsutil, "copy_contents", broken_copy)
    with pytest.raises(TransportError, match="No space left"):
        t.fetch_tree("tests", dest)
    assert sorted(p.name for p in dest.iterdir()) == ["a"]
    assert (dest / "a").read_text() == "old"


def test_copy_file_keeps_mode_and_times_and_replaces_a_stale_temp(tmp_path: Path) -> None:
    """The copy has the source's bytes, permission bits and mtime; a temp file of this
    pid's name left by a dead process is replaced, and none stays behind."""
    src = tmp_path / "tool.sh"
    src.write_bytes(b"#!/bin/sh\necho hi\n" * 5000)
    os.chmod(src, 0o751)
    os.utime(src, ns=(1_600_000_000_000_000_000, 1_500_000_000_123_456_789))
    dest_dir = tmp_path / "dest"
    dest_dir.mkdir()
    serial = next(mirror_mod._TEMP_SERIAL) + 1  # the name the next copy will use
    stale = dest_dir / f"{mirror_mod.TEMP_PREFIX}{os.getpid()}.{serial}"
    stale.write_text("left by a dead copier")
    assert mirror_mod.copy_file(src, dest_dir / "tool.sh")
    got = (dest_dir / "tool.sh").stat()
    assert (dest_dir / "tool.sh").read_bytes() == src.read_bytes()
    assert got.st_mode & 0o7777 == 0o751
    assert got.st_mtime_ns == 1_500_000_000_123_456_789
    assert sorted(p.name for p in dest_dir.iterdir()) == ["tool.sh"]


def test_copy_file_without_sendfile_reads_and_writes(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel cannot sendfile between the two files, the copy is whole anyway."""
    src = tmp_path / "big"
    src.write_bytes(os.urandom(3 << 20))

    def no_sendfile(*_args: object) -> int:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(mirror_mod.os, "sendfile", no_sendfile)
    assert mirror_mod.copy_file(src, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()


def test_copy_file_of_a_vanished_source_or_a_fifo_is_skipped(tmp_path: Path) -> None:
    """A source gone since the listing, or a FIFO put in its place (which a blocking open
    would wait on for ever), is skipped, and no temp file stays."""
    assert mirror_mod.copy_file(tmp_path / "gone", tmp_path / "copy") is False
    assert list(tmp_path.iterdir()) == []
    os.mkfifo(tmp_path / "fifo")
    assert mirror_mod.copy_file(tmp_path / "fifo", tmp_path / "copy") is False
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_a_tree_is_small_up_to_the_limit_counting_files_and_folders(tmp_path: Path) -> None:
    """mirror's "auto" copies a tree of at most AUTO_COPY_ENTRIES entries: files and
    folders at any depth count, and a folder that cannot be read is not small."""
    _tree(tmp_path / "t", {"a": "", "sub/b": "", "sub/deeper/c": ""})  # 5 entries
    assert mirror_mod._at_most(tmp_path / "t", 5)
    assert not mirror_mod._at_most(tmp_path / "t", 4)
    assert not mirror_mod._at_most(tmp_path / "missing", 5)


def test_fetch_tree_does_not_follow_symlinks_out_of_the_tree(home: Path, t: LocalTransport,
                                                             tmp_path: Path) -> None:
    """A link to a file inside the tree is copied as a file; links out or to dirs are not."""
    outside = tmp_path / "secret"
    outside.write_text("secret")
    _tree(home, {"tests/real": "R", "tests/sub/x": "X"})
    (home / "tests/inside-link").symlink_to("real")
    (home / "tests/outside-link").symlink_to(outside)
    (home / "tests/dir-link").symlink_to("sub")
    (home / "tests/dangling").symlink_to("nowhere")
    dest = tmp_path / "dest"
    t.fetch_tree("tests", dest)
    assert _snapshot(dest) == {"real": "R", "inside-link": "R", "sub/x": "X"}
    assert not (dest / "inside-link").is_symlink()


def test_fetch_tree_exclude_predicate(home: Path, t: LocalTransport, tmp_path: Path) -> None:
    """The predicate sees POSIX paths relative to the root, directories with a trailing
    '/'; an excluded directory is not descended, and excluded entries already in dest go
    (rsync --delete-excluded)."""
    _tree(home, {"tree/keep.c": "k", "tree/x.o": "o", "tree/bin/gs": "gs",
                 "tree/src/bin/tool": "t", "tree/src/a.c": "a", "tree/doc/bin": "file"})
    seen: list[str] = []

    def exclude(path: str) -> bool:
        seen.append(path)
        return path.endswith(".o") or path == "bin/" or path.endswith("/bin/")

    dest = tmp_path / "dest"
    _tree(dest, {"bin/old": "stale", "y.o": "stale", "keep.c": "k"})
    t.fetch_tree("tree", dest, exclude=exclude)
    assert _snapshot(dest) == {"keep.c": "k", "src/a.c": "a", "doc/bin": "file"}
    assert sorted(seen) == ["bin/", "doc/", "doc/bin", "keep.c", "src/", "src/a.c", "src/bin/",
                            "x.o"]
    # Without a predicate, fetch_tree is the plain mirror again: everything comes back.
    t.fetch_tree("tree", dest)
    assert len(_snapshot(dest)) == 6


def test_fetch_tree_max_size(home: Path, t: LocalTransport, tmp_path: Path,
                             caplog: pytest.LogCaptureFixture) -> None:
    """A file over max_size is not copied (one of exactly max_size is), named with its size
    in a warning, and a copy of it already in dest is deleted."""
    _tree(home, {"tree/small": "1234", "tree/exact": "12345", "tree/sub/big": "123456"})
    dest = tmp_path / "dest"
    _tree(dest, {"sub/big": "old"})
    t.fetch_tree("tree", dest, max_size=5)
    assert _snapshot(dest) == {"small": "1234", "exact": "12345"}
    assert "sub/big: 6 bytes, over the 5-byte limit" in caplog.text


def test_left_out_lists_what_the_mirror_skips(home: Path, t: LocalTransport,
                                              tmp_path: Path) -> None:
    """left_out names links the mirror does not follow, special files, in-flight temp files
    and oversized files, not what the predicate excludes (nor what is under it)."""
    outside = tmp_path / "secret"
    outside.write_text("s")
    _tree(home, {"tree/a": "a", "tree/sub/big": "123456", "tree/skip/link-target": "x",
                 f"tree/{mirror_mod.TEMP_PREFIX}1": "tmp"})
    (home / "tree/sub/out").symlink_to(outside)
    (home / "tree/skip/out").symlink_to(outside)
    (home / "tree/in").symlink_to("a")
    (home / "tree/dir-link").symlink_to("sub")
    os.mkfifo(home / "tree/fifo")
    got = t.left_out("tree", exclude=lambda p: p == "skip/", max_size=5)
    assert got == sorted([f"{mirror_mod.TEMP_PREFIX}1", "dir-link", "fifo", "sub/big",
                          "sub/out"])
    dest = tmp_path / "dest"
    t.fetch_tree("tree", dest, exclude=lambda p: p == "skip/", max_size=5)
    assert _snapshot(dest) == {"a": "a", "in": "a"}


def test_fetch_tree_missing_source_is_an_error(t: LocalTransport, tmp_path: Path) -> None:
    """Fetching a directory the master does not have raises TransportError naming it."""
    with pytest.raises(TransportError, match="fetch tests: no such directory"):
        t.fetch_tree("tests", tmp_path / "dest")


def test_upload_creates_parents_and_replaces_atomically(home: Path, t: LocalTransport,
                                                        tmp_path: Path) -> None:
    """upload copies into new directories and replaces an existing file whole."""
    src = tmp_path / "node7.log"
    src.write_text("log 1")
    t.upload(src, "runs/20190408/node7.log")
    target = home / "runs/20190408/node7.log"
    assert target.read_text() == "log 1"
    src.write_text("log 2, longer")
    t.upload(src, "runs/20190408/node7.log")
    assert target.read_text() == "log 2, longer"
    assert os.listdir(target.parent) == ["node7.log"]  # no temp file left


def test_upload_is_atomic_on_failure(home: Path, t: LocalTransport, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed upload leaves the previous master copy intact and no temp file."""
    _tree(home, {"runs/r/log": "previous"})
    src = tmp_path / "log"
    src.write_text("new")

    def broken_copy(fd_in: int, fd_out: int, st: os.stat_result) -> None:
        os.write(fd_out, b"ne")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(mirror_mod.fsutil, "copy_contents", broken_copy)
    with pytest.raises(TransportError, match="upload runs/r/log: Input/output error"):
        t.upload(src, "runs/r/log")
    assert os.listdir(home / "runs/r") == ["log"]
    assert (home / "runs/r/log").read_text() == "previous"


def test_upload_errors(home: Path, t: LocalTransport, tmp_path: Path) -> None:
    """A missing local file or a directory target is a TransportError."""
    with pytest.raises(TransportError, match="does not exist"):
        t.upload(tmp_path / "missing", "runs/x")
    (home / "runs").mkdir()
    src = tmp_path / "f"
    src.write_text("x")
    with pytest.raises(TransportError, match="is a directory"):
        t.upload(src, "runs")


def test_make_transport(tmp_path: Path) -> None:
    """'local' gives a LocalTransport on master_home; 'ssh' an SshTransport built from the
    node keys, not yet connected; anything else is a ConfigError."""
    tr = make_transport(Config(master_home=tmp_path))
    assert isinstance(tr, LocalTransport) and tr.root == tmp_path
    ssh_tr = make_transport(Config(transport="ssh", master_host="m.example", ssh_port=2222,
                                   ssh_user="cluster", ssh_key="/k",
                                   ssh_known_hosts=Path("~/kh"),
                                   master_home=Path("/srv/cluster-home"),
                                   connect_retries=3, connect_retry_delay=0.5))
    assert isinstance(ssh_tr, SshTransport) and ssh_tr.connects == 0
    assert ssh_tr.target == SshTarget("m.example", 2222, "cluster", "/k",
                                      Path(os.path.expanduser("~/kh")))
    assert ssh_tr.remote_path("tests/a.ps") == "/srv/cluster-home/tests/a.ps"
    assert (ssh_tr.connect_retries, ssh_tr.connect_retry_delay) == (3, 0.5)
    with pytest.raises(ConfigError):
        make_transport(Config(transport="ftp"))


@pytest.mark.parametrize("home,expected", [("cluster-home", "cluster-home/job.start"),
                                           ("~/cluster-home", "cluster-home/job.start"),
                                           ("~", "job.start"),
                                           ("/abs/home", "/abs/home/job.start")])
def test_ssh_remote_paths(home: str, expected: str) -> None:
    """On the master, a relative master_home (or ~/...) is relative to the login home."""
    tr = SshTransport(SshTarget("m"), home)
    assert tr.remote_path("job.start") == expected
    with pytest.raises(TransportError, match="'..'"):
        tr.remote_path("../job.start")


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_mirror_by_rsync_holds_what_the_copy_holds(home: Path, tmp_path: Path) -> None:
    """runtime.mirror's two copiers leave out, follow and delete the same entries."""
    outside = tmp_path / "secret"
    outside.write_text("s")
    _tree(home, {"tree/a": "a", "tree/sub/big": "123456", "tree/skip/x": "x",
                 "tree/sub/keep": "k", f"tree/{mirror_mod.TEMP_PREFIX}1": "tmp"})
    (home / "tree/sub/out").symlink_to(outside)
    (home / "tree/in").symlink_to("a")
    (home / "tree/dir-link").symlink_to("sub")
    results = []
    for method in ("copy", "rsync"):
        dest = tmp_path / method
        _tree(dest, {"stale": "old", "skip/x": "old", "sub/big": "old"})
        mirror_mod.mirror(home / "tree", dest, exclude=lambda p: p == "skip/", max_size=5,
                          method=method, timeout=60)
        results.append(_snapshot(dest))
    assert results[0] == results[1] == {"a": "a", "in": "a", "sub/keep": "k"}
