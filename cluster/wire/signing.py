"""Signed messages: HMAC-SHA256 over a request and over its reply, and the replay guard.

Pure code: no sockets, no files (the keys' files are :mod:`cluster.nodekeys`'s).  Both
socket protocols use it, keyed by the sending node's own key (docs/protocol.md, "Signed
messages"): the node protocol (:mod:`cluster.wire.protocol`) with :func:`run_key`, the
heartbeat protocol (:mod:`cluster.wire.heartbeat`) with :func:`heartbeat_key`.

The secret is 32 random bytes written as 64 lower-case hex digits (:func:`new_secret`);
:func:`parse_secret` turns that text into the key the functions below take.

A signed **request** is the plain request with two header lines added (the *nonce* anywhere
among the headers, the *sig* as the last line before the terminator)::

    node n1
    ...
    nonce <32 hex>            16 hex of a session (random per client process) + 16 hex counter
    sig <64 hex>              HMAC-SHA256(key, every byte of the request but this line)
    OK                        (or ABORT)

"Every byte but this line" is the bytes before the sig line followed by the terminator
line, so the MAC covers the terminator too (an ``OK`` cannot be turned into an ``ABORT``).

A signed **reply** is the plain reply followed by one line::

    sig <64 hex>              HMAC-SHA256(key, b"reply " + <request nonce> + b"\\n" + reply)

so a reply verifies only for the request it answers (a recorded reply cannot be replayed to
another request), and a reply MAC can never pass for a request MAC (its input starts with
``reply <nonce>``, which is no request's first line).

Replay: a nonce is ``<session><counter>``; a client counts up in its session.
:class:`ReplayGuard` refuses a nonce already accepted from the same sender, and one
:data:`WINDOW` or more counts behind the newest of its session (requests sent at the same time
from several threads may arrive a little out of order; a recording replayed later is far
behind).  It keeps two numbers per (sender, session), the newest count and a bit mask of
the window: bounded memory however many requests.

All comparisons of MACs use :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hmac
import itertools
import re
import secrets
import threading
from collections.abc import Iterable

from cluster.errors import ProtocolError

#: Bytes of a secret (written as twice as many hex digits).
SECRET_BYTES = 32
#: The text form of a secret: 64 hex digits.
SECRET_TEXT = re.compile(r"[0-9a-f]{64}")
#: A nonce: 16 hex digits of session, 16 of counter.
NONCE = re.compile(rb"[0-9a-f]{32}")
#: Hex digits of a nonce's session part (the sending process: random per NonceSource).
SESSION_HEX = 16
NONCE_LINE = b"nonce "
SIG_LINE = b"sig "
#: Hex digits of a MAC (SHA-256).
SIG_HEX = 64
#: How far behind the newest count of its session a nonce may be and still be accepted.
WINDOW = 64
#: Most (sender, session) pairs a ReplayGuard remembers; past it the least recently used
#: is forgotten (only senders that hold the secret ever add one).
MAX_SESSIONS = 65536

_REPLY_PREFIX = b"reply "


class SignatureError(ProtocolError):
    """A message is unsigned, or its signature does not verify.  ``reason`` is one of
    :data:`UNSIGNED`, :data:`BAD_SIGNATURE`, :data:`REPLAYED`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


#: The refusal reasons (the master and the monitor answer and log them as they are).
UNSIGNED = "unsigned request"
BAD_SIGNATURE = "bad signature"
REPLAYED = "replayed nonce"


def new_secret() -> str:
    """A fresh secret: 64 hex digits of :func:`secrets.token_bytes`."""
    return secrets.token_hex(SECRET_BYTES)


def parse_secret(text: str | bytes) -> bytes:
    """The key of a secret's text (64 hex digits, surrounding white space ignored).

    ValueError naming what was expected for anything else: a wrong key would make every
    message fail to verify, which is harder to diagnose than this message.
    """
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    value = text.strip()
    if not SECRET_TEXT.fullmatch(value):
        raise ValueError(f"a secret is {2 * SECRET_BYTES} lower-case hex digits, got "
                         f"{len(value)} characters")
    return bytes.fromhex(value)


