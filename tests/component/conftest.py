"""Fixtures of the component tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from cluster.master.serve.server import NodeServer


class Handler(Protocol):
    """Anything with the master's request handler (tests' scripted masters)."""

    def handler(self, data: bytes, peer: str) -> bytes: ...


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], int]]:
    """``serve(master)`` answers node calls with ``master.handler`` on a free loopback port
    (returned) from a background thread, until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(master: Handler) -> int:
        server = NodeServer(("127.0.0.1", 0), master.handler, deadline=5)

        def loop() -> None:
            while not stop.is_set():
                server.serve_once(0.05)
            server.close()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        threads.append(t)
        return server.server_address[1]

    yield start
    stop.set()
    for t in threads:
        t.join(5)
