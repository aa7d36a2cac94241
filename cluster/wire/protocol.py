"""The node protocol of seed 001, as pure code: no sockets, no files, no clock.

See docs/protocol.md for the prose.  A node opens a TCP connection to port base+priority and
sends ``<var> <value>`` lines ended by a line ``OK`` (or ``ABORT`` when it is leaving); the
master answers with one reply and closes the connection.

Request headers (node -> master)::

    node <name>               required; letters, digits, '.', '_', '-'
    id <jobid>                the run id the node read from job.start
    caps <capability string>  what the node is (send_caps.py); key=value words
    jobs <pending> <running>  jobs held but not started, jobs running now
    slots <n>                 how many jobs the node runs at once
    busy <task>               still working on BUILD or UPLOAD (keeps the lease alive)
    built <jobid>             this node process has built the product for run <jobid>
    unbuilt <prog>[,<prog>...]  with ``built``: the programs of job.start's ``programs``
                              that its build did not make (``bin/<prog>`` missing or not
                              executable); at most 32 names of 1-64 [A-Za-z0-9_.+-]
    digests <prog>=<64 hex>[,...]  with ``built``: the sha256 of each program of job.start's
                              ``programs`` the build made, with its resource files (the
                              build part of a job's key in the master's result cache;
                              :mod:`cluster.node.builddigest`); at most 32
    keychanges <prog>=<n>:<part>[|<part>...][;...]  with ``digests``: for each program
                              whose digest moved since this node last computed it, how
                              many of its key's parts changed and the first few of them
                              (percent-encoded paths, or ``os``, ``arch``, ``tree:<path>``):
                              what the master's report names (docs/results.md)
    instance <16 hex>         the node's instance: random, kept in its work_dir (a restart
                              of the node keeps it; another machine under the same name has
                              another one)
    failure <code> [reason]   <0: fatal for the run; >0: drop this node
    status <text>             free text for dashboards
    timeouts <n> <max>        tests killed by timeout so far, and the limit
    bundle <name>             a sweep run's results' files, put before this call in
                              runs/<id>/results/incoming/<name> (docs/sweeps.md)
    moving <reason>           told ABORT preempted: it leaves for a more urgent run
    features <word>...        the optional reply lines the node understands
                              (:mod:`cluster.wire.withdraw`: ``withdraw``)
    result <test> <error> <t1> <t2> <t3> <md5> <product...>   one finished job (repeatable)

Unknown headers are ignored (the format was made to grow); a malformed known header is an
error.  Replies (master -> node)::

    ABORT [reason] | BUILD | UPLOAD | CONTINUE | JOBS\\n<count>\\n<job line>...

then, to a node that asked for them (``features withdraw``), ``withdraw <test>...`` lines:
the jobs it holds whose result came from another node (:mod:`cluster.wire.withdraw`).

Signed (docs/protocol.md, "Signed messages"; :mod:`cluster.wire.signing`): a node adds
``nonce <32 hex>`` and, last before ``OK``/``ABORT``, ``sig <64 hex>`` (HMAC-SHA256 under
the run's secret from job.start); the master verifies before it parses, and its reply ends
with a ``sig`` line bound to the request's nonce, which the node verifies before it acts on
any line.  The functions here deal with the plain message: to the parser ``nonce`` and
``sig`` are unknown headers, and :func:`parse_reply` takes the reply without its ``sig``
line (:func:`~cluster.wire.signing.verify_reply` returns it so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cluster.config import DEFAULTS

# A node's name is a datatype (the config checks it too); re-exported for the wire's users.
from cluster.datatypes import NODE_NAME as NODE_NAME
from cluster.datatypes import valid_node_name as valid_node_name

# The failure codes of seed 001 live in cluster.defaults; re-exported (``X as X``) for the
# code that reads them off a Request.
from cluster.defaults import FAILURE_BUILD as FAILURE_BUILD
from cluster.defaults import FAILURE_NETWORK as FAILURE_NETWORK
from cluster.defaults import FAILURE_TIMEOUTS as FAILURE_TIMEOUTS
from cluster.errors import ProtocolError
from cluster.records import ERROR_INTERNAL, MD5, TEST_ID, JobResult
from cluster.wire.framing import (
    Header,
    LineFramer,
    decode_lines,
    integers,
    matching,
    one_line,
    parse_headers,
    text,
)
from cluster.wire.jobstart import MAX_PROGRAMS, PROGRAM, parse_programs

# The keychanges header's grammar lives in its own module; re-exported for its users.
from cluster.wire.keychanges import MAX_KEY_PART as MAX_KEY_PART
from cluster.wire.keychanges import MAX_KEY_PARTS as MAX_KEY_PARTS
from cluster.wire.keychanges import KeyChanges as KeyChanges
from cluster.wire.keychanges import format_keychanges as format_keychanges
from cluster.wire.keychanges import parse_keychanges as parse_keychanges
from cluster.wire.withdraw import WITHDRAW, format_withdraw, parse_features, parse_withdraw

#: The feature word a node sends (``features withdraw``) to be told ``withdraw`` lines.
FEATURE_WITHDRAW = WITHDRAW

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
#: A node's instance id (``instance`` header): 16 lower-case hex digits.
INSTANCE = re.compile(r"[0-9a-f]{16}")
#: A results bundle's name (``bundle`` header): ``<node>.<instance>.<n>.tar``, a tar file,
#: or ``<node>.<instance>.<n>.d``, a folder (a node on the master home's file system).
BUNDLE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\.[0-9a-f]{16}\.[0-9]{1,12}\.(tar|d)")

TERMINATORS = ("OK", "ABORT")
#: The limits a master applies unless configured otherwise (the config table's defaults).
DEFAULT_MAX_LINE = DEFAULTS.max_line_bytes
DEFAULT_MAX_LINES = DEFAULTS.max_request_lines

# Reply verbs.
ABORT = "ABORT"
BUILD = "BUILD"
UPLOAD = "UPLOAD"
CONTINUE = "CONTINUE"
JOBS = "JOBS"
VERBS = (ABORT, BUILD, UPLOAD, CONTINUE, JOBS)

# ABORT reasons: the master answers ``ABORT <reason>``, and a node decides by the reason's
# first words whether the run is over for it (FINAL_ABORTS) or only for now.  Both sides use
# these names, so a reason the master writes is the one a node compares.  A reason with
# details is ``<name>: <details>`` (``<name> ...`` for the few noted).
#: The ABORT reason of a run that stopped (``run aborted: <why>``, or bare).
RUN_ABORTED = "run aborted"
#: Why a master that finds the PID file no longer its own stops its run: a successor goes on
#: with the same run, so its nodes come back and join it (seed 001).
REPLACED = "clustermaster replaced"
#: The run has no more work for the node.
ABORT_RUN_COMPLETE = "run complete"
#: The node may not take part in this run (placement, or its build): ``unsuitable: <why>``.
ABORT_UNSUITABLE = "unsuitable"
#: The node asked about another run: ``wrong job id, running <run id>``.
ABORT_WRONG_JOB_ID = "wrong job id"
#: The node reported a failure and is out of the run: ``dropped after failure <n>`` (then,
#: when the master knows more, ``: <why>``).
ABORT_DROPPED = "dropped"
#: The node said ABORT itself (it is leaving); the master's answer.
ABORT_GOODBYE = "goodbye"
#: The master's listener is at its connection cap; the node asks again later.
ABORT_BUSY = "master busy, try again"
#: The master failed answering the request (a bug, logged there).
ABORT_MASTER_ERROR = "master error"
#: The request broke a bound of the listener: ``refused: <bound>``.
ABORT_REFUSED = "refused"
#: The request could not be parsed, or failed its signature: ``bad request: <problem>``.
ABORT_BAD_REQUEST = "bad request"
#: A more urgent run needs this node (docs/protocol.md, "Preemption at job boundaries"):
#: ``preempted: for run <id> (priority <p>)``.  The node starts nothing more, finishes the
#: jobs it runs and sends their results, uploads its logs, says ABORT itself and joins the
#: most urgent run; it comes back to this one as any new node does.  Not final.
ABORT_PREEMPTED = "preempted"


def preempted_for(reason: str) -> str | None:
    """The run id a ``preempted: for run <id> (...)`` reason sends the node to; None for
    any other reason, or one whose id is not a job id."""
    words = reason.strip().split()
    if len(words) < 4 or words[:3] != [f"{ABORT_PREEMPTED}:", "for", "run"]:
        return None
    return words[3] if JOB_ID.fullmatch(words[3]) else None

#: ABORT reasons (prefixes) after which a node must not join the same run again; those
#: matched whole by REJOIN_ABORTS are the exception.
FINAL_ABORTS = (ABORT_RUN_COMPLETE, ABORT_UNSUITABLE, ABORT_WRONG_JOB_ID, RUN_ABORTED,
                ABORT_DROPPED)
#: ABORT reasons, matched whole, that start like a final one but after which a node comes
#: back to the run: its master was replaced by one that goes on with the same run.
REJOIN_ABORTS = (f"{RUN_ABORTED}: {REPLACED}",)


def _unbuilt(value: str) -> tuple[tuple[str, ...]]:
    try:
        names = parse_programs(value)
    except ValueError as exc:
        raise ValueError(f"takes a comma list of the programs the build did not make, at "
                         f"most {MAX_PROGRAMS} names of 1-64 [A-Za-z0-9_.+-]: {exc}") from None
    return (names,)


#: A program's build digest (``digests`` header): sha256 in lower-case hex.
DIGEST = re.compile(r"[0-9a-f]{64}")


def parse_digests(value: str) -> tuple[tuple[str, str], ...]:
    """The ``digests`` header's ``<prog>=<64 hex>`` comma list as (program, digest) pairs
    sorted by program; ValueError says what is wrong."""
    pairs: dict[str, str] = {}
    words = value.split(",") if value.strip() else []
    if len(words) > MAX_PROGRAMS:
        raise ValueError(f"takes at most {MAX_PROGRAMS} <program>=<sha256> words, got "
                         f"{len(words)}")
    for word in words:
        name, eq, digest = word.strip().partition("=")
        if not eq or not PROGRAM.fullmatch(name) or not DIGEST.fullmatch(digest):
            raise ValueError(f"takes <program>=<64 lower-case hex digits> words, got {word!r}")
        if name in pairs:
            raise ValueError(f"program {name!r} given twice")
        pairs[name] = digest
    return tuple(sorted(pairs.items()))


def _digests(value: str) -> tuple[tuple[tuple[str, str], ...]]:
    return (parse_digests(value),)


def _keychanges(value: str) -> tuple[KeyChanges]:
    return (parse_keychanges(value),)


def _failure(value: str) -> tuple[int, str]:
    code, _, reason = value.partition(" ")
    try:
        return int(code), reason
    except ValueError:
        raise ValueError("takes an integer code and an optional reason") from None


#: The request headers (see the module docstring) and the Request fields they set.
REQUEST_HEADERS: dict[str, Header] = {
    "node": matching("node", NODE_NAME, "takes a node name: 1-64 of [A-Za-z0-9._-]"),
    "id": matching("job_id", JOB_ID, "takes a job id: 1-64 of [A-Za-z0-9._:-]",
                   empty_ok=True),
    "caps": text("caps"),
    "jobs": integers("pending", "running", minimum=0),
    "slots": integers("slots", minimum=0),
    "busy": Header(("busy",), lambda value: (value or "yes",)),
    "built": matching("built", JOB_ID, "takes the job id of the run the node built for"),
    "unbuilt": Header(("unbuilt",), _unbuilt),
    "digests": Header(("digests",), _digests),
    "keychanges": Header(("keychanges",), _keychanges),
    "instance": matching("instance", INSTANCE, "takes a node instance: 16 lower-case hex "
                         "digits"),
    "failure": Header(("failure", "failure_reason"), _failure),
    "status": text("status"),
    "timeouts": integers("timeouts", "max_timeouts", minimum=0),
    "bundle": matching("bundle", BUNDLE_NAME, "takes a results bundle's name: "
                       "<node>.<16 hex instance>.<number>.tar or .d"),
    "moving": text("moving"),
    "features": Header(("features",), lambda value: (parse_features(value),)),
}


@dataclass(frozen=True)
class Request:
    """One node connection's headers, parsed."""

    node: str
    job_id: str = ""
    caps: str = ""
    pending: int = 0
    running: int = 0
    slots: int = 0
    busy: str = ""
    #: The run id the node says it has built for ("" until its build for a run is done):
    #: the only thing that makes the master hand it jobs.
    built: str = ""
    #: With ``built``: the programs of job.start's ``programs`` its build did not make.
    unbuilt: tuple[str, ...] = ()
    #: With ``built``: (program, sha256) of each program its build made (docs/results.md,
    #: "Results reused").
    digests: tuple[tuple[str, str], ...] = ()
    #: With ``digests``: (program, parts changed, the first parts) of each program whose
    #: digest moved since the node last computed it (:func:`parse_keychanges`).
    keychanges: KeyChanges = ()
    #: The node's instance id (see :data:`INSTANCE`); "" from a node that sends none.
    instance: str = ""
    failure: int = 0
    failure_reason: str = ""
    status: str = ""
    timeouts: int = 0
    max_timeouts: int = 0
    #: A sweep run's results bundle (:data:`BUNDLE_NAME`), "" when the call has none.
    bundle: str = ""
    #: Told ``ABORT preempted: ...``: that reason (a master that took the run over since
    #: learns from it that the node moves, not fails); "" otherwise.
    moving: str = ""
    #: The optional reply lines the node understands (``features``; :data:`FEATURE_WITHDRAW`).
    features: tuple[str, ...] = ()
    results: tuple[JobResult, ...] = ()
    leaving: bool = False  # terminated by ABORT instead of OK
    problems: tuple[str, ...] = ()  # result lines that were malformed (see parse_request)
    #: With ``parse_request(..., canonical=True)`` the results come here instead of
    #: ``results``: each as the text after ``result `` in the form format_result writes.
    result_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reply:
    """The master's answer: a verb, and for JOBS the job lines, for ABORT a reason."""

    verb: str
    jobs: tuple[str, ...] = field(default=())
    reason: str = ""
    #: The tests whose jobs the node is to stop (``withdraw`` lines; any verb but ABORT).
    withdraw: tuple[str, ...] = ()


