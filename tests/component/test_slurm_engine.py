"""The Slurm engine against a real private single-host Slurm (Debian's slurmctld, slurmd,
munge): submit, list, cancel, a refused submission (also as the provisioner's status file
records it), a controller that is down, and a private Slurm that leaves nothing running
when stopped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cluster.cli import clusterscale
from cluster.provision.engine import EngineError, EngineJob
from cluster.provision.slurm import SlurmEngine
from cluster.provision.slurmhost import PrivateSlurm, SlurmHostError
from cluster.wire.provision import read_status
from tests.unit.test_clusterscale import write_resources

#: Bound of every wait for Slurm to act [seconds] (it acts within about 2 s).
WAIT = 15.0


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.1)


def marked(text: str) -> list[dict[str, object]]:
    """The live processes (not zombies) whose command line holds ``text``."""
    return [p.info for p in psutil.process_iter(["pid", "cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE
            and text in " ".join(p.info["cmdline"] or [])]


def job(engine: SlurmEngine, prefix: str, job_id: str) -> EngineJob | None:
    return next((j for j in engine.jobs(prefix) if j.job_id == job_id), None)


def test_a_job_is_submitted_seen_running_by_its_prefix_and_cancelled(
        private_slurm: PrivateSlurm) -> None:
    engine = SlurmEngine(env=private_slurm.env)
    job_id = engine.submit("sltest-xyz", ["sleep", "30"], 1)
    assert job_id.isdigit()
    wait_for("running job", lambda: (j := job(engine, "sltest", job_id)) is not None
             and j.state == "running")
    assert engine.jobs("sltest") == [EngineJob(job_id, "sltest-xyz", "running", "")]
    assert engine.jobs("slte") == []  # a prefix is a whole word before "-"
    engine.cancel(job_id)
    wait_for("cancelled job gone", lambda: engine.jobs("sltest") == [])
    engine.cancel(job_id)  # a job already gone is not an error


def test_the_command_line_reaches_the_job_word_for_word(private_slurm: PrivateSlurm,
                                                        tmp_path: Path) -> None:
    engine = SlurmEngine(env=private_slurm.env, output_dir=tmp_path)
    argv = ["sh", "-c", 'printf "%s|" "$0" "$1"; echo', "it's $HOME", "a  b;*"]
    job_id = engine.submit("sltest-quote", argv, 1)
    out = tmp_path / f"sltest-quote-{job_id}.out"
    wait_for("job's output", lambda: out.exists() and out.read_text().endswith("\n"))
    assert out.read_text() == "it's $HOME|a  b;*|\n"


def test_a_partition_that_does_not_exist_is_refused_with_slurms_words(
        private_slurm: PrivateSlurm) -> None:
    engine = SlurmEngine(partition="nosuchpartition", env=private_slurm.env)
    with pytest.raises(EngineError) as caught:
        engine.submit("sltest-nowhere", ["true"], 1)
    message = str(caught.value)
    assert message.startswith("sbatch: exit status 1: ")
    assert "invalid partition" in message.lower()
    assert SlurmEngine(env=private_slurm.env).jobs("sltest") == []


def test_a_job_that_does_not_fit_waits_with_slurms_reason(private_slurm: PrivateSlurm) -> None:
    engine = SlurmEngine(env=private_slurm.env)
    whole = engine.submit("sltest-whole", ["sleep", "30"], private_slurm.cpus)
    try:
        wait_for("the whole node taken", lambda: (j := job(engine, "sltest", whole))
                 is not None and j.state == "running")
        waiting = engine.submit("sltest-waits", ["sleep", "30"], 1)
        wait_for("Slurm's reason", lambda: (j := job(engine, "sltest", waiting)) is not None
                 and j.reason != "")
        assert job(engine, "sltest", waiting) == EngineJob(waiting, "sltest-waits", "pending",
                                                           "Resources")
        engine.cancel(waiting)
    finally:
        engine.cancel(whole)
    wait_for("cancelled jobs gone", lambda: engine.jobs("sltest") == [])


def test_a_stopped_private_slurm_leaves_nothing_running_and_sbatch_then_fails(
        tmp_path: Path) -> None:
    marker = f"sltest-marker-{uuid.uuid4().hex}"
    slurm = PrivateSlurm(tmp_path / "s").start()
    try:
        engine = SlurmEngine(env=slurm.env)
        pids = slurm.pids
        assert sorted(pids) == ["munged", "slurmctld", "slurmd"]
        socket_dir = slurm.munge_socket.parent
        # The job's shell carries the marker in its command line ($0).
        job_id = engine.submit("sltest-left", ["sh", "-c", "sleep 30; true", marker], 1)
        wait_for("job's shell", lambda: marked(marker) != [])
        assert job(engine, "sltest", job_id) == EngineJob(job_id, "sltest-left", "running")
    finally:
        slurm.stop()
    assert slurm.pids == {}
    for name, pid in pids.items():
        assert not psutil.pid_exists(pid), f"{name} (pid {pid}) still there"
    assert marked(str(tmp_path)) == []  # munged, slurmctld, slurmd name their files
    assert marked(marker) == []  # the job's shell and its sleep
    assert not socket_dir.exists()
    with pytest.raises(EngineError) as caught:
        engine.submit("sltest-down", ["true"], 1)
    assert str(caught.value).startswith("sbatch: exit status 1: ")
    assert "Unable to contact slurm controller" in str(caught.value)


def test_a_private_slurm_without_munged_says_so_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no Slurm, no munge
    slurm = PrivateSlurm(tmp_path / "s")
    with pytest.raises(SlurmHostError, match="cannot start munged.*munge installed"):
        slurm.start()
    assert slurm.pids == {}
    assert slurm.munge_socket == Path()  # its /tmp folder removed


def test_clusterscale_records_sbatchs_refusal_in_its_status_file(
        private_slurm: PrivateSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provisioner with the real Slurm engine (its default factory, the site's
    SLURM_CONF) and a partition Slurm does not have: one look, and provision.json says
    what sbatch said, for the console to show."""
    monkeypatch.setenv("SLURM_CONF", private_slurm.env["SLURM_CONF"])
    write_resources(tmp_path / "resources.json", time.time(), wanted=2)
    assert clusterscale.main(["--home", str(tmp_path), "--once", "--set",
                              "slurm_partition=nosuch", "--set", "node_prefix=sltest"]) == 0
    status = read_status(tmp_path / "provision.json", time.time())
    assert status.trouble.startswith("sbatch: exit status 1: sbatch: error: ")
    assert "invalid partition" in status.trouble.lower()
    assert (status.engine, status.wanted, status.pending, status.running, status.jobs) == \
        ("Slurm", 2, 0, 0, ())
    assert "submit failed: " + status.trouble in status.action
    assert SlurmEngine(env=private_slurm.env).jobs("sltest") == []
