"""The heartbeat protocol (node -> the master's monitor), as pure code.

One connection per heartbeat.  The node sends header lines of seed 001's format::

    node <name>                  required, cluster.wire.protocol.valid_node_name
    status <free text>           optional  -> home/nodes/<name>.status
    caps <caps line>             optional  -> home/nodes/<name>.caps  (cluster.wire.caps)
    wait <seconds>               optional  hold the answer up to this long (long-poll)
    skip <run id> [<run id>...]  optional, may repeat: runs the node will not join
    bye yes                      optional: the node is leaving for good (an ephemeral node
                                 that exits): its nodes/ files are removed, not touched
    lanes yes                    optional: the node knows lanes (cluster.lanes) and may be
                                 told of runs in priority 0's user lanes
    OK

and the monitor answers one line per run waiting in the home, then ``END``::

    job <lane> <jobid>           one per job[.n].start (its ``id`` line), most urgent
                                 first: n = 0, 1, 2 -- the lane of priority n -- and, only
                                 to a node that sent ``lanes yes``, the user lanes 3.. of
                                 priority 0, listed with lane 0 in the order the monitor
                                 would have new nodes join them (docs/runoptions.md,
                                 "Fair share")
    END

or ``ERROR <what was wrong>`` for a malformed request.  Unknown headers are ignored (seed 001:
the format is meant to grow), so a monitor that predates ``wait`` simply answers at once,
and a node that sends no ``wait`` is answered at once as before.

Long-poll: with ``wait <seconds>`` (a decimal number, at most :data:`MAX_WAIT` honoured) the
monitor records the heartbeat at once, then holds the answer until a run waits whose id is
not among the ``skip`` ids, or until the wait ends; either way the answer is the same list
of every waiting run (skipped ones included).  A node thus learns of a new run within a
fraction of a second while sending no more heartbeats than one per wait.

Signed (docs/protocol.md, "Signed messages"): a heartbeat carries ``nonce`` and, last before
``OK``, ``sig`` lines, and the monitor's answer ends with a ``sig`` line, as the node
protocol's messages (:mod:`cluster.wire.signing`), keyed by the node's heartbeat key
(derived from its own key, ``node-keys/<name>.key`` in the master home).  The monitor
refuses an unsigned, wrongly signed or replayed heartbeat (``ERROR unsigned request ...``,
``ERROR bad signature ...``, ``ERROR replayed nonce ...``, unsigned) and records nothing of
it; :func:`format_heartbeat` and :func:`parse_reply` deal with the plain message, the caller
signs and verifies.

The request is bounded: :data:`MAX_LINES` lines of at most :data:`MAX_LINE` bytes, at most
:data:`MAX_SKIP` skip ids in all.  The server is :mod:`cluster.master.daemon.monitor`, the client
:mod:`cluster.node.heartbeat`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cluster.errors import ProtocolError
from cluster.lanes import ALL_LANES
from cluster.wire.framing import (
    LineFramer,
    decode_lines,
    matching,
    one_line,
    parse_headers,
    text,
)
from cluster.wire.protocol import JOB_ID, NODE_NAME

#: Longest request line accepted, in bytes.
MAX_LINE = 4096
#: Most header lines in one heartbeat (the OK line not counted).
MAX_LINES = 16
#: Longest reply the client accepts, in bytes (three job lines and END need far less).
MAX_REPLY = 65536
#: Longest hold the monitor grants a ``wait`` header, in seconds (a longer wait is cut to
#: this; clients set their socket timeout from the wait they asked, so any value is safe).
MAX_WAIT = 30.0
#: Most run ids all ``skip`` headers of one heartbeat may name together.  A node skips only
#: runs it saw waiting (one per priority), so a handful is plenty.
MAX_SKIP = 64

#: A ``wait`` value: a decimal number of seconds, e.g. ``10`` or ``0.5``.
WAIT_VALUE = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")
#: The one value of ``bye``.
BYE_VALUE = re.compile(r"yes")

OK = "OK"
END = "END"
ERROR = "ERROR"

#: The heartbeat headers and the Heartbeat fields they set.
HEADERS = {
    "node": matching("node", NODE_NAME, "takes a node name: 1-64 of [A-Za-z0-9._-]",
                     unique=True),
    "status": text("status"),
    "caps": text("caps"),
    "wait": matching("wait", WAIT_VALUE, "takes a number of seconds such as 10 or 0.5"),
    "bye": matching("bye", BYE_VALUE, "takes yes", unique=True),
    "lanes": matching("lanes", BYE_VALUE, "takes yes", unique=True),
}
#: The repeatable header of the run ids a node will not join (collected, not in HEADERS).
SKIP = "skip"


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat request.  ``None`` means the header was not sent.

    ``wait`` is the hold the node asks for in seconds (None: answer at once, as before the
    long-poll); ``skip`` the run ids that must not end the hold.
    """

    node: str
    status: str | None = None
    caps: str | None = None
    wait: float | None = None
    skip: frozenset[str] = field(default_factory=frozenset)
    #: The node's goodbye: it is leaving for good (the ``bye yes`` header).
    bye: bool = False
    #: The node may be told of runs in user lanes (the ``lanes yes`` header).
    lanes: bool = False


