"""The supervisor publishes the node code at every tick (master/daemon/supervisor.py's on_tick and
NodeCodePublisher): a change in the checkout is in node-code/ after the next tick, a
failure is logged once and never stops the clustermasters from starting."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest

from cluster.master.daemon.supervisor import NodeCodePublisher, Supervisor
from cluster.node import code
from tests.helpers import copy_code


def _repo(dest: Path) -> Path:
    return copy_code(dest)


def _expected_manifest(repo: Path, dest: Path) -> str:
    """The MANIFEST a publish of ``repo`` into ``dest`` must write: the sources as in the
    repo, their bytecode as in ``dest``."""
    files = code.node_files(repo)
    md5s = {rel: code.file_md5(repo / rel) for rel in files}
    md5s.update({rel: code.file_md5(dest / rel) for rel in code.published_files(files)
                 if rel not in md5s})
    return code.format_manifest(md5s)


def test_each_tick_publishes_and_a_failure_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = _repo(tmp_path / "repo")
    dest = tmp_path / "home" / "node-code"
    publisher = NodeCodePublisher(repo, dest)
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    supervisor = Supervisor([command], interval=1.0, on_tick=publisher)

    def tick(now: float) -> None:
        supervisor.tick(now)
        for child in supervisor.children:  # at most two copies may live: let each end
            child.proc.wait(60)

    try:
        tick(0.0)
        assert (dest / code.MANIFEST).read_text() == _expected_manifest(repo, dest)

        caps = repo / "cluster/node/caps.py"
        caps.write_text(caps.read_text() + "# changed\n")
        tick(1.0)
        assert (dest / "cluster/node/caps.py").read_text().endswith("# changed\n")

        # A broken checkout: logged once, the published copy stays, the masters still start.
        good = (dest / code.MANIFEST).read_text()
        caps.write_text("import cluster.not_there\n")
        caplog.set_level(logging.ERROR, logger="cluster.supervisor")
        tick(2.0)
        tick(3.0)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "cluster.not_there" in errors[0], errors
        assert (dest / code.MANIFEST).read_text() == good
        assert marker.read_text() == "xxxx"
    finally:
        supervisor.shutdown()


@pytest.mark.parametrize("remembered", [False, True], ids=["first-call", "after-memo"])
def test_a_tamper_keeping_size_and_mtime_is_undone_at_the_next_tick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remembered: bool) -> None:
    """The published copy is checked by content: a same-size edit of it whose mtime is put
    back (os.utime) is replaced by the checkout's file at the next call, whether the
    publisher had already found that copy intact (its memo, keyed on the copy's stat with
    its ctime) or sees it for the first time (a restarted supervisor)."""
    repo = _repo(tmp_path / "repo")
    dest = tmp_path / "home" / "node-code"
    publisher = NodeCodePublisher(repo, dest)
    # Trust a copy's ctime at once, so the second call below remembers every copy intact.
    monkeypatch.setattr(code, "RACY_WINDOW", 0.0)
    assert publisher() is True
    target = dest / "cluster/node/caps.py"
    good = target.read_bytes()
    if remembered:
        assert publisher() is False
        time.sleep(0.05)  # past the coarse clock tick that stamped the copies' ctimes
    else:
        monkeypatch.setattr(code, "_VERIFIED", {}, raising=False)  # a new process
    before = target.stat()
    evil = b"#" * len(good)
    target.write_bytes(evil)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    assert publisher() is True
    assert target.read_bytes() == good
    assert (dest / code.MANIFEST).read_text() == _expected_manifest(repo, dest)
    assert publisher() is False
