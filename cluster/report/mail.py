"""Mailing run reports (ARTIFEX.md §2.9, §6.4) through the configured SMTP server.

Who gets a report:

* commit runs (kind ``git``) and auto runs (``auto``): ``list_address``;
* user runs (``user``, ref = the user name): the user's address from the e-mail table,
  Cc ``maintainer``;
* a user missing from the table: ``maintainer`` only, with "bad username" in the subject,
  so somebody notices and fixes the table.

The e-mail table (``emails_table``, default ``<home>/emails.tab``) holds one
``user<TAB>address`` per line (any run of blanks works as the separator too); blank lines
and lines starting with ``#`` are ignored.  A malformed line is logged with its line number
and skipped, so one typo does not stop every other user's mail.

Mail goes out with plain SMTP (no TLS, no login): the master is expected to hand it to a
local or trusted relay, as the Perl's ``mail`` did.
"""

from __future__ import annotations

import logging
import smtplib
import socket
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from pathlib import Path
from typing import NamedTuple

from cluster.config import Config
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import KINDS

log = logging.getLogger("cluster.mail")

SMTP_TIMEOUT = 30.0  # seconds; a hung relay must not hold the master forever
BAD_USERNAME = "bad username"


class MailError(ClusterError):
    """A report could not be handed to the SMTP server."""

    def __init__(self, server: str, problem: str) -> None:
        super().__init__(server, problem)
        self.server = server
        self.problem = problem

    def __str__(self) -> str:
        return f"mail via SMTP server {self.server}: {self.problem}"


class Recipients(NamedTuple):
    """Where one report goes, and what to add to its subject ("" for nothing)."""

    to: list[str]
    cc: list[str]
    subject_note: str


def _valid_address(address: str) -> bool:
    # Deliberately simple: one '@' with something on each side and nothing that would let a
    # table line add recipients or headers (blanks, commas, angle brackets, quotes).
    local, at, domain = address.partition("@")
    return (bool(at) and bool(local) and bool(domain) and "@" not in domain
            and not any(c in address for c in " \t\r\n,;<>\"'()"))


def read_emails_table(path: Path) -> dict[str, str]:
    """``{user: address}`` from the e-mail table at ``path``; {} (logged) if it is missing.

    Malformed lines (not two fields, or an address that is not ``local@domain``) are logged
    as ``<path>:<lineno>: ...`` and skipped; a user listed twice keeps the last address.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        log.warning("e-mail table %s does not exist; every user run goes to the maintainer",
                    path)
        return {}
    except OSError as exc:
        log.error("e-mail table %s cannot be read (%s); every user run goes to the "
                  "maintainer", path, exc.strerror)
        return {}
    table: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2 or not _valid_address(fields[1]):
            log.error("%s:%d: skipping malformed line %r; expected 'user<TAB>address' "
                      "with address like name@example.org", path, lineno, raw)
            continue
        user, address = fields
        if user in table and table[user] != address:
            log.warning("%s:%d: user %s listed again; using %s, not %s",
                        path, lineno, user, address, table[user])
        table[user] = address
    return table


def recipients(kind: str, ref: str, cfg: Config, home: Home) -> Recipients:
    """The recipients of the report of a ``kind`` run (``ref``: the user for ``user``).

    ValueError for a kind that is not one of queuefiles.KINDS (a caller's bug).
    """
    if kind not in KINDS:
        raise ValueError(f"run kind {kind!r}: expected one of {', '.join(KINDS)}")
    if kind != "user":
        return Recipients([cfg.list_address], [], "")
    address = read_emails_table(home.root / cfg.emails_table).get(ref)
    if address is None:
        log.warning("user %r is not in the e-mail table; mailing the maintainer %s",
                    ref, cfg.maintainer)
        return Recipients([cfg.maintainer], [], f"{BAD_USERNAME} {ref}")
    return Recipients([address], [cfg.maintainer], "")


def build_message(cfg: Config, to: Recipients, subject: str, body: str) -> EmailMessage:
    """The text/plain utf-8 message of one report."""
    msg = EmailMessage()
    msg["From"] = cfg.mail_from
    msg["To"] = ", ".join(to.to)
    if to.cc:
        msg["Cc"] = ", ".join(to.cc)
    # Subjects are built from queue lines and revisions: collapse any line break so the
    # header stays one header.
    text = " ".join(subject.split())
    if to.subject_note:
        text = f"{text} ({to.subject_note})" if text else to.subject_note
    msg["Subject"] = text
    msg["Date"] = formatdate(localtime=True)
    msg["Message-ID"] = make_msgid(domain=parseaddr(cfg.mail_from)[1].rpartition("@")[2]
                                   or None)
    msg.set_content(body, subtype="plain", charset="utf-8")
    return msg


def send_report(cfg: Config, home: Home, kind: str, ref: str, subject: str, body: str) -> None:
    """Mail a report to the recipients of a ``kind``/``ref`` run through cfg.smtp_host:port.

    Raises MailError naming ``host:port`` if the server cannot be reached or refuses the
    message (or every recipient).  Recipients refused individually while others were
    accepted are logged, not raised: the report did go out.
    """
    to = recipients(kind, ref, cfg, home)
    msg = build_message(cfg, to, subject, body)
    server = f"{cfg.smtp_host}:{cfg.smtp_port}"
    try:
        with smtplib.SMTP(cfg.smtp_host, cfg.smtp_port, timeout=SMTP_TIMEOUT) as smtp:
            refused = smtp.send_message(msg)
    except smtplib.SMTPRecipientsRefused as exc:
        raise MailError(server, f"every recipient was refused: {_refusals(exc.recipients)}") \
            from None
    except smtplib.SMTPResponseException as exc:
        reply = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) \
            else str(exc.smtp_error)
        raise MailError(server, f"server replied {exc.smtp_code} {reply}") from None
    except (smtplib.SMTPException, OSError, OverflowError) as exc:
        # OSError covers refused connections, DNS failures and timeouts (socket.timeout);
        # OverflowError is what socket raises for a port outside 0-65535.
        what = "timed out" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
        raise MailError(server, f"{what} (expected an SMTP server accepting mail there)") \
            from None
    if refused:
        log.error("mail %r: the server %s refused %s", msg["Subject"], server, _refusals(refused))
    log.info("mailed %r to %s%s via %s", msg["Subject"], msg["To"],
             f" cc {msg['Cc']}" if msg["Cc"] else "", server)


def _refusals(refused: dict[str, tuple[int, bytes]]) -> str:
    return "; ".join(f"{rcpt} ({code} {reply.decode('utf-8', 'replace')})"
                     for rcpt, (code, reply) in refused.items())
