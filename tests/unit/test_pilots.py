"""Pilots (cluster.provision.pilots): the pilot script run for real by sh, its log read
back, and the watch's judgement -- failures in a row, the back-off, one WARNING a streak,
a host excluded after N and cleared by clusterscale.py --clear-host -- on a FakeClock with
a scripted engine."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli import clusterscale
from cluster.provision.engine import EngineJob
from cluster.provision.exclusions import Exclusions
from cluster.provision.pilots import (
    EXIT_CANNOT_START,
    PilotSettings,
    PilotWatch,
    cut_log,
    pilot_argv,
    prune_logs,
    read_pilot_log,
)
from cluster.provision.scaler import Demand, Provisioner, ScaleSettings
from cluster.runtime.clock import FakeClock
from tests.helpers import REPO
from tests.unit.test_scaler import COMMAND, ScriptedEngine

SETTINGS = PilotSettings(min_life=60.0, backoff=10.0, backoff_max=40.0, exclude_after=3,
                         log_keep=50)


def run_pilot(tmp_path: Path, python: str, command: list[str], job_id: str = "7",
              env: dict[str, str] | None = None) -> tuple[int, Path]:
    argv = pilot_argv(command, python, tmp_path / "pilots", "slurm", "$SLURM_JOB_ID")
    done = subprocess.run(argv, env={**os.environ, "SLURM_JOB_ID": job_id, **(env or {})},
                          timeout=60, capture_output=True)
    return done.returncode, tmp_path / "pilots" / f"slurm-{job_id}.log"


def test_a_python_without_the_nodes_modules_is_said_in_the_log_and_exits_2(
        tmp_path: Path) -> None:
    """A Python that cannot import the node's modules (a bare venv: no psutil) is caught
    before the node starts, in one line naming the fix."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    status, log = run_pilot(tmp_path, str(venv / "bin" / "python"),
                            [str(REPO / "clusterpull.py"), "--ephemeral"])
    assert status == EXIT_CANNOT_START
    text = log.read_text()
    assert text.startswith("pilot: start ") and " job 7 python " in text
    assert "No module named" in text
    assert "cannot import the node's modules; set node_python in master.conf" in text
    end = read_pilot_log(log, "7", "slurm-7", 0.0)
    assert end.status == EXIT_CANNOT_START and end.host and end.life < 5
    assert end.failed(60.0)
    assert "No module named" in " ".join(end.tail)


def test_the_node_runs_under_the_python_given_with_its_name(tmp_path: Path) -> None:
    """The command gets the job's node name and --quiet; its exit status is the pilot's."""
    script = tmp_path / "fake.py"
    script.write_text("import sys; print('argv', sys.argv[1:]); sys.exit(5)\n")
    status, log = run_pilot(tmp_path, sys.executable, [str(script), "--ephemeral"], "42")
    assert status == 5
    text = log.read_text()
    assert "argv ['--ephemeral', '--name', 'slurm-42', '--quiet']" in text
    end = read_pilot_log(log, "42", "slurm-42", 0.0)
    assert end.status == 5 and end.failed(60.0)
    assert not end.failed(0.0)  # a long life is no failure


def test_logs_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "slurm-1.log"
    big.write_bytes(b"pilot: start 1 host h job 1 python p\n" + b"x" * 200_000 + b"\nlast\n")
    cut_log(big)
    assert big.stat().st_size == 65_536 and big.read_bytes().endswith(b"last\n")
    for n in range(10):
        (tmp_path / f"slurm-{n + 2}.log").write_text("x")
        os.utime(tmp_path / f"slurm-{n + 2}.log", (n, n))
    assert prune_logs(tmp_path, 4) == 7
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [
        "slurm-1.log", "slurm-10.log", "slurm-11.log", "slurm-9.log"]


def write_log(folder: Path, job_id: str, host: str, status: int, life: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"slurm-{job_id}.log").write_text(
        f"pilot: start 1000 host {host} job {job_id} python /usr/bin/python3\n"
        "ModuleNotFoundError: No module named 'psutil'\n"
        f"pilot: end {1000 + life:.0f} exit {status}\n")


