"""End to end: localcluster.py prints its status page's URL, shows a progress line on a
terminal while it waits, and prints nothing of it into a pipe.

The real ``localcluster.py`` runs a small product shell run of slow jobs twice: once with its
stdout on a pseudo-terminal (read here as a terminal would be), once into a pipe.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import FAST, REPO, free_port

pytestmark = pytest.mark.e2e

#: The run: this many jobs, each sleeping JOB_SECONDS, on two one-slot nodes.
JOBS = 12
JOB_SECONDS = 1
TIMEOUT = 300


def argv(tmp_path: Path, name: str, status_port: int) -> list[str]:
    corpus = tmp_path / "slow"
    if not corpus.exists():
        corpus.mkdir()
        (corpus / "jobs.cmds").write_text(
            "".join(f"sleep {JOB_SECONDS}; echo job {i}\n" for i in range(1, JOBS + 1)))
    line = [sys.executable, str(REPO / "localcluster.py"), "--home", str(tmp_path / name),
            "--corpus", str(corpus), "--product", "shell", "--timeout", str(TIMEOUT),
            "--set", f"base_port={free_port(5)}", "--set", f"monitor_port={free_port()}",
            "--set", f"status_port={status_port}"]
    for key, value in FAST.items():
        line += ["--set", f"{key}={value}"]
    return line


def run_on_a_terminal(command: list[str]) -> tuple[int, str]:
    """(exit status, what a terminal showed) of ``command`` with its stdout on a pty."""
    main, secondary = pty.openpty()
    child = subprocess.Popen(command, stdout=secondary, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL)
    os.close(secondary)
    chunks = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        status = child.wait(timeout=60)
    finally:
        os.close(main)
        if child.poll() is None:
            child.kill()
            child.wait()
    return status, b"".join(chunks).decode("utf-8", errors="replace")


def test_a_terminal_sees_the_url_and_a_progress_line_a_pipe_only_the_url(
        tmp_path: Path) -> None:
    port = free_port()
    status, shown = run_on_a_terminal(argv(tmp_path, "tty", port))
    assert status == 0, shown[-3000:]
    assert f"Status page: http://127.0.0.1:{port}/" in shown
    progress = re.findall(r"\r((\d+) of (\d+) jobs done, \d+ running, \d+ nodes?, [0-9.]+/s, "
                          r"[^\r\n]*)", shown)
    assert progress, shown[-3000:]
    assert {int(total) for _, _, total in progress} == {JOBS}
    assert len({int(done) for _, done, _ in progress}) >= 2  # it moved while we watched
    assert all(len(line) < 80 for line, _, _ in progress)
    # The line is blanked before the report, which starts on a clean line.
    archive = Path(shown.strip().splitlines()[-1].strip())
    first = (archive / "report.txt").read_text().splitlines()[0]
    tail = shown[shown.rindex("jobs done"):]
    assert re.search(r"\r +\r" + re.escape(first), tail), tail[:500]

    port = free_port()
    piped = subprocess.run(argv(tmp_path, "pipe", port), capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert piped.stdout.startswith(f"Status page: http://127.0.0.1:{port}/\n")
    assert "\r" not in piped.stdout and "jobs done" not in piped.stdout
    assert Path(piped.stdout.splitlines()[-1]).parent.name == "archive"
