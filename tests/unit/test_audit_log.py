"""cluster.master.files.audit: the run's audit lines, buffered and appended once per flush."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.master.files import audit
from cluster.master.files.audit import AuditLog
from cluster.runtime.clock import FakeClock
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request


def test_lines_name_the_peer_node_what_it_reported_and_what_it_got(tmp_path: Path) -> None:
    clock = FakeClock(1_795_000_000.25)
    log = AuditLog(tmp_path / "runs" / "r1" / "audit.log", clock)
    req = Request(node="n1", job_id="r1", pending=3, running=2, busy="build", failure=1,
                  status="building\nnow", leaving=True)
    log.connection("10.0.0.7:5123", req, Reply(protocol.JOBS, ("a x true ; y",) * 5), 12, 2)
    log.connection("10.0.0.7:5124", Request(node="n1"),
                   Reply(protocol.ABORT, reason="run complete"), 0)
    log.refusal("10.0.0.9:1", "evil", "bad signature: the request's sig does not match")
    log.refusal("10.0.0.9:2", "", "unsigned request")
    assert not log.path.exists()  # nothing before a flush
    log.flush()
    lines = log.path.read_text().splitlines()
    assert lines == [
        "2026-11-18T11:06:40.250Z 10.0.0.7:5123 node n1 reported results 12 refused 2 "
        "jobs 3 2 busy build failure 1 leaving status building now given JOBS 5",
        "2026-11-18T11:06:40.250Z 10.0.0.7:5124 node n1 reported results 0 jobs 0 0 "
        "status - given ABORT: run complete",
        "2026-11-18T11:06:40.250Z 10.0.0.9:1 node evil refused bad signature: the request's "
        "sig does not match",
        "2026-11-18T11:06:40.250Z 10.0.0.9:2 node - refused unsigned request",
    ]
    assert "a x true" not in log.path.read_text()  # counts, never job lines
    clock.advance(1.5)
    log.refusal("p", "n", "x")
    log.flush()
    log.refusal("p", "n", "too soon")
    log.flush()  # within FLUSH_INTERVAL of the last write: kept for the next
    assert "too soon" not in log.path.read_text()
    clock.advance(audit.FLUSH_INTERVAL)
    log.flush()
    assert log.path.read_text().splitlines()[-2] == \
        "2026-11-18T11:06:41.750Z p node n refused x"
    assert len(log.path.read_text().splitlines()) == 6
    log.refusal("p", "n", "last")
    log.flush(force=True)  # the end of the serving: written at once
    assert log.path.read_text().splitlines()[-1].endswith("refused last")


def test_the_buffer_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "MAX_BUFFERED", 3)
    log = AuditLog(tmp_path / "audit.log", FakeClock(0.0))
    for i in range(10):
        log.refusal(f"p{i}", "n", "unsigned request")
    assert len(log.lines) == 3
    log.flush()
    lines = (tmp_path / "audit.log").read_text().splitlines()
    assert len(lines) == 4 and "refused 7 more connection(s) not recorded" in lines[-1]


def test_a_failed_write_is_logged_and_does_not_raise(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = AuditLog(blocker / "audit.log", FakeClock(0.0))  # its folder is a file
    log.refusal("p", "n", "x")
    log.flush()
    assert "cannot append to the audit log" in caplog.text and log.lines == []


def test_a_reply_that_withdraws_copies_says_how_many(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.log", FakeClock(1_795_000_000.25))
    log.connection("10.0.0.7:5123", Request(node="n2"),
                   Reply(protocol.CONTINUE, withdraw=("t1.ps", "t2.ps")), 0)
    log.flush()
    assert log.path.read_text().splitlines() == [
        "2026-11-18T11:06:40.250Z 10.0.0.7:5123 node n2 reported results 0 jobs 0 0 "
        "status - given CONTINUE withdrew 2"]
