"""``num_execution=N`` (docs/runoptions.md section 7): the option's grammar on a queue line
and the expansion of a shell run's job lines into ranks."""

from __future__ import annotations

import pytest

from cluster.config import DEFAULTS
from cluster.errors import QueueLineError
from cluster.jobs.commands import shell_command
from cluster.jobs.ranks import expand_ranks, rank_name
from cluster.records import TEMP, TEST_ID, Job
from cluster.runoptions import MAX_NUM_EXECUTION, RunOptions
from cluster.runspec import RunSpec


def test_a_shell_run_takes_num_execution() -> None:
    spec = RunSpec.parse("user bob shell num_execution=3")
    assert spec.line() == "user bob shell num_execution=3"
    assert RunOptions.of(spec.options, DEFAULTS).num_execution == 3
    assert RunOptions.of((), DEFAULTS).num_execution is None
    assert RunSpec.parse(f"auto x shell num_execution={MAX_NUM_EXECUTION} every_node")


@pytest.mark.parametrize(("value", "expected"), [
    ("0", "num_execution=0: expected a whole number from 1 to 1000"),
    ("-2", "num_execution=-2: expected a whole number from 1 to 1000"),
    ("1.5", "num_execution=1.5: expected a whole number from 1 to 1000"),
    ("three", "num_execution=three: expected a whole number from 1 to 1000"),
    (str(MAX_NUM_EXECUTION + 1), "expected a whole number from 1 to 1000"),
    ("", "num_execution= has no value"),
])
def test_bad_counts_are_refused_naming_the_option(value: str, expected: str) -> None:
    with pytest.raises(QueueLineError, match=expected.replace(".", r"\.")):
        RunSpec.parse(f"user bob shell num_execution={value}")


@pytest.mark.parametrize("products", ["gs", "mupdf", "sweep", "gs,pdfwrite"])
def test_num_execution_goes_with_product_shell_only(products: str) -> None:
    with pytest.raises(QueueLineError, match="num_execution= goes with product shell only"):
        RunSpec.parse(f"user bob {products} num_execution=2")


def test_each_job_becomes_its_ranks_with_rank_and_count_exported() -> None:
    jobs = [Job("cmds__a.cmds.1", f"{TEMP}/cmds__a.cmds.1.log",
                shell_command("cmds__a.cmds.1", "echo $CLUSTER_RANK")),
            Job("cmds__a.cmds.2", f"{TEMP}/cmds__a.cmds.2.log",
                shell_command("cmds__a.cmds.2", "true"))]
    lines = list(expand_ranks([j.line + "\n" for j in jobs], 3))
    copies = [Job.parse(line) for line in lines]
    assert [c.name for c in copies] == [f"cmds__a.cmds.{n}.rank{k}" for n in (1, 2)
                                        for k in range(3)]
    assert all(TEST_ID.fullmatch(c.name) for c in copies)
    first = copies[1]  # cmds__a.cmds.1.rank1
    assert first.logfile == f"{TEMP}/cmds__a.cmds.1.rank1.log"
    assert first.command == ("export CLUSTER_RANK=1 CLUSTER_COUNT=3 ; "
                             + shell_command("cmds__a.cmds.1.rank1", "echo $CLUSTER_RANK"))
    assert f"{TEMP}/cmds__a.cmds.1." not in first.command.replace(
        f"{TEMP}/cmds__a.cmds.1.rank1.", "")


def test_ranks_that_would_not_make_test_ids_are_left_out() -> None:
    long = "x" * 398
    job = Job(long, f"{TEMP}/{long}.log", shell_command(long, "true"))
    assert list(expand_ranks([job.line + "\n"], 2)) == []
    assert rank_name("t.1", 0) == "t.1.rank0"
    with pytest.raises(ValueError, match="1 or more"):
        list(expand_ranks([], 0))


def test_with_every_node_each_rank_is_made_once_per_node() -> None:
    from cluster.master.model.placement import RunPolicy, expand_every_node
    from cluster.runoptions import RunOptions as Options

    job = Job("c.1", f"{TEMP}/c.1.log", shell_command("c.1", "echo $CLUSTER_RANK"))
    lines = list(expand_every_node(expand_ranks([job.line + "\n"], 2), ["n1", "n2"]))
    copies = [Job.parse(line) for line in lines]
    assert [c.name for c in copies] == ["c.1.rank0@n1", "c.1.rank0@n2", "c.1.rank1@n1",
                                        "c.1.rank1@n2"]
    assert copies[3].command.startswith("export CLUSTER_RANK=1 CLUSTER_COUNT=2 ; ")
    assert f"{TEMP}/c.1.rank1@n2.out" in copies[3].command
    policy = RunPolicy.of(Options.of(["every_node", "num_execution=2"], DEFAULTS))
    policy.pin(c.name for c in copies)
    assert policy.pinned_to("n2") == [1, 3]
