"""The Grid Engine engine against a real private single-host cell (Debian's
gridengine-master, -exec and -client): an array job submitted, its tasks listed running and
run with their own ids, one task deleted, tasks kept off an excluded host (pending), a
refused submission quoting qsub, and a cell that leaves nothing running when stopped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cluster.provision.engine import EngineError
from cluster.provision.gridengine import GridEngine
from cluster.provision.sgehost import PrivateGridEngine

pytestmark = pytest.mark.xdist_group("gridengine")

WAIT = 15.0


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.1)


def test_an_array_job_runs_its_tasks_lists_them_and_deletes_one(
        private_gridengine: PrivateGridEngine, tmp_path: Path) -> None:
    engine = GridEngine(env=private_gridengine.env)
    ids = engine.submit_many("getest-node", ["sh", "-c", f"echo $JOB_ID.$SGE_TASK_ID > "
                                             f"{tmp_path}/$SGE_TASK_ID; exec sleep 30"], 1, 3)
    assert len(ids) == 3 and ids[0].endswith(".1") and ids[2].endswith(".3")

    def states() -> dict[str, str]:
        return {job.job_id: job.state for job in engine.jobs("getest")}
    wait_for("3 tasks running", lambda: states() == dict.fromkeys(ids, "running"))
    # Each task's shell sees its own id as job_id_shell says.
    wait_for("the tasks' files", lambda: all((tmp_path / str(n)).exists() for n in (1, 2, 3)))
    assert [(tmp_path / str(n)).read_text().strip() for n in (1, 2, 3)] == ids
    engine.cancel(ids[0])
    wait_for("task 1 gone", lambda: ids[0] not in states())
    engine.cancel(ids[0])  # gone already: not an error
    for job_id in ids[1:]:
        engine.cancel(job_id)
    wait_for("every task gone", lambda: states() == {})


def test_an_excluded_host_keeps_the_tasks_pending(
        private_gridengine: PrivateGridEngine) -> None:
    engine = GridEngine(env=private_gridengine.env)
    ids = engine.submit_many("getest-off", ["sleep", "30"], 1, 2,
                             exclude=[private_gridengine.host])
    time.sleep(2.5)  # two scheduler passes
    jobs = engine.jobs("getest")
    assert [(j.job_id, j.state) for j in jobs] == [(i, "pending") for i in ids]
    for job_id in ids:
        engine.cancel(job_id)
    wait_for("the pending tasks gone", lambda: engine.jobs("getest") == [])


def test_a_refused_submission_quotes_qsub(private_gridengine: PrivateGridEngine) -> None:
    engine = GridEngine(queue="nosuchqueue", env=private_gridengine.env)
    with pytest.raises(EngineError, match=r"^qsub: exit status \d+: .*nosuchqueue"):
        engine.submit("getest-x", ["true"], 1)


def test_a_stopped_cell_leaves_nothing_running(tmp_path: Path) -> None:
    marker = f"getest-{uuid.uuid4().hex}"  # other tests on this machine sleep too
    with PrivateGridEngine(tmp_path / "sge", slots=2) as cell:
        pids = dict(cell.pids)
        engine = GridEngine(env=cell.env)
        engine.submit_many("getest-left", ["sh", "-c", "sleep 300; true", marker], 1, 2)
        wait_for("the tasks running", lambda: len([
            j for j in engine.jobs("getest") if j.state == "running"]) == 2)
    assert not [pid for pid in pids.values() if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    left = [p.info for p in psutil.process_iter(["pid", "name", "cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE
            and (p.info["name"] == "sge_shepherd"
                 or marker in " ".join(p.info["cmdline"] or []))]
    assert left == []
    # No command reaches it any more.
    with pytest.raises(EngineError, match="qstat: exit status"):
        GridEngine(env=cell.env, timeout=20).jobs("getest")
