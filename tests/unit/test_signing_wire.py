"""cluster.wire.signing: requests and replies signed, verified, tampered with, replayed."""

from __future__ import annotations

import pytest

from cluster.records import JobResult
from cluster.wire import protocol, signing
from cluster.wire.heartbeat import Heartbeat, format_heartbeat, parse_heartbeat
from cluster.wire.jobstart import JobStart

KEY = signing.parse_secret(signing.new_secret())
OTHER = signing.parse_secret(signing.new_secret())


def _request() -> bytes:
    return protocol.format_request(protocol.Request(
        node="n1", job_id="run-1", caps="tools=gs", pending=1, running=2, slots=4,
        results=(JobResult("a.pdf.ppmraw.72.0", 0, 0.1, 0, 0, "0" * 32, "gs", "n1"),)))


def test_new_secret_is_64_hex_and_fresh() -> None:
    a, b = signing.new_secret(), signing.new_secret()
    assert signing.SECRET_TEXT.fullmatch(a) and a != b
    assert signing.parse_secret(a + "\n") == bytes.fromhex(a)


@pytest.mark.parametrize("text", ["", "abc", "g" * 64, "A" * 64, "0" * 63, "0" * 65])
def test_parse_secret_refuses_what_is_not_64_hex(text: str) -> None:
    with pytest.raises(ValueError, match="64 lower-case hex"):
        signing.parse_secret(text)


def test_signed_request_verifies_and_parses_as_before() -> None:
    plain = _request()
    nonce = signing.NonceSource().next()
    signed = signing.sign_request(plain, KEY, nonce)
    lines = signed.decode().splitlines()
    assert lines[-1] == "OK" and lines[-2].startswith("sig ") and f"nonce {nonce}" in lines
    body, got = signing.verify_request(signed, KEY)
    assert got == nonce and body.endswith(b"OK\n") and b"sig " not in body
    # The master parses the signed bytes as they are: nonce and sig are unknown headers.
    assert protocol.parse_request(signed) == protocol.parse_request(plain)
    assert protocol.parse_request(signed, canonical=True) == \
        protocol.parse_request(plain, canonical=True)


def test_tampering_with_any_byte_breaks_the_signature() -> None:
    signed = signing.sign_request(_request(), KEY, signing.NonceSource().next())
    for i in range(len(signed)):
        changed = bytearray(signed)
        changed[i] ^= 0x01
        with pytest.raises(signing.SignatureError):
            signing.verify_request(bytes(changed), KEY)


def test_terminator_is_covered_ok_cannot_become_abort() -> None:
    signed = signing.sign_request(_request(), KEY, signing.NonceSource().next())
    flipped = signed[:-3] + b"ABORT\n"
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify_request(flipped, KEY)
    assert caught.value.reason == signing.BAD_SIGNATURE


def test_wrong_key_unsigned_and_nonce_missing() -> None:
    nonce = signing.NonceSource().next()
    signed = signing.sign_request(_request(), KEY, nonce)
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify_request(signed, OTHER)
    assert caught.value.reason == signing.BAD_SIGNATURE
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify_request(_request(), KEY)
    assert caught.value.reason == signing.UNSIGNED
    assert "unsigned" in str(caught.value)
    # A sig without a nonce (someone who knows the key but skipped it) is refused too.
    plain = _request()
    last = plain.rfind(b"\n", 0, len(plain) - 1) + 1
    head, tail = plain[:last], plain[last:]
    forged = head + b"sig " + signing._mac(KEY, head + tail) + b"\n" + tail
    with pytest.raises(signing.SignatureError, match="nonce"):
        signing.verify_request(forged, KEY)


