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
    failure <code> [reason]   <0: fatal for the run; >0: drop this node
    status <text>             free text for dashboards
    timeouts <n> <max>        tests killed by timeout so far, and the limit
    result <test> <error> <t1> <t2> <t3> <md5> <product...>   one finished job (repeatable)

Unknown headers are ignored (the format was made to grow); a malformed known header is an
error.  Replies (master -> node)::

    ABORT [reason] | BUILD | UPLOAD | CONTINUE | JOBS\\n<count>\\n<job line>...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster.errors import ProtocolError
from cluster.records import ERROR_INTERNAL, MD5, TEST_ID, JobResult

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

TERMINATORS = ("OK", "ABORT")
DEFAULT_MAX_LINE = 65536
DEFAULT_MAX_LINES = 200000

# Reply verbs.
ABORT = "ABORT"
BUILD = "BUILD"
UPLOAD = "UPLOAD"
CONTINUE = "CONTINUE"
JOBS = "JOBS"
VERBS = (ABORT, BUILD, UPLOAD, CONTINUE, JOBS)

# Failure codes of seed 001.
FAILURE_BUILD = -1
FAILURE_NETWORK = 1
FAILURE_TIMEOUTS = 2


def valid_node_name(name: str) -> bool:
    return NODE_NAME.fullmatch(name) is not None


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
    failure: int = 0
    failure_reason: str = ""
    status: str = ""
    timeouts: int = 0
    max_timeouts: int = 0
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


def _ints(value: str, count: int, header: str, lineno: int, line: str) -> list[int]:
    words = value.split()
    if len(words) != count:
        raise ProtocolError(f"header {header!r} takes {count} integer(s)", line, lineno)
    try:
        return [int(w) for w in words]
    except ValueError:
        raise ProtocolError(f"header {header!r} takes integers", line, lineno) from None


