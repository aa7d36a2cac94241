"""A node's jobs each write in a folder of their own, and a shell job's files are bounded.

run.py's engine against a scripted master on loopback (tests/component/test_node_run.py),
with real slot shells running real shell-product job lines (cluster.jobs.commands):

* two jobs running at once that write the same file name in ``__temp__`` each hash their
  own file (once they shared the run's one temp folder: the later write won for both);
* a job finds its folder empty (but for its own log and output), though the jobs before it
  in that folder left files behind: folders are cleared between jobs, and few are made;
* a shell job that writes a file past ``max_output_bytes`` -- a 10 GB sparse one, or 2 MB
  of zeros against a 1 MB bound -- is stopped by ``ulimit -f`` and fails with error 1,
  its output never hashed; one of exactly the bound is a result as usual.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.defaults import NODE_EXIT_DONE
from cluster.jobs.commands import shell_command
from cluster.node import nodejobs
from cluster.records import ERROR_NONE, ERROR_READ, TEMP, Job, JobResult
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request
from tests.component.test_node_run import RUN, ScriptedMaster, make_node_home, node, write_start

#: Seconds after which the scripted master ends the run, every result in or not.
GIVE_UP = 120.0


def shell_jobs(commands: dict[str, str]) -> tuple[str, ...]:
    """The job lines of product shell jobs ``{name: command}``, as the master hands them."""
    return tuple(Job(name, f"{TEMP}/{name}.log", shell_command(name, command)).line
                 for name, command in commands.items())


def script(lines: tuple[str, ...]) -> Callable[[Request, list[Request]], bytes]:
    """BUILD, then all the jobs at once, then CONTINUE until every result is in, then
    ABORT (run complete); ABORT all the same after :data:`GIVE_UP` seconds, so a node
    that lost a job cannot keep the test waiting."""
    given = {"done": False}
    deadline = time.monotonic() + GIVE_UP

    def answer(req: Request, seen: list[Request]) -> bytes:
        if time.monotonic() > deadline:
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if req.busy:
            return protocol.format_reply(Reply(protocol.CONTINUE))
        if req.failure:
            return protocol.format_reply(Reply(protocol.ABORT, reason="dropped"))
        if not given["done"]:
            given["done"] = True
            return protocol.format_reply(Reply(protocol.JOBS, lines))
        if sum(len(r.results) for r in seen) >= len(lines):
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        return protocol.format_reply(Reply(protocol.CONTINUE))

    return answer


def run_jobs(home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int],
             commands: dict[str, str], **settings: object) -> dict[str, JobResult]:
    """Run the shell jobs ``commands`` on one node; their results by name."""
    write_start(home)
    master = ScriptedMaster(script(shell_jobs(commands)))
    port = serve(master)
    assert node(home, tmp_path, port, **settings).run() == NODE_EXIT_DONE
    results = {r.name: r for req in master.seen for r in req.results}
    assert set(results) == set(commands)
    return results


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_node_home(tmp_path)


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def test_two_jobs_writing_one_name_at_once_each_hash_their_own(
        home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    # Both run at once (two slots): each writes __temp__/shared, waits until the other has
    # written its own too, and prints what its file holds.
    gate = tmp_path / "gate"
    gate.mkdir()
    commands = {
        f"t{n}": (f"echo {n} > {TEMP}/shared && touch {gate}/{n} && "
                  f"while [ ! -e {gate}/{3 - n} ]; do sleep 0.01; done && cat {TEMP}/shared")
        for n in (1, 2)}
    results = run_jobs(home, tmp_path, serve, commands, slots=2, job_timeout=30.0)
    assert {name: (r.error, r.md5) for name, r in results.items()} == {
        "t1": (ERROR_NONE, md5("1\n")), "t2": (ERROR_NONE, md5("2\n"))}


def test_each_job_finds_its_folder_empty_though_earlier_ones_left_files(
        home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    # Each lists its folder (its own log and output are there already: the shell made
    # them), then leaves a file and a folder behind for whoever comes next.
    names = [f"t{n}" for n in range(12)]
    commands = {name: (f"ls -A {TEMP} && touch {TEMP}/left && mkdir {TEMP}/sub && "
                       f"touch {TEMP}/sub/deep") for name in names}
    results = run_jobs(home, tmp_path, serve, commands, slots=2)
    assert {name: r.md5 for name, r in results.items()} == {
        name: md5(f"{name}.log\n{name}.out\n") for name in names}
    # Folders are handed on, not made per job; and none is left after the run.
    work_temp = tmp_path / "work" / "runs" / RUN / "temp"
    assert [p.name for p in work_temp.iterdir()] == []


def test_a_shell_job_past_max_output_bytes_fails_unhashed(
        home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    limit = 1 << 20
    commands = {
        "sparse": "truncate -s 10G /dev/stdout",  # 10 GB, but no block written
        "zeros": f"head -c {2 * limit} /dev/zero",
        "exact": f"head -c {limit} /dev/zero",
        # A file beside its output is bounded as well (ulimit -f: whole 512-byte blocks).
        "beside": f"head -c {2 * limit} /dev/zero > {TEMP}/big; wc -c < {TEMP}/big",
    }
    results = run_jobs(home, tmp_path, serve, commands, slots=2, max_output_bytes=limit)
    assert {name: (r.error, r.md5) for name, r in results.items()} == {
        "sparse": (ERROR_READ, "0"), "zeros": (ERROR_READ, "0"),
        "exact": (ERROR_NONE, hashlib.md5(bytes(limit)).hexdigest()),
        "beside": (ERROR_NONE, md5(f"{limit + 512}\n"))}
    text = (tmp_path / "work" / "runs" / RUN / "n1.log").read_text()
    for name in ("sparse", "zeros"):
        assert (f"node n1: {name}'s output is over max_output_bytes ({limit} bytes): the "
                "job failed, its output not hashed") in text, text
    assert "over max_output_bytes" not in text.split("===exact===")[1].split("===")[0]


def test_the_node_recognises_a_shell_jobs_command() -> None:
    """The node knows a shell job by the start of its command (the node side imports no
    job code): the form cluster.jobs.commands makes."""
    assert shell_command("t1", "true").startswith(nodejobs.SHELL_JOB_START)
