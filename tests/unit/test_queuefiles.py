"""Unit tests of cluster.queue: the queue line grammar and the locked queue file."""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import MAX_LINE, RunSpec

# ----------------------------------------------------------------------------------------------
# Grammar


@pytest.mark.parametrize("line, kind, ref, products, options", [
    ("user alice gs", "user", "alice", ("gs",), ()),
    ("git 0123abc gs,pdfwrite", "git", "0123abc", ("gs", "pdfwrite"), ()),
    ("git " + "a" * 40 + " ps2write", "git", "a" * 40, ("ps2write",), ()),
    ("auto nightly-debug_Z.1 mupdf", "auto", "nightly-debug_Z.1", ("mupdf",), ()),
    ("user bob gs lowres bmpcmp filter=pdf", "user", "bob", ("gs",),
     ("bmpcmp", "filter=pdf", "lowres")),
    ("user bob gs extras=-dFoo=1 rev=origin/ghostpdl-9.20", "user", "bob", ("gs",),
     ("extras=-dFoo=1", "rev=origin/ghostpdl-9.20")),
    ("  user\tcarol   gs  relaxtimeout  \n", "user", "carol", ("gs",), ("relaxtimeout",)),
])
def test_parse_valid_lines(line: str, kind: str, ref: str, products: tuple[str, ...],
                           options: tuple[str, ...]) -> None:
    """Valid lines parse into their fields, options in canonical (sorted) order."""
    spec = RunSpec.parse(line)
    assert (spec.kind, spec.ref, spec.products, spec.options) == (kind, ref, products, options)


@pytest.mark.parametrize("line, fragment", [
    ("", "too few fields"),
    ("user alice", "too few fields"),
    ("svn 1234 gs", "unknown run kind 'svn'"),
    ("git xyz1234 gs", "bad commit"),
    ("git 012345 gs", "bad commit"),          # 6 hex digits: too short
    ("git " + "a" * 41 + " gs", "bad commit"),
    ("user ../etc gs", "bad user name"),
    ("user .hidden gs", "bad user name"),
    ("user " + "a" * 65 + " gs", "bad user name"),
    ("auto -x gs", "bad auto job name"),
    ("user alice svg", "unknown product 'svg'"),
    ("user alice gs,gs", "listed twice"),
    ("user alice gs,,pdfwrite", "empty product"),
    ("user alice gs,", "empty product"),
    ("user alice gs,mupdf", "must be queued alone"),
    ("user alice mupdf,pdfwrite", "must be queued alone"),
    ("user alice gs fast", "unknown option 'fast'"),
    ("user alice gs colour=red", "unknown option 'colour'"),
    ("user alice gs filter=", "has no value"),
    ("user alice gs lowres highres", "exclude each other"),
    ("user alice gs lowres lowres", "given twice"),
    ("user alice gs filter=a filter=b", "given twice"),
    ("user alice gs tree=../x", "bad tree"),
    ("user alice gs rev=--upload-pack=x", "bad rev"),
    ("user alice gs\x00", "control"),
    ("user alice gs\x1cbmpcmp", "control"),
    ("user alice\x0bgs", "control"),
    ("user alice gs filter=" + "x" * MAX_LINE, "at most 4096"),
])
def test_parse_rejects_with_reason(line: str, fragment: str) -> None:
    """Invalid lines raise QueueLineError whose message names the problem and expected form."""
    with pytest.raises(QueueLineError) as info:
        RunSpec.parse(line, source="queue.1", lineno=7)
    text = str(info.value)
    assert fragment in text
    assert "queue.1:7" in text
    assert info.value.lineno == 7


def test_error_lists_expected_values() -> None:
    """A bad product error lists every legal product."""
    with pytest.raises(QueueLineError,
                       match="gs, pdfwrite, ps2write, xpswrite, pcl, xps, mupdf, shell"):
        RunSpec.parse("user alice svg")


@pytest.mark.parametrize("line", [
    "user alice gs",
    "git ABCDEF0 gs,pdfwrite,ps2write",
    "user bob ps2write,gs highres extras=-Z@ bmpcmp",
    "auto weekly mupdf ifilter=xps tree=mupdf",
])
def test_canonical_line_round_trips(line: str) -> None:
    """parse(spec.line()) == spec, and line() is stable."""
    spec = RunSpec.parse(line)
    again = RunSpec.parse(spec.line())
    assert again == spec
    assert again.line() == spec.line()


def test_canonical_form_normalizes() -> None:
    """Product order, option order, whitespace and sha case do not make distinct runs."""
    a = RunSpec.parse("git ABCDEF0 pdfwrite,gs bmpcmp lowres")
    b = RunSpec.parse("git  abcdef0\tgs,pdfwrite   lowres bmpcmp")
    assert a == b
    assert a.line() == "git abcdef0 gs,pdfwrite bmpcmp lowres"


