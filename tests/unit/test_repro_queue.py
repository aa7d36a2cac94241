"""A repro run (docs/operating.md, "Reproducing one job: `clusteradmin repro`"): its queue
line and options (``repro=``, ``nodes=``), the one predicate of runs outside the stream,
the job list the master makes of it, and what clusteradmin reads of its archive."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pytest

from cluster.config import DEFAULTS, Config
from cluster.console import repro, reproqueue
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.master.files import reprokeep
from cluster.master.run.runsetup import JobListError, RunSetup
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.runoptions import RunOptions
from cluster.runspec import RunSpec, outside_stream
from cluster.runtime.clock import FakeClock
from cluster.triggers.droppings import same_push
from tests.unit.test_repro import NAME, RUN, _archive


def _found(home: Home, options: str = "", snapshot: bool = True) -> repro.Found:
    folder = _archive(home)
    info = folder / "run.info"
    info.write_text(info.read_text().replace("queue user alice gs\n",
                                             f"queue user alice gs {options}\n")
                    .replace("options\n", f"options {options}\n"), encoding="utf-8")
    if snapshot:
        (folder / reprokeep.SOURCE_DIR / "ghostpdl").mkdir(parents=True)
    return repro.find(home, RUN, NAME)


def test_the_repro_line_carries_the_runs_source_and_how_its_node_ran_a_job(
        tmp_path: Path) -> None:
    home = Home(tmp_path)
    found = _found(home, "lowres relaxtimeout task_timeout=5m filter=a max_failed_nodes=2")
    spec = reproqueue.repro_spec(found, "node2", 59.5)
    assert spec.line() == (
        f"user alice gs confirm=no job_timeout=60 nodes=node2 queue_timeout=60 relaxtimeout "
        f"repro={RUN}:{NAME} reuse=no task_timeout=5m")
    assert RunSpec.parse(spec.line()) == spec
    assert spec.repro == (RUN, NAME) and spec.outside_stream
    options = RunOptions.of(spec.options, DEFAULTS)
    assert options.nodes == ("node2",) and not options.reuse and options.confirm is False
    assert options.placed("node2", ()) and not options.placed("node1", ())
    assert reproqueue.queue(home, spec) and not reproqueue.queue(home, spec)
    assert QueueFile.for_priority(home, reproqueue.REPRO_PRIORITY).read() == [spec]


def test_a_user_run_without_its_snapshot_or_a_sweep_is_not_queued(tmp_path: Path) -> None:
    found = _found(Home(tmp_path / "a"), snapshot=False)
    with pytest.raises(repro.ReproCannot, match="kept no source snapshot"):
        reproqueue.repro_spec(found, "node1", 60)
    swept = _found(Home(tmp_path / "b"))
    swept = dataclasses.replace(swept, start=dataclasses.replace(swept.start,
                                                                 products=("sweep",)))
    with pytest.raises(repro.ReproCannot, match="sweep run"):
        reproqueue.repro_spec(swept, "node1", 60)


@pytest.mark.parametrize("word", [f"repro={RUN}", f"repro=a/b:{NAME}", f"repro={RUN}:",
                                  f"repro={RUN}:/etc", f"repro=a.b:{NAME}"])
def test_bad_repro_words_are_refused(word: str) -> None:
    with pytest.raises(QueueLineError, match="repro"):
        RunSpec.parse(f"user bob gs {word}")


def test_repro_goes_with_any_kind_but_a_sweep() -> None:
    assert RunSpec.parse(f"git abc1234 gs tree=ghostpdl repro={RUN}:{NAME}").repro == (
        RUN, NAME)
    assert RunSpec.parse(f"auto nightly gs,pdfwrite repro={RUN}:{NAME}").outside_stream
    with pytest.raises(QueueLineError, match="repro"):
        RunSpec.parse(f"user bob sweep repro={RUN}:{NAME}")


def test_one_predicate_names_the_runs_outside_the_stream() -> None:
    assert outside_stream([f"repro={RUN}:{NAME}"])
    assert outside_stream([f"culprit={RUN}.3", "confirm=no"])
    assert not outside_stream(["reuse=no", "nodes=node2", "tree=ghostpdl", "repro"])
    assert not RunSpec.parse("git abc1234 gs tree=ghostpdl").outside_stream


def test_a_push_never_replaces_a_waiting_repro_run() -> None:
    push = RunSpec.parse("user alice gs")
    same = same_push(push)
    assert same(RunSpec.parse("user alice gs lowres"))
    assert not same(RunSpec.parse(f"user alice gs repro={RUN}:{NAME} nodes=node2"))


def test_the_master_makes_a_repro_runs_job_list_of_the_archived_line(tmp_path: Path) -> None:
    home = Home(tmp_path)
    folder = _archive(home)
    line = f"{NAME} __temp__/{NAME}.log timeout=12.5 ; echo gs"
    (folder / reprokeep.JOBS_NAME).write_bytes(gzip.compress(
        f"other.ps.ppmraw.72.0 __temp__/o.log true ; echo o\n{line}\n".encode()))
    setup = RunSetup(Config(), home, 0, QueueFile.for_priority(home, 0), FakeClock(), [])
    out = tmp_path / "jobs"
    with open(out, "w", encoding="utf-8") as fh:
        setup.repro_jobs(RunSpec.parse(f"user alice gs repro={RUN}:{NAME}"), fh)
    assert out.read_text() == line + "\n"  # its own timeout word kept
    assert Job.parse(line).timeout == 12.5
    with pytest.raises(JobListError, match="has no line of test nope"), \
            open(out, "w", encoding="utf-8") as fh:
        setup.repro_jobs(RunSpec.parse(f"user alice gs repro={RUN}:nope"), fh)


def test_repro_source_links_the_archived_snapshot(tmp_path: Path) -> None:
    home = Home(tmp_path)
    _found(home)
    kept = home.archive / RUN / reprokeep.SOURCE_DIR / "ghostpdl"
    (kept / "Makefile").write_text("all:\n", encoding="utf-8")
    setup = RunSetup(Config(), home, 0, QueueFile.for_priority(home, 0), FakeClock(), [])
    dest = tmp_path / "runs" / "r" / "source" / "ghostpdl"
    setup.repro_source(RunSpec.parse(f"user alice gs repro={RUN}:{NAME}"), dest)
    assert (dest / "Makefile").stat().st_ino == (kept / "Makefile").stat().st_ino
    with pytest.raises(ClusterError, match="kept no source snapshot"):
        setup.repro_source(RunSpec.parse(f"user alice gs tree=mupdf repro={RUN}:{NAME}"),
                           tmp_path / "other")


def test_a_node_must_be_known(tmp_path: Path) -> None:
    home = Home(tmp_path)
    found = _found(home)
    with pytest.raises(repro.ReproUsage, match="unknown node 'node9'"):
        reproqueue.check_node(home, found, "node9")
    with pytest.raises(repro.ReproUsage, match="bad node name"):
        reproqueue.check_node(home, found, "../x")
    home.nodes.mkdir(parents=True)
    (home.nodes / "node9.up").touch()
    reproqueue.check_node(home, found, "node9")
    (found.archive / "logs").mkdir()
    (found.archive / "logs" / "node7.log").touch()
    reproqueue.check_node(home, found, "node7")


def test_the_ended_repro_run_is_read_from_its_archive(tmp_path: Path) -> None:
    archive = tmp_path / "20261128130000-p0-beef"
    (archive / "logs").mkdir(parents=True)
    (archive / "run.info").write_text("id x\noutcome done\nnodes 1\n", encoding="utf-8")
    (archive / f"{archive.name}.tab").write_text(
        f"{NAME}\t0\t0.05\t0.00\t0.00\t0\t{'f' * 32}\t{archive.name}\tgs\tnode2\n",
        encoding="utf-8")
    (archive / "logs" / "node2.log").write_text(
        f"==={NAME}X===\nnot it\n\n==={NAME}===\nfirst\n\n==={NAME}===\ngs\n{'f' * 32}  -\n\n"
        "===other===\nx\n\n", encoding="utf-8")
    ended = reproqueue.result(archive, NAME, "node2")
    assert ended.complete and ended.row is not None and ended.row.machine == "node2"
    assert ended.log_block == f"==={NAME}===\ngs\n{'f' * 32}  -\n"
    assert reproqueue.log_block(archive / "logs" / "none.log", NAME) == ""

    (archive / "run.info").write_text(
        "id x\noutcome timed-out\nreason it ran 61.0 s, longer than its job_timeout 60 s\n",
        encoding="utf-8")
    (archive / f"{archive.name}.tab").unlink()
    (archive / "logs" / "node2.log").unlink()
    ended = reproqueue.result(archive, NAME, "node2")
    assert not ended.complete
    assert reproqueue.why_not(ended, "node2") == (
        f"repro run {archive.name} ended timed-out: it ran 61.0 s, longer than its "
        "job_timeout 60 s (node node2 never took it)")


def test_clusteradmin_repro_usage_errors_exit_2(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from cluster.cli import clusteradmin

    home = Home(tmp_path)
    home.create()
    _found(home)
    for words in (["--queue", "--here"], ["--wait-timeout", "0"],
                  ["--wait-timeout", "nan"], ["--node", "node9", "--queue"]):
        assert clusteradmin.main(["--home", str(tmp_path), "repro", RUN, NAME, *words]) == 2
        assert "clusteradmin" in capsys.readouterr().err, words
    assert QueueFile.for_priority(home, reproqueue.REPRO_PRIORITY).read() == []