def _mac(key: bytes, data: bytes) -> bytes:
    # hmac.digest: one call into OpenSSL, no HMAC object (the master signs and verifies
    # every request; this is most of what signing costs it).
    return hmac.digest(key, data, "sha256").hex().encode("ascii")


def run_key(node_key: bytes, run_id: str) -> bytes:
    """The key of a node's requests and the master's replies in run ``run_id``: an HMAC of
    ``run <id>`` under the node's own key (:mod:`cluster.nodekeys`).  Only the node and
    the master can make it; a request recorded in one run verifies in no other."""
    return hmac.digest(node_key, b"run " + run_id.encode("utf-8"), "sha256")


def heartbeat_key(node_key: bytes) -> bytes:
    """The key of a node's heartbeats and the monitor's answers: an HMAC of ``heartbeat``
    under the node's own key (never equal to a run key: no run id is ``heartbeat``'s
    suffix of ``run ``)."""
    return hmac.digest(node_key, b"heartbeat", "sha256")


class NonceSource:
    """The nonces of one client: a random session and a counter from 1, thread-safe."""

    def __init__(self) -> None:
        self.session = secrets.token_hex(8)
        self._count = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            n = next(self._count)
        return f"{self.session}{n:016x}"


# ----------------------------------------------------------------------------------------------
# Requests

def _split_terminator(data: bytes) -> tuple[int, int]:
    """(start of the last line, start of the line before it) of ``data``, which ends with
    a newline.  ProtocolError if there is no line before the terminator."""
    end = len(data) - 1
    if end < 0 or data[end] != 0x0A:
        raise ProtocolError("message does not end with a newline")
    last = data.rfind(b"\n", 0, end) + 1
    if last == 0:
        raise ProtocolError("message has no header line before its terminator")
    before = data.rfind(b"\n", 0, last - 1) + 1
    return last, before


def sign_request(data: bytes, secret: bytes, nonce: str) -> bytes:
    """``data`` (a complete request: header lines, then the terminator line) signed with
    ``secret`` (a key from :func:`parse_secret`): a ``nonce`` line and, last before the
    terminator, the ``sig`` line.  ``nonce`` comes from :meth:`NonceSource.next`."""
    last = data.rfind(b"\n", 0, len(data) - 1) + 1
    head = data[:last] + NONCE_LINE + nonce.encode("ascii") + b"\n"
    tail = data[last:]
    return head + SIG_LINE + _mac(secret, head + tail) + b"\n" + tail


def verify_request(data: bytes, secret: bytes) -> tuple[bytes, str]:
    """Check the signature of a complete request; return ``(request without its sig line,
    nonce)``.

    SignatureError (:data:`UNSIGNED`) when the line before the terminator is not a ``sig``
    line or no ``nonce`` header is there, (:data:`BAD_SIGNATURE`) when the MAC does not
    match.  Verified before anything in the request is parsed or believed.
    """
    try:
        last, before = _split_terminator(data)
    except ProtocolError as exc:
        raise SignatureError(UNSIGNED, str(exc)) from None
    line = data[before:last].rstrip(b"\r\n")
    if not line.startswith(SIG_LINE):
        raise SignatureError(UNSIGNED, "no 'sig' line before the terminator")
    given = line[len(SIG_LINE):]
    head = data[:before]
    body = head + data[last:]
    if not hmac.compare_digest(given, _mac(secret, body)):
        raise SignatureError(BAD_SIGNATURE, "the request's sig does not match its bytes")
    nonce = find_nonce(head)
    if nonce is None:
        raise SignatureError(UNSIGNED, "no 'nonce <32 hex>' header")
    return body, nonce


def find_nonce(data: bytes) -> str | None:
    """The value of the (last) ``nonce`` header of ``data``, or None if there is no valid
    one.  Looks at line starts only."""
    at = data.rfind(b"\n" + NONCE_LINE)
    if at < 0:
        if not data.startswith(NONCE_LINE):
            return None
        start = len(NONCE_LINE)
    else:
        start = at + 1 + len(NONCE_LINE)
    end = data.find(b"\n", start)
    value = data[start:end if end >= 0 else len(data)].rstrip(b"\r")
    if NONCE.fullmatch(value) is None:
        return None
    return value.decode("ascii")


