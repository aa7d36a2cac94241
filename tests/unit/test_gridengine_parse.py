"""The Grid Engine engine's pure parts against outputs recorded from Son of Grid Engine
8.1.9 (Debian's gridengine-client): qsub -terse, qstat -xml with running array tasks and
pending ones, and the qsub command line with its exclusions."""

from __future__ import annotations

import pytest

from cluster.config import Config
from cluster.errors import ConfigError
from cluster.provision.engine import ENDING, PENDING, RUNNING, EngineError, EngineJob
from cluster.provision.engines import make_engine
from cluster.provision.gridengine import (
    GridEngine,
    engine_state,
    expand_tasks,
    parse_qstat,
    parse_submitted,
)
from cluster.provision.slurm import SlurmEngine

#: qstat -xml -u root, recorded: job 4 (two running tasks), 5 pending (-l h=!vm), a
#: pending array 7 (tasks 1-3), 8 being deleted, and another user's name.
QSTAT_XML = """<?xml version='1.0'?>
<job_info  xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/qstat.xsd">
  <queue_info>
    <job_list state="running">
      <JB_job_number>4</JB_job_number>
      <JAT_prio>0.50000</JAT_prio>
      <JB_name>sge-node</JB_name>
      <JB_owner>root</JB_owner>
      <state>r</state>
      <JAT_start_time>2026-11-28T14:17:28</JAT_start_time>
      <queue_name>main@vm</queue_name>
      <slots>1</slots>
      <tasks>1</tasks>
    </job_list>
    <job_list state="running">
      <JB_job_number>4</JB_job_number>
      <JAT_prio>0.50000</JAT_prio>
      <JB_name>sge-node</JB_name>
      <JB_owner>root</JB_owner>
      <state>dr</state>
      <JAT_start_time>2026-11-28T14:17:28</JAT_start_time>
      <queue_name>main@vm</queue_name>
      <slots>1</slots>
      <tasks>2</tasks>
    </job_list>
  </queue_info>
  <job_info>
    <job_list state="pending">
      <JB_job_number>5</JB_job_number>
      <JAT_prio>0.50000</JAT_prio>
      <JB_name>sge-node</JB_name>
      <JB_owner>root</JB_owner>
      <state>qw</state>
      <JB_submission_time>2026-11-28T14:17:28</JB_submission_time>
      <queue_name></queue_name>
      <slots>1</slots>
    </job_list>
    <job_list state="pending">
      <JB_job_number>7</JB_job_number>
      <JAT_prio>0.00000</JAT_prio>
      <JB_name>sge-node</JB_name>
      <JB_owner>root</JB_owner>
      <state>qw</state>
      <JB_submission_time>2026-11-28T14:17:30</JB_submission_time>
      <queue_name></queue_name>
      <slots>1</slots>
      <tasks>1-3:1</tasks>
    </job_list>
    <job_list state="pending">
      <JB_job_number>9</JB_job_number>
      <JAT_prio>0.00000</JAT_prio>
      <JB_name>sgex-node</JB_name>
      <JB_owner>root</JB_owner>
      <state>Eqw</state>
      <JB_submission_time>2026-11-28T14:17:30</JB_submission_time>
      <queue_name></queue_name>
      <slots>1</slots>
    </job_list>
  </job_info>
</job_info>
"""


def test_qstat_xml_is_one_job_per_array_task_of_the_prefix() -> None:
    assert parse_qstat(QSTAT_XML, "sge") == [
        EngineJob("4.1", "sge-node", RUNNING), EngineJob("4.2", "sge-node", ENDING),
        EngineJob("5", "sge-node", PENDING), EngineJob("7.1", "sge-node", PENDING),
        EngineJob("7.2", "sge-node", PENDING), EngineJob("7.3", "sge-node", PENDING)]
    assert parse_qstat(QSTAT_XML, "sgex") == [
        EngineJob("9", "sgex-node", PENDING, "error state (qstat -j JOB says why)")]
    assert parse_qstat("<?xml version='1.0'?><job_info><queue_info/><job_info/></job_info>",
                       "sge") == []
    with pytest.raises(EngineError, match="qstat: its XML cannot be read"):
        parse_qstat("error: commlib error: got select error (Connection refused)", "sge")


@pytest.mark.parametrize(("code", "state"), [
    ("qw", PENDING), ("hqw", PENDING), ("Eqw", PENDING), ("r", RUNNING), ("t", RUNNING),
    ("Rr", RUNNING), ("s", RUNNING), ("dr", ENDING), ("dt", ENDING), ("?", PENDING)])
def test_states(code: str, state: str) -> None:
    assert engine_state(code)[0] == state


def test_task_lists_and_terse_ids() -> None:
    assert expand_tasks("1-4:1") == ["1", "2", "3", "4"]
    assert expand_tasks("1-5:2") == ["1", "3", "5"]
    assert expand_tasks("3,5") == ["3", "5"]
    assert parse_submitted("4.1-2:1\n", 2) == ["4.1", "4.2"]
    assert parse_submitted("12.1-1:1\n", 1) == ["12.1"]
    with pytest.raises(EngineError, match="expected a job id"):
        parse_submitted("Unable to run job: job rejected", 1)


def test_the_qsub_line_asks_for_an_array_and_keeps_off_excluded_hosts() -> None:
    engine = GridEngine(queue="main", pe="smp", options=("-P", "regress"))
    assert engine.qsub_argv("sge-node", 1, 3) == [
        "qsub", "-terse", "-N", "sge-node", "-t", "1-3", "-V", "-cwd", "-j", "y", "-o",
        "/dev/null", "-S", "/bin/sh", "-q", "main", "-P", "regress"]
    words = engine.qsub_argv("sge-node", 4, 1, ["vm"])
    assert words[words.index("-pe"):words.index("-pe") + 3] == ["-pe", "smp", "4"]
    assert words[words.index("-l") + 1] == "h=!vm"
    both = GridEngine().qsub_argv("sge-node", 1, 1, ["a", "b.example"])
    assert both[both.index("-l") + 1] == "h=!(a|b.example)"
    with pytest.raises(EngineError, match="not a host name"):
        GridEngine().qsub_argv("sge-node", 1, 1, ["a|b"])


def test_the_engine_is_one_setting() -> None:
    assert isinstance(make_engine(Config()), SlurmEngine)
    sge = make_engine(Config(provision_engine="gridengine", gridengine_queue="q1"))
    assert isinstance(sge, GridEngine) and sge.queue == "q1" and sge.label == "Grid Engine"
    own = make_engine(Config(provision_engine="tests.unit.test_scaler:ScriptedEngine"))
    assert type(own).__name__ == "ScriptedEngine"
    for bad, said in (("pbs", "expected slurm, gridengine, or module:Class"),
                      ("no.such.module:X", "cannot be imported"),
                      ("tests.unit.test_scaler:Nothing", "has no class Nothing"),
                      ("cluster.config:Config", "it lacks label, job_id_shell")):
        with pytest.raises(ConfigError, match=said):
            make_engine(Config(provision_engine=bad))
