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