def header_value(data: bytes, name: bytes) -> str:
    """The value of the first ``name`` header of the request ``data`` ("" if absent), read
    without parsing the request: for naming the sender of a request that is refused."""
    key = name + b" "
    if data.startswith(key):
        start = len(key)
    else:
        at = data.find(b"\n" + key)
        if at < 0:
            return ""
        start = at + 1 + len(key)
    end = data.find(b"\n", start)
    value = data[start:end if end >= 0 else len(data)][:128]
    return value.rstrip(b"\r").decode("utf-8", "replace")


# ----------------------------------------------------------------------------------------------
# Replies

def sign_reply(reply: bytes, secret: bytes, nonce: str) -> bytes:
    """``reply`` (complete, newline-ended) followed by its ``sig`` line: the MAC of
    ``reply <nonce>\\n`` and the reply, under ``secret``."""
    return reply + SIG_LINE + _reply_mac(secret, nonce, reply) + b"\n"


def _reply_mac(secret: bytes, nonce: str, reply: bytes) -> bytes:
    return _mac(secret, b"%s%s\n%s" % (_REPLY_PREFIX, nonce.encode("ascii"), reply))


def verify_reply(data: bytes, secret: bytes, nonce: str) -> bytes:
    """The reply ``data`` without its ``sig`` line, if that line is its last and verifies
    for the request of ``nonce``; else SignatureError (:data:`UNSIGNED` or
    :data:`BAD_SIGNATURE`).  Nothing of a reply may be acted upon before this."""
    if not data.endswith(b"\n"):
        raise SignatureError(UNSIGNED, "reply cut short (no final newline)")
    last = data.rfind(b"\n", 0, len(data) - 1) + 1
    line = data[last:].rstrip(b"\r\n")
    if not line.startswith(SIG_LINE):
        raise SignatureError(UNSIGNED, "reply has no 'sig' line at its end")
    body = data[:last]
    if not hmac.compare_digest(line[len(SIG_LINE):], _reply_mac(secret, nonce, body)):
        raise SignatureError(BAD_SIGNATURE, "the reply's sig does not match (not from a "
                             "master holding this run's secret, or altered)")
    return body


# ----------------------------------------------------------------------------------------------
# Replay

class ReplayGuard:
    """Which nonces were seen: per (sender, session) the newest counter accepted and which
    of the :data:`WINDOW` counts before it were (a bit mask).

    :meth:`accept` is called only for requests whose signature verified, so only holders
    of the secret add entries; at most ``max_sessions`` are kept (least recently used
    forgotten first).  Not thread-safe: each server is one thread.
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._last: dict[tuple[str, str], tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def entries(self) -> list[tuple[str, str, int, int]]:
        """What the guard holds, as ``(sender, session, newest count, seen mask)``, least
        recently used first: for saving it (:meth:`restore`)."""
        return [(sender, session, newest, seen)
                for (sender, session), (newest, seen) in self._last.items()]

    def restore(self, entries: Iterable[tuple[str, str, int, int]]) -> None:
        """Take back what :meth:`entries` gave (a guard saved by an earlier process)."""
        for sender, session, newest, seen in entries:
            self._last[(sender, session)] = (newest, seen & _FULL)
            if len(self._last) > self.max_sessions:
                del self._last[next(iter(self._last))]

    def accept(self, sender: str, nonce: str) -> bool:
        """Whether ``nonce`` (32 hex) is new for ``sender``: not accepted before, and fewer
        than :data:`WINDOW` counts behind the newest of its session.  If so it is
        remembered."""
        key = (sender, nonce[:16])
        count = int(nonce[16:], 16)
        entry = self._last.pop(key, None)
        if entry is None:
            newest, seen = count, 1
        else:
            newest, seen = entry
            if count > newest:
                shift = count - newest
                seen = ((seen << shift) | 1) & _FULL if shift < WINDOW else 1
                newest = count
            else:
                behind = newest - count
                if behind >= WINDOW or seen >> behind & 1:
                    self._last[key] = entry
                    return False
                seen |= 1 << behind
        self._last[key] = (newest, seen)  # re-inserted: most recently used last
        if len(self._last) > self.max_sessions:
            del self._last[next(iter(self._last))]
        return True


_FULL = (1 << WINDOW) - 1
