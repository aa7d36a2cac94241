"""A bad queue line is logged once, ever, cut to a readable length, and kept byte for byte.

The break: a 100 MB corrupt line was logged in full, twice, by every
clustermaster invocation.  Here real processes read a queue holding such a line, as masters
do, and their whole output is measured.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.queuebadlines import EXCERPT_CHARS, MAX_REPORTED, REPORTED_SUFFIX
from cluster.runspec import RunSpec
from tests.helpers import REPO

BIG = 100 * 1024 * 1024

#: One "clustermaster invocation": reads the queue twice (phase 1 and the head), logging to
#: stderr as the command lines do; prints its peak memory.
READER = textwrap.dedent("""
    import logging, sys
    from pathlib import Path
    from cluster.home import Home
    from cluster.queue import QueueFile
    from cluster.runspec import RunSpec
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    q = QueueFile.for_priority(Home(Path(sys.argv[1])), 0)
    q.read()
    q.head()
    if sys.argv[2] == "append":
        q.append(RunSpec.parse("user zed gs"))
    # VmHWM, not ru_maxrss: the latter keeps the high-water mark of the forked parent
    # across exec, so a big pytest process would be counted.
    status = Path("/proc/self/status").read_text()
    print(next(l.split()[1] for l in status.splitlines() if l.startswith("VmHWM:")))
""")


def _invoke(home: Path, what: str = "read") -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", READER, str(home), what], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr, int(done.stdout.strip())


def _sha(path: Path, start: int, length: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(start)
        while length:
            chunk = fh.read(min(length, 1 << 20))
            assert chunk
            h.update(chunk)
            length -= len(chunk)
    return h.hexdigest()


@pytest.fixture
def big_queue(tmp_path: Path) -> tuple[Path, int]:
    """A home whose queue holds a run, a 100 MB corrupt line, and a run."""
    home = Home(tmp_path)
    path = home.queue(0)
    with open(path, "wb") as fh:
        fh.write(b"user ann gs\n")
        start = fh.tell()
        block = b"garbage " * (1 << 17)  # 1 MiB
        for _ in range(BIG // len(block)):
            fh.write(block)
        fh.write(b"\nuser bob gs\n")
    return tmp_path, start


def test_a_100mb_line_is_logged_once_across_invocations_cut_short(
        big_queue: tuple[Path, int]) -> None:
    root, start = big_queue
    path = Home(root).queue(0)
    line_sha = _sha(path, start, BIG)
    outputs = [_invoke(root) for _ in range(3)]
    warnings = [line for err, _ in outputs for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert f"{path}:2:" in warning and f"{BIG} bytes" in warning
    assert "'garbage garbage" in warning
    # At most EXCERPT_CHARS of the line, plus the words around it.
    assert len(warning) < EXCERPT_CHARS + 500
    assert sum(len(err) for err, _ in outputs) < 5000
    # The side file remembers that one line, nothing else.
    side = path.with_name(path.name + REPORTED_SUFFIX)
    assert side.read_text() == line_sha + "\n"


def test_a_rewrite_keeps_the_big_line_byte_for_byte_in_bounded_memory(
        big_queue: tuple[Path, int]) -> None:
    root, start = big_queue
    path = Home(root).queue(0)
    line_sha = _sha(path, start, BIG)
    _err, peak_kb = _invoke(root, "append")
    # Peak memory of the whole Python process: the line is streamed, never held (holding it
    # once would be 100 MB, as bytes and text 200 MB and more).
    assert peak_kb < 60 * 1024, f"peak {peak_kb} kB"
    assert _sha(path, start, BIG) == line_sha
    with open(path, "rb") as fh:
        assert fh.read(start) == b"user ann gs\n"
        fh.seek(start + BIG)
        assert fh.read() == b"\nuser bob gs\nuser zed gs\n"
    assert [s.ref for s in QueueFile.for_priority(Home(root), 0).read()] == ["ann", "bob", "zed"]


def test_reported_lines_are_pruned_and_a_returning_line_is_logged_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "queue.lst"
    side = tmp_path / ("queue.lst" + REPORTED_SUFFIX)
    path.write_text("user ann gs\nsvn 1234\n")
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        QueueFile(path, tmp_path / "queue.lck").read()
        QueueFile(path, tmp_path / "queue.lck").read()  # another "process": already reported
    assert len(caplog.records) == 1 and side.exists()
    path.write_text("user ann gs\n")  # an operator removed it
    QueueFile(path, tmp_path / "queue.lck").read()
    assert not side.exists()  # nothing bad left: nothing remembered
    caplog.clear()
    path.write_text("user ann gs\nsvn 1234\n")
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        QueueFile(path, tmp_path / "queue.lck").read()
    assert len(caplog.records) == 1


def test_many_bad_lines_are_summed_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "queue.lst"
    path.write_text("".join(f"junk line {i}\n" for i in range(500)) + "user ann gs\n")
    q = QueueFile(path, tmp_path / "queue.lck")
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        assert [s.ref for s in q.read()] == ["ann"]
        q.read()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == MAX_REPORTED + 1
    assert f"{500 - MAX_REPORTED} more bad queue lines" in messages[-1]


def test_a_long_problem_is_cut_and_a_long_comment_is_no_problem(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "queue.lst"
    path.write_text("user ann gs " + "x" * 4000 + "\n"  # an unknown 4000-character option
                    + "# " + "c" * 100_000 + "\nuser bob gs\n")
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        runs = QueueFile(path, tmp_path / "queue.lck").read()
    assert [s.ref for s in runs] == ["bob"]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert f"{path}:1:" in message and "unknown option" in message
    assert len(message) < 3 * EXCERPT_CHARS + 300


def test_two_identical_bad_lines_are_one_report_and_both_are_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "queue.lst"
    path.write_bytes(b"bad \xff\nuser ann gs\nbad \xff\n")
    q = QueueFile(path, tmp_path / "queue.lck")
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        assert q.remove(RunSpec.parse("user ann gs"))
    assert len(caplog.records) == 1
    assert path.read_bytes() == b"bad \xff\nbad \xff\n"


def test_a_side_file_that_cannot_be_written_does_not_stop_a_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A reader without write access (here: a directory in the side file's place) still
    reads the queue, and one queue object still logs a line once."""
    path = tmp_path / "queue.lst"
    path.write_text("svn 1234\nuser ann gs\n")
    (tmp_path / ("queue.lst" + REPORTED_SUFFIX)).mkdir()
    q = QueueFile(path, tmp_path / "queue.lck")
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        assert [s.ref for s in q.read()] == ["ann"]
        assert [s.ref for s in q.read()] == ["ann"]
    assert len(caplog.records) == 1
