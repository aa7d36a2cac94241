"""The per-run options' grammar and a run's effective settings (cluster.runoptions), and
the queue line that carries them (cluster.queue)."""

from __future__ import annotations

import pytest

from cluster.config import Config
from cluster.errors import QueueLineError
from cluster.runoptions import RunOptionError, RunOptions, check_words, parse_duration
from cluster.runspec import RunSpec


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1.5h", 5400.0), ("2d", 172800.0),
    ("30d", 30 * 86400.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration("job_timeout", text) == seconds


@pytest.mark.parametrize("word", [
    "job_timeout=0", "job_timeout=-5", "job_timeout=nan", "job_timeout=inf", "job_timeout=1e3",
    "job_timeout=31d", "job_timeout=5 m", "queue_timeout=", "task_timeout=1w",
    "max_failed_nodes=-1", "max_worker_instances=0", "max_cluster_instances=1.5",
    "max_worker_instances=100001", "max_cluster_instances=٣", "groups=a/b", "groups=a,,b",
    "groups=a,a", "exclude=../n1", "after=", "name=-x", "name=a/b", "exclusive=yes",
    "groups=" + ",".join(f"g{i}" for i in range(65))])
def test_bad_values_are_refused_naming_the_option(word: str) -> None:
    key = word.partition("=")[0]
    with pytest.raises(QueueLineError, match=key):
        RunSpec.parse(f"user bob gs {word}")


def test_a_run_after_itself_is_refused() -> None:
    with pytest.raises(RunOptionError, match=r"after=b,a names the run itself \(name=a\)"):
        check_words(["name=a", "after=b,a"])
    with pytest.raises(QueueLineError, match="names the run itself"):
        RunSpec.parse("user bob gs name=a after=a")


def test_unknown_options_and_repeats_are_refused() -> None:
    with pytest.raises(QueueLineError, match="unknown option 'job_timeut'"):
        RunSpec.parse("user bob gs job_timeut=5")
    with pytest.raises(QueueLineError, match="given twice"):
        RunSpec.parse("user bob gs exclusive exclusive")


def test_the_options_travel_on_the_queue_line_canonically() -> None:
    spec = RunSpec.parse("user bob gs,pcl groups=win64,lin exclusive job_timeout=2h lowres")
    assert spec.line() == "user bob gs,pcl exclusive groups=win64,lin job_timeout=2h lowres"
    assert RunSpec.parse(spec.line()) == spec
    sweep = RunSpec.parse("user s sweep every_node task_timeout=30 sweep=s.toml")
    assert sweep.option("task_timeout") == "30"


def test_effective_settings_default_to_the_global_ones() -> None:
    cfg = Config(max_run_time=7200.0, max_failed_nodes=10)
    plain = RunOptions.of(["lowres"], cfg)
    assert (plain.job_timeout, plain.queue_timeout, plain.task_timeout) == (7200.0, None, None)
    assert (plain.max_failed_nodes, plain.max_worker_instances,
            plain.max_cluster_instances) == (10, None, None)
    assert not (plain.exclusive or plain.no_reschedule or plain.every_node)
    assert plain.given == () and plain.placed("n1", [])
    spec = RunSpec.parse("user bob gs job_timeout=15m queue_timeout=1h task_timeout=30 "
                         "max_failed_nodes=0 max_worker_instances=1 max_cluster_instances=4 "
                         "exclusive no_reschedule every_node groups=win64,mac exclude=n2 "
                         "name=nightly-gs after=nightly-build,20261126010000-p2-aa00")
    opts = RunOptions.of(spec.options, cfg)
    assert (opts.job_timeout, opts.queue_timeout, opts.task_timeout) == (900.0, 3600.0, 30.0)
    assert (opts.max_failed_nodes, opts.max_worker_instances,
            opts.max_cluster_instances) == (0, 1, 4)
    assert opts.exclusive and opts.no_reschedule and opts.every_node
    assert opts.groups == ("win64", "mac") and opts.exclude == ("n2",)
    assert opts.name == "nightly-gs"
    assert opts.after == ("nightly-build", "20261126010000-p2-aa00")
    assert "groups=win64,mac" in opts.given and "lowres" not in opts.given
    assert opts.placed("n1", ["mac"]) and not opts.placed("n1", ["linux"])
    assert not opts.placed("n2", ["win64"])