def decode_lines(data: bytes, what: str = "request") -> list[str]:
    """``data`` as text lines (a final newline does not make an empty last line)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


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
    lines = decode_lines(data)
    if len(lines) > max_lines + 1:
        raise ProtocolError(f"request has {len(lines)} lines, more than the limit {max_lines}")
    if not lines or lines[-1].rstrip("\r") not in TERMINATORS:
        raise ProtocolError("request does not end with a line OK or ABORT")
    if canonical:
        fast = _parse_fast(lines, max_line)
        if fast is not None:
            return fast
    node = ""
    values: dict[str, object] = {}
    results: list[tuple[int, str]] = []
    for lineno, raw in enumerate(lines[:-1], 1):
        line = raw.rstrip("\r")
        if len(raw) > max_line:
            raise ProtocolError(f"line longer than {max_line} bytes", line, lineno)
        if not line:
            continue
        var, _, value = line.partition(" ")
        if var == "result":
            results.append((lineno, value))
        elif var == "node":
            if not valid_node_name(value):
                raise ProtocolError("node name must be 1-64 of [A-Za-z0-9._-]", line, lineno)
            node = value
        elif var == "id":
            if value and not JOB_ID.fullmatch(value):
                raise ProtocolError("job id must be 1-64 of [A-Za-z0-9._:-]", line, lineno)
            values["job_id"] = value
        elif var == "jobs":
            values["pending"], values["running"] = _ints(value, 2, var, lineno, line)
        elif var == "timeouts":
            values["timeouts"], values["max_timeouts"] = _ints(value, 2, var, lineno, line)
        elif var == "slots":
            (values["slots"],) = _ints(value, 1, var, lineno, line)
        elif var == "failure":
            code, _, reason = value.partition(" ")
            (values["failure"],) = _ints(code, 1, var, lineno, line)
            values["failure_reason"] = reason
        elif var in ("caps", "status"):
            values[var] = value
        elif var == "busy":
            values["busy"] = value or "yes"
        # Any other header is ignored: the format is meant to grow (seed 001).
    if not node:
        raise ProtocolError("request has no 'node <name>' header")
    for key in ("pending", "running", "slots", "timeouts", "max_timeouts"):
        if int(values.get(key, 0)) < 0:  # type: ignore[call-overload]
            raise ProtocolError(f"{key} must not be negative")
    leaving = lines[-1].rstrip("\r") == "ABORT"
    problems: list[str] = []
    if canonical:
        texts: list[str] = []
        fast = CANONICAL_RESULT.fullmatch
        for lineno, value in results:
            if fast(value) is not None:
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
                       leaving=leaving, **values)  # type: ignore[arg-type]
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
                   leaving=leaving, **values)  # type: ignore[arg-type]


#: A whole ``result`` line whose value is canonical (for findall over a request's text).
_CANONICAL_LINE = re.compile(r"^result (" + CANONICAL_RESULT.pattern + ")$", re.M)


def _parse_fast(lines: list[str], max_line: int) -> Request | None:
    """:func:`parse_request` with ``canonical`` for the usual request, or None.

    The usual request: no ``\\r``, no line too long, every result line canonical, good
    headers.  Its result lines are then validated and collected by one findall over the
    text instead of a Python step each.  Anything else returns None, and the line by line
    parse takes over (and names the line of any problem).
    """
    body = lines[:-1]
    text = "\n".join(body)
    if "\r" in text or (len(text) > max_line and max(map(len, body)) > max_line):
        return None
    texts = _CANONICAL_LINE.findall(text)
    others = [line for line in body if not line.startswith("result ")]
    if len(texts) != len(body) - len(others):
        return None
    node = ""
    values: dict[str, object] = {}
    try:
        for line in others:
            var, _, value = line.partition(" ")
            if var == "node":
                if not valid_node_name(value):
                    return None
                node = value
            elif var == "id":
                if value and not JOB_ID.fullmatch(value):
                    return None
                values["job_id"] = value
            elif var == "jobs":
                values["pending"], values["running"] = _ints(value, 2, var, 0, line)
            elif var == "slots":
                (values["slots"],) = _ints(value, 1, var, 0, line)
            elif var == "timeouts":
                values["timeouts"], values["max_timeouts"] = _ints(value, 2, var, 0, line)
            elif var == "failure":
                code, _, reason = value.partition(" ")
                (values["failure"],) = _ints(code, 1, var, 0, line)
                values["failure_reason"] = reason
            elif var in ("caps", "status"):
                values[var] = value
            elif var == "busy":
                values["busy"] = value or "yes"
            elif var == "result":
                return None  # "result" alone: malformed, described by the slow path
    except ProtocolError:
        return None
    if not node:
        return None
    for key in ("pending", "running", "slots", "timeouts", "max_timeouts"):
        if int(values.get(key, 0)) < 0:  # type: ignore[call-overload]
            return None
    return Request(node=node, result_lines=tuple(texts), leaving=lines[-1] == "ABORT",
                   **values)  # type: ignore[arg-type]


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
    if req.failure:
        out.append(f"failure {req.failure} {req.failure_reason}".rstrip())
    if req.status:
        out.append(f"status {_one_line(req.status)}")
    out.append(f"timeouts {req.timeouts} {req.max_timeouts}")
    out.extend(format_result(r) for r in req.results)
    out.extend("result " + text for text in req.result_lines)
    out.append("ABORT" if req.leaving else "OK")
    return ("\n".join(out) + "\n").encode("utf-8")


def _one_line(text: str) -> str:
    return " ".join(text.split())


class RequestFramer:
    """Collects a request from a byte stream, enforcing the limits as bytes arrive.

    ``feed(chunk)`` returns the complete request (up to and including the OK/ABORT line)
    once it has arrived, else None; it raises ProtocolError as soon as a line grows past
    ``max_line`` bytes or the line count past ``max_lines``, so a hostile peer cannot make
    the master buffer without bound.  Bytes after the terminator are ignored.
    """

    __slots__ = ("buf", "line_start", "lines", "max_line", "max_lines")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE,
                 max_lines: int = DEFAULT_MAX_LINES) -> None:
        self.buf = bytearray()
        self.line_start = 0
        self.lines = 0
        self.max_line = max_line
        self.max_lines = max_lines

    def feed(self, chunk: bytes) -> bytes | None:
        buf = self.buf
        buf += chunk
        start = self.line_start
        # The first terminator line (at start, or after a newline) among the complete lines.
        found = _TERMINATOR.match(buf, start) or _TERMINATOR_AFTER_NL.search(buf, start)
        end = found.end() if found is not None else buf.rfind(b"\n") + 1
        if end > start:
            if end - start > self.max_line + 1:
                # Some complete line may be too long: look at each (names the first one).
                self._check_lines(start, end)
            lines = self.lines + buf.count(b"\n", start, end)
            if found is not None:
                if lines - 1 > self.max_lines:
                    raise ProtocolError(f"request has more than {self.max_lines} lines")
                return bytes(buf[:end])
            self.lines = lines
            self.line_start = start = end
            if lines > self.max_lines:
                raise ProtocolError(f"request has more than {self.max_lines} lines")
        if len(buf) - start > self.max_line:
            raise ProtocolError(f"line longer than {self.max_line} bytes",
                                lineno=self.lines + 1)
        return None

    def _check_lines(self, start: int, end: int) -> None:
        buf = self.buf
        lineno = self.lines
        while start < end:
            nl = buf.find(b"\n", start, end)
            lineno += 1
            if nl - start > self.max_line:
                raise ProtocolError(f"line longer than {self.max_line} bytes", lineno=lineno)
            if lineno > self.max_lines + 1:
                return  # the caller reports the line count
            start = nl + 1


#: A line OK or ABORT (an optional CR before the newline), where the request ends: at the
#: start of the unread lines, or after a newline (a literal first byte: a fast search).
_TERMINATOR = re.compile(rb"(?:OK|ABORT)\r?\n")
_TERMINATOR_AFTER_NL = re.compile(rb"\n(?:OK|ABORT)\r?\n")


def format_reply(reply: Reply) -> bytes:
    if reply.verb == JOBS:
        if not reply.jobs:
            return b"JOBS\n0\n"
        body = "\n".join(reply.jobs)
        return f"JOBS\n{len(reply.jobs)}\n{body}\n".encode()
    if reply.verb == ABORT and reply.reason:
        return f"ABORT {_one_line(reply.reason)}\n".encode()
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
        jobs = lines[2:]
        if count != len(jobs):
            raise ProtocolError(f"JOBS announced {count} jobs but carried {len(jobs)}")
        return Reply(JOBS, tuple(jobs))
    if verb not in VERBS or (rest and verb != ABORT) or len(lines) > 1:
        raise ProtocolError("reply must be ABORT, BUILD, UPLOAD, CONTINUE or JOBS", lines[0], 1)
    return Reply(verb, reason=rest)