def parse_result(value: str, machine: str = "") -> JobResult:
    """Parse the value of a ``result`` header; ValueError says what is wrong."""
    words = value.split(" ", 6)
    if len(words) != 7:
        raise ValueError("result takes <test> <error> <t1> <t2> <t3> <md5> <product>")
    name, err, t1, t2, t3, md5, product = words
    if not TEST_ID.fullmatch(name):
        raise ValueError(f"bad test id {name!r}")
    try:
        error = int(err)
        times = (float(t1), float(t2), float(t3))
    except ValueError:
        raise ValueError("error must be an integer and times numbers") from None
    if not -1 <= error <= 10:
        raise ValueError(f"error code {error} outside -1..10")
    if md5 != "0" and not MD5.fullmatch(md5):
        raise ValueError(f"md5 {md5!r} is neither 32 hex digits nor 0")
    if not product.strip():
        raise ValueError("empty product")
    return JobResult(name, error, times[0], times[1], times[2], md5, product, machine)


def format_result(r: JobResult) -> str:
    return (f"result {r.name} {r.error} {r.time1:.2f} {r.time2:.2f} {r.time3:.2f} "
            f"{r.md5} {r.product}")


#: A result value already in the form :func:`format_result` writes, as nodes send it: then
#: it is valid as it stands, and :func:`canonical_result` need not take it apart.  (Times of
#: at most 12 integer digits survive float() and ``.2f`` unchanged.)
_TIME = r"(?:0|[1-9][0-9]{0,11})\.[0-9][0-9]"
CANONICAL_RESULT = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_.+,@%=-]{0,400} (?:-1|10|[0-9])"
    rf" {_TIME} {_TIME} {_TIME} (?:[0-9a-f]{{32}}|0) \S.*")


