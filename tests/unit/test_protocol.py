"""The node protocol: parse/format round trips, and every kind of malformed input."""

from __future__ import annotations

import pytest

from cluster.errors import ProtocolError
from cluster.records import JobResult
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request, RequestFramer, parse_reply, parse_request

MD5 = "0123456789abcdef0123456789abcdef"


def test_request_round_trip_keeps_every_header_and_result() -> None:
    """format_request and parse_request are inverses, results included."""
    req = Request(node="n1", job_id="20261122-p0-ab12", caps="os=Linux cpus=2", pending=3,
                  running=2, slots=2, busy="build", failure=2, failure_reason="too many",
                  status="12 tests completed", timeouts=1, max_timeouts=20,
                  results=(JobResult("a__b.ps.ppmraw.72.0", 0, 0.5, 0, 0, MD5, "gs", "n1"),
                           JobResult("c.pdf.pdf.ppmraw.72.0", 3, 1, 2, 0, "0",
                                     "gs pdfwrite", "n1")))
    assert parse_request(protocol.format_request(req)) == req


def test_results_take_the_machine_from_the_node_header() -> None:
    """A result line carries no machine; the node header supplies it."""
    data = b"node alpha\nid x\nresult t.ps.ppmraw.72.0 0 0.1 0 0 " + MD5.encode() + b" gs\nOK\n"
    (r,) = parse_request(data).results
    assert r.machine == "alpha" and r.product == "gs" and r.md5 == MD5


def test_abort_terminator_marks_a_leaving_node() -> None:
    assert parse_request(b"node a\nABORT\n").leaving
    assert not parse_request(b"node a\nOK\n").leaving


def test_unknown_headers_are_ignored() -> None:
    """The format was made to grow: a newer node's extra headers must not break us."""
    req = parse_request(b"node a\ncolour blue\nx-future 1 2 3\nOK\n")
    assert req.node == "a"


@pytest.mark.parametrize(("data", "problem"), [
    (b"id 1\nOK\n", "no 'node"),
    (b"node bad name!\nOK\n", "node name"),
    (b"node ../etc\nOK\n", "node name"),
    (b"node a\njobs 1\nOK\n", "takes 2 integer"),
    (b"node a\njobs one two\nOK\n", "integers"),
    (b"node a\njobs -1 0\nOK\n", "negative"),
    (b"node a\nfailure x\nOK\n", "integer"),
    (b"node a\nid bad id with spaces\nOK\n", "job id"),
    (b"node a\n", "OK or ABORT"),
    (b"", "OK or ABORT"),
    (b"node a\n\xff\xfe\nOK\n", "UTF-8"),
])
def test_malformed_requests_name_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        parse_request(data)
    assert problem in str(exc.value)


@pytest.mark.parametrize(("line", "problem"), [
    (b"result x 0 0 0 0", "result takes"),
    (b"result x 0 0 0 0 nothex gs", "md5"),
    (b"result x 99 0 0 0 0 gs", "outside"),
    (b"result x 0 zero 0 0 0 gs", "times"),
    (b"result x 0 0 0 0 0 ", "empty product"),
])
def test_a_bad_result_becomes_an_internal_error_and_spares_the_good_ones(
        line: bytes, problem: str) -> None:
    """One poisoned result must not make the master refuse the node's other results."""
    good = b"result ok.ps.ppmraw.72.0 0 0.1 0 0 " + MD5.encode() + b" gs"
    req = parse_request(b"node a\n" + good + b"\n" + line + b"\nOK\n")
    assert [(r.name, r.error) for r in req.results] == [("ok.ps.ppmraw.72.0", 0), ("x", 10)]
    (text,) = req.problems
    assert problem in text and "line 3" in text


def test_a_result_without_a_readable_test_id_is_only_reported() -> None:
    req = parse_request(b"node a\nresult x$(rm) 0 0 0 0 0 gs\nOK\n")
    assert req.results == () and "bad test id" in req.problems[0]


def test_error_names_the_line_number() -> None:
    with pytest.raises(ProtocolError) as exc:
        parse_request(b"node a\nid x\njobs 1\nOK\n")
    assert "line 3" in str(exc.value)


def test_oversized_line_and_too_many_lines_are_refused() -> None:
    with pytest.raises(ProtocolError, match="longer than 100"):
        parse_request(b"node a\nstatus " + b"x" * 200 + b"\nOK\n", max_line=100)
    with pytest.raises(ProtocolError, match="lines"):
        parse_request(b"node a\n" + b"status x\n" * 50 + b"OK\n", max_lines=10)


