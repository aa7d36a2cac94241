"""The legacy droppings of seed 000, gs.run and ghostscript.run, beside cluster_command.run
(and, as ARTIFEX §2.7 places them, in users/<user>/ itself)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import discovery, droppings
from cluster.triggers.push import is_excluded, push_tree


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    return h


def drop(home: Home, rel: str, text: str) -> Path:
    path = home.users / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def scan(home: Home) -> list[str]:
    queue = QueueFile.for_priority(home, 0)
    return [s.line() for s in droppings.scan_user_droppings(home, Config(), queue)]


def test_legacy_droppings_are_runs_like_cluster_command_run(home: Home) -> None:
    a = drop(home, "ann/ghostpdl/gs.run", "user ann gs lowres\n")
    b = drop(home, "bob/ghostpdl/ghostscript.run", "")  # empty: "all products"
    c = drop(home, "cat/gs.run", "\n")                   # in users/<user>/, as ARTIFEX has it
    d = drop(home, "dan/ghostscript.run", "user dan mupdf\n")
    assert scan(home) == ["user ann gs lowres", "user bob gs,pdfwrite,ps2write",
                          "user cat gs,pdfwrite,ps2write", "user dan mupdf"]
    assert not any(p.exists() for p in (a, b, c, d))


def test_bad_legacy_droppings_are_set_aside(home: Home, caplog: pytest.LogCaptureFixture) -> None:
    drop(home, "ann/ghostpdl/gs.run", "ann gs pcl xps\n")     # the Perl's format: not a run
    drop(home, "bob/mupdf/gs.run", "")                        # all gs products, in mupdf/
    drop(home, "cat/ghostscript.run", "user mallory gs\n")    # another user
    assert scan(home) == []
    rejected = sorted(p.relative_to(home.users).as_posix()
                      for p in home.users.rglob(f"*{droppings.REJECTED_SUFFIX}"))
    assert rejected == ["ann/ghostpdl/gs.run.rejected", "bob/mupdf/gs.run.rejected",
                        "cat/ghostscript.run.rejected"]
    assert "belong in tree 'ghostpdl', not 'mupdf'" in caplog.text
    assert "must be a 'user cat ...' line" in caplog.text


def test_a_directory_named_like_a_dropping_is_not_one(home: Home) -> None:
    """users/<user>/gs.run may be a tree, and <tree>/gs.run/ a source directory."""
    (home.users / "ann" / "gs.run").mkdir(parents=True)
    (home.users / "bob" / "ghostpdl" / "gs.run").mkdir(parents=True)
    assert droppings.waiting(home) == []
    assert scan(home) == []
    assert (home.users / "bob" / "ghostpdl" / "gs.run").is_dir()


def test_the_watcher_notices_legacy_droppings(home: Home) -> None:
    watch = discovery.WorkWatcher(home)
    assert watch() == []
    drop(home, "ann/ghostpdl/ghostscript.run", "")
    assert watch() == [0]
    assert watch() == []
    drop(home, "bob/gs.run", "")
    assert watch() == [0]


def test_the_watcher_notices_a_dropping_written_again(home: Home) -> None:
    path = drop(home, "ann/ghostpdl/cluster_command.run", "user ann gs\n")
    watch = discovery.WorkWatcher(home)
    watch()
    before = path.stat()
    path.write_text("user ann gs lowres\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert watch() == [0]


def test_a_push_never_sends_a_legacy_dropping_from_the_top_of_the_tree(home: Home,
                                                                        tmp_path: Path) -> None:
    """A gs.run at the top of a developer's tree would be a run request on the master;
    deeper down it is an ordinary file and goes."""
    assert is_excluded("gs.run") and is_excluded("ghostscript.run.rejected")
    assert not is_excluded("doc/gs.run") and not is_excluded("gs.run.c/")
    dev = tmp_path / "dev"
    (dev / "doc").mkdir(parents=True)
    (dev / "gs.run").write_text("user mallory gs\n")
    (dev / "doc" / "gs.run").write_text("docs\n")
    target = push_tree(home, dev, RunSpec.parse("user ann gs"), method="copy")
    assert not (target / "gs.run").exists()
    assert (target / "doc" / "gs.run").read_text() == "docs\n"
    assert scan(home) == ["user ann gs"]
