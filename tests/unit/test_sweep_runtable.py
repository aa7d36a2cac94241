"""A sweep file's [run] table (docs/runoptions.md): each key a per-run option, its TOML value turned
into the option word of the sweep run's queue line, every problem refused naming
``run.<key>`` and what was expected (cluster.sweep.runtable, through the sweep file's
loader as a submission reads it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.errors import SweepError
from cluster.runspec import RunSpec
from cluster.sweep.spec import load
from cluster.triggers.sweeppush import prepare_sweep

HEAD = 'command = "echo {a}"\n[axes]\na = [1, 2]\n'


def sweep_file(tmp_path: Path, run_table: str) -> Path:
    folder = tmp_path / "sweep"
    folder.mkdir(exist_ok=True)
    path = folder / "sweep.toml"
    path.write_text(HEAD + "[run]\n" + run_table, encoding="utf-8")
    return path


def words(tmp_path: Path, run_table: str) -> tuple[str, ...]:
    return load(sweep_file(tmp_path, run_table)).run


def refused(tmp_path: Path, run_table: str) -> SweepError:
    with pytest.raises(SweepError) as info:
        load(sweep_file(tmp_path, run_table))
    return info.value


def test_every_kind_of_option_becomes_its_word(tmp_path: Path) -> None:
    got = words(tmp_path, 'job_timeout = "2h"\nqueue_timeout = 90\ntask_timeout = 1.5\n'
                'max_failed_nodes = 0\nmax_worker_instances = 1\nmax_cluster_instances = "3"\n'
                'groups = ["win64", "fast"]\nexclude = "n1,n2"\nname = "nightly-model"\n'
                'after = ["nightly-build"]\nexclusive = true\nno_reschedule = false\n'
                'every_node = false\n')
    assert got == ("after=nightly-build", "exclude=n1,n2", "exclusive", "groups=win64,fast",
                   "job_timeout=2h", "max_cluster_instances=3", "max_failed_nodes=0",
                   "max_worker_instances=1", "name=nightly-model", "queue_timeout=90",
                   "task_timeout=1.5")
    # Every word is one the queue line takes, for a sweep run too.
    assert RunSpec.parse("user al sweep " + " ".join(got)).options == got


def test_an_empty_or_absent_run_table_gives_no_words(tmp_path: Path) -> None:
    assert words(tmp_path, "") == ()
    assert words(tmp_path, "exclusive = false\n") == ()


@pytest.mark.parametrize(("table", "key", "expected"), [
    ('slots = 4\n', "run.slots", "not a per-run option; expected one of job_timeout"),
    ('"job timeout" = "2h"\n', 'run."job timeout"', "not a per-run option"),
    ('job_timeout = "-1"\n', "run.job_timeout", "expected a duration in seconds"),
    ('job_timeout = -5\n', "run.job_timeout", "expected a duration in seconds"),
    ('job_timeout = nan\n', "run.job_timeout", "expected a duration in seconds"),
    ('job_timeout = inf\n', "run.job_timeout", "expected a duration in seconds"),
    ('job_timeout = "31d"\n', "run.job_timeout", "at most 30 days"),
    ('job_timeout = true\n', "run.job_timeout", "got a boolean, expected a duration"),
    ('queue_timeout = [1]\n', "run.queue_timeout", "got a list, expected a duration"),
    ('max_worker_instances = 0\n', "run.max_worker_instances",
     "expected a whole number from 1 to"),
    ('max_failed_nodes = -1\n', "run.max_failed_nodes", "expected a whole number from 0 to"),
    ('max_cluster_instances = 1.5\n', "run.max_cluster_instances",
     "got a float, expected a whole number"),
    ('exclusive = "yes"\n', "run.exclusive", "got a string, expected true or false"),
    ('every_node = 1\n', "run.every_node", "got an integer, expected true or false"),
    ('groups = "a/b"\n', "run.groups", "no '/'"),
    ('groups = []\n', "run.groups", "got a list, expected a string of comma-separated names"),
    ('groups = ["a", 1]\n', "run.groups", "expected a string of comma-separated names"),
    ('exclude = "n1,n1"\n', "run.exclude", "'n1' listed twice"),
    ('name = "../x"\n', "run.name", "expected a run name"),
    ('name = 7\n', "run.name", "got an integer, expected a string"),
    ('name = "a"\nafter = "b,a"\n', "run.after", "names the run itself (name=a)"),
])
def test_a_bad_key_or_value_is_refused_naming_it(tmp_path: Path, table: str, key: str,
                                                 expected: str) -> None:
    error = refused(tmp_path, table)
    assert error.key == key
    assert error.where == "sweep.toml"
    assert expected in error.problem, error.problem
    assert f"key {key}:" in str(error)


def test_the_submission_carries_the_words_and_a_given_word_replaces_the_tables(
        tmp_path: Path) -> None:
    path = sweep_file(tmp_path, 'job_timeout = "2h"\nexclusive = true\n')
    submission = prepare_sweep(path)
    assert submission.words == ["sweep", "sweep=sweep.toml", "exclusive", "job_timeout=2h"]
    assert submission.words_with(["job_timeout=3h", "relaxtimeout"]) == [
        "sweep", "sweep=sweep.toml", "exclusive", "job_timeout=3h", "relaxtimeout"]
