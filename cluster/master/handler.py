"""What the master does with one node request's bytes: the checks of issue 11, then the run.

:class:`RequestHandler` is the :class:`~cluster.master.server.NodeServer`'s handler.  For
each complete request it:

1. reads the claimed job id (without parsing anything else): another run's request is
   refused;
2. verifies the request's signature under the run's secret, before anything in it is
   parsed or believed (an unsigned or wrongly signed request is refused);
3. parses it (a malformed one gets a signed ABORT naming the problem);
4. checks its nonce against the replay guard (a replayed request is refused);
5. lets :class:`~cluster.master.runstate.RunState` decide the reply, journals the new
   results before the node hears back, and records the connection in the audit trail;
6. signs the reply, covering the request's nonce.

A refusal is one log line naming the peer and the node it claimed, and one audit line;
its reply is an unsigned ABORT (a node treats it as a failed call) and nothing it carried
is recorded.  The server's own refusals (framing errors, bounds) reach the audit trail
through :meth:`RequestHandler.server_refused`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cluster.errors import ProtocolError
from cluster.master import journal
from cluster.master.audit import AuditLog
from cluster.master.runstate import RunState
from cluster.wire import protocol, signing

log = logging.getLogger("cluster.master")


@dataclass(frozen=True)
class RunSession:
    """What the handler needs of a run besides its state: the key of its signed
    messages, the nonces seen, and its audit trail."""

    key: bytes
    guard: signing.ReplayGuard
    audit: AuditLog


@dataclass(frozen=True)
class _Served:
    state: RunState
    journal: journal.Journal
    session: RunSession


class RequestHandler:
    """``handler(request bytes, peer) -> reply bytes`` for the run it is bound to.

    The master listens before the run's state exists (a node's early call waits in the
    backlog), so the handler is made first and :meth:`bind` gives it the run once there is
    one; it must be bound before the server is served.  ``max_line`` and ``max_lines`` are
    the parser's bounds, ``monotonic`` the run's clock.
    """

    def __init__(self, max_line: int, max_lines: int, monotonic: Callable[[], float]) -> None:
        self.max_line = max_line
        self.max_lines = max_lines
        self.monotonic = monotonic
        self._served: _Served | None = None

    def bind(self, state: RunState, jrnl: journal.Journal, session: RunSession) -> None:
        """Serve ``state``'s run, journaling in ``jrnl``, under ``session``."""
        self._served = _Served(state, jrnl, session)

    def unbind(self) -> None:
        """The serving is over: drop the references to the run (its state is large)."""
        self._served = None

    def server_refused(self, peer: str, reason: str) -> None:
        """The server's refusal hook: a request it refused itself, into the audit trail."""
        if self._served is not None:
            self._served.session.audit.refusal(peer, "", reason)

    def __call__(self, data: bytes, peer: str) -> bytes:
        served = self._served
        if served is None:
            raise RuntimeError("RequestHandler called before bind(): no run to serve")
        state, session = served.state, served.session
        if signing.header_value(data, b"id") != state.run_id:
            # Another run's node (or none): remember nothing, as RunState would.
            return self._refuse(session, peer, data, f"wrong job id, running {state.run_id}")
        # Verified before anything in it is parsed or believed (issue 11).
        try:
            _, nonce = signing.verify_request(data, session.key)
        except signing.SignatureError as exc:
            return self._refuse(session, peer, data, str(exc))
        try:
            req = protocol.parse_request(data, self.max_line, self.max_lines, canonical=True)
        except ProtocolError as exc:
            log.warning("peer %s: bad request: %s", peer, exc)
            session.audit.refusal(peer, signing.header_value(data, b"node"),
                                  f"bad request: {exc}")
            return signing.sign_reply(protocol.format_reply(
                protocol.Reply(protocol.ABORT, reason=f"bad request: {exc}")),
                session.key, nonce)
        if not session.guard.accept(req.node, nonce):
            return self._refuse(session, peer, data, f"{signing.REPLAYED} {nonce}")
        outcome = state.handle(req, self.monotonic(), nonce[:signing.SESSION_HEX], peer)
        for note in outcome.notes:
            log.warning("peer %s: %s", peer, note)
        if outcome.journal:
            served.journal.write(outcome.journal)  # on disk before the node hears back
        session.audit.connection(peer, req, outcome.reply, outcome.results, outcome.refused)
        return signing.sign_reply(protocol.format_reply(outcome.reply), session.key, nonce)

    @staticmethod
    def _refuse(session: RunSession, peer: str, data: bytes, reason: str) -> bytes:
        # One log line naming the peer and the node it claimed (read only now: a refusal
        # is rare, a request is not); nothing it carried is recorded.  Unsigned: a node
        # treats it as a failed call.
        claimed = signing.header_value(data, b"node")
        log.warning("peer %s (claims node %s): refused: %s", peer, claimed or "-", reason)
        session.audit.refusal(peer, claimed, reason)
        return protocol.format_reply(protocol.Reply(protocol.ABORT, reason=reason))