def test_reply_signature_binds_the_request_nonce() -> None:
    nonces = signing.NonceSource()
    first, second = nonces.next(), nonces.next()
    reply = protocol.format_reply(protocol.Reply(protocol.JOBS, ("t1 t1.log true ; gs x",)))
    signed = signing.sign_reply(reply, KEY, first)
    assert signing.verify_reply(signed, KEY, first) == reply
    # Replayed to another request (another nonce): refused.
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify_reply(signed, KEY, second)
    assert caught.value.reason == signing.BAD_SIGNATURE
    with pytest.raises(signing.SignatureError):
        signing.verify_reply(signed, OTHER, first)
    with pytest.raises(signing.SignatureError) as caught:
        signing.verify_reply(reply, KEY, first)
    assert caught.value.reason == signing.UNSIGNED
    for i in range(len(signed) - 1):
        changed = bytearray(signed)
        changed[i] ^= 0x20
        with pytest.raises(signing.SignatureError):
            signing.verify_reply(bytes(changed), KEY, first)


def test_a_reply_mac_is_no_request_mac() -> None:
    nonce = signing.NonceSource().next()
    reply = signing.sign_reply(b"CONTINUE\n", KEY, nonce)
    mac = reply.rsplit(b"\n", 2)[-2]
    # The same bytes offered as a request's: the domain prefix makes the MACs differ.
    with pytest.raises(signing.SignatureError):
        signing.verify_request(b"CONTINUE\n" + mac + b"\nOK\n", KEY)


def test_nonces_count_up_within_a_session() -> None:
    source = signing.NonceSource()
    values = [source.next() for _ in range(3)]
    assert len({v[:16] for v in values}) == 1
    assert [int(v[16:], 16) for v in values] == [1, 2, 3]
    assert signing.NonceSource().session != source.session


def test_replay_guard_refuses_a_repeated_nonce() -> None:
    guard = signing.ReplayGuard()
    source = signing.NonceSource()
    a, b, c = source.next(), source.next(), source.next()
    assert guard.accept("n1", a)
    assert not guard.accept("n1", a)  # replayed
    assert guard.accept("n1", c)
    assert guard.accept("n1", b)      # a little out of order (two threads): still new
    assert not guard.accept("n1", b) and not guard.accept("n1", a)
    assert guard.accept("n2", a)      # another sender: its own count
    assert guard.accept("n1", signing.NonceSource().next())  # a new session (a restart)


def test_replay_guard_refuses_what_is_too_far_behind() -> None:
    guard = signing.ReplayGuard()
    source = signing.NonceSource()
    nonces = [source.next() for _ in range(signing.WINDOW + 2)]
    assert guard.accept("n1", nonces[0])
    assert guard.accept("n1", nonces[-1])
    assert not guard.accept("n1", nonces[1])  # WINDOW behind the newest: refused
    assert guard.accept("n1", nonces[-2]) and not guard.accept("n1", nonces[-2])


def test_replay_guard_memory_is_bounded() -> None:
    guard = signing.ReplayGuard(max_sessions=4)
    for i in range(10):
        assert guard.accept(f"n{i}", signing.NonceSource().next())
    assert len(guard) == 4


def test_heartbeats_sign_the_same_way() -> None:
    plain = format_heartbeat(Heartbeat("n1", status="idle", wait=2.0, skip=frozenset({"r1"})))
    signed = signing.sign_request(plain, KEY, signing.NonceSource().next())
    signing.verify_request(signed, KEY)
    assert parse_heartbeat(signed) == parse_heartbeat(plain)


def test_header_value_reads_the_claimed_name_without_parsing() -> None:
    data = b"node evil\nid run-1\nOK\n"
    assert signing.header_value(data, b"node") == "evil"
    assert signing.header_value(data, b"id") == "run-1"
    assert signing.header_value(b"jobs 0 0\nnode x\r\nOK\n", b"node") == "x"
    assert signing.header_value(data, b"caps") == ""


def test_job_start_carries_the_secret_only_when_asked() -> None:
    secret = signing.new_secret()
    start = JobStart(id="r1", priority=0, queue="user a gs", kind="user", ref="a",
                     products=("gs",), tree="ghostpdl", source="ghostpdl", build="make",
                     tests="tests", secret=secret)
    assert "secret" not in start.format()
    assert f"secret {secret}\n" in start.format(with_secret=True)
    assert JobStart.parse(start.format(with_secret=True)) == start
    assert JobStart.parse(start.format()).secret == ""
