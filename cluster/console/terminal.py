"""clustermonitor's terminal view (port of clustermonitor.pl, ARTIFEX.md §2.10).

The Perl showed the ``status`` line, one line per ``*.status`` file (``--DOWN--`` when the
node's ``$m.up`` was older than 300 s) and the current ``queue.lst``, redrawn in place with
ANSI codes.  This view shows the same from :func:`cluster.console.status.snapshot`:

* a status line per running run (done/total, rate, estimated end, nodes, elapsed), or the
  ``status[.lane]`` line of an idle lane (priority 0 may have several: cluster.lanes);
* one line per node: ``--DOWN--`` (and since when) once not heard from for
  ``node_down_after`` seconds, ``--DISABLED--`` for a disabled node, else its run, jobs done
  in it and its status text;
* every queued run per priority, then the newest runs;
* when a provisioner runs (docs/provisioning.md), its last look before the nodes: "from
  Slurm: wanted W, pending P, running R", each job with its node and a pending job's reason,
  the last failed call's message, or that the provisioner is not running; a node a batch job
  runs shows its job id after its name.

:func:`render` is a pure function of the snapshot (the tests call it with made-up ones);
:func:`watch` redraws it every ``interval`` seconds (clear screen + cursor home) until
stopped, or prints it once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from cluster.console import provisioning

#: Clear the screen and put the cursor top left (what clustermonitor.pl printed).
CLEAR = "\x1b[2J\x1b[H"
#: How many recent runs the view lists.
RECENT_SHOWN = 5
DOWN = "--DOWN--"
DISABLED = "--DISABLED--"

JSON = dict[str, Any]


def _clock(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%H:%M:%S", time.gmtime(epoch))


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(round(seconds)))
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _lane(entry: JSON) -> str:
    """``p0`` for a run or status line of a priority's own lane, ``p0 (lane 3)`` for one of
    a user lane (cluster.lanes: priority 0's second, third ... master)."""
    priority = entry.get("priority")
    lane = entry.get("lane", priority)
    return f"p{priority}" if lane == priority else f"p{priority} (lane {lane})"


def run_line(run: JSON, now: float) -> str:
    """The status line of one running run."""
    head = f"{_lane(run)} {run.get('run')} {run.get('queue', '')}"
    if run.get("state") == "starting":
        return f"{head}: starting (making the job list)"
    jobs = run.get("jobs") or {}
    total, done = int(jobs.get("total") or 0), int(jobs.get("done") or 0)
    pct = f" {100 * done // total}%" if total else ""
    eta = run.get("eta")
    eta_text = "eta -" if eta is None else f"eta {_clock(eta)} UTC (in {_span(eta - now)})"
    line = (f"{head}: {done}/{total}{pct} done, {jobs.get('running', 0)} running, "
            f"{float(run.get('rate') or 0):.1f}/s, {eta_text}, "
            f"{len(run.get('nodes') or {})} nodes, {_span(run.get('elapsed'))} elapsed")
    stopping = run.get("stopping") or (f"stop requested by {run['stop_requested']}"
                                       if run.get("stop_requested") else "")
    if run.get("waiting"):
        line += f" [waiting: {run['waiting']}]"
    if stopping:
        line += f" [{stopping}]"
    if run.get("fatal"):
        line += f" [{run['fatal']}]"
    return line


def node_line(node: JSON, width: int) -> str:
    """One node: ``name  --DOWN-- since 12:00:00 UTC``, ``--DISABLED--`` or its work."""
    name = f"{node['name']:<{width}}"
    note = provisioning.node_note(node)
    if note:
        name += f"  {note}"
    if node.get("disabled"):
        return f"{name}  {DISABLED} {node['disabled']}"
    if node.get("down_since") is not None:
        return f"{name}  {DOWN} since {_clock(node['down_since'])} UTC"
    if node.get("last_heard") is None:
        return f"{name}  {DOWN} never heard from"
    work = f"run {node['run']}: {node.get('done', 0)} done" if node.get("run") else "idle"
    extra = "".join(f", {node[k]} {k}" for k in ("errors", "timeouts") if node.get(k))
    status = f"  {node['status']}" if node.get("status") else ""
    if not node.get("run") and node.get("status") == "idle":
        status = ""  # "idle  idle" says it twice
    elif not node.get("run") and status.startswith("  running run"):
        # In no running run, yet its last heartbeat said it ran one (the run ended or was
        # stopped since): say that it is what the node last said, not "idle running run".
        status = f"  (last heartbeat: {node['status']})"
    return f"{name}  {work}{extra}{status}"


def render(snap: JSON, columns: int | None = None) -> list[str]:
    """The view of ``snap`` (a :func:`~cluster.console.status.snapshot`) as lines, each cut
    to ``columns`` characters when given."""
    now = float(snap.get("now") or 0.0)
    lines = [f"cluster {snap.get('master', '')} at {_clock(now)} UTC"]
    # A busy lane's live line replaces its status line (one per lane: cluster.lanes).
    busy = {r.get("lane", r.get("priority")) for r in snap.get("running", [])}
    for run in snap.get("running", []):
        lines.append(run_line(run, now))
    for entry in snap.get("status", []):
        if entry.get("lane", entry.get("priority")) not in busy:
            lines.append(f"{_lane(entry)} {entry['line']}")
    if not snap.get("running") and not snap.get("status"):
        lines.append("idle")
    nodes = snap.get("nodes", [])
    provision = provisioning.lines(snap.get("provision"))
    if provision:
        lines.append("")
        lines += provision
    lines.append("")
    lines.append(f"nodes ({len(nodes)}):")
    width = max((len(n["name"]) for n in nodes), default=0)
    lines += ["  " + node_line(n, width) for n in nodes]
    lines.append("")
    lines.append("queues:")
    waiting = False
    for queue in snap.get("queues", []):
        for run in queue.get("runs", []):
            waiting = True
            lines.append(f"  p{queue['priority']} {run['line']}"
                         + ("  (running)" if run.get("running") else ""))
    if not waiting:
        lines.append("  empty")
    recent = snap.get("recent", [])[:RECENT_SHOWN]
    if recent:
        lines.append("")
        lines.append("recent runs:")
        for r in recent:
            counts = ", ".join(f"{r[k]} {k}" for k in ("differences", "indeterminate",
                                                                 "errors")
                               if r.get(k) is not None)
            lines.append(f"  {_clock(r.get('ended'))} {r['run']} {r.get('what', '')}: "
                         f"{r.get('outcome', '')}, {_span(r.get('elapsed'))}"
                         + (f", {counts}" if counts else ""))
    if columns is not None and columns > 0:
        lines = [line[:columns] for line in lines]
    return lines


def watch(take: Callable[[], JSON], out: TextIO, interval: float, *, once: bool,
          stop: Callable[[], bool], wait: Callable[[float], bool],
          columns: Callable[[], int | None] = lambda: None) -> int:
    """Print the view of ``take()``: once (``once``), or redrawn in place every
    ``interval`` seconds until ``stop()`` (``wait(seconds)`` sleeps, returning True when
    stopped).  Returns how many times it drew."""
    drawn = 0
    while True:
        text = "\n".join(render(take(), columns())) + "\n"
        out.write(text if once else CLEAR + text)
        out.flush()
        drawn += 1
        if once or stop() or wait(interval):
            return drawn
