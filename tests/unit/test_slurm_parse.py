"""The Slurm engine's pure parts: squeue's lines as engine jobs, sbatch's job id and
command line; and the error when the Slurm commands are not there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cluster.provision.engine import EngineError, EngineJob
from cluster.provision.slurm import (
    SQUEUE_FORMAT,
    SlurmEngine,
    engine_state,
    parse_job_id,
    parse_squeue,
)

SQUEUE_OUT = (
    "101\tslurm-a\tPENDING\tResources\n"
    "102\tslurm-b\tRUNNING\tNone\n"
    "103\tslurm-c\tCONFIGURING\tNone\n"
    "104\tslurm-d\tCOMPLETING\tNone\n"
    "105\tslurm-e\tPENDING\tNone\n"
    "106\tslurm-f\tPENDING\tPartitionDown\n"
    "107\tother-g\tRUNNING\tNone\n"
    "108\tslurmx-h\tRUNNING\tNone\n"
    "\n"
    "109\tslurm-i\tREQUEUE_HOLD\tJobHeldAdmin\n"
    "110\tslurm-j\tWEIRD_NEW_STATE\tNone\n"
)


def test_squeue_lines_become_engine_jobs_of_the_prefix_only() -> None:
    assert parse_squeue(SQUEUE_OUT, "slurm") == [
        EngineJob("101", "slurm-a", "pending", "Resources"),
        EngineJob("102", "slurm-b", "running", ""),
        EngineJob("103", "slurm-c", "running", ""),
        EngineJob("104", "slurm-d", "ending", ""),
        EngineJob("105", "slurm-e", "pending", ""),
        EngineJob("106", "slurm-f", "pending", "PartitionDown"),
        EngineJob("109", "slurm-i", "pending", "JobHeldAdmin"),
        # A state this code does not know is counted, never dropped, and shown.
        EngineJob("110", "slurm-j", "pending", "Slurm state WEIRD_NEW_STATE"),
    ]
    assert parse_squeue("", "slurm") == []


def test_states_map_to_the_engines_four() -> None:
    assert engine_state("PENDING") == ("pending", "")
    assert engine_state("RUNNING") == ("running", "")
    assert engine_state("CONFIGURING") == ("running", "")
    assert engine_state("COMPLETING") == ("ending", "")
    assert engine_state("CANCELLED") == ("gone", "")
    assert engine_state("") == ("pending", "Slurm state (empty)")


def test_a_line_without_four_columns_is_an_error_naming_squeue() -> None:
    with pytest.raises(EngineError, match=r"^squeue: line 2 .*'garbage'"):
        parse_squeue("1\tslurm-a\tRUNNING\tNone\ngarbage\n", "slurm")
    assert SQUEUE_FORMAT.count("\t") == 3


def test_sbatch_parsable_output_gives_the_job_id() -> None:
    assert parse_job_id("4711\n") == "4711"
    assert parse_job_id("4711;cluster2\n") == "4711"
    for bad in ("", "Submitted batch job 4711", "x;y"):
        with pytest.raises(EngineError, match="^sbatch: expected a job id"):
            parse_job_id(bad)


def test_sbatch_command_line_carries_the_settings_and_quotes_the_command(
        tmp_path: Path) -> None:
    engine = SlurmEngine(partition="batch", account="gs", time_limit="2:00:00",
                         options=("--exclusive", "--qos=low"), output_dir=tmp_path)
    argv = ["clusterpull.py", "--ephemeral", "--name", "it's a; $(x)"]
    words = engine.sbatch_argv("slurm-n1", argv, 4)
    assert words[:-2] == [
        "sbatch", "--parsable", "--job-name", "slurm-n1", "--cpus-per-task", "4",
        "--partition", "batch", "--account", "gs", "--time", "2:00:00",
        "--exclusive", "--qos=low", "--output", str(tmp_path / "%x-%j.out")]
    assert words[-2] == "--wrap"
    assert shlex.split(words[-1]) == ["exec", *argv]
    plain = SlurmEngine().sbatch_argv("slurm-n2", ["true"], 1)
    assert plain == ["sbatch", "--parsable", "--job-name", "slurm-n2", "--cpus-per-task",
                     "1", "--output", "/dev/null", "--wrap", "exec true"]


@pytest.mark.parametrize(("name", "argv", "slots", "problem"), [
    ("slurm-a", [], 1, "no command"),
    ("slurm-a", ["true"], 0, "0 slots"),
    ("slurm a", ["true"], 1, "one word"),
    ("", ["true"], 1, "one word"),
])
def test_a_bad_submission_is_refused_before_sbatch(name: str, argv: list[str], slots: int,
                                                   problem: str) -> None:
    with pytest.raises(EngineError, match=f"^sbatch: .*{problem}"):
        SlurmEngine().sbatch_argv(name, argv, slots)


def test_missing_slurm_commands_are_an_engine_error_naming_the_command(
        tmp_path: Path) -> None:
    engine = SlurmEngine(env={"PATH": str(tmp_path)})  # an empty folder: no Slurm here
    where = re.escape(str(tmp_path))
    with pytest.raises(EngineError, match=rf"^sbatch: not found on PATH \({where}\); is "
                                          r"Slurm's client \(slurm-client\) installed\?$"):
        engine.submit("slurm-a", ["true"], 1)
    with pytest.raises(EngineError, match=r"^squeue: not found on PATH"):
        engine.jobs("slurm")
    with pytest.raises(EngineError, match=r"^scancel: not found on PATH"):
        engine.cancel("12")
    with pytest.raises(EngineError, match=r"^scancel: job id '12; rm' is not"):
        engine.cancel("12; rm")


def test_a_slurm_command_that_cannot_start_is_an_engine_error_naming_it(
        tmp_path: Path) -> None:
    """On PATH but not startable (its interpreter missing): the exec's own error, quoted."""
    broken = tmp_path / "squeue"
    broken.write_text("#!/nonexistent/interpreter\n", encoding="utf-8")
    broken.chmod(0o755)
    engine = SlurmEngine(env={"PATH": str(tmp_path)})
    with pytest.raises(EngineError, match=r"^squeue: cannot run it \(cannot start squeue "
                                          r".*No such file.*slurm-client"):
        engine.jobs("slurm")