def framer(max_line: int = MAX_LINE, max_lines: int = MAX_LINES) -> LineFramer:
    """A reader of one heartbeat request from a byte stream (complete at its OK line)."""
    return LineFramer((OK.encode(),), max_line, max_lines)


def format_wait(seconds: float) -> str:
    """``seconds`` as a ``wait`` value: non-negative, at most 6 decimals, no exponent."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"wait of {seconds!r} s: expected a finite number of seconds >= 0")
    text = f"{min(seconds, 999_999_999.0):.6f}".rstrip("0").rstrip(".")
    return text or "0"


def format_heartbeat(hb: Heartbeat) -> bytes:
    """The wire form of ``hb``; newlines inside status/caps are folded to spaces.

    The skip ids go several to a line, each line within :data:`MAX_LINE`.  ValueError for
    more than :data:`MAX_SKIP` skip ids, an id that is not a job id, or a bad wait.
    """
    out = [f"node {hb.node}"]
    if hb.status is not None:
        out.append(f"status {one_line(hb.status)}".rstrip())
    if hb.caps is not None:
        out.append(f"caps {one_line(hb.caps)}".rstrip())
    if hb.wait is not None:
        out.append(f"wait {format_wait(hb.wait)}")
    out.extend(_skip_lines(hb.skip))
    if hb.bye:
        out.append("bye yes")
    if hb.lanes:
        out.append("lanes yes")
    out.append(OK)
    return ("\n".join(out) + "\n").encode("utf-8")


def _skip_lines(ids: Iterable[str]) -> list[str]:
    ids = sorted(ids)
    if len(ids) > MAX_SKIP:
        raise ValueError(f"{len(ids)} skip ids: at most {MAX_SKIP} fit a heartbeat")
    lines: list[str] = []
    line = SKIP
    for run_id in ids:
        if not JOB_ID.fullmatch(run_id):
            raise ValueError(f"skip id {run_id!r} is not a job id")
        if len(line) + 1 + len(run_id) > MAX_LINE:
            lines.append(line)
            line = SKIP
        line += " " + run_id
    if line != SKIP:
        lines.append(line)
    return lines


def parse_heartbeat(data: bytes, max_line: int = MAX_LINE, max_lines: int = MAX_LINES
                    ) -> Heartbeat:
    """Parse a complete request (up to and including ``OK``); ProtocolError names the fault.

    Control characters are refused: status and caps go into files dashboards show.
    """
    lines = decode_lines(data)
    if not lines or lines[-1].rstrip("\r") != OK:
        raise ProtocolError("request does not end with a line OK")
    if len(lines) - 1 > max_lines:
        raise ProtocolError(f"request has {len(lines) - 1} lines, more than {max_lines}")
    values, skip_lines = parse_headers(lines[:-1], HEADERS, max_line=max_line,
                                       collect=SKIP, control_ok=False)
    if "node" not in values:
        raise ProtocolError("request has no 'node <name>' header (expected one naming the "
                            "node)")
    wait = float(values["wait"]) if "wait" in values else None
    skip: set[str] = set()
    for lineno, value in skip_lines:
        ids = value.split()
        if not ids:
            raise ProtocolError("header 'skip' takes one or more run ids", f"skip {value}",
                                lineno)
        for run_id in ids:
            if not JOB_ID.fullmatch(run_id):
                raise ProtocolError(f"header 'skip': {run_id!r} is not a run id (expected "
                                    "1-64 of [A-Za-z0-9._:-])", f"skip {value}", lineno)
        skip.update(ids)
        if len(skip) > MAX_SKIP:
            raise ProtocolError(f"more than {MAX_SKIP} skip ids (expected the few runs the "
                                "node will not join)", f"skip {value}", lineno)
    return Heartbeat(values["node"], values.get("status"), values.get("caps"), wait,
                     frozenset(skip), bye="bye" in values, lanes="lanes" in values)


def format_reply(jobs: Sequence[tuple[int, str]]) -> bytes:
    """``job <lane> <id>`` lines and ``END`` (``jobs``: (lane, id) pairs, in order)."""
    return "".join(f"job {p} {job_id}\n" for p, job_id in jobs).encode() + b"END\n"


def format_error(what: str) -> bytes:
    """``ERROR <what>`` on one line: the answer to a request the monitor refuses."""
    return f"{ERROR} {one_line(what)}\n".encode()


def parse_reply(data: bytes) -> list[tuple[int, str]]:
    """The waiting jobs of a monitor reply: (lane, id) pairs in the reply's order.

    ProtocolError for an ``ERROR`` reply (its text is the problem), a missing ``END`` (the
    reply was cut short), or a line that is not ``job <lane> <id>``.
    """
    lines = decode_lines(data, "reply")
    if lines and lines[0].startswith(ERROR):
        raise ProtocolError("monitor refused the heartbeat: " + lines[0][len(ERROR):].strip())
    if not lines or lines[-1] != END:
        raise ProtocolError("reply does not end with END (cut short?)")
    jobs: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines[:-1], 1):
        words = line.split(" ")
        if (len(words) != 3 or words[0] != "job" or not words[1].isdigit()
                or int(words[1]) not in ALL_LANES or not JOB_ID.fullmatch(words[2])):
            raise ProtocolError(f"expected 'job <lane 0-{max(ALL_LANES)}> <id>'", line, lineno)
        jobs.append((int(words[1]), words[2]))
    return jobs