def test_constructor_validates_and_normalizes() -> None:
    """RunSpec built directly is checked and canonical like a parsed one."""
    spec = RunSpec("user", "alice", ("pdfwrite", "gs"), ("lowres",))
    assert spec.products == ("gs", "pdfwrite")
    assert spec == RunSpec.parse("user alice gs,pdfwrite lowres")
    with pytest.raises(QueueLineError, match="must be queued alone"):
        RunSpec("user", "alice", ("mupdf", "gs"))
    with pytest.raises(QueueLineError, match="bad user name"):
        RunSpec("user", "al ice", ("gs",))


def test_option_and_flag_accessors() -> None:
    """option() returns key=value values, has_flag() tells flags."""
    spec = RunSpec.parse("user alice gs filter=a=b relaxtimeout")
    assert spec.option("filter") == "a=b"
    assert spec.option("extras") is None
    assert spec.has_flag("relaxtimeout")
    assert not spec.has_flag("bmpcmp")
    assert not spec.has_flag("filter")


def test_tree_property() -> None:
    """tree is mupdf for a mupdf run, ghostpdl otherwise, unless tree= says."""
    assert RunSpec.parse("user a mupdf").tree == "mupdf"
    assert RunSpec.parse("user a gs,pdfwrite").tree == "ghostpdl"
    assert RunSpec.parse("user a gs tree=extract").tree == "extract"


def test_trailing_crlf_is_ignored() -> None:
    """A CRLF line (edited on Windows) parses like the LF one."""
    assert RunSpec.parse("user alice gs\r\n") == RunSpec.parse("user alice gs")


# ----------------------------------------------------------------------------------------------
# Queue file


def _queue(tmp_path: Path) -> QueueFile:
    return QueueFile(tmp_path / "queue.lst", tmp_path / "queue.lck")


def test_for_priority_uses_home_names(tmp_path: Path) -> None:
    """for_priority picks queue[.p].lst and queue[.p].lck of the home (seed 000's names)."""
    q = QueueFile.for_priority(Home(tmp_path), 2)
    assert q.path == tmp_path / "queue.2.lst"
    assert q.lock_path == tmp_path / "queue.2.lck"
    assert q.legacy_path == tmp_path / "queue.2"
    assert QueueFile.for_priority(Home(tmp_path), 0).path == tmp_path / "queue.lst"


def test_lock_path_must_differ(tmp_path: Path) -> None:
    """Locking the file that gets replaced would protect nothing: refused."""
    with pytest.raises(ValueError):
        QueueFile(tmp_path / "queue.lst", tmp_path / "queue.lst")


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    """A queue that was never written is empty."""
    q = _queue(tmp_path)
    assert q.read() == []
    assert q.head() is None
    assert not q.remove(RunSpec.parse("user a gs"))


def test_append_read_head_remove(tmp_path: Path) -> None:
    """Runs come back in append order; head is the first; remove drops that run only."""
    q = _queue(tmp_path)
    a, b, c = (RunSpec.parse(x) for x in ("user a gs", "git 0123abc gs", "auto n mupdf"))
    assert q.append(a) and q.append(b) and q.append(c)
    assert q.read() == [a, b, c]
    assert q.head() == a
    assert q.remove(b)
    assert q.read() == [a, c]
    assert (tmp_path / "queue.lst").read_text() == "user a gs\nauto n mupdf\n"


def test_append_refuses_duplicates(tmp_path: Path) -> None:
    """The same run (same canonical line) is not queued twice."""
    q = _queue(tmp_path)
    assert q.append(RunSpec.parse("user a gs,pdfwrite lowres"))
    assert not q.append(RunSpec.parse("user  a pdfwrite,gs   lowres"))
    assert len(q.read()) == 1


def test_remove_takes_the_matching_line_not_the_first(tmp_path: Path) -> None:
    """remove(spec) removes the first line equal to spec, whatever its position."""
    (tmp_path / "queue.lst").write_text("user a gs\nuser b gs\nuser c gs\n")
    q = _queue(tmp_path)
    assert q.remove(RunSpec.parse("user c gs"))
    assert [s.ref for s in q.read()] == ["a", "b"]


def test_remove_matches_non_canonical_lines(tmp_path: Path) -> None:
    """A hand-written line equal in meaning to spec is removed."""
    (tmp_path / "queue.lst").write_text("git ABCDEF0  pdfwrite,gs\n")
    q = _queue(tmp_path)
    assert q.remove(RunSpec.parse("git abcdef0 gs,pdfwrite"))
    assert q.read() == []


