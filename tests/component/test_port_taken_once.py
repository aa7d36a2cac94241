"""A master whose port another program holds says so at most once a minute, not at every
invocation (the supervisor starts one every 10 s): real clustermaster processes, a real
process listening on the port, the stamp file in the home's log/ aged by hand to stand for
the minute passing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cluster.home import suffixed
from cluster.master.run import clustermaster
from tests.component.scripted_nodes import make_home, master_argv
from tests.helpers import free_port

HOLDER = """
import socket, sys, time
s = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
time.sleep(120)
"""


def test_a_taken_port_is_logged_once_a_minute(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "listening\n"
        argv = master_argv(home, port, suffixed=True)

        def invocation() -> list[str]:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
            return [line for line in done.stderr.splitlines() if "cannot listen" in line]

        said = [invocation() for _ in range(3)]
        assert [len(lines) for lines in said] == [1, 0, 0], said
        assert f"127.0.0.1:{port}" in said[0][0] and "at most once a minute" in said[0][0]
        assert not home.job_start(2).exists()  # the run waits, nothing of it was made
        # A minute later (the stamp aged by hand): said once more.
        stamp = home.log_dir / suffixed(clustermaster.PORT_STAMP, 2)
        old = time.time() - clustermaster.PORT_LOG_EVERY - 1
        os.utime(stamp, (old, old))
        assert len(invocation()) == 1
        assert len(invocation()) == 0
        log_text = (home.log_dir / suffixed("clustermaster.log", 2)).read_text()
        assert log_text.count("cannot listen") == 2
    finally:
        holder.kill()
        holder.wait()