def canonical_result(value: str) -> str:
    """``value`` (a ``result`` header's value) as :func:`format_result` would write it.

    ValueError, as from :func:`parse_result`, if it is malformed.  The journal and the
    master's results hold this form: ``<test> <error> <t1> <t2> <t3> <md5> <product>`` with
    the times to two decimals.
    """
    if CANONICAL_RESULT.fullmatch(value) is not None:
        return value
    return format_result(parse_result(value))[7:]


def internal_error_result(name: str) -> str:
    """The canonical result that stands for a malformed result line of test ``name``."""
    return f"{name} {ERROR_INTERNAL} 0.00 0.00 0.00 0 unknown"


def parse_request(data: bytes, max_line: int = DEFAULT_MAX_LINE,
                  max_lines: int = DEFAULT_MAX_LINES, *, canonical: bool = False) -> Request:
    """Parse a complete request (bytes up to and including the OK/ABORT line).

    With ``canonical`` the results are left as text, in :attr:`Request.result_lines` (see
    :func:`canonical_result`), instead of becoming :class:`JobResult` objects: the master
    journals and keeps them as text, and a million objects would cost it time and memory.

    Raises ProtocolError naming the line and the problem for anything malformed: a line
    over ``max_line`` bytes, more than ``max_lines`` lines, bytes that are not UTF-8, a
    missing terminator, a missing or bad ``node``, a known header with a bad value.

    A malformed ``result`` line is the exception: rejecting the whole request would also
    reject the node's good results, and it would send them again forever.  So the line
    is described in ``problems``; if its test id is readable the test gets an internal-error
    result (error 10), so the run can still complete and the problem shows in the report.
    """
    if canonical:
        fast = _parse_fast(data, max_line, max_lines)
        if fast is not None:
            return fast
    lines = decode_lines(data)
    if len(lines) > max_lines + 1:
        raise ProtocolError(f"request has {len(lines)} lines, more than the limit {max_lines}")
    if not lines or lines[-1].rstrip("\r") not in TERMINATORS:
        raise ProtocolError("request does not end with a line OK or ABORT")
    values, results = parse_headers(lines[:-1], REQUEST_HEADERS, max_line=max_line,
                                    collect="result")
    node = _node(values)
    leaving = lines[-1].rstrip("\r") == "ABORT"
    problems: list[str] = []
    if canonical:
        texts: list[str] = []
        fast_match = CANONICAL_RESULT.fullmatch
        for lineno, value in results:
            if fast_match(value) is not None:
                texts.append(value)
                continue
            try:
                texts.append(canonical_result(value))
            except ValueError as exc:
                problems.append(str(ProtocolError(str(exc), "result " + value, lineno)))
                name = value.split(" ", 1)[0]
                if TEST_ID.fullmatch(name):
                    texts.append(internal_error_result(name))
        return Request(node=node, result_lines=tuple(texts), problems=tuple(problems),
                       leaving=leaving, **values)
    parsed: list[JobResult] = []
    for lineno, value in results:
        try:
            parsed.append(parse_result(value, node))
        except ValueError as exc:
            problems.append(str(ProtocolError(str(exc), "result " + value, lineno)))
            name = value.split(" ", 1)[0]
            if TEST_ID.fullmatch(name):
                parsed.append(JobResult(name, ERROR_INTERNAL, 0.0, 0.0, 0.0, "0", "unknown",
                                        node))
    return Request(node=node, results=tuple(parsed), problems=tuple(problems),
                   leaving=leaving, **values)