def test_failed_pilots_back_off_warn_once_and_exclude_the_host(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    engine = ScriptedEngine()
    exclusions = Exclusions(tmp_path / "provision-excluded.json")
    logs = tmp_path / "pilots"
    watch = PilotWatch(SETTINGS, clock, logs, "slurm", "/opt/py/bin/python3", exclusions)
    provisioner = Provisioner(engine, ScaleSettings(4, 30.0, "slurm", 1), clock,
                              pilots=watch)
    demand = Demand(1, True, COMMAND)
    caplog.set_level(logging.INFO)
    submits_at: list[float] = []
    for _ in range(200):  # 200 looks of 1 s
        before = len(engine.submits)
        provisioner.step(demand)
        if len(engine.submits) > before:
            submits_at.append(clock.monotonic())
        # Every job dies at once on host n7, its log saying why.
        for job_id in list(engine.table):
            write_log(logs, job_id, "n7", 1, 0.0)
            del engine.table[job_id]
        clock.sleep(1.0)
    # Each pilot runs the command under the Python given.
    argv = engine.submits[0][1]
    assert argv[6] == "/opt/py/bin/python3" and argv[-len(COMMAND):] == list(COMMAND)
    # A handful of submits, the gaps growing to the cap (10, 20, 40, 40 s...).
    gaps = [round(b - a) for a, b in zip(submits_at, submits_at[1:], strict=False)]
    assert len(submits_at) <= 8, submits_at
    assert gaps[:3] == [11, 21, 41] and all(g <= 41 for g in gaps), gaps
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and r.getMessage().startswith("pilot failed")]
    assert len(warnings) == 1
    assert "No module named 'psutil'" in warnings[0].getMessage()
    assert "job 1001 (node slurm-1001) on host n7 exited 1 after 0 s" in warnings[0].getMessage()
    # After three failures on n7 it is excluded, and every later submit keeps off it.
    assert set(exclusions.hosts()) == {"n7"}
    assert engine.excludes[:3] == [[], [], []] and engine.excludes[3:] and all(
        e == ["n7"] for e in engine.excludes[3:])
    assert sum("host n7 excluded" in r.getMessage() for r in caplog.records) == 1
    # The status file says it all.
    status = clusterscale.provision_status(provisioner, provisioner.step(demand), 1.0,
                                           clock.time())
    assert status.failing == len(submits_at) and status.excluded == ("n7",)
    assert "No module named 'psutil'" in status.failure
    # An administrator clears it; the next submit goes anywhere again.
    assert clusterscale.main(["--home", str(tmp_path), "--clear-host", "n7"]) == 0
    assert exclusions.hosts() == {}


def test_a_pilot_that_lives_ends_the_streak_and_exits_0_or_by_a_signal_are_no_failures(
        tmp_path: Path) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    logs = tmp_path / "pilots"
    watch = PilotWatch(SETTINGS, clock, logs, "slurm", "py", None)
    watch.submitted(["1"])
    write_log(logs, "1", "h", 2, 1.0)
    assert [e.job_id for e in watch.look([])] == ["1"] and watch.streak == 1
    assert watch.hold()[0] == 0
    watch.submitted(["3"])
    write_log(logs, "3", "h", 143, 1.0)
    watch.look([])
    assert watch.streak == 1  # exit 143: stopped by a signal, not judged a failure
    assert watch.gone_nodes == ["slurm-3"]
    # Exit 0 (nothing was wanted of it): the node started, so pilots work.
    watch.submitted(["2"])
    write_log(logs, "2", "h", 0, 1.0)
    watch.look([])
    assert watch.streak == 0
    watch.submitted(["6"])
    write_log(logs, "6", "h", 1, 1.0)
    watch.look([])
    assert watch.streak == 1
    # A job seen running for pilot_min_life ends the streak.
    watch.look([EngineJob("4", "slurm-node", "running")])
    clock.sleep(61)
    watch.look([EngineJob("4", "slurm-node", "running")])
    assert watch.streak == 0 and watch.hold() == (None, "")
    # A job whose log is not readable here is judged by the looks that saw it.
    watch.submitted(["5"])
    clock.sleep(2)
    (end,) = watch.look([EngineJob("4", "slurm-node", "running")])
    assert end.status is None and end.log == "" and end.life == 2 and end.failed(60.0)