@pytest.mark.parametrize("reply", [
    Reply(protocol.ABORT), Reply(protocol.ABORT, reason="wrong job id"), Reply(protocol.BUILD),
    Reply(protocol.UPLOAD), Reply(protocol.CONTINUE),
    Reply(protocol.JOBS, ("a x true ; echo 1", "b y true ; echo 2")), Reply(protocol.JOBS, ()),
])
def test_reply_round_trip(reply: Reply) -> None:
    assert parse_reply(protocol.format_reply(reply)) == reply


def test_jobs_reply_has_the_seed_001_shape() -> None:
    """JOBS, then the count, then the job lines, each on its own line."""
    data = protocol.format_reply(Reply(protocol.JOBS, ("a x true ; echo 1",)))
    assert data == b"JOBS\n1\na x true ; echo 1\n"


@pytest.mark.parametrize(("data", "problem"), [
    (b"", "empty"), (b"HELLO\n", "must be"), (b"BUILD now\n", "must be"),
    (b"JOBS\n", "without a count"), (b"JOBS\nmany\n", "not an integer"),
    (b"JOBS\n3\na x true ; b\n", "announced 3"), (b"CONTINUE\nextra\n", "must be"),
])
def test_malformed_replies(data: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        parse_reply(data)


def test_framer_finds_the_terminator_across_chunks() -> None:
    """Bytes may arrive one at a time; the request is complete at the OK line."""
    framer = RequestFramer()
    data = b"node a\nstatus OK then\nOK\ntrailing garbage"
    out = None
    for i in range(len(data)):
        out = framer.feed(data[i:i + 1])
        if out is not None:
            break
    assert out == b"node a\nstatus OK then\nOK\n"


def test_framer_accepts_crlf_and_abort() -> None:
    assert RequestFramer().feed(b"node a\r\nABORT\r\n") == b"node a\r\nABORT\r\n"


def test_framer_stops_an_endless_line_early() -> None:
    """A peer streaming one endless line is cut off once it passes the limit."""
    framer = RequestFramer(max_line=1000)
    framer.feed(b"node a\nstatus ")
    with pytest.raises(ProtocolError, match="longer than 1000"):
        for _ in range(100):
            framer.feed(b"y" * 100)
    assert len(framer.buf) < 20000


def test_framer_stops_endless_lines() -> None:
    framer = RequestFramer(max_lines=5)
    with pytest.raises(ProtocolError, match="more than 5 lines"):
        framer.feed(b"x\n" * 10)


# ------------------------------------------------------------------ the master's canonical parse
def result_line(name: str, md5: str = MD5, times: str = "0.10 0.00 0.00") -> bytes:
    return f"result {name} 0 {times} {md5} gs pdfwrite".encode()


@pytest.mark.parametrize("value", [
    "t.1 0 0.10 0.00 0.00 " + MD5 + " gs",
    "t.1 -1 12.34 0.00 999999999999.99 0 gs pdfwrite",
    "t.1 10 0.00 0.00 0.00 0 unknown",
])
def test_canonical_result_keeps_canonical_text(value: str) -> None:
    assert protocol.canonical_result(value) is value
    r = protocol.parse_result(value)
    assert protocol.format_result(r) == "result " + value


@pytest.mark.parametrize(("value", "canonical"), [
    ("t.1 0 0.1 0 0 " + MD5 + " gs", "t.1 0 0.10 0.00 0.00 " + MD5 + " gs"),
    ("t.1 07 1e1 00.5 -0 0 gs", "t.1 7 10.00 0.50 -0.00 0 gs"),
    ("t.1 0 1 2 3 0  gs", "t.1 0 1.00 2.00 3.00 0  gs"),  # a product starting with a space
])
def test_canonical_result_rewrites_what_format_result_would(value: str, canonical: str) -> None:
    assert protocol.canonical_result(value) == canonical
    assert protocol.canonical_result(value) == protocol.format_result(
        protocol.parse_result(value))[7:]


def test_canonical_result_refuses_what_parse_result_refuses() -> None:
    with pytest.raises(ValueError, match="md5"):
        protocol.canonical_result("t.1 0 0 0 0 nothex gs")


@pytest.mark.parametrize("data", [
    b"node a\nid r1\ncaps x=1\nslots 8\njobs 3 2\ntimeouts 1 20\nstatus s\n"
    + result_line("a.1") + b"\n" + result_line("b.2") + b"\nOK\n",
    b"node a\n" + result_line("a.1", times="0.1 0 0") + b"\nbusy\nABORT\n",  # not canonical
    b"node a\r\n" + result_line("a.1") + b"\r\nOK\r\n",  # CRs: the line by line parse
    b"node a\n" + result_line("a.1") + b"\nresult x 0 0 0 0\nOK\n",  # a bad result
    b"node a\nfailure -1 build failed\n\nOK\n",
    # The block of results between headers, as a signed request has it.
    b"node a\njobs 0 0\n" + result_line("a.1") + b"\n" + result_line("b.2")
    + b"\nnonce " + b"0" * 32 + b"\nsig " + b"f" * 64 + b"\nOK\n",
    b"node a\n" + result_line("a.1") + b"\nstatus s\n" + result_line("b.2") + b"\nOK\n",
    b"node a\n" + result_line("a.1") + b"\nnosuchheader 1\n" + result_line("b.2") + b"\nOK\n",
    result_line("a.1") + b"\nnode a\nABORT\n",  # the results first
    b"node a\n" + result_line("a.1") + b"\nresult\nOK\n",  # a bare result header
    b"node a\n" + result_line("a.1") + b" " + "é".encode() * 1200 + b"\nOK\n",  # long product
])
def test_canonical_parse_agrees_with_the_object_parse(data: bytes) -> None:
    """Same headers, problems and results, the results as canonical text."""
    objects = parse_request(data)
    texts = parse_request(data, canonical=True)
    assert texts.results == () and objects.result_lines == ()
    assert texts.result_lines == tuple(protocol.format_result(r)[7:] for r in objects.results)
    assert texts.problems == objects.problems
    assert (dict(texts.__dict__, result_lines=(), problems=())
            == dict(objects.__dict__, results=(), problems=()))


@pytest.mark.parametrize(("data", "problem"), [
    (b"id 1\nOK\n", "no 'node"),
    (b"node bad name!\n" + result_line("a.1") + b"\nOK\n", "node name"),
    (b"node a\njobs 1\n" + result_line("a.1") + b"\nOK\n", "line 2"),
    (b"node a\njobs -1 0\nOK\n", "negative"),
    (b"node a\nid bad id with spaces\nOK\n", "job id"),
    (b"node a\nstatus " + b"x" * 200 + b"\n" + result_line("a.1") + b"\nOK\n", "longer than"),
])
def test_canonical_parse_refuses_what_the_object_parse_refuses(data: bytes, problem: str
                                                                ) -> None:
    with pytest.raises(ProtocolError) as exc:
        parse_request(data, max_line=150, canonical=True)
    assert problem in str(exc.value)


@pytest.mark.parametrize(("data", "fast"), [
    (b"node a\nid r\n" + result_line("a.1") + b"\n" + result_line("b.2") + b"\nnonce n\nOK\n",
     True),
    (b"node a\nslots 2\nOK\n", True),
    (result_line("a.1") + b"\nnode a\nABORT\n", True),
    (b"node a\n" + result_line("a.1") + b"\nstatus s\n" + result_line("b.2") + b"\nOK\n",
     False),  # a header among the results
    (b"node a\n" + result_line("a.1", times="0.1 0 0") + b"\nOK\n", False),
    (b"node a\r\nOK\r\n", False),
    (b"node a\n" + b"result a.1 0 0.10 0.00 0.00 0 " + b"p" * 1001 + b"\nOK\n", False),
    (b"node a\nslots 2\nOK\n" + b"trailing", False),
])
def test_the_fast_parse_takes_the_usual_request_and_leaves_the_rest(data: bytes, fast: bool
                                                                    ) -> None:
    """The usual request is parsed without a step per line; anything else goes the line by
    line way, which agrees with it where both apply (above)."""
    got = protocol._parse_fast(data, protocol.DEFAULT_MAX_LINE, protocol.DEFAULT_MAX_LINES)
    assert (got is not None) == fast
    if got is not None:
        assert got == parse_request(data, max_line=protocol._FAST_LINE_BYTES - 1,
                                    canonical=True)  # the slow way, forced
    assert protocol._parse_fast(data, protocol.DEFAULT_MAX_LINE, max_lines=1) is None


@pytest.mark.parametrize("value", [
    f"t.1 0 0.10 0.00 0.00 {MD5} gs", "t.1 -1 12.34 0.00 999999999999.99 0 gs pdfwrite",
    "t.1 10 0.00 0.00 0.00 0 unknown", f"t.1 11 0.00 0.00 0.00 {MD5} gs",
    f"t.1 -2 0.00 0.00 0.00 {MD5} gs", f"t.1 0 01.00 0.00 0.00 {MD5} gs",
    f"t.1 0 1000000000000.00 0.00 0.00 {MD5} gs", f"t.1 0 1.0 0.00 0.00 {MD5} gs",
    f"t.1 0 0.00 0.00 0.00 {MD5[:-1]} gs", f"t.1 0 0.00 0.00 0.00 {MD5}0 gs",
    f"t.1 0 0.00 0.00 0.00 {MD5.upper()} gs", f"t.1 0 0.00 0.00 0.00 {MD5}  gs",
    f"{'a' * 401} 0 0.00 0.00 0.00 {MD5} gs", f"{'a' * 402} 0 0.00 0.00 0.00 {MD5} gs",
    f"-t 0 0.00 0.00 0.00 {MD5} gs", f"t.1 0 0.00 0.00 0.00 {MD5} " + "p" * 1000,
    f"t.1 0 0.00 0.00 0.00 {MD5} gs é\u2003x", f"t.1 0 0.00 0.00 0.00 {MD5}",
])
def test_the_fast_result_pattern_takes_what_the_canonical_one_takes(value: str) -> None:
    """Line by line or in a block, a result value is taken or left alike."""
    assert (protocol._FAST_RESULT_LINE.fullmatch("result " + value) is not None) == \
        (protocol.CANONICAL_RESULT.fullmatch(value) is not None)


def test_format_request_writes_result_lines() -> None:
    req = Request(node="a", result_lines=("t.1 0 0.10 0.00 0.00 0 gs",))
    assert parse_request(protocol.format_request(req), canonical=True).result_lines == \
        req.result_lines


def test_framer_takes_a_whole_request_in_one_chunk_and_ignores_the_rest() -> None:
    data = b"node a\n" + b"\n".join(result_line(f"t.{i}") for i in range(100)) + b"\nOK\n"
    assert RequestFramer().feed(data + b"node b\nOK\n") == data
    assert RequestFramer().feed(b"OK\n") == b"OK\n"  # the terminator as the first line
    assert RequestFramer().feed(b"node a\nOKAY\nABORT\n") == b"node a\nOKAY\nABORT\n"


def test_framer_names_a_long_line_inside_a_big_chunk() -> None:
    data = b"node a\n" + b"status " + b"y" * 300 + b"\n" + b"x\n" * 400 + b"OK\n"
    with pytest.raises(ProtocolError) as exc:
        RequestFramer(max_line=100).feed(data)
    assert "longer than 100" in str(exc.value) and "line 2" in str(exc.value)


def test_framer_counts_lines_across_chunks() -> None:
    framer = RequestFramer(max_lines=5)
    assert framer.feed(b"a\nb\nc\n") is None
    assert framer.feed(b"d\ne\nOK\n") == b"a\nb\nc\nd\ne\nOK\n"  # 5 lines, then OK
    framer = RequestFramer(max_lines=5)
    framer.feed(b"a\nb\nc\n")
    with pytest.raises(ProtocolError, match="more than 5 lines"):
        framer.feed(b"d\ne\nf\nOK\n")


def test_keychanges_round_trip_and_refusals() -> None:
    """A node names what moved in a program's key: paths with spaces, percent signs and
    non-UTF-8 bytes come back as they were; a bad word is refused naming what is expected."""
    from cluster.wire.protocol import MAX_KEY_PARTS, format_keychanges, parse_keychanges

    changes = (("gs", 3, ("/usr/lib/x86_64-linux-gnu/libtiff.so.6", "tree:lib/a b%.ps",
                          "/opt/\udcff")),
               ("mutool", 12, tuple(f"/lib/l{n}" for n in range(MAX_KEY_PARTS))))
    req = protocol.Request(node="n1", job_id="r1", built="r1",
                           digests=(("gs", "a" * 64), ("mutool", "b" * 64)),
                           keychanges=changes)
    back = protocol.parse_request(protocol.format_request(req))
    assert back.keychanges == changes
    for bad in ("gs", "gs=x:/a", "gs=1:/a|/b", "gs=1:/a;gs=1:/b", "g s=1:/a",
                "gs=99:" + "|".join(["/a"] * (MAX_KEY_PARTS + 1))):
        with pytest.raises(ValueError, match="keychanges|given twice|takes"):
            parse_keychanges(bad)
    long_part = "/" + "%" * 2000
    (name, count, parts), = parse_keychanges(format_keychanges((("gs", 1, (long_part,)),)))
    assert (name, count) == ("gs", 1) and long_part.startswith(parts[0])
