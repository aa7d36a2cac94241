"""A real SMTP server for the tests: aiosmtpd on 127.0.0.1 that keeps what it is given.

``with smtp_server() as (collector, port): ...`` -- point ``smtp_host``/``smtp_port`` at it,
then read ``collector.received``: the SMTP envelope (who really gets the mail) and the
parsed message of every mail, in arrival order.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from cluster.runtime.ports import free_port


@dataclass
class Received:
    """One message as the server got it."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    @property
    def body(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        assert part is not None, "the mail has no text/plain body"
        # The SMTP transfer gives CRLF line ends; the report files have LF.
        return part.get_content().replace("\r\n", "\n")


@dataclass
class Collector:
    """aiosmtpd handler: accept every message and keep it."""

    received: list[Received] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        with self.arrived:
            self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
            self.arrived.notify_all()
        return "250 OK"

    def wait_for(self, count: int, timeout: float) -> list[Received]:
        """The first ``count`` messages, waiting up to ``timeout`` s for them to arrive."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(f"{len(self.received)} mail(s) arrived within "
                                     f"{timeout} s; expected {count}")
            return self.received[:count]


@contextlib.contextmanager
def smtp_server() -> Iterator[tuple[Collector, int]]:
    handler = Collector()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield handler, port
    finally:
        controller.stop()
