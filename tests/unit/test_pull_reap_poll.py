"""ClusterPull's loop while run.py runs: how often it looks at run.py and the stop flag.

localcluster.py's stop waits for each node's clusterpull, and a node's next heartbeat
after its run waits for run.py to be reaped: both take up to one slice of this loop."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cluster.config import Config
from cluster.node.pull import Child, ClusterPull
from cluster.runtime.clock import FakeClock
from cluster.runtime.ports import free_port


def test_while_run_py_runs_the_loop_looks_again_every_twentieth_of_a_second(
        tmp_path: Path) -> None:
    clock = FakeClock()
    # No monitor on that port: the heartbeats fail (tried again from 0.25 s on, less often
    # each time); between them the loop still looks at run.py every 0.05 s.
    cfg = Config(node_name="n1", work_dir=tmp_path / "work", heartbeat_interval=10.0,
                 monitor_port=free_port(), master_host="127.0.0.1")
    pull = ClusterPull(cfg, caps="", clock=clock)
    run_py = subprocess.Popen(["sleep", "30"])
    try:
        pull.child = Child(0, "20261126120000-p0-abcd", run_py)
        status = pull.run(until=lambda now: 0 if now >= 2.0 else None)
    finally:
        run_py.kill()
        run_py.wait()
    assert status == 0
    looks = [s for s in clock.sleeps if s > 0]
    assert looks and max(looks) <= 0.05 + 1e-9, looks[:5]


def test_a_run_py_that_moved_leaves_its_run_open_and_the_most_urgent_run_next(
        tmp_path: Path) -> None:
    """run.py exits 5 (moved: preempted by a more urgent run): the run it left is neither
    finished nor backed off from, so the node joins it again as soon as nothing more urgent
    waits; exit 4 still backs off, exit 0 still finishes."""
    cfg = Config(node_name="n1", work_dir=tmp_path / "work")
    pull = ClusterPull(cfg, caps="", clock=FakeClock())
    nightly = "20261126120000-p2-abcd"
    started: list[tuple[int, str]] = []

    def start(priority: int, run_id: str) -> bool:
        started.append((priority, run_id))
        return True

    pull._start = start  # type: ignore[method-assign]
    for code in (5, 4, 0):
        pull.retry_after.clear()
        pull.child = Child(2, nightly, subprocess.Popen(["sh", "-c", f"exit {code}"]))
        pull.child.proc.wait()
        assert pull._reap(100.0)
        if code == 5:
            assert nightly not in pull.finished and not pull.retry_after
            pull.waiting = [(0, "20261126120001-p0-beef"), (2, nightly)]
            assert pull._start_next(100.0) and started == [(0, "20261126120001-p0-beef")]
            pull.waiting = [(2, nightly)]
            assert pull._start_next(100.0) and started[-1] == (2, nightly)
        elif code == 4:
            assert pull.retry_after == {nightly: 100.0 + cfg.rejoin_delay}
        else:
            assert nightly in pull.finished
