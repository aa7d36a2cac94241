"""A daemon's listening socket, or the exit code and message saying why not."""

from __future__ import annotations

import logging
import socket

import pytest

from cluster.defaults import EXIT_PORT_TAKEN, EXIT_USAGE
from cluster.runtime import service

log = logging.getLogger("test.listen")


def test_a_taken_port_is_named_with_the_remedy(caplog: pytest.LogCaptureFixture) -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        address = held.getsockname()[:2]
        with caplog.at_level(logging.ERROR, logger="test.listen"):
            got = service.listen_or_exit(lambda: socket.create_server(address), address,
                                         "serve the thing", "set thing_port to a free port",
                                         log)
    assert got == EXIT_PORT_TAKEN
    assert (f"cannot serve the thing on 127.0.0.1:{address[1]}: the port is taken (another "
            "program listens on it); stop that program or set thing_port to a free port"
            ) in caplog.text


def test_an_address_of_another_machine_is_a_usage_error(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    address = ("192.0.2.1", 0)  # TEST-NET-1: never this machine's (nothing is sent)
    with caplog.at_level(logging.ERROR, logger="test.listen"):
        got = service.listen_or_exit(lambda: socket.create_server(address), address,
                                     "serve the thing", "set thing_port", log)
    assert got == EXIT_USAGE
    assert "cannot serve the thing on 192.0.2.1:0:" in caplog.text
    assert "expected an address of this machine" in caplog.text


def test_the_server_comes_back_when_it_can_listen() -> None:
    got = service.listen_or_exit(lambda: socket.create_server(("127.0.0.1", 0)),
                                 ("127.0.0.1", 0), "serve", "fix", log)
    assert isinstance(got, socket.socket)
    got.close()