def _node(values: dict[str, Any]) -> str:
    """The ``node`` header's value, taken out of ``values`` (the other fields stay)."""
    node = values.pop("node", "")
    if not node:
        raise ProtocolError("request has no 'node <name>' header (expected one naming the "
                            "node)")
    return str(node)


#: The longest product the fast parse takes (a longer one goes the line by line way).
_FAST_PRODUCT = 1000
#: A whole ``result`` line whose value is canonical, for findall over a request's block of
#: result lines: CANONICAL_RESULT with the product bounded, so that a line it matches has at
#: most :data:`_FAST_LINE_BYTES` bytes.  Its repeats are possessive (``{m,n}+``): what
#: follows each can never be matched by giving characters back, so the matches are the same,
#: and the engine keeps no positions to go back to (a quarter faster).
_FAST_TIME = r"(?:0|[1-9][0-9]{0,11}+)\.[0-9][0-9]"
_FAST_RESULT_LINE = re.compile(
    r"^result ([A-Za-z0-9][A-Za-z0-9_.+,@%=-]{0,400}+ (?:-1|10|[0-9])"
    rf" {_FAST_TIME} {_FAST_TIME} {_FAST_TIME} (?:[0-9a-f]{{32}}+|0)"
    rf" \S[^\n]{{0,{_FAST_PRODUCT - 1}}}+)$", re.M)
