"""The heartbeat protocol (node -> the master's monitor), as pure code.

One connection per heartbeat.  The node sends header lines of seed 001's format::

    node <name>                  required, cluster.wire.protocol.valid_node_name
    status <free text>           optional  -> home/nodes/<name>.status
    caps <caps line>             optional  -> home/nodes/<name>.caps  (cluster.wire.caps)
    OK

and the monitor answers one line per run waiting in the home, then ``END``::

    job <priority> <jobid>       one per job[.p].start, p = 0, 1, 2 (its ``id`` line)
    END

or ``ERROR <what was wrong>`` for a malformed request.  Unknown headers are ignored (seed 001:
the format is meant to grow).  The server is :mod:`cluster.master.monitor`, the client
:mod:`cluster.node.heartbeat`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.defaults import PRIORITIES
from cluster.errors import ProtocolError
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

OK = "OK"
END = "END"
ERROR = "ERROR"

#: The heartbeat headers and the Heartbeat fields they set.
HEADERS = {
    "node": matching("node", NODE_NAME, "takes a node name: 1-64 of [A-Za-z0-9._-]",
                     unique=True),
    "status": text("status"),
    "caps": text("caps"),
}


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat request.  ``None`` means the header was not sent."""

    node: str
    status: str | None = None
    caps: str | None = None


def framer(max_line: int = MAX_LINE, max_lines: int = MAX_LINES) -> LineFramer:
    """A reader of one heartbeat request from a byte stream (complete at its OK line)."""
    return LineFramer((OK.encode(),), max_line, max_lines)


def format_heartbeat(hb: Heartbeat) -> bytes:
    """The wire form of ``hb``; newlines inside status/caps are folded to spaces."""
    out = [f"node {hb.node}"]
    if hb.status is not None:
        out.append(f"status {one_line(hb.status)}".rstrip())
    if hb.caps is not None:
        out.append(f"caps {one_line(hb.caps)}".rstrip())
    out.append(OK)
    return ("\n".join(out) + "\n").encode("utf-8")


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
    values, _ = parse_headers(lines[:-1], HEADERS, max_line=max_line, control_ok=False)
    if "node" not in values:
        raise ProtocolError("request has no 'node <name>' header (expected one naming the "
                            "node)")
    return Heartbeat(values["node"], values.get("status"), values.get("caps"))


def format_reply(jobs: Sequence[tuple[int, str]]) -> bytes:
    """``job <priority> <id>`` lines and ``END``."""
    return "".join(f"job {p} {job_id}\n" for p, job_id in jobs).encode() + b"END\n"


def format_error(what: str) -> bytes:
    return f"{ERROR} {one_line(what)}\n".encode()


def parse_reply(data: bytes) -> list[tuple[int, str]]:
    """The waiting jobs of a monitor reply.

    ProtocolError for an ``ERROR`` reply (its text is the problem), a missing ``END`` (the
    reply was cut short), or a line that is not ``job <priority> <id>``.
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
                or int(words[1]) not in PRIORITIES or not JOB_ID.fullmatch(words[2])):
            raise ProtocolError("expected 'job <priority 0-2> <id>'", line, lineno)
        jobs.append((int(words[1]), words[2]))
    return jobs
