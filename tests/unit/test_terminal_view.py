"""clustermonitor's view (cluster.console.terminal): a pure function of a snapshot, and the
redraw loop."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from cluster.console import terminal
from cluster.console.status import StatusReader
from tests.helpers import REPO
from tests.unit.test_console_status import NOW, RUN, make_home, running_home

SNAP = {
    "version": 1, "now": NOW, "master": "casper",
    "queues": [{"priority": 0, "runs": [{"line": "user alice gs", "running": False,
                                         "id": "p0:1"}]},
               {"priority": 1, "runs": [{"line": "git 0123abcd gs", "running": True,
                                         "id": RUN}]},
               {"priority": 2, "runs": []}],
    "running": [{"run": RUN, "priority": 1, "queue": "git 0123abcd gs", "state": "running",
                 "jobs": {"total": 200, "done": 50, "running": 8, "left": 142},
                 "rate": 2.5, "eta": NOW + 60, "elapsed": 125.0, "stopping": "",
                 "stop_requested": "bob@host", "fatal": "",
                 "nodes": {"n1": {}, "n2": {}}}],
    "nodes": [
        {"name": "n1", "status": "running jobs", "last_heard": NOW - 3, "down_since": None,
         "disabled": None, "run": RUN, "done": 30, "errors": 2, "timeouts": 0},
        {"name": "node-two", "status": "", "last_heard": NOW - 900, "down_since": NOW - 600,
         "disabled": None, "run": None, "done": 0, "errors": 0, "timeouts": 0},
        {"name": "n3", "status": "idle", "last_heard": NOW - 1, "down_since": None,
         "disabled": "disabled by ann@host at 2027-01-15T08:00:00Z", "run": None,
         "done": 0, "errors": 0, "timeouts": 0},
    ],
    "recent": [{"run": "20270101000000-p2-0001", "what": "auto nightly gs", "ended": NOW - 50,
                "elapsed": 3725.0, "outcome": "done", "differences": 4, "errors": 1}],
    "status": [{"priority": 1, "line": "run x - busy"}, {"priority": 2, "line": "idle - last"}],
}


def test_the_view_has_a_status_line_per_run_a_line_per_node_and_the_queues() -> None:
    lines = terminal.render(SNAP)
    text = "\n".join(lines)
    assert lines[0].startswith("cluster casper at ")
    assert lines[1] == (f"p1 {RUN} git 0123abcd gs: 50/200 25% done, 8 running, 2.5/s, "
                        f"eta {terminal._clock(NOW + 60)} UTC (in 1:00), 2 nodes, 2:05 elapsed"
                        " [stop requested by bob@host]")
    assert "p2 idle - last" in lines  # an idle priority's status line
    assert "run x - busy" not in text  # priority 1 runs: its live line replaces it
    assert f"  n1        run {RUN}: 30 done, 2 errors  running jobs" in lines
    assert f"  node-two  --DOWN-- since {terminal._clock(NOW - 600)} UTC" in lines
    assert "  n3        --DISABLED-- disabled by ann@host at 2027-01-15T08:00:00Z" in lines
    queue = lines[lines.index("queues:") + 1:]
    assert queue[:2] == ["  p0 user alice gs", "  p1 git 0123abcd gs  (running)"]
    assert "  " + terminal._clock(NOW - 50) + " 20270101000000-p2-0001 auto nightly gs: " \
        "done, 1:02:05, 4 differences, 1 errors" in lines


def test_the_view_is_cut_to_the_terminal_width_and_handles_an_idle_cluster() -> None:
    assert all(len(line) <= 30 for line in terminal.render(SNAP, columns=30))
    idle = terminal.render({"now": NOW, "master": "m", "queues": [], "running": [],
                            "nodes": [], "recent": [], "status": []})
    assert idle[1] == "idle" and "  empty" in idle and "nodes (0):" in idle
    starting = dict(SNAP, running=[dict(SNAP["running"][0], state="starting")])
    assert terminal.render(starting)[1] == f"p1 {RUN} git 0123abcd gs: starting (making " \
        "the job list)"


def test_the_view_of_a_real_snapshot_and_the_redraw_loop(tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    reader = StatusReader()
    out = io.StringIO()
    answers = iter([False, False, True])  # wait() returns True once stopped
    waited: list[float] = []

    def wait(seconds: float) -> bool:
        waited.append(seconds)
        return next(answers)

    draws = terminal.watch(lambda: reader.snapshot(home, cfg, NOW), out, 0.01, once=False,
                           stop=lambda: False, wait=wait)
    assert waited == [0.01] * 3
    assert draws == 3
    frames = out.getvalue().split(terminal.CLEAR)
    assert frames[0] == "" and len(frames) == 4
    assert "--DOWN--" in frames[1] and f"p1 {RUN}" in frames[1]
    once = io.StringIO()
    assert terminal.watch(lambda: reader.snapshot(home, cfg, NOW), once, 5, once=True,
                          stop=lambda: False, wait=lambda s: False) == 1
    assert terminal.CLEAR not in once.getvalue()


def test_clustermonitor_prints_once_when_its_output_is_not_a_terminal(tmp_path: Path) -> None:
    home, _cfg = make_home(tmp_path)
    (home.nodes / "n1.up").touch()
    done = subprocess.run([sys.executable, str(REPO / "clustermonitor.py"), "--home",
                           str(home.root), "--interval", "0.1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert terminal.CLEAR not in done.stdout
    assert "nodes (1):" in done.stdout and "  n1  idle" in done.stdout
    bad = subprocess.run([sys.executable, str(REPO / "clustermonitor.py"), "--home",
                          str(tmp_path / "none"), "--once"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_a_node_in_no_run_is_idle_and_a_stale_running_status_is_said_as_its_last_words(
        ) -> None:
    """Once a node whose run ended or was stopped showed "idle  running run <id>"."""
    base = {"last_heard": NOW - 2, "down_since": None, "disabled": None, "run": None,
            "done": 0, "errors": 0, "timeouts": 0}
    stale = terminal.node_line({**base, "name": "n4",
                                "status": f"running run {RUN} (priority 1)"}, 2)
    assert stale == f"n4  idle  (last heartbeat: running run {RUN} (priority 1))"
    assert terminal.node_line({**base, "name": "n5", "status": "idle"}, 2) == "n5  idle"


def test_two_priority_0_runs_each_with_its_lane() -> None:
    """Lane 0 and user lane 3 both run priority-0 runs (cluster.lanes); lane 4 is idle."""
    other = "20270115080500-p0-c3c3"
    run = {**SNAP["running"][0], "priority": 0, "lane": 0, "queue": "user alice gs"}
    snap = {**SNAP,
            "running": [run, {**run, "run": other, "lane": 3, "queue": "user carol gs"}],
            "status": [{"priority": 0, "lane": 0, "line": "run a - busy"},
                       {"priority": 0, "lane": 3, "line": "run c - busy"},
                       {"priority": 0, "lane": 4, "line": "idle - last"}]}
    lines = terminal.render(snap)
    assert lines[1].startswith(f"p0 {RUN} user alice gs: 50/200")
    assert lines[2].startswith(f"p0 (lane 3) {other} user carol gs: 50/200")
    assert "p0 (lane 4) idle - last" in lines
    assert not any("busy" in line for line in lines)
