"""The master's request handler: signature, parse, replay, then the run (docs/protocol.md,
"Signed messages")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.master.files import journal
from cluster.master.files.audit import AuditLog
from cluster.master.files.keycache import run_keys
from cluster.master.serve.handler import NonceLog, RequestHandler, RunSession
from cluster.master.state.runstate import RunState
from cluster.wire import protocol, signing
from tests.helpers import node_run_key
from tests.unit.test_runstate import RUN, jobs

MD5 = "0123456789abcdef0123456789abcdef"


def node_key(home: Path, name: str) -> bytes:
    """The run key of node ``name``, whose own key is made in ``home`` now."""
    return node_run_key(home, name, RUN)


class Served:
    """A handler bound to a run of ``n`` jobs, its journal and audit trail in ``tmp``."""

    def __init__(self, tmp: Path, n: int = 4) -> None:
        self.home = tmp / "home"
        self.home.mkdir(exist_ok=True)
        self.key = node_key(self.home, "n1")  # the run key of node n1's own key
        self.state = RunState(RUN, jobs(n), 0.0)
        self.journal = journal.Journal(tmp / "results", RUN)
        self.audit = AuditLog(tmp / "audit.log")
        self.handler = RequestHandler(4096, 1000, lambda: 1.0)
        self.guard = signing.ReplayGuard()
        NonceLog.load(tmp / "nonces", self.guard)  # what earlier masters accepted
        self.handler.bind(self.state, self.journal,
                          RunSession(run_keys(self.home, RUN, lambda: 1.0), self.guard,
                                     self.audit, NonceLog(tmp / "nonces")))
        self.nonces = signing.NonceSource()

    def call(self, body: str, key: bytes | None = None, nonce: str | None = None
             ) -> tuple[bytes, str]:
        """The reply to ``body`` (header lines) signed with ``key`` (default: the run's)."""
        nonce = nonce or self.nonces.next()
        data = signing.sign_request((body + "OK\n").encode(), key or self.key, nonce)
        return self.handler(data, "10.0.0.9:4000"), nonce

    def reply(self, body: str) -> protocol.Reply:
        """A signed reply to ``body``, verified and parsed as a node would."""
        raw, nonce = self.call(body)
        return protocol.parse_reply(signing.verify_reply(raw, self.key, nonce))


def headers(node: str = "n1", run: str = RUN, results: tuple[str, ...] = ()) -> str:
    lines = [f"node {node}", f"id {run}", f"built {run}", "slots 2", "jobs 0 0"]
    lines += [f"result {name} 0 0.10 0.20 0.30 {MD5} gs" for name in results]
    return "\n".join(lines) + "\n"


def test_a_signed_request_is_served_its_results_journaled_and_its_reply_signed(
        tmp_path: Path) -> None:
    served = Served(tmp_path)
    assert served.reply(headers()).verb == protocol.BUILD
    given = served.reply(headers())
    assert given.verb == protocol.JOBS and given.jobs
    name = given.jobs[0].split(" ", 1)[0]
    served.reply(headers(results=(name,)))
    assert name in served.state.results
    served.journal.sync()
    assert f"{name} 0 0.10 0.20 0.30 {MD5} gs" in (tmp_path / "results").read_text()
    served.audit.flush(force=True)
    audit = (tmp_path / "audit.log").read_text()
    assert "node n1 reported results 1" in audit and "given JOBS" in audit


@pytest.mark.parametrize("how", ["unsigned", "wrong key", "wrong id"])
def test_a_refused_request_gets_an_unsigned_abort_and_nothing_is_recorded(
        tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    served = Served(tmp_path)
    served.reply(headers())
    name = served.reply(headers()).jobs[0].split(" ", 1)[0]
    body = headers(results=(name,))
    with caplog.at_level(logging.WARNING, logger="cluster.master"):
        if how == "unsigned":
            raw = served.handler((body + "OK\n").encode(), "10.0.0.9:4000")
        elif how == "wrong key":
            raw, _ = served.call(body, key=bytes(32))
        else:
            raw, _ = served.call(headers(run="other-run", results=(name,)))
    assert raw.startswith(b"ABORT ") and raw.count(b"\n") == 1  # no sig line
    assert served.state.results.count == 0
    assert "peer 10.0.0.9:4000 (claims node n1): refused" in caplog.text
    served.audit.flush(force=True)
    assert "node n1 refused" in (tmp_path / "audit.log").read_text()


def test_a_replayed_request_is_refused(tmp_path: Path) -> None:
    served = Served(tmp_path)
    first, nonce = served.call(headers())
    assert first.startswith(b"BUILD")
    again, _ = served.call(headers(), nonce=nonce)
    assert again.startswith(b"ABORT ") and signing.REPLAYED.encode() in again


def test_a_malformed_signed_request_gets_a_signed_abort_naming_the_problem(
        tmp_path: Path) -> None:
    served = Served(tmp_path)
    raw, nonce = served.call("node n1\nid " + RUN + "\nslots many\n")
    reply = protocol.parse_reply(signing.verify_reply(raw, served.key, nonce))
    assert reply.verb == protocol.ABORT and "bad request" in reply.reason
    assert "slots" in reply.reason


def test_the_servers_own_refusals_reach_the_audit_trail_and_an_unbound_handler_says_so(
        tmp_path: Path) -> None:
    served = Served(tmp_path)
    served.handler.server_refused("10.0.0.7:1", "request larger than 10 bytes")
    served.audit.flush(force=True)
    assert "10.0.0.7:1 node - refused request larger than 10 bytes" in \
        (tmp_path / "audit.log").read_text()
    served.handler.unbind()
    served.handler.server_refused("10.0.0.7:1", "ignored: no run")  # no error, no trail
    with pytest.raises(RuntimeError, match="before bind"):
        served.handler(b"node n1\nOK\n", "10.0.0.7:1")


# ------------------------------------------------------------------ node keys

def test_a_node_key_signs_for_its_own_name_only(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    served = Served(tmp_path)
    node_key(served.home, "n2")
    with caplog.at_level(logging.WARNING, "cluster.master"):
        raw, _ = served.call(headers(node="n2"), key=served.key)  # n1's key, n2's name
    assert raw.startswith(b"ABORT bad signature")
    assert "(claims node n2): refused: bad signature" in caplog.text
    assert "n2" not in served.state.nodes


def test_a_name_the_master_holds_no_key_for_is_refused(tmp_path: Path) -> None:
    served = Served(tmp_path)
    raw, _ = served.call(headers(node="ghost"), key=served.key)
    assert raw.startswith(b"ABORT unknown node") and b"'ghost'" in raw
    assert "ghost" not in served.state.nodes


def test_a_key_file_open_to_others_is_refused_the_trail_naming_it(tmp_path: Path) -> None:
    served = Served(tmp_path)
    key = node_key(served.home, "n3")
    path = nodekeys.key_path(served.home, "n3")
    path.chmod(0o644)
    raw, _ = served.call(headers(node="n3"), key=key)
    assert raw.startswith(b"ABORT node key refused") and str(path).encode() not in raw
    served.audit.flush(force=True)
    assert str(path) in (tmp_path / "audit.log").read_text()  # the admin's trail says it


def test_nonces_accepted_before_a_takeover_are_refused_after_it(tmp_path: Path) -> None:
    served = Served(tmp_path)
    data = signing.sign_request((headers() + "OK\n").encode(), served.key,
                                served.nonces.next())
    assert served.handler(data, "10.0.0.9:1").startswith(b"BUILD")
    successor = Served(tmp_path)  # a new master: an empty state, the nonce log loaded
    again = successor.handler(data, "10.0.0.9:1")
    assert again.startswith(b"ABORT ") and signing.REPLAYED.encode() in again
    fresh, _ = successor.call(headers())
    assert fresh.startswith(b"BUILD")
