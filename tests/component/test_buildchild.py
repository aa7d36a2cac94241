"""build.py's job list made in a forked child of the master (cluster/master/buildchild.py):
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
from cluster.master import buildchild
from tests.helpers import CORPUS, REPO


def _run(main: buildchild.JobListMain, tmp_path: Path, timeout: float = 30.0,
         args: tuple[str, ...] = ()) -> tuple[buildchild.Made, str]:
    path = tmp_path / "jobs"
    with open(path, "w", encoding="utf-8") as out:
        made = buildchild.run(main, list(args), out, timeout)
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
    assert made.returncode == buildchild.CRASHED and jobs == ""
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


@pytest.mark.parametrize("code", [0, 1, 3])
def test_the_status_is_the_mains(tmp_path: Path, code: int) -> None:
    made, _ = _run(lambda argv: code, tmp_path)
    assert made.returncode == code
