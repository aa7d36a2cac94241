"""Component tests of cluster.report.mail against a real SMTP server (aiosmtpd on 127.0.0.1).

Each test starts its own server on a free port; its handler keeps every envelope it was
given, so the tests check both what the SMTP envelope said (who really gets the mail) and
the headers of the message itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from cluster import configfile
from cluster.config import Config
from cluster.home import Home
from cluster.report import mail
from tests.helpers import free_port
from tests.smtp import Collector, smtp_server


@pytest.fixture
def smtp() -> Iterator[tuple[Collector, int]]:
    with smtp_server() as server:
        yield server


@pytest.fixture
def home(tmp_path: Path) -> Home:
    root = tmp_path / "home"
    root.mkdir()
    (root / "emails.tab").write_text(
        "# user<TAB>address\n"
        "alice\talice@example.org\n"
        "\n"
        "this line is malformed\n"
        "bob    bob@example.net\n", encoding="utf-8")
    return Home(root)


def _cfg(port: int) -> Config:
    return configfile.load(None, {"smtp_host": "127.0.0.1", "smtp_port": str(port)})


def test_user_run_goes_to_the_user_with_cc_the_maintainer(smtp: tuple[Collector, int],
                                                          home: Home) -> None:
    handler, port = smtp
    cfg = _cfg(port)
    mail.send_report(cfg, home, "user", "alice", "user alice gs lowres r1234",
                     "Differences in 1 of 10 tests: \u00e9t\u00e9.pdf\n")
    [got] = handler.received
    assert sorted(got.rcpt_tos) == sorted(["alice@example.org", cfg.maintainer])
    assert got.mail_from == cfg.mail_from
    assert got.message["To"] == "alice@example.org"
    assert got.message["Cc"] == cfg.maintainer
    assert got.message["Subject"] == "user alice gs lowres r1234"
    assert got.message.get_content_type() == "text/plain"
    assert got.message.get_content_charset() == "utf-8"
    # SMTP carries CRLF line ends; the text itself must arrive intact, accents included.
    assert got.message.get_content().splitlines() == [
        "Differences in 1 of 10 tests: \u00e9t\u00e9.pdf"]


def test_unknown_user_goes_to_the_maintainer_as_bad_username(smtp: tuple[Collector, int],
                                                             home: Home) -> None:
    handler, port = smtp
    cfg = _cfg(port)
    mail.send_report(cfg, home, "user", "mallory", "user mallory gs", "report\n")
    [got] = handler.received
    assert got.rcpt_tos == [cfg.maintainer]
    assert got.message["To"] == cfg.maintainer and got.message["Cc"] is None
    assert "bad username" in got.message["Subject"]
    assert "mallory" in got.message["Subject"]


@pytest.mark.parametrize(("kind", "ref"), [("git", "0123abcd"), ("auto", "nightly-debug")])
def test_commit_and_auto_runs_go_to_the_list(smtp: tuple[Collector, int], home: Home,
                                             kind: str, ref: str) -> None:
    handler, port = smtp
    cfg = _cfg(port)
    mail.send_report(cfg, home, kind, ref, f"{ref}: fix banding\nsecond line", "report\n")
    [got] = handler.received
    assert got.rcpt_tos == [cfg.list_address] == ["gs-regression@localhost"]
    assert got.message["Cc"] is None
    # A line break in the subject must not end the header.
    assert got.message["Subject"] == f"{ref}: fix banding second line"


def test_malformed_table_line_is_logged_with_its_number_and_skipped(
        home: Home, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="cluster.mail"):
        table = mail.read_emails_table(home.root / "emails.tab")
    assert table == {"alice": "alice@example.org", "bob": "bob@example.net"}
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"{home.root / 'emails.tab'}:4:" in record.getMessage()
    assert "this line is malformed" in record.getMessage()


def test_recipients_of_each_kind(home: Home) -> None:
    cfg = Config()
    assert mail.recipients("git", "abc", cfg, home) == ([cfg.list_address], [], "")
    assert mail.recipients("user", "bob", cfg, home) == (["bob@example.net"],
                                                         [cfg.maintainer], "")
    to, cc, note = mail.recipients("user", "nobody", cfg, home)
    assert (to, cc) == ([cfg.maintainer], []) and note == "bad username nobody"
    with pytest.raises(ValueError, match="expected one of"):
        mail.recipients("svn", "1", cfg, home)


def test_missing_table_sends_users_to_the_maintainer(tmp_path: Path) -> None:
    cfg = Config()
    to, cc, note = mail.recipients("user", "alice", cfg, Home(tmp_path))
    assert to == [cfg.maintainer] and "bad username" in note


def test_unreachable_server_raises_mail_error_naming_it(home: Home) -> None:
    port = free_port()  # nothing listens there
    cfg = _cfg(port)
    with pytest.raises(mail.MailError) as exc:
        mail.send_report(cfg, home, "git", "abc", "subject", "body\n")
    assert f"127.0.0.1:{port}" in str(exc.value)


class Refuser(Collector):
    """A server that takes the envelope but refuses the message itself."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        return "554 5.6.0 message refused by policy"


def test_a_refused_message_raises_mail_error_with_the_reply(home: Home) -> None:
    port = free_port()
    controller = Controller(Refuser(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        with pytest.raises(mail.MailError) as exc:
            mail.send_report(_cfg(port), home, "auto", "nightly-x", "subject", "body\n")
    finally:
        controller.stop()
    assert f"127.0.0.1:{port}" in str(exc.value)
    assert "554" in str(exc.value) and "refused by policy" in str(exc.value)
