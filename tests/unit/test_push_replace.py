"""No push is lost: a push replaces a waiting run of the same push, and waits for
a running one; clusterpush says which.  Pushes are made by the real clusterpush.py.

The break: pushing again while the first push ran, the new dropping matched the running
run (the queue head), was taken as already queued and deleted: one run, and its report
showed the second tree.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.master.files import ending
from cluster.master.files.ending import EndRecord, Outcome
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import droppings, push
from cluster.wire.jobstart import JobStart
from tests.helpers import REPO


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    return h


def tree(tmp_path: Path, text: str, name: str = "ghostpdl") -> Path:
    root = tmp_path / "trees" / text / name
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "a.c").write_text(f"int a = {text!r};\n")
    return root


def clusterpush(home: Home, tree_dir: Path, user: str, *words: str) -> list[str]:
    """Run the real clusterpush.py; return the lines it printed."""
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", user, "--copy", *words], cwd=tree_dir,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def scan(home: Home) -> list[RunSpec]:
    return droppings.scan_user_droppings(home, Config(), QueueFile.for_priority(home, 0))


def queued(home: Home) -> list[str]:
    return [s.line() for s in QueueFile.for_priority(home, 0).read()]


def start_run(home: Home, line: str) -> None:
    """What the master writes when it starts the run of ``line``."""
    spec = RunSpec.parse(line)
    home.job_start(0).write_text(JobStart(
        id="20240101-000000-p0", priority=0, queue=spec.line(), kind=spec.kind, ref=spec.ref,
        products=spec.products, tree=spec.tree, source=f"users/{spec.ref}/{spec.tree}",
        build="make", tests="tests").format())


def test_a_push_replaces_the_waiting_run_of_the_same_push_in_place(
        home: Home, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert clusterpush(home, tree(tmp_path, "one"), "ann", "gs", "lowres") == \
        ["queueing: user ann gs lowres"]
    scan(home)
    clusterpush(home, tree(tmp_path, "bob"), "bob", "gs")
    scan(home)
    assert queued(home) == ["user ann gs lowres", "user bob gs"]
    printed = clusterpush(home, tree(tmp_path, "two"), "ann", "gs", "highres")
    assert printed == ["queueing: user ann gs highres",
                       "replacing your waiting run 'user ann gs lowres' (position 1 in the "
                       "queue) with 'user ann gs highres'"]
    with caplog.at_level(logging.INFO):
        assert scan(home) == [RunSpec.parse("user ann gs highres")]
    # Same place, the new options; one run, which will build the second tree.
    assert queued(home) == ["user ann gs highres", "user bob gs"]
    assert "replaces the waiting run user ann gs lowres (position 1" in caplog.text
    assert "'two'" in (home.user_tree("ann", "ghostpdl") / "src/a.c").read_text()


def test_the_same_line_again_while_it_waits_is_one_run(home: Home, tmp_path: Path) -> None:
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs")
    scan(home)
    printed = clusterpush(home, tree(tmp_path, "two"), "ann", "gs")
    assert "already waits at position 1" in printed[1]
    assert scan(home) == []
    assert queued(home) == ["user ann gs"]


def test_other_products_are_another_push(home: Home, tmp_path: Path) -> None:
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs")
    scan(home)
    assert clusterpush(home, tree(tmp_path, "two"), "ann", "pdfwrite") == \
        ["queueing: user ann pdfwrite"]
    scan(home)
    assert queued(home) == ["user ann gs", "user ann pdfwrite"]


def test_a_push_while_the_same_push_runs_is_queued_after_it(home: Home,
                                                             tmp_path: Path) -> None:
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs")
    scan(home)
    clusterpush(home, tree(tmp_path, "bob"), "bob", "gs")
    scan(home)
    start_run(home, "user ann gs")
    printed = clusterpush(home, tree(tmp_path, "two"), "ann", "gs")
    assert printed[1] == ("your run 'user ann gs' is running (it keeps the tree it started "
                          "with); this push is queued after it")
    assert scan(home) == [RunSpec.parse("user ann gs")]
    assert queued(home) == ["user ann gs", "user bob gs", "user ann gs"]
    # A third push while the second waits replaces the second, never the running one.
    clusterpush(home, tree(tmp_path, "three"), "ann", "gs", "relaxtimeout")
    scan(home)
    assert queued(home) == ["user ann gs", "user bob gs", "user ann gs relaxtimeout"]
    # The master's dequeue of the running run removes one copy only.
    clusterpush(home, tree(tmp_path, "four"), "ann", "gs")
    scan(home)
    assert queued(home) == ["user ann gs", "user bob gs", "user ann gs"]
    assert QueueFile.for_priority(home, 0).remove(RunSpec.parse("user ann gs"))
    assert queued(home) == ["user bob gs", "user ann gs"]


def test_a_push_while_the_same_run_ends_is_queued_after_it(home: Home,
                                                            tmp_path: Path) -> None:
    """job.start is removed when the serving ends (nodes leave), the line only after the
    report and mail: a push in between is not merged into the ended run."""
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs")
    scan(home)
    start_run(home, "user ann gs")
    start = JobStart.parse(home.job_start(0).read_text())
    record = EndRecord.create(home.run_dir(start.id), start, Outcome.DONE)
    home.job_start(0).unlink()
    record.mark(ending.REPORT)
    clusterpush(home, tree(tmp_path, "two"), "ann", "gs")
    scan(home)
    assert queued(home) == ["user ann gs", "user ann gs"]
    QueueFile.for_priority(home, 0).remove(RunSpec.parse("user ann gs"))
    record.mark(ending.DEQUEUE)
    # Dequeued: the second push's run now waits, and a third push replaces it.
    clusterpush(home, tree(tmp_path, "three"), "ann", "gs", "lowres")
    scan(home)
    assert queued(home) == ["user ann gs lowres"]


def test_an_unreadable_job_start_protects_the_head(home: Home, tmp_path: Path) -> None:
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs")
    scan(home)
    home.job_start(0).write_text("garbage\n")
    clusterpush(home, tree(tmp_path, "two"), "ann", "gs")
    scan(home)
    assert queued(home) == ["user ann gs", "user ann gs"]


def test_a_push_not_yet_scanned_is_replaced_by_the_next(home: Home, tmp_path: Path) -> None:
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs", "lowres")
    printed = clusterpush(home, tree(tmp_path, "two"), "ann", "gs")
    assert printed[1] == "this push replaces your previous push, which was not queued yet"
    scan(home)
    assert queued(home) == ["user ann gs"]


def test_a_dropping_whose_tree_is_locked_waits_for_the_next_scan(home: Home,
                                                                  tmp_path: Path) -> None:
    """A push syncing (or a snapshot copying) holds the tree's lock: the scan leaves the
    dropping for later instead of racing it."""
    clusterpush(home, tree(tmp_path, "one"), "ann", "gs")
    with push.tree_locked(home, "ann", "ghostpdl", 5):
        assert scan(home) == []
        assert (home.user_tree("ann", "ghostpdl") / droppings.DROPPING).exists()
    assert scan(home) == [RunSpec.parse("user ann gs")]


def test_withdraw_keeps_the_running_copy(home: Home) -> None:
    """What `clusterpush abort` needs: the queued copy behind the running one goes, the
    running one stays for its master to end."""
    q = QueueFile.for_priority(home, 0)
    for line in ("user ann gs", "user bob gs", "user ann gs", "user ann mupdf"):
        q.append(RunSpec.parse(line), duplicate=True)
    gone = q.withdraw(lambda s: s.ref == "ann", running=RunSpec.parse("user ann gs"))
    assert [s.line() for s in gone] == ["user ann gs", "user ann mupdf"]
    assert queued(home) == ["user ann gs", "user bob gs"]
