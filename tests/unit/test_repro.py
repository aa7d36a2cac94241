"""The pure parts of ``clusteradmin repro`` (docs/operating.md, "Reproducing one job:
`clusteradmin repro`"): the archive's job list read back, the node's keys read from its
build log, a reused row's maker, the placeholders filled and the output kept."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.console import repro, reprorun
from cluster.home import Home
from cluster.jobs.commands import (
    JobConfig,
    mupdf_command,
    raster_command,
    shell_command,
    two_stage_command,
)
from cluster.master.files import reprokeep
from cluster.node import builddigest
from cluster.records import BIN, TEMP, TESTS

RUN = "20261128120000-p0-abcd"
NAME = "tests__ex__golfer.eps.ppmraw.72.0"


def test_keep_jobs_compresses_the_job_list_and_job_line_finds_a_test(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    lines = [f"t{i}.ppmraw.72.0 __temp__/t{i}.log true ; echo {i}" for i in range(2000)]
    jobs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    archive = tmp_path / "archive"
    archive.mkdir()
    assert reprokeep.keep_jobs(jobs, archive)
    kept = archive / reprokeep.JOBS_NAME
    assert gzip.decompress(kept.read_bytes()) == jobs.read_bytes()
    assert kept.stat().st_size < jobs.stat().st_size / 5
    assert reprokeep.job_line(archive, "t1999.ppmraw.72.0") == lines[1999]
    # A prefix of other tests' ids is not a test.
    assert reprokeep.job_line(archive, "t1") is None
    assert reprokeep.job_line(archive, "t1.ppmraw.72.0") == lines[1]
    assert reprokeep.job_line(archive, "t2000.ppmraw.72.0") is None
    assert not reprokeep.keep_jobs(tmp_path / "none", archive)


def test_keep_source_moves_the_snapshot_once(tmp_path: Path) -> None:
    snapshot = tmp_path / "runs" / RUN / "source" / "ghostpdl"
    snapshot.mkdir(parents=True)
    (snapshot / "Makefile").write_text("all:\n", encoding="utf-8")
    archive = tmp_path / "archive" / RUN
    moved = reprokeep.keep_source(snapshot, archive)
    assert moved == archive / "source" / "ghostpdl" and (moved / "Makefile").is_file()
    assert not snapshot.exists()
    assert reprokeep.keep_source(snapshot, archive) is None  # a cut end step, done again
    assert reprokeep.kept_source(archive, "ghostpdl") == moved
    assert reprokeep.kept_source(archive, "mupdf") is None


def test_keys_line_round_trips_and_other_lines_are_not_keys() -> None:
    env, gs, pcl = "a" * 64, "b" * 64, "c" * 64
    line = builddigest.keys_line("node1", RUN, env, [("gpcl6", pcl), ("gs", gs)])
    assert builddigest.parse_keys_line(line + "\n") == (
        "node1", RUN, env, (("gpcl6", pcl), ("gs", gs)))
    assert builddigest.parse_keys_line("node node1: build command ended after 0.0 s") is None
    assert builddigest.parse_keys_line(line.replace(env, "short")) is None


def test_environment_digest_moves_with_an_environment_variable(tmp_path: Path) -> None:
    one = builddigest.environment_digest({"PATH": "/bin"})
    assert one == builddigest.environment_digest({"PATH": "/usr/bin"})  # not a part
    assert one != builddigest.environment_digest({"GS_LIB": "/x"})
    font = tmp_path / "font"
    font.write_bytes(b"1")
    with_font = builddigest.environment_digest({}, [font])
    font.write_bytes(b"2")
    assert with_font != builddigest.environment_digest({}, [font])


def test_node_keys_takes_the_last_keys_of_the_node_and_run(tmp_path: Path) -> None:
    log = tmp_path / "node1.build.log"
    first = builddigest.keys_line("node1", RUN, "1" * 64, [("gs", "2" * 64)])
    last = builddigest.keys_line("node1", RUN, "3" * 64, [("gs", "4" * 64)])
    other = builddigest.keys_line("node1", "20261128110000-p0-0000", "5" * 64, [])
    log.write_text("node node1: building runs/x/source/ghostpdl for run x\n"
                   "node node1: build folder /w/node1/build/user__alice__ghostpdl updated "
                   "from /w/node1/src/user__alice__ghostpdl: 3 files written, 0 deleted\n"
                   f"{first}\n{last}\n{other}\n", encoding="utf-8")
    keys = repro.node_keys(log, "node1", RUN)
    assert keys == repro.NodeKeys("/w/node1/build/user__alice__ghostpdl", "3" * 64,
                                  (("gs", "4" * 64),))
    assert repro.node_keys(tmp_path / "missing.log", "node1", RUN) == repro.NodeKeys(
        None, None, ())


def test_maker_of_a_reused_row_is_the_node_and_run_that_made_it() -> None:
    assert repro.maker("node2", RUN) == ("node2", RUN)
    assert repro.maker("cache:node1@20261127000000-p1-ffff", RUN) == (
        "node1", "20261127000000-p1-ffff")
    assert repro.maker("cache:broken", RUN) == ("cache:broken", RUN)


def test_fill_puts_temp_in_first_and_programs_are_named_once() -> None:
    tc = JobConfig.parse("pdf.ppmraw.72.0")
    command = two_stage_command(NAME, "ex/golfer.eps", tc, 1000)
    filled = repro.fill(command, {TEMP: "/t", BIN: "/b", TESTS: "/c"})
    assert "__" not in filled.replace(NAME, "")
    assert "/b/gs -sOutputFile=/t/" in filled and "< /c/ex/golfer.eps" in filled
    assert repro.programs(command) == ["gs"]


@pytest.mark.parametrize("config,make", [
    ("ppmraw.72.0", raster_command),
    ("tiff24nc.72.0", raster_command),
    ("pdf.ppmraw.72.0", two_stage_command),
])
def test_keeping_output_keeps_the_raster_and_its_md5(config: str, make: object) -> None:
    tc = JobConfig.parse(config)
    command = make(NAME, "ex/golfer.eps", tc, 1000)  # type: ignore[operator]
    kept = repro.keeping_output(command, NAME)
    raster = f"{TEMP}/{NAME}.raster"
    assert raster in kept and " ; rm -f " not in kept
    assert kept.count("md5sum") == command.count("md5sum")
    # One tee per rendering (the log's echo of it shows it too), never two in a row.
    assert "| tee" not in kept.replace(f"|tee {raster} | md5sum", "")
    if tc.device.startswith("tiff"):
        assert kept.count("tee") == 0  # the seeking device writes the raster file itself


def test_keeping_output_of_mupdf_tees_the_stream_and_leaves_shell_jobs_alone() -> None:
    command = mupdf_command(NAME, "ex/a.pdf", JobConfig.parse("ppmraw.72.0"))
    kept = repro.keeping_output(command, NAME)
    assert f"| tee {TEMP}/{NAME}.raster | md5sum >> {TEMP}/{NAME}.md5" in kept
    assert kept.count("tee ") == 1
    shell = shell_command("echo17", "echo 17")
    assert repro.keeping_output(shell, "echo17") == shell


def test_lines_say_same_or_different_and_what_the_run_recorded() -> None:
    assert repro.compare_line("a" * 32, "a" * 32) == f"md5 {'a' * 32}  run {'a' * 32}  same"
    assert repro.compare_line("a" * 32, "b" * 32).endswith("  DIFFERENT")
    assert repro.key_line("environment digest", "x", "x") == \
        "environment digest x (the run's: same)"
    assert repro.key_line("environment digest", "x", "y") == \
        "environment digest x (the run's: y)"
    assert repro.key_line("build digest gs", "x", None).endswith("(the run's: not recorded)")


def _archive(home: Home, jobs: bool = True) -> Path:
    folder = home.archive / RUN
    folder.mkdir(parents=True)
    (folder / "run.info").write_text(
        f"id {RUN}\npriority 0\nqueue user alice gs\nkind user\nref alice\nproducts gs\n"
        f"tree ghostpdl\nsource runs/{RUN}/source/ghostpdl\nbuild make\ntests tests\n"
        "options\nelapsed 1.0\noutcome done\n", encoding="utf-8")
    (folder / f"{RUN}.tab").write_text(
        f"{NAME}\t0\t0.05\t0.00\t0.00\t0\t{'e' * 32}\t{RUN}\tgs\tnode1\n", encoding="utf-8")
    if jobs:
        line = f"{NAME} __temp__/{NAME}.log true ; echo gs"
        (folder / reprokeep.JOBS_NAME).write_bytes(gzip.compress(line.encode() + b"\n"))
    return folder


def test_find_reads_the_row_the_job_and_names_what_is_unknown(tmp_path: Path) -> None:
    home = Home(tmp_path)
    _archive(home)
    found = repro.find(home, RUN, "tests/ex/golfer.eps.ppmraw.72.0")
    assert (found.node, found.made_in, found.row.md5) == ("node1", RUN, "e" * 32)
    assert found.job.command == "echo gs" and not found.reused
    assert found.keys == repro.NodeKeys(None, None, ())
    with pytest.raises(repro.ReproUsage, match="unknown run '20261128000000-p0-0000'"):
        repro.find(home, "20261128000000-p0-0000", NAME)
    with pytest.raises(repro.ReproUsage, match="unknown test 'nope.ppmraw.72.0'"):
        repro.find(home, RUN, "nope.ppmraw.72.0")


def test_find_in_a_run_archived_without_a_job_list_cannot_run(tmp_path: Path) -> None:
    home = Home(tmp_path)
    _archive(home, jobs=False)
    with pytest.raises(repro.ReproCannot, match="kept no job list"):
        repro.find(home, RUN, NAME)


def test_the_home_clean_up_leaves_a_kept_snapshot_alone(tmp_path: Path) -> None:
    """A dead writer's temp file is removed from an archived run's folders, never from the
    user's files of its kept snapshot (a file there may be named like one)."""
    home = Home(tmp_path)
    folder = _archive(home)
    dead = 999_999_999  # no such pid
    name = f".x.{dead}.abcdefgh.tmp"
    for where in (folder / "logs", folder / "source" / "ghostpdl" / "base"):
        where.mkdir(parents=True)
        (where / name).write_text("", encoding="utf-8")
    removed = home.clean_temps()
    assert removed == [folder / "logs" / name]
    assert (folder / "source" / "ghostpdl" / "base" / name).is_file()
    (folder / "logs" / name).write_text("", encoding="utf-8")
    assert home.clean_temps(RUN) == [folder / "logs" / name]


def test_a_node_build_that_is_gone_or_elsewhere_is_not_here(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    _archive(home)
    found = repro.find(home, RUN, NAME)
    work = tmp_path / "node-work" / "node1"
    build_dir = work / "build" / "user__alice__ghostpdl"
    found = dataclasses.replace(found, keys=repro.NodeKeys(str(build_dir), None, ()))
    with pytest.raises(repro.NotHere, match="is not on this machine"):
        reprorun.on_node(found, "node1", Config())
    (work / "build").mkdir(parents=True)
    with pytest.raises(repro.NotHere, match="is gone"):
        reprorun.on_node(found, "node1", Config())
    build_dir.mkdir()
    place = reprorun.on_node(found, "node1", Config())
    assert place.bin_dir == build_dir / "bin" and place.tests == work / "tests"
    with pytest.raises(repro.ReproCannot, match="bin/gs is missing or not executable"):
        reprorun.run(dataclasses.replace(found, job=dataclasses.replace(
            found.job, command="__bin__/gs -v")), place, tmp_path / "out", Config())