#: "result " + a test id + " -1" + three " <12 digits>.dd" + " <md5>" + " " + the product
#: (a character is at most 4 bytes).
_FAST_LINE_BYTES = 7 + 401 + 3 + 3 * 16 + 33 + 1 + 4 * _FAST_PRODUCT
_RESULT_LINE_START = "\nresult "


def _parse_fast(data: bytes, max_line: int, max_lines: int) -> Request | None:
    """:func:`parse_request` with ``canonical`` for the usual request, or None.

    The usual request: UTF-8, no ``\r``, within ``max_lines``, its result lines one block
    (headers before and after it, none among them), each canonical.  The block's lines are
    then validated and collected by one findall, and only the few header lines are looked at
    one by one: no Python step per result.  Anything else returns None, and the line by line
    parse takes over (and names the line of any problem).
    """
    if max_line < _FAST_LINE_BYTES:
        return None  # a line the pattern takes could be too long: let the slow way check
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.endswith("\nOK\n"):
        body, leaving = text[:-4], False
    elif text.endswith("\nABORT\n"):
        body, leaving = text[:-7], True
    else:
        return None
    if "\r" in body or body.count("\n") + 1 > max_lines:  # its lines, the terminator aside
        return None
    # The block of result lines: from the first line starting "result " to the end of the
    # last one.
    at_start = body.startswith("result ")
    first = 0 if at_start else body.find(_RESULT_LINE_START) + 1
    if not at_start and first == 0:
        texts: list[str] = []
        others = body.split("\n")  # no result line
    else:
        last = body.rfind(_RESULT_LINE_START) + 1  # 0: the first line is the only one
        end = body.find("\n", last)
        if end < 0:
            end = len(body)
        block = body[first:end]
        texts = _FAST_RESULT_LINE.findall(block)
        if len(texts) != block.count("\n") + 1:
            return None  # a header among the results, or a result that is not canonical
        others = (body[:first] + body[end + 1:]).split("\n")
    try:
        values, bare = parse_headers(others, REQUEST_HEADERS, max_line=max_line,
                                     collect="result")
        node = _node(values)
    except ProtocolError:
        return None
    if bare:
        return None  # "result" alone: malformed, described by the slow path
    return Request(node=node, result_lines=tuple(texts), leaving=leaving, **values)


