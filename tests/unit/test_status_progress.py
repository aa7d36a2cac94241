"""localcluster's status page and progress line: the line's text from a snapshot, its
writing only to a terminal, and the status port's place among the cluster's ports."""

from __future__ import annotations

import io
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from cluster import configfile
from cluster.config import Config
from cluster.console.progress import ProgressLine, progress_line
from cluster.errors import LocalClusterError
from cluster.home import Home
from cluster.localcluster import LocalCluster
from cluster.localports import page_url, status_port
from cluster.runtime.ports import free_port

LINE = "user alice gs"


def snap_running(**changes: Any) -> dict[str, Any]:
    run = {"run": "20261123160000-p0-a1b2", "priority": 0, "queue": LINE, "state": "running",
           "jobs": {"total": 225, "done": 120, "running": 8, "left": 97}, "rate": 3.44,
           "eta": 1000.0 + 31, "nodes": {"n1": {}, "n2": {}}, "stopping": ""}
    run.update(changes)
    return {"now": 1000.0, "running": [run], "queues": [{"priority": 0, "runs": [
        {"line": LINE}]}]}


def test_the_line_of_a_running_run() -> None:
    end = time.strftime("%H:%M:%S", time.localtime(1031.0))
    assert progress_line(snap_running(), LINE) == (
        f"120 of 225 jobs done, 8 running, 2 nodes, 3.4/s, ends ~{end} (in 31 s)")
    text = progress_line(snap_running(eta=None, nodes={"n1": {}},
                                      stopping="stopped by alice"), LINE)
    assert "1 node, " in text and "end not known yet" in text
    assert text.endswith("; stopping: stopped by alice")
    assert progress_line(snap_running(state="starting"), LINE).endswith(
        "building the job list")


def test_the_line_of_a_queued_or_unknown_run() -> None:
    snap = {"now": 1.0, "running": [], "queues": [
        {"priority": 0, "runs": [{"line": "user bob gs"}, {"line": LINE}]}]}
    assert progress_line(snap, LINE) == "queued at priority 0, 1 run(s) ahead"
    snap["queues"][0]["runs"] = [{"line": LINE}]
    assert progress_line(snap, LINE) == "queued at priority 0, waiting for a master"
    assert progress_line(snap, "user carol gs") == "waiting for the run to be queued"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def make_line(stream: io.StringIO, snaps: list[dict[str, Any]],
              clock: list[float]) -> ProgressLine:
    home = Home(Path("/nonexistent"))
    return ProgressLine(stream, home, Config(), LINE, interval=1.0,
                        snapshot=lambda h, c: snaps.pop(0), clock=lambda: clock[0])


def test_a_terminal_gets_the_line_rewritten_in_place_at_most_once_a_second() -> None:
    out = FakeTerminal()
    clock = [0.0]
    line = make_line(out, [snap_running(), snap_running(jobs={"done": 5, "total": 9})], clock)
    line.update()
    first = out.getvalue()
    assert first.startswith("\r") and "120 of 225 jobs done" in first and "\n" not in first
    clock[0] = 0.5
    line.update()  # too soon: nothing written
    assert out.getvalue() == first
    clock[0] = 1.2
    line.update()
    second = out.getvalue()[len(first):]
    # The shorter line is padded over the longer one left on the terminal.
    assert second.startswith("\r") and "5 of 9 jobs done" in second
    assert len(second) - 1 == len(first) - 1
    line.clear()
    assert out.getvalue().endswith("\r")
    assert "\n" not in out.getvalue()


def test_nothing_is_written_when_the_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    line = make_line(out, [snap_running()], [5.0])
    line.update()
    line.clear()
    assert out.getvalue() == "" and not line.enabled


def test_a_failing_snapshot_shows_as_a_line_and_does_not_raise() -> None:
    out = FakeTerminal()

    def broken(home: Home, cfg: Config) -> dict[str, Any]:
        raise OSError("no such home")

    line = ProgressLine(out, Home(Path("/x")), Config(), LINE, snapshot=broken,
                        clock=lambda: 10.0)
    line.update()
    assert "no progress: OSError: no such home" in out.getvalue()


# ------------------------------------------------------------------------------ the port
def test_the_status_port_is_checked_with_the_others() -> None:
    assert status_port(Config(status_port=0)) is None
    assert status_port(Config(status_port=9020)) == (9020, "status page: status_port")
    with pytest.raises(LocalClusterError, match=r"port 9011 is both the monitor: "
                                                r"monitor_port and the status page"):
        status_port(Config(base_port=9100, monitor_port=9011, status_port=9011))
    with pytest.raises(LocalClusterError, match=r"port 70000 \(status page: status_port\) "
                                                r"is not a TCP port"):
        status_port(Config(status_port=70000))


def test_a_taken_status_port_stops_the_start_naming_it(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cluster = LocalCluster(tmp_path / "home", 1)
        cfg = configfile.load(None, {"base_port": str(free_port(5)),
                                 "monitor_port": str(free_port()), "status_port": str(port)})
        with pytest.raises(LocalClusterError, match=rf"port {port} on 127.0.0.1 \(status "
                                                    rf"page: status_port\) cannot be bound"):
            cluster.check_ports(cfg)
    assert cluster.procs == []


def test_the_page_url() -> None:
    assert page_url("127.0.0.1", 9020) == "http://127.0.0.1:9020/"
    assert page_url("::1", 9020) == "http://[::1]:9020/"
    assert page_url("0.0.0.0", 9020) == f"http://{socket.gethostname()}:9020/"
    cluster = LocalCluster(Path("/tmp/x"))
    assert cluster.status_url(Config(status_port=0)) is None
    assert cluster.status_url(Config(status_port=9021)) == "http://127.0.0.1:9021/"
