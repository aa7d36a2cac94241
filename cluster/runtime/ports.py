"""Free TCP ports on loopback for the daemons of a local cluster, a private Slurm or a test.

A port is *free now*, not reserved: whoever asks binds it at once, and a daemon that finds
it taken all the same is started again on another (the private Slurm and sshd do).  Two
rules keep such collisions rare where many clusters start side by side (the test suite's
parallel workers):

* a port handed out once by this process is not handed out again (among the last 4096),
  since a whole configuration's ports are picked before anything binds them;
* with :data:`PORTS_ENV` set to ``LOW-HIGH``, ports are picked in that range instead of
  the kernel's ephemeral range: each worker gets a range of its own, so one never picks a
  port another has just picked, and a range below the ephemeral one is never given by
  the kernel to a ``connect()`` as its source port either.
"""

from __future__ import annotations

import os
import random
import socket
from collections import deque

#: Ports free_port has handed out in this process, oldest first (bounded: see free_port).
_HANDED_OUT: deque[int] = deque(maxlen=4096)
#: ``LOW-HIGH``: where free_port looks for ports instead of the kernel's ephemeral range
#: (why: the module docstring).
PORTS_ENV = "CLUSTER_FREE_PORTS"


def _port_range() -> tuple[int, int] | None:
    """The range of :data:`PORTS_ENV`, or None when it is not set.  ValueError naming the
    variable for a value that is not ``LOW-HIGH`` with 1024 <= LOW < HIGH <= 65535."""
    text = os.environ.get(PORTS_ENV, "").strip()
    if not text:
        return None
    low, _, high = text.partition("-")
    try:
        pair = int(low), int(high)
    except ValueError:
        pair = (0, 0)
    if not 1024 <= pair[0] < pair[1] <= 65535:
        raise ValueError(f"{PORTS_ENV}={text!r}: expected LOW-HIGH, two ports with "
                         "1024 <= LOW < HIGH <= 65535")
    return pair


def free_port(count: int = 1) -> int:
    """A base port such that ``count`` consecutive ports are free on loopback now.

    (Free now, not reserved: good enough for a local cluster or a test, which binds at once.)
    A range never overlaps one handed out earlier in this process (among the last 4096
    ports): ports are picked for a whole configuration before anything binds them, so two
    calls (``base_port`` and ``status_port``, say) must not both be given a port the kernel
    happens to offer twice while nothing holds it.  With :data:`PORTS_ENV` set, the ports
    are looked for in that range instead of where the kernel offers them.
    """
    given = set(_HANDED_OUT)
    span = _port_range()
    for _ in range(200):
        if span is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                base = s.getsockname()[1]
        else:
            base = random.randrange(span[0], max(span[0] + 1, span[1] - count))
        if base + count >= 65535 or given.intersection(range(base, base + count)):
            continue
        socks = []
        try:
            for i in range(count):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            _HANDED_OUT.extend(range(base, base + count))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free port range found")


def free_ports(count: int) -> list[int]:
    """``count`` distinct single ports free on loopback now (:func:`free_port` each)."""
    return [free_port() for _ in range(count)]
