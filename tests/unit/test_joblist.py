"""The job list by index: names in memory, lines in memory or read from the jobs file; and
the master's build.py call that writes the jobs file (bounded by build_timeout)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.master.model import joblist
from cluster.master.model.joblist import JobFile, MemoryJobList
from cluster.master.run import runsetup
from cluster.master.run.clustermaster import ClusterMaster
from cluster.master.run.runsetup import JobListError
from cluster.records import Job
from cluster.wire.jobstart import JobStart


def job(i: int, command: str = "echo hi") -> Job:
    return Job(f"t{i}.ps.ppmraw.72.0", f"__temp__/t{i}.log", command)


def test_memory_list_keeps_the_first_job_of_a_name() -> None:
    jobs = MemoryJobList([job(1), job(2), job(1, "other")])
    assert jobs.names == ["t1.ps.ppmraw.72.0", "t2.ps.ppmraw.72.0"]
    assert jobs.index["t2.ps.ppmraw.72.0"] == 1 and "t1.ps.ppmraw.72.0" in jobs
    assert jobs.lines([1, 0]) == [job(2).line, job(1).line]


def test_job_file_indexes_lines_and_reads_any_selection(tmp_path: Path) -> None:
    jobs = [job(i, f"echo {i} | md5sum") for i in range(10)]
    path = tmp_path / "jobs"
    path.write_text("".join(j.line + "\n" for j in jobs))
    got = JobFile(path)
    try:
        assert got.names == [j.name for j in jobs] and len(got) == 10
        assert got.dense  # every line a job: consecutive jobs are one read
        assert got.lines(list(range(10))) == [j.line for j in jobs]  # one read
        assert got.lines(list(range(4, 7))) == [j.line for j in jobs[4:7]]
        assert got.lines([3, 4, 7, 0, 1]) == [jobs[i].line for i in (3, 4, 7, 0, 1)]
        assert got.line(9) == jobs[9].line and got.lines([]) == []
    finally:
        got.close()


def test_job_file_skips_what_job_parse_rejects(tmp_path: Path) -> None:
    """Blank lines silently; bad lines and repeated ids counted and described."""
    path = tmp_path / "jobs"
    path.write_text("\n".join([
        job(1).line, "", "   ", "not a job line", "bad name!x log true ; echo",
        "t2 log true ; ", job(1, "again").line, job(3).line]) + "\n")
    got = JobFile(path)
    assert got.names == [job(1).name, job(3).name]
    assert not got.dense
    assert got.lines([0, 1]) == [job(1).line, job(3).line]  # not adjacent in the file
    assert got.skipped == 4 and len(got.problems) == 4
    assert ":4: " in got.problems[0] and "empty command" in got.problems[2]
    assert "used by an earlier line" in got.problems[3]
    got.close()


def test_job_file_without_final_newline_and_with_utf8(tmp_path: Path) -> None:
    lines = [job(1, "echo é | md5sum").line, job(2, "echo ü€").line, job(3).line]
    path = tmp_path / "jobs"
    path.write_bytes("\n".join(lines).encode())  # multi-byte characters: byte offsets
    got = JobFile(path)
    assert got.lines([0, 1, 2]) == lines and got.lines([2]) == [lines[2]]
    got.close()


def test_job_file_lines_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setattr(joblist, "_CHUNK", 7)  # every line spans several reads
    jobs = [job(i, "x" * (i % 5 + 1)) for i in range(50)]
    path = tmp_path / "jobs"
    path.write_text("".join(j.line + "\n" for j in jobs))
    got = JobFile(path)
    assert got.lines(list(range(50))) == [j.line for j in jobs]
    got.close()


def test_job_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs"
    path.write_bytes(job(1).line.encode() + b"\n" + b"t2 log true ; echo \xff\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        JobFile(path)


def test_empty_job_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs"
    path.write_text("")
    got = JobFile(path)
    assert len(got) == 0 and got.skipped == 0
    got.close()


# ------------------------------------------------------------------ the master's build.py call
def _master_with_build_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str,
                              build_timeout: float) -> tuple[ClusterMaster, JobStart]:
    """A master whose build.py is ``body``, and the job.start of a run to make jobs for."""
    script = tmp_path / "build.py"
    script.write_text(body)
    monkeypatch.setattr(runsetup, "BUILD_SCRIPT", script)
    cfg = Config().with_changes(home=tmp_path / "home", build_timeout=build_timeout)
    master = ClusterMaster(cfg, 0)
    master.home.create()
    start = JobStart(id="run-1", priority=0, queue="user ann gs", kind="user", ref="ann",
                     products=("gs",), tree="ghostpdl", source="users/ann/ghostpdl",
                     build="make", tests="tests")
    return master, start


def test_build_py_past_build_timeout_is_a_job_list_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A hung build.py is killed after build_timeout; no jobs file, no temporary file."""
    master, start = _master_with_build_script(
        tmp_path, monkeypatch, "import time\nprint('t1 log true ; echo 1')\ntime.sleep(60)\n",
        build_timeout=0.5)
    began = time.monotonic()
    with pytest.raises(JobListError, match=r"build\.py failed: timed out after 0\.5 s"):
        master.setup.jobs(start)
    assert time.monotonic() - began < 30
    assert list(master.home.jobs(0).parent.glob(f"*{master.home.jobs(0).name}*")) == []


