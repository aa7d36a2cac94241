"""The run's audit trail (CL-MW's audit file, seed 004): ``runs/<id>/audit.log``.

One line per node connection -- when, which peer, which node, what it reported and what it
was given -- and one per refusal, with its reason.  The end of the run copies the file to
``archive/<id>/audit.log`` (:mod:`cluster.master.end.endrun`).

Lines (fields separated by one space; ``<time>`` is UTC with milliseconds)::

    <time> <peer> node <name> reported results <n>[ refused <n>] jobs <p> <r>
        [busy <task>] [failure <code>] [leaving] status <text> given <VERB>[ <count>|: <reason>]
    <time> <peer> node <name or -> refused <reason>
    <time> - move <text>

A ``move`` line is a step of preemption (docs/protocol.md, "Preemption at job
boundaries"): ``node n1 chosen to leave for run X (priority 0)`` (the master's choice),
``node n1 told to leave for ...: 3 unstarted jobs put back, 1 to finish`` (the reply that
said so), ``node n1 left for ...`` (its leaving call).

``given`` names the verb and, for JOBS, the count of jobs: never job lines (they are in
the run's job list).  ``status`` is the node's free text, folded to one line and cut to
:data:`MAX_STATUS` characters; it is last but for ``given`` so a reader can split the line
on `` given ``.  A refused request's node is the name it claimed (unverified).

Cheap enough for a million jobs: lines are collected in memory and appended to the file in
one write at most every :data:`FLUSH_INTERVAL` seconds (the serve loop calls
:meth:`AuditLog.flush` at every iteration; the end of the serving forces the last one), at
most :data:`MAX_BUFFERED` lines between writes (beyond that, lines are counted, not kept, and one
line says how many were left out).  A master killed outright loses at most the last
interval's lines.  The file is opened in append mode for each flush, so a
master that takes a run over adds to its predecessor's trail.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from cluster.runtime.clock import Clock, SystemClock
from cluster.wire.protocol import ABORT, JOBS, Reply, Request

log = logging.getLogger("cluster.audit")

#: Characters of a node's status text kept in a line.
MAX_STATUS = 120
#: Most lines held between two writes (a flood of refusals must not grow the buffer).
MAX_BUFFERED = 100_000
#: Least time between two writes [seconds]: a busy serve loop iterates thousands of times a
#: second, and an open-append-close each time would cost the master more than the lines.
FLUSH_INTERVAL = 0.2


def _one_line(text: str, limit: int = MAX_STATUS) -> str:
    return " ".join(text.split())[:limit]


class AuditLog:
    """The audit trail of one run.  Callers use :meth:`connection`, :meth:`refusal` and
    :meth:`flush` (from the serve loop); nothing is written before a flush."""

    def __init__(self, path: Path, clock: Clock | None = None) -> None:
        self.path = path
        self.clock = clock or SystemClock()
        self.lines: list[str] = []
        self.left_out = 0
        self._second = -1
        self._stamp = ""
        self._next_write = 0.0

    def _time(self) -> str:
        now = self.clock.time()
        second = int(now)
        if second != self._second:  # strftime once a second, not once a line
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"

    def _add(self, line: str) -> None:
        if len(self.lines) >= MAX_BUFFERED:
            self.left_out += 1
            return
        self.lines.append(line)

    def connection(self, peer: str, req: Request, reply: Reply, results: int,
                   refused: int = 0) -> None:
        """A served request of node ``req.node`` from ``peer``: ``results`` carried, of which
        ``refused`` were refused (jobs never handed to it), and the ``reply`` it got."""
        parts = [self._time(), peer, "node", req.node, "reported results", str(results)]
        if refused:
            parts += ["refused", str(refused)]
        parts += ["jobs", str(req.pending), str(req.running)]
        if req.busy:
            parts += ["busy", _one_line(req.busy, 32)]
        if req.failure:
            parts += ["failure", str(req.failure)]
        if req.leaving:
            parts.append("leaving")
        parts += ["status", _one_line(req.status) or "-", "given", reply.verb]
        if reply.verb == JOBS:
            parts.append(str(len(reply.jobs)))
        elif reply.verb == ABORT and reply.reason:
            parts[-1] += ":"
            parts.append(_one_line(reply.reason))
        if reply.withdraw:
            parts += ["withdrew", str(len(reply.withdraw))]
        self._add(" ".join(parts))

    def refusal(self, peer: str, node: str, reason: str) -> None:
        """A request refused before anything it carried was believed (``node``: the name it
        claimed, "" if none)."""
        self._add(f"{self._time()} {peer} node {_one_line(node, 64) or '-'} refused "
                  f"{_one_line(reason, 400)}")

    def move(self, text: str) -> None:
        """A step of preemption: a node chosen to leave for a more urgent run, told so, or
        gone."""
        self._add(f"{self._time()} - move {_one_line(text, 400)}")

    def flush(self, force: bool = False) -> None:
        """Append the collected lines to the file (one write), if :data:`FLUSH_INTERVAL`
        passed since the last write or ``force``.  A failure is logged and the lines are
        dropped: the audit trail must not stop the run."""
        if not self.lines and not self.left_out:
            return
        now = self.clock.monotonic()
        if not force and now < self._next_write:
            return
        self._next_write = now + FLUSH_INTERVAL
        lines = self.lines
        if self.left_out:
            lines.append(f"{self._time()} - node - refused {self.left_out} more connection(s) "
                         f"not recorded: over {MAX_BUFFERED} lines between two writes")
        self.lines = []
        self.left_out = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
        except OSError as exc:
            log.error("cannot append to the audit log %s: %s (%d lines lost)", self.path, exc,
                      len(lines))
