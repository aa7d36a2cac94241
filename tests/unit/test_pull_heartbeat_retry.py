"""A resident node's heartbeat that failed (the monitor not listening yet, or down) is
tried again after 0.05 s, doubling up to heartbeat_interval: a node started a moment before
its monitor listens joins the first run at once, not one interval (10 s) later."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.node import heartbeat
from cluster.node.pull import FIRST_RETRY, ClusterPull
from cluster.runtime.clock import FakeClock
from cluster.runtime.ports import free_port


def _pull(tmp_path: Path, port: int) -> ClusterPull:
    cfg = Config(node_name="n1", work_dir=tmp_path / "work", heartbeat_interval=10.0,
                 monitor_port=port, master_host="127.0.0.1")
    return ClusterPull(cfg, caps="", clock=FakeClock())


def test_refused_heartbeats_are_tried_again_sooner_then_once_an_interval(
        tmp_path: Path) -> None:
    pull = _pull(tmp_path, free_port())  # nothing listens there: each call is refused
    pauses = []
    for _ in range(10):
        now = pull.clock.monotonic()
        pauses.append(pull.tick(now) - now)
    assert pauses == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0])
    assert pull.failures == 10 and FIRST_RETRY == 0.05


def test_an_answered_heartbeat_starts_the_backoff_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pull = _pull(tmp_path, free_port())  # refused, until the monitor answers below

    def pause() -> float:
        now = pull.clock.monotonic()
        return pull.tick(now) - now

    assert [pause() for _ in range(3)] == pytest.approx([0.05, 0.1, 0.2])
    with monkeypatch.context() as answered:  # the monitor answers: no run waits
        answered.setattr(heartbeat, "send_heartbeat", lambda *a, **k: [])
        assert pause() == 10.0 and pull.failures == 0
    assert [pause() for _ in range(2)] == pytest.approx([0.05, 0.1])  # refused again: anew
    # The formula itself, for any count of failures in a row.
    pull.failures = 5
    assert pull.heartbeat_retry(10.0) == pytest.approx(0.8)
    pull.failures = 1
    assert pull.heartbeat_retry(10.0) == FIRST_RETRY
    pull.retry_delay = 3.0  # an ephemeral node's connect_retry_delay wins
    assert pull.heartbeat_retry(10.0) == 3.0


def test_a_node_whose_monitor_listens_a_moment_later_calls_it_at_its_next_try(
        tmp_path: Path) -> None:
    """The heartbeat reaches the monitor's port FIRST_RETRY (0.05 s) after it was refused:
    a listening socket then takes the connection (here closed unanswered)."""
    port = free_port()
    pull = _pull(tmp_path, port)
    now = pull.clock.monotonic()
    due = pull.tick(now)
    assert due - now == FIRST_RETRY and pull.failures == 1
    called = []
    with socket.create_server(("127.0.0.1", port)) as monitor:
        monitor.settimeout(5)

        def answer() -> None:
            conn, _ = monitor.accept()
            called.append(True)
            conn.close()

        thread = threading.Thread(target=answer)
        thread.start()
        pull.clock.sleep(due - now)
        pull.tick(pull.clock.monotonic())
        thread.join(5)
    assert called == [True]