def test_build_py_output_becomes_the_jobs_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    master, start = _master_with_build_script(
        tmp_path, monkeypatch, "print('t1 log true ; echo 1')\nprint('t2 log true ; echo 2')\n",
        build_timeout=60)
    jobs = master.setup.jobs(start)
    assert jobs.names == ["t1", "t2"]
    jobs.close()
    assert master.home.jobs(0).read_text() == "t1 log true ; echo 1\nt2 log true ; echo 2\n"


def test_the_jobs_file_is_made_slowest_first_and_a_takeover_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowest first: ordered once, by the baseline's times, when the file is made; a master
    that takes the run over reuses the file, so it hands out the same order."""
    master, start = _master_with_build_script(
        tmp_path, monkeypatch,
        "".join(f"print('t{i} log true ; echo {i}')\n" for i in (1, 2, 3, 4)),
        build_timeout=60)
    master.home.tables.mkdir(parents=True, exist_ok=True)
    (master.home.tables / "current.tab").write_text(
        "".join(f"t{i}\t0\t{t}\t0.00\t0.00\t0\t{'a' * 32}\tr\tgs\tn1\n"
                for i, t in ((1, "0.50"), (2, "9.00"), (3, "2.00"))))
    jobs = master.setup.jobs(start)
    assert jobs.names == ["t4", "t2", "t3", "t1"]  # t4 unknown, then the longest first
    jobs.close()
    (master.home.tables / "current.tab").unlink()  # a successor sees another baseline
    again = master.setup.jobs(start)
    assert again.names == ["t4", "t2", "t3", "t1"]
    again.close()


def test_failing_build_py_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    master, start = _master_with_build_script(
        tmp_path, monkeypatch, "import sys\nsys.exit('no corpus here')\n", build_timeout=60)
    with pytest.raises(JobListError, match=r"build\.py failed: exit status 1: no corpus here"):
        master.setup.jobs(start)
    assert not master.home.jobs(0).exists()


def test_consecutive_indexes_are_told_apart_from_any_others() -> None:
    assert joblist.consecutive([4]) and joblist.consecutive([4, 5, 6])
    assert joblist.consecutive(range(7, 10)) and joblist.consecutive((0, 1))
    assert not joblist.consecutive([]) and not joblist.consecutive([4, 6])
    assert not joblist.consecutive([6, 5, 4]) and not joblist.consecutive([4, 6, 6])
    assert not joblist.consecutive([4, 9, 6])  # the ends alone would say yes
