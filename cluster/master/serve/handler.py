"""What the master does with one node request's bytes: signature, replay, then the run.

:class:`RequestHandler` is the :class:`~cluster.master.serve.server.NodeServer`'s handler.  For
each complete request it:

1. reads the claimed job id (without parsing anything else): another run's request is
   refused;
2. verifies the request's signature under the run key of the node it claims to be (from
   its own key: :func:`~cluster.master.files.keycache.run_keys`), before anything in it is
   parsed or believed (an unsigned or wrongly signed request, or one from a name the
   master holds no key for, is refused);
3. parses it (a malformed one gets a signed ABORT naming the problem);
4. checks its nonce against the replay guard (a replayed request is refused) and logs it
   (:class:`NonceLog`: the guard survives a takeover);
5. for a sweep run, lets its :class:`~cluster.master.serve.sweepintake.SweepIntake` take the
   results' files and judge them (the results withheld for a retry or held for their
   check script taken out, the last tries' rewritten; the time it took not counted
   against any node's heartbeat:
   :meth:`~cluster.master.state.runstate.RunState.pause`), then lets
   :class:`~cluster.master.state.runstate.RunState` decide the reply, journals the new
   results before the node hears back, and records the connection in the audit trail;
6. signs the reply, covering the request's nonce.

A refusal is one log line naming the peer and the node it claimed, and one audit line;
its reply is an unsigned ABORT (a node treats it as a failed call) and nothing it carried
is recorded.  The server's own refusals (framing errors, bounds) reach the audit trail
through :meth:`RequestHandler.server_refused`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import ProtocolError
from cluster.master.files import journal, keycache
from cluster.master.files.audit import AuditLog
from cluster.master.files.keycache import NodeKeyCache
from cluster.master.serve.sweepintake import SweepIntake
from cluster.master.state.runstate import RunState
from cluster.runtime.peers import RefusalLog
from cluster.wire import protocol, signing

log = logging.getLogger("cluster.master")


class NonceLog:
    """The nonces a run's masters accepted, one ``<node> <nonce>`` line each, appended to
    ``runs/<id>/nonces`` before the reply goes out: a master that takes the run over loads
    them into its :class:`~cluster.wire.signing.ReplayGuard`, so a request recorded before
    the takeover is still refused as replayed.  One write per accepted request (never per
    job); not fsync'ed: it must survive the master process, which the page cache does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @staticmethod
    def load(path: Path, guard: signing.ReplayGuard) -> int:
        """Feed the nonces ``path`` holds into ``guard``; how many.  Torn or malformed
        lines (a master killed mid-write) are skipped."""
        count = 0
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    node, _, nonce = line.rstrip(b"\n").partition(b" ")
                    if signing.NONCE.fullmatch(nonce) and node:
                        guard.accept(node.decode("utf-8", "replace"), nonce.decode("ascii"))
                        count += 1
        except FileNotFoundError:
            pass
        return count

    def append(self, node: str, nonce: str) -> None:
        os.write(self._fd, f"{node} {nonce}\n".encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass(frozen=True)
class RunSession:
    """What the handler needs of a run besides its state: the keys of its nodes' signed
    messages, the nonces seen (and their log, for a successor), and its audit trail."""

    keys: NodeKeyCache
    guard: signing.ReplayGuard
    audit: AuditLog
    nonces: NonceLog | None = None


@dataclass(frozen=True)
class _Served:
    state: RunState
    journal: journal.Journal
    session: RunSession
    intake: SweepIntake | None = None


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
        #: The server's per-peer refusal log (set once the server exists): the handler's
        #: refusals are counted and bounded with the server's own.
        self.refusals: RefusalLog | None = None

    def bind(self, state: RunState, jrnl: journal.Journal, session: RunSession,
             intake: SweepIntake | None = None) -> None:
        """Serve ``state``'s run, journaling in ``jrnl``, under ``session``; a sweep run's
        results go through ``intake`` first (None for every other run: no cost)."""
        self._served = _Served(state, jrnl, session, intake)

    def unbind(self) -> None:
        """The serving is over: drop the references to the run (its state is large)."""
        self._served = None

    def settle(self) -> int:
        """A sweep run's verdicts of its check scripts that ended (the server calls this
        when the check pool's wake-up fd is readable): each try settled, its result
        journaled.  How many verdicts."""
        served = self._served
        if served is None or served.intake is None:
            return 0
        return served.intake.settle(served.state, served.journal.write, self.monotonic())

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
            return self._refuse(session, peer, data,
                                f"{protocol.ABORT_WRONG_JOB_ID}, running {state.run_id}")
        # Verified before anything in it is parsed or believed (docs/protocol.md, "Signed
        # messages"), under the key of the node it claims to be: one node's key signs for no
        # other name.
        claimed = signing.header_value(data, b"node")
        try:
            key, nonce = keycache.verify(session.keys, claimed, data)
        except keycache.KeyRefused as exc:
            return self._refuse(session, peer, data, exc.reason, logged=exc.logged)
        try:
            req = protocol.parse_request(data, self.max_line, self.max_lines, canonical=True)
        except ProtocolError as exc:
            log.warning("peer %s: bad request: %s", peer, exc)
            session.audit.refusal(peer, signing.header_value(data, b"node"),
                                  f"bad request: {exc}")
            return signing.sign_reply(protocol.format_reply(
                protocol.Reply(protocol.ABORT, reason=f"{protocol.ABORT_BAD_REQUEST}: {exc}")),
                key, nonce)
        if req.node != claimed:
            # header_value read the first node header, the parser keeps the last.
            return self._refuse(session, peer, data, "more than one node name in a request")
        if not session.guard.accept(req.node, nonce):
            return self._refuse(session, peer, data, f"{signing.REPLAYED} {nonce}")
        if session.nonces is not None:
            session.nonces.append(req.node, nonce)  # before the reply: a successor's guard
        intake = served.intake
        if intake is not None:
            began = self.monotonic()
            req = intake.take(req, state, nonce[:signing.SESSION_HEX])
            # Judging may run check scripts: no node's silence counts that time.
            state.pause(self.monotonic() - began)
        outcome = state.handle(req, self.monotonic(), nonce[:signing.SESSION_HEX], peer)
        for note in outcome.notes:
            log.warning("peer %s: %s", peer, note)
        if outcome.journal:
            served.journal.write(outcome.journal)  # on disk before the node hears back
        if intake is not None:
            intake.done(req)
        session.audit.connection(peer, req, outcome.reply, outcome.results, outcome.refused)
        return signing.sign_reply(protocol.format_reply(outcome.reply), key, nonce)

    def _refuse(self, session: RunSession, peer: str, data: bytes, reason: str,
                logged: str = "") -> bytes:
        # One log line naming the peer and the node it claimed (read only now: a refusal
        # is rare, a request is not); nothing it carried is recorded.  Unsigned: a node
        # treats it as a failed call.  Through the server's RefusalLog when there is one
        # (a stranger's stream of well-formed unsigned requests is a few lines
        # and one summary per burst, in the log and in the audit trail alike).
        # ``logged``: what the log and the audit trail say when it is more than the peer is
        # told.
        claimed = signing.header_value(data, b"node")
        said = logged or reason
        if self.refusals is None:
            log.warning("peer %s (claims node %s): refused: %s", peer, claimed or "-", said)
            session.audit.refusal(peer, claimed, said)
        elif self.refusals.note(peer.rpartition(":")[0] or peer,
                                "peer %s (claims node %s): refused: %s", peer,
                                claimed or "-", said):
            session.audit.refusal(peer, claimed, said)
        return protocol.format_reply(protocol.Reply(protocol.ABORT, reason=reason))
