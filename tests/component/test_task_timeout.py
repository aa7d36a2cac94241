"""A run's ``task_timeout`` (docs/runoptions.md, section 3) reaches the node in job.start
and is each job's timeout there: a real node (run.py's engine) against a scripted master on
loopback kills a job of the run after the run's task_timeout, not after its own, longer
job_timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE
from cluster.master.model import runlimits
from cluster.records import ERROR_TIMEOUT
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart
from tests.component.test_node_run import (
    RUN,
    SECRET,
    ScriptedMaster,
    make_node_home,
    node,
    script_once,
)
from tests.helpers import give_key


def test_the_runs_task_timeout_travels_in_job_start_and_the_node_applies_it(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    home = make_node_home(tmp_path)
    spec = RunSpec.parse("user t gs task_timeout=1")
    start = JobStart(id=RUN, priority=0, queue=spec.line(), kind="user", ref="t",
                     products=("gs",), tree="ghostpdl", source="src", build="make",
                     tests="tests")
    start = runlimits.with_task_timeout(start, runlimits.run_options(spec, Config()))
    (home / "job.start").write_text(start.format())
    assert "job_timeout 1.0\n" in (home / "job.start").read_text()
    give_key(home, "n1", SECRET)
    master = ScriptedMaster(script_once(
        "echo gs > __temp__/t0.ps.ppmraw.72.0.log ; sleep 60"))
    port = serve(master)
    began = time.monotonic()
    code = node(home, tmp_path, port, job_timeout=300.0, kill_grace=0.5).run()
    took = time.monotonic() - began
    assert code == NODE_EXIT_DONE
    (result,) = [r for req in master.seen for r in req.results]
    assert result.error == ERROR_TIMEOUT
    assert took < 30, f"the job ran {took:.0f} s: the node kept its own job_timeout 300"