def format_request(req: Request) -> bytes:
    """The wire form of ``req`` (the inverse of :func:`parse_request`)."""
    out = [f"node {req.node}"]
    if req.job_id:
        out.append(f"id {req.job_id}")
    if req.caps:
        out.append(f"caps {req.caps}")
    out.append(f"jobs {req.pending} {req.running}")
    if req.slots:
        out.append(f"slots {req.slots}")
    if req.busy:
        out.append(f"busy {req.busy}")
    if req.built:
        out.append(f"built {req.built}")
    if req.unbuilt:
        out.append("unbuilt " + ",".join(req.unbuilt))
    if req.digests:
        out.append("digests " + ",".join(f"{p}={d}" for p, d in req.digests))
    if req.keychanges:
        out.append("keychanges " + format_keychanges(req.keychanges))
    if req.instance:
        out.append(f"instance {req.instance}")
    if req.failure:
        out.append(f"failure {req.failure} {one_line(req.failure_reason)}".rstrip())
    if req.status:
        out.append(f"status {one_line(req.status)}")
    out.append(f"timeouts {req.timeouts} {req.max_timeouts}")
    if req.bundle:
        out.append(f"bundle {req.bundle}")
    if req.moving:
        out.append(f"moving {one_line(req.moving)}")
    if req.features:
        out.append("features " + " ".join(req.features))
    out.extend(format_result(r) for r in req.results)
    out.extend("result " + text for text in req.result_lines)
    out.append("ABORT" if req.leaving else "OK")
    return ("\n".join(out) + "\n").encode("utf-8")


