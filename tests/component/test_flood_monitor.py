"""The monitor under a stranger's connection flood: one unauthenticated process
looping connections at a real monitor_port.py once wrote 34,150 log lines (4.2 MB) in 25 s,
and its open sockets took the monitor's whole connection budget, so honest heartbeats were
answered "busy".  Here the flooder (127.0.0.2) opens and closes connections as fast as it can
for 20 s, keeping its newest ~1,000 open, while a node on 127.0.0.1 sends signed heartbeats.
The monitor runs with the common 1,024 open-file limit (960 connections), so the flood's
sockets alone would fill it.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from cluster.home import Home
from cluster.node import heartbeat as node_heartbeat
from tests.helpers import REPO, free_port, give_key, reaped, wait_for

RUN = "20261126000000"
FLOOD_SECONDS = 20.0
#: What a 20 s flood may add to the monitor's log at most.
LOG_BOUND = 100_000

#: One process, one source address, as fast as it can: half the connections closed at
#: once (alternately with a reset and a FIN), the rest held, the newest HOLD of them open.
FLOODER = r"""
import collections, resource, socket, struct, sys, time
port, seconds, hold = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * hold), hard))
held = collections.deque()
made = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT: ports reused at once
    try:
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        time.sleep(0.001)
        continue
    made += 1
    if made % 2:
        if made % 4 == 1:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    else:
        held.append(s)
        if len(held) > hold:
            held.popleft().close()
print(made)
"""


def _nofile_1024() -> None:
    """The monitor's open-file limit as most systems set it by default."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))


def test_a_connection_flood_neither_fills_the_log_nor_crowds_out_heartbeats(
        tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    home.job_start(0).write_text(f"id {RUN}\nproduct gs\n")
    port = free_port()
    log = home.log_dir / "monitor_port.log"
    argv = [sys.executable, str(REPO / "monitor_port.py"), "--set", f"home={home.root}",
            "--set", f"monitor_port={port}", "--set", "listen_address=127.0.0.1"]
    with reaped(subprocess.Popen(argv, cwd=REPO, stderr=subprocess.DEVNULL,
                                 preexec_fn=_nofile_1024)) as monitor:

        def beat(node: str) -> object:
            try:
                return node_heartbeat.send_heartbeat("127.0.0.1", port, node, timeout=10,
                                                     secret=give_key(home.root, node))
            except node_heartbeat.HeartbeatError as exc:
                return str(exc)

        wait_for(lambda: beat("warmup") == [(0, RUN)], 20, "monitor_port.py to answer")
        before = log.stat().st_size
        with reaped(subprocess.Popen([sys.executable, "-c", FLOODER, str(port),
                                      str(FLOOD_SECONDS), "1000"],
                                     stdout=subprocess.PIPE, text=True)) as flooder:
            time.sleep(3)  # the flood is at full strength
            answers = []
            while flooder.poll() is None and len(answers) < 12:
                answers.append(beat(f"honest{len(answers)}"))
                time.sleep(1)
            out, _ = flooder.communicate(timeout=60)
        grown = log.stat().st_size - before
        assert monitor.poll() is None, "monitor_port.py died under the flood"
    made = int(out)
    assert made >= 5000, f"the flooder made only {made} connections: no flood to test"
    assert len(answers) >= 10
    assert answers == [[(0, RUN)]] * len(answers), answers
    assert grown < LOG_BOUND, f"{made} connections grew the log by {grown} bytes"
    text = log.read_text()
    # The flood is not hidden: its first refusals and their summary name the peer.
    assert "peer 127.0.0.2:" in text and "more refusals" in text