def test_corrupt_lines_logged_skipped_and_kept(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A corrupt line is logged with file and line number, skipped, and kept on rewrite."""
    path = tmp_path / "queue.lst"
    path.write_bytes(b"# a comment\n\nuser a gs\nsvn 1234 gs\nuser b gs\n"
                     b"user \xff\xfe gs\nuser c gs")
    q = _queue(tmp_path)
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        runs = q.read()
    assert [s.ref for s in runs] == ["a", "b", "c"]
    messages = [r.getMessage() for r in caplog.records if r.name == "cluster.queue"]
    assert any(f"{path}:4" in m and "svn" in m for m in messages)
    assert any(f"{path}:6" in m for m in messages)
    # A rewrite keeps every byte of what it did not understand.
    assert q.remove(RunSpec.parse("user b gs"))
    assert q.append(RunSpec.parse("user d gs"))
    assert path.read_bytes() == (b"# a comment\n\nuser a gs\nsvn 1234 gs\n"
                                 b"user \xff\xfe gs\nuser c gs\nuser d gs\n")


def test_corrupt_line_warned_once_per_queue_object(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A master polling the queue does not repeat the same warning every time."""
    (tmp_path / "queue.lst").write_text("bogus\n")
    q = _queue(tmp_path)
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        q.read()
        q.read()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_rewrite_is_atomic_and_keeps_lock_inode(tmp_path: Path) -> None:
    """A rewrite replaces the queue's inode, never the lock file's, and leaves no temp file."""
    q = _queue(tmp_path)
    q.append(RunSpec.parse("user a gs"))
    queue_ino = (tmp_path / "queue.lst").stat().st_ino
    lock_ino = (tmp_path / "queue.lck").stat().st_ino
    q.append(RunSpec.parse("user b gs"))
    assert (tmp_path / "queue.lst").stat().st_ino != queue_ino
    assert (tmp_path / "queue.lck").stat().st_ino == lock_ino
    assert (tmp_path / "queue.lck").read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["queue.lck", "queue.lst"]


def test_rewrite_preserves_mode(tmp_path: Path) -> None:
    """Readers of other users keep their access after a rewrite."""
    q = _queue(tmp_path)
    q.append(RunSpec.parse("user a gs"))
    os.chmod(tmp_path / "queue.lst", 0o640)
    q.append(RunSpec.parse("user b gs"))
    assert (tmp_path / "queue.lst").stat().st_mode & 0o777 == 0o640


def test_append_waits_for_exclusive_lock(tmp_path: Path) -> None:
    """append blocks while someone else holds queue.lck."""
    q = _queue(tmp_path)
    fd = os.open(tmp_path / "queue.lck", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    done = threading.Event()

    def worker() -> None:
        q.append(RunSpec.parse("user a gs"))
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert not done.wait(0.3)
        assert not (tmp_path / "queue.lst").exists()
    finally:
        os.close(fd)
    t.join(5)
    assert done.is_set()
    assert q.read() == [RunSpec.parse("user a gs")]


# --- several processes at once ----------------------------------------------------------------

WRITERS = 8
PER_WRITER = 50


def _append_many(root: str, writer: int) -> None:
    q = QueueFile(Path(root) / "queue.lst", Path(root) / "queue.lck")
    for i in range(PER_WRITER):
        q.append(RunSpec("auto", f"w{writer}-{i}", ("gs",)))


def _watch_unlocked(root: str, stop: Any, bad: Any) -> None:
    """Read the queue WITHOUT the lock: thanks to os.replace it is never torn."""
    path = Path(root) / "queue.lst"
    while not stop.is_set():
        try:
            data = path.read_text()
        except FileNotFoundError:
            continue
        if data and not data.endswith("\n"):
            bad.append("torn: " + data[-40:])
        for line in data.splitlines():
            try:
                RunSpec.parse(line)
            except QueueLineError as exc:
                bad.append(str(exc))


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    """8 processes x 50 distinct appends give exactly 400 whole, distinct, parseable lines."""
    ctx = multiprocessing.get_context("fork")
    manager = ctx.Manager()
    bad = manager.list()
    stop = ctx.Event()
    watcher = ctx.Process(target=_watch_unlocked, args=(str(tmp_path), stop, bad))
    watcher.start()
    writers = [ctx.Process(target=_append_many, args=(str(tmp_path), w))
               for w in range(WRITERS)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    stop.set()
    watcher.join(10)
    assert list(bad) == []
    lines = (tmp_path / "queue.lst").read_text().splitlines()
    assert len(lines) == WRITERS * PER_WRITER
    assert len(set(lines)) == len(lines)
    specs = _queue(tmp_path).read()
    assert {s.ref for s in specs} == {f"w{w}-{i}" for w in range(WRITERS)
                                      for i in range(PER_WRITER)}
    # Each writer's own lines stay in its order.
    for w in range(WRITERS):
        mine = [int(s.ref.split("-")[1]) for s in specs if s.ref.startswith(f"w{w}-")]
        assert mine == sorted(mine)
    manager.shutdown()


def _append_then_remove(root: str, writer: int) -> None:
    q = QueueFile(Path(root) / "queue.lst", Path(root) / "queue.lck")
    for i in range(20):
        spec = RunSpec("user", f"u{writer}-{i}", ("gs",))
        q.append(spec)
        if i % 2:
            assert q.remove(spec)
        time.sleep(0)


def test_concurrent_appends_and_removes(tmp_path: Path) -> None:
    """Interleaved appends and removes from several processes keep exactly the survivors."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_then_remove, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    refs = sorted(s.ref for s in _queue(tmp_path).read())
    assert refs == sorted(f"u{w}-{i}" for w in range(4) for i in range(0, 20, 2))
