"""A program's main in a forked child (cluster/runtime/forkrun.py), as the master runs build.py:
the same lines as build.py run as a program, its stderr kept, its failures, crashes and
timeouts told apart, and nothing of it written through the master's own log handlers."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.cli.clustermaster import build_main
from cluster.runtime import forkrun
from tests.helpers import CORPUS, REPO


def _run(main: forkrun.Main, tmp_path: Path, timeout: float = 30.0,
         args: tuple[str, ...] = ()) -> tuple[forkrun.Made, str]:
    path = tmp_path / "jobs"
    with open(path, "w", encoding="utf-8") as out:
        made = forkrun.run(main, list(args), out, timeout)
    return made, path.read_text(encoding="utf-8")


def test_the_fork_writes_what_build_py_run_alone_prints(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    args = ["--home", str(home), "--tests", str(CORPUS.parent), "--seed", "7", "gs", "lowres"]
    alone = subprocess.run([sys.executable, str(REPO / "build.py"), *args],
                           capture_output=True, text=True, check=True, timeout=60)
    made, jobs = _run(build_main, tmp_path, args=tuple(args))
    assert made.ok and made.returncode == 0 and not made.timed_out
    assert jobs == alone.stdout and jobs.count("\n") > 10


def test_stderr_and_the_exit_status_come_back(tmp_path: Path) -> None:
    def main(argv: list[str]) -> int:
        print("a line", flush=True)
        logging.getLogger("cluster.build").warning("a warning for %s", argv)
        return 2

    made, jobs = _run(main, tmp_path, args=("x",))
    assert (made.returncode, made.timed_out, made.ok) == (2, False, False)
    assert jobs == "a line\n" and "a warning for ['x']" in made.stderr


def test_an_exception_is_status_70_with_its_traceback(tmp_path: Path) -> None:
    def main(argv: list[str]) -> int:
        raise RuntimeError("the corpus exploded")

    made, jobs = _run(main, tmp_path)
    assert made.returncode == forkrun.CRASHED and jobs == ""
    assert "RuntimeError: the corpus exploded" in made.stderr


def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    def main(argv: list[str]) -> int:
        time.sleep(60)
        return 0

    began = time.monotonic()
    made, _ = _run(main, tmp_path, timeout=0.3)
    assert made.timed_out and made.returncode == -9 and not made.ok
    assert time.monotonic() - began < 10


def test_the_child_logs_to_its_stderr_not_through_the_masters_handlers(
        tmp_path: Path) -> None:
    master_log = tmp_path / "clustermaster.log"
    handler = logging.FileHandler(master_log)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        def main(argv: list[str]) -> int:
            logging.getLogger("cluster.build").warning("from the child")
            return 0

        made, _ = _run(main, tmp_path)
    finally:
        root.removeHandler(handler)
        handler.close()
    assert made.ok and "from the child" in made.stderr
    assert "from the child" not in master_log.read_text()


@pytest.mark.parametrize(("exit_with", "code", "said"), [
    (None, 0, ""), (4, 4, ""), ("usage: no such word", 1, "usage: no such word")])
def test_sys_exit_in_main_is_its_status_as_for_a_program(
        tmp_path: Path, exit_with: object, code: int, said: str) -> None:
    def main(argv: list[str]) -> int:
        sys.exit(exit_with)

    made, _ = _run(main, tmp_path)
    assert made.returncode == code and said in made.stderr
    assert "Traceback" not in made.stderr


@pytest.mark.parametrize("code", [0, 1, 3])
def test_the_status_is_the_mains(tmp_path: Path, code: int) -> None:
    made, _ = _run(lambda argv: code, tmp_path)
    assert made.returncode == code


def test_the_master_orders_a_jobs_file_in_a_fork_and_only_with_a_baseline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """cluster.master.model.joborder.order_run_jobs: the ordering runs in a forked child, what
    it did is logged; without tables/current.tab nothing is started at all."""
    from cluster.master.model.joborder import order_run_jobs
    from cluster.report.tab import TabRow, write_tab

    def job(name: str) -> str:
        return f"{name} __temp__/{name}.log true ; echo {name} | md5sum"

    jobs, tables = tmp_path / "jobs", tmp_path / "tables"
    tables.mkdir()
    jobs.write_text("".join(job(n) + "\n" for n in "abc"))
    caplog.set_level(logging.INFO, logger="cluster.master")
    order_run_jobs(jobs, tables)
    assert "no baseline" in caplog.text and jobs.read_text().startswith(job("a"))
    write_tab(tables / "current.tab", [TabRow(n, 0, t, 0, 0, "a" * 32, "r", "gs", "n1")
                                       for n, t in (("a", 0.1), ("b", 0.2), ("c", 3.0))])
    caplog.clear()
    order_run_jobs(jobs, tables)
    assert "3 jobs, 3 with a known time; ordered slowest first" in caplog.text
    assert jobs.read_text() == "".join(job(n) + "\n" for n in "cba")


def test_the_outcome_in_words_is_a_programs(tmp_path: Path) -> None:
    """Made.describe says what proc.Result.describe says of a program: the master's
    messages for build.py read the same run in a fork or as a program."""
    assert _run(lambda argv: 2, tmp_path)[0].describe(30) == "exit status 2"

    def slow(argv: list[str]) -> int:
        time.sleep(60)
        return 0

    assert _run(slow, tmp_path, timeout=0.2)[0].describe(0.2) == "timed out after 0.2 s"