class RequestFramer(LineFramer):
    """Collects a request from a byte stream (see :class:`~cluster.wire.framing.LineFramer`):
    complete at its OK or ABORT line, within ``max_line`` bytes a line and ``max_lines``
    lines."""

    __slots__ = ()

    def __init__(self, max_line: int = DEFAULT_MAX_LINE,
                 max_lines: int = DEFAULT_MAX_LINES) -> None:
        super().__init__(tuple(t.encode() for t in TERMINATORS), max_line, max_lines)


def format_reply(reply: Reply) -> bytes:
    if reply.withdraw:
        return (format_reply(Reply(reply.verb, reply.jobs, reply.reason))
                + format_withdraw(reply.withdraw).encode())
    if reply.verb == JOBS:
        if not reply.jobs:
            return b"JOBS\n0\n"
        body = "\n".join(reply.jobs)
        return f"JOBS\n{len(reply.jobs)}\n{body}\n".encode()
    if reply.verb == ABORT and reply.reason:
        return f"ABORT {one_line(reply.reason)}\n".encode()
    return f"{reply.verb}\n".encode()


def parse_reply(data: bytes) -> Reply:
    """Parse the master's reply; ProtocolError if it is not one of the five forms."""
    lines = decode_lines(data, "reply")
    if not lines:
        raise ProtocolError("empty reply")
    verb, _, rest = lines[0].partition(" ")
    if verb == JOBS:
        if len(lines) < 2:
            raise ProtocolError("JOBS reply without a count")
        try:
            count = int(lines[1])
        except ValueError:
            raise ProtocolError("JOBS count is not an integer", lines[1], 2) from None
        jobs = lines[2:2 + max(count, 0)]
        if count != len(jobs):
            raise ProtocolError(f"JOBS announced {count} jobs but carried {len(jobs)}")
        return Reply(JOBS, tuple(jobs), withdraw=parse_withdraw(lines[2 + count:], 3 + count))
    if verb not in VERBS or (rest and verb != ABORT):
        raise ProtocolError("reply must be ABORT, BUILD, UPLOAD, CONTINUE or JOBS", lines[0], 1)
    withdraw = parse_withdraw(lines[1:], 2)
    if withdraw and verb == ABORT:
        raise ProtocolError("an ABORT reply withdraws nothing (the node stops every job)",
                            lines[1], 2)
    return Reply(verb, reason=rest, withdraw=withdraw)
