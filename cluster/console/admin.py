"""clusteradmin's commands (seed 003's prun admin, for this cluster): what each reads or
writes in the master home, and how its answer is printed.

Reading commands return JSON-able dicts built from :mod:`cluster.console.status` (and
:mod:`cluster.console.history`), and a ``format_*`` function turns each into text lines:

* :func:`stat` -- the queues, the running runs (each named by its lane,
  :func:`cluster.lanes.describe`; done/total, rate, estimated end), node
  counts and, when a provisioner runs, its last look ("from Slurm: wanted W, pending P,
  running R", its jobs, its trouble: :mod:`cluster.console.provisioning`);
* :func:`nodes` -- one row per node: state (up, down, disabled), last heard, run, done, caps;
* :func:`info` -- one run, queued, running or archived (:func:`status.run_detail`).

Steering commands write the files the master and the monitor act on:

* :func:`stop` -- a running run: ``runs/<id>/stop``
  (:func:`~cluster.master.files.abort.request_stop`; the master serving it ends it as
  aborted, "stopped by <who>[: reason]"); a waiting run: withdrawn from its queue
  (:meth:`cluster.queue.QueueFile.withdraw`);
* :func:`stop_all` -- every running run and every waiting run;
* :func:`disable_node` / :func:`enable_node` -- ``nodes/<name>.down`` (first line
  ``disabled by <who> at <ISO time>``, then the reason): the master gives a disabled node
  no work.

A run is named by its id, or a waiting run by ``p<priority>:<position>`` (as ``stat``
shows it) or by its queue line.  Errors (an unknown run, node or test) are ClusterErrors
naming the thing.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster import lanes
from cluster.config import Config
from cluster.console import bless as blessed
from cluster.console import history as test_history
from cluster.console import nodelist, provisioning, runinfo, status
from cluster.datatypes import valid_node_name
from cluster.defaults import PRIORITIES
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.master.files import abort, groups
from cluster.queue import QueueFile
from cluster.report import indeterminate
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.wire.jobstart import JobStart

JSON = dict[str, Any]
#: How many failed tests ``info`` prints (``--json`` has them all).
MAX_FAILED_SHOWN = 50


def who_am_i() -> str:
    """``$USER@hostname``: who a stop or a disable is recorded as."""
    user = os.environ.get("USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def _when(epoch: float | None, now: float | None = None) -> str:
    """``2025-01-02 12:00:00 UTC``, with ``(N s ago)`` / ``(in N s)`` when ``now`` is given."""
    if epoch is None:
        return "-"
    text = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
    if now is not None:
        delta = epoch - now
        text += f" (in {_span(delta)})" if delta >= 0 else f" ({_span(-delta)} ago)"
    return text


def _span(seconds: float | None) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def node_state(node: JSON) -> str:
    """``disabled``, ``down`` or ``up``."""
    if node.get("disabled"):
        return "disabled"
    return "down" if node.get("down") else "up"


# ---------------------------------------------------------------------------------- stat
def stat(home: Home, cfg: Config, now: float | None = None) -> JSON:
    """The cluster in brief: queues, running runs with progress, node counts."""
    snap = status.snapshot(home, cfg, now)
    states = [node_state(n) for n in snap["nodes"]]
    return {
        "now": snap["now"], "master": snap["master"],
        "running": [{
            "run": r["run"], "priority": r["priority"], "lane": r.get("lane", r["priority"]),
            "kind": r["kind"],
            "queue": r["queue"], "state": r.get("state", "running"),
            "done": r["jobs"].get("done", 0), "total": r["jobs"].get("total", 0),
            "running": r["jobs"].get("running", 0), "left": r["jobs"].get("left", 0),
            "rate": r.get("rate"), "eta": r.get("eta"), "elapsed": r.get("elapsed"),
            "nodes": len(r.get("nodes") or {}), "stopping": r.get("stopping") or "",
            "stop_requested": r.get("stop_requested"),
            "waiting": r.get("waiting") or "", "order": r.get("order", 0),
        } for r in snap["running"]],
        "queues": [{"priority": q["priority"], "waiting": sum(not r["running"]
                                                              for r in q["runs"]),
                    "runs": q["runs"]} for q in snap["queues"]],
        "nodes": {"total": len(states), "up": states.count("up"),
                  "down": states.count("down"), "disabled": states.count("disabled"),
                  "in_a_run": sum(1 for n in snap["nodes"] if n["run"])},
        "provision": snap.get("provision"),
    }


def format_stat(data: JSON) -> list[str]:
    now = data["now"]
    lines = [f"master {data['master']}, {_when(now)}", "running:"]
    for r in data["running"]:
        total = r["total"]
        pct = f" ({100 * r['done'] / total:.0f}%)" if total else ""
        line = (f"  p{r['priority']} {r['run']} {r['queue']}: "
                + ("starting (making the job list)" if r["state"] == "starting" else
                   f"{r['done']}/{total} done{pct}, {r['running']} running, {r['left']} left, "
                   f"{r['rate'] or 0:.1f}/s, eta {_when(r['eta'], now)}, {r['nodes']} nodes, "
                   f"{_span(r['elapsed'])} so far"))
        lane = r.get("lane", r["priority"])
        if lane != r["priority"]:  # a user lane: priority 0's second, third ... master
            line += f" [{lanes.describe(lane)}]"
        if r.get("order"):
            line += f" [order {r['order']}]"
        if r.get("waiting"):
            line += f" [waiting: {r['waiting']}]"
        if r["stopping"] or r["stop_requested"]:
            line += f" [stopping: {r['stopping'] or 'requested by ' + r['stop_requested']}]"
        lines.append(line)
    if not data["running"]:
        lines.append("  none")
    lines.append("queues:")
    for q in data["queues"]:
        lines.append(f"  priority {q['priority']}: {q['waiting']} waiting"
                     + ("" if q["runs"] else ""))
        for run in q["runs"]:
            lines.append(f"    {run['id']:<24} {run['line']}"
                         + ("  (running)" if run["running"] else
                            f"  queued {_when(run['queued'], now)}")
                         + (f"  [order {run['order']}]" if run.get("order") else ""))
            if run.get("waits"):  # its after= runs, or the run a bmpcmp compares
                lines.append(f"      {run['waits']}")
    n = data["nodes"]
    lines.append(f"nodes: {n['total']} ({n['up']} up, {n['down']} down, {n['disabled']} "
                 f"disabled; {n['in_a_run']} in a run)")
    # The provisioner's last look, when there is one (docs/provisioning.md).
    lines += provisioning.lines(data.get("provision"))
    return lines


# ---------------------------------------------------------------------------------- ls
def nodes(home: Home, cfg: Config, now: float | None = None) -> JSON:
    """Every node: name, state, last heard, run, done, errors, timeouts, caps, status."""
    snap = status.snapshot(home, cfg, now)
    return {"now": snap["now"], "nodes": [{**n, "state": node_state(n)}
                                          for n in snap["nodes"]]}


def format_nodes(data: JSON) -> list[str]:
    now = data["now"]
    rows = [("NAME", "STATE", "LAST HEARD", "RUN", "DONE", "CAPS")]
    for n in data["nodes"]:
        heard = "never" if n["last_heard"] is None else f"{_span(now - n['last_heard'])} ago"
        state = n["state"]
        if state == "down" and n["down_since"] is not None:
            state = f"down since {time.strftime('%H:%M:%S', time.gmtime(n['down_since']))}"
        rows.append((n["name"], state, heard, n["run"] or "-", str(n["done"]),
                     n["caps"] or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
             for r in rows]
    for n in data["nodes"]:
        if n["disabled"]:
            lines.append(f"{n['name']}: {n['disabled']}"
                         + (f" ({n['disabled_reason']})" if n["disabled_reason"] else ""))
    if not data["nodes"]:
        lines = ["no node has been heard from"]
    return lines


# ---------------------------------------------------------------------------------- info
def info(home: Home, run: str) -> JSON:
    """One run (see :func:`cluster.console.status.run_detail`); ``run`` may also be a
    waiting run's queue line."""
    return status.run_detail(home, resolve_queued(home, run) or run)


def format_info(data: JSON) -> list[str]:
    lines = [f"run {data['run']}: {data['state']}" + (" (its end steps are under way)"
                                                     if data.get("ending") else "")]
    for key, value in data["info"].items():
        lines.append(f"  {key}: {value}")
    live = data.get("live")
    if live:
        jobs = live.get("jobs", {})
        lines.append(f"  progress: {jobs.get('done', 0)}/{jobs.get('total', 0)} done, "
                     f"{jobs.get('running', 0)} running, rate {live.get('rate') or 0:.1f}/s, "
                     f"eta {_when(live.get('eta'))}")
    if data.get("stop_requested"):
        lines.append(f"  stop requested by {data['stop_requested']}")
    counts = data.get("counts") or {}
    if counts:
        lines.append("  counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()
                                              if v is not None))
    if data["by_node"]:
        lines.append("  tests per node:")
        failed_by: dict[str, int] = {}
        for f in data["failed"]:
            failed_by[f["machine"]] = failed_by.get(f["machine"], 0) + 1
        for node, tests in data["by_node"].items():
            lines.append(f"    {node}: {len(tests)} tests, {failed_by.get(node, 0)} failed")
    if data["failed"]:
        lines.append(f"  failed tests ({len(data['failed'])}):")
        for f in data["failed"][:MAX_FAILED_SHOWN]:
            lines.append(f"    {f['test']}  error {f['error']}  on {f['machine']}")
        if len(data["failed"]) > MAX_FAILED_SHOWN:
            lines.append(f"    ... and {len(data['failed']) - MAX_FAILED_SHOWN} more "
                         f"(--json lists them all)")
    links = data.get("links") or {}
    for name, link in links.items():
        if link:
            lines.append(f"  {name}: {home_path(link)}")
    head = data.get("report_head")
    if head and data["info"].get("outcome") not in (None, "done"):
        lines.append("  report:")
        lines += [f"    {line}" for line in head[:20]]
    return lines


def home_path(link: str) -> str:
    """A status-page link (``/archive/<id>/report.txt``) as a path in the home."""
    return link.lstrip("/")


# ---------------------------------------------------------------------------------- stop
@dataclass(frozen=True)
class Stopped:
    """What a stop did: asked the master to stop a running run, or withdrew a waiting one."""

    action: str  # "stop requested" or "withdrawn"
    run: str  # the run id, or the waiting run's p<priority>:<position>
    priority: int
    line: str
    #: The lane whose master serves the stopped run (cluster.lanes); None: a waiting run.
    lane: int | None = None

    def message(self) -> str:
        if self.action == "withdrawn":
            return f"withdrew {self.line!r} from queue {self.priority} ({self.run})"
        lane = self.priority if self.lane is None else self.lane
        master = f"priority-{self.priority} master" if lane == self.priority else \
            f"master of {lanes.describe(lane)}"
        return f"asked the {master} to stop run {self.run} ({self.line})"


def _running(home: Home) -> dict[int, JobStart]:
    """lane -> the job.start of the run it serves, every busy lane (cluster.lanes)."""
    return runinfo.lane_starts(home)


def _asked(start: JobStart, lane: int) -> Stopped:
    return Stopped("stop requested", start.id, start.priority, start.queue, lane)


def _of(running: dict[int, JobStart], priority: int) -> list[JobStart]:
    """The runs of ``running`` (lane -> job.start) that hold lines of ``priority``'s
    queue, in lane order."""
    return [running[lane] for lane in lanes.lanes_of(priority) if lane in running]


def running_starts(home: Home) -> list[JobStart]:
    """The job.start of every run running now (one per busy lane: cluster.lanes)."""
    return list(_running(home).values())


def resolve_queued(home: Home, ref: str) -> str | None:
    """``p<priority>:<position>`` of the first waiting run whose queue line is ``ref``
    (None if ``ref`` is not a queue line, or no such run waits)."""
    if " " not in ref.strip():
        return None
    try:
        spec = RunSpec.parse(ref)
    except QueueLineError:
        return None
    for p in PRIORITIES:
        for position, queued in enumerate(QueueFile.for_priority(home, p).read(), start=1):
            if queued == spec:
                return runinfo.queue_ref(p, position)
    raise ClusterError(f"no run {spec.line()!r} is queued (see clusteradmin stat)")


def queue_place(home: Home, ref: str, priority: int, position: int
                ) -> tuple[int, QueueFile, list[RunSpec], int]:
    """The queue that ``ref`` (``p<priority>:<position>``) names, its lines and the
    position, checked: ClusterError naming ``ref`` for an unknown priority or a position
    past the queue's end."""
    if priority not in PRIORITIES:
        raise ClusterError(f"{ref}: there is no priority {priority} (expected one of "
                           f"{', '.join(map(str, PRIORITIES))})")
    queue = QueueFile.for_priority(home, priority)
    specs = queue.read()
    if position > len(specs):
        raise ClusterError(f"{ref}: queue {priority} holds {len(specs)} run(s), not {position}")
    return priority, queue, specs, position


def running_at(starts: list[JobStart], specs: list[RunSpec], position: int
               ) -> JobStart | None:
    """The run of ``starts`` (the running runs of the queue's lanes, in lane order) whose
    line is line ``position`` (1-based) of a queue holding ``specs``, or None: each holds
    the first line equal to its job.start's that no other one holds (QueueFile.withdraw's
    rule; :func:`cluster.console.runinfo.running_lines`)."""
    return runinfo.running_lines(starts, specs).get(position - 1)


def is_running_line(current: JobStart | list[JobStart] | None, specs: list[RunSpec],
                    position: int) -> bool:
    """Whether line ``position`` (1-based) of a queue holding ``specs`` is a running run
    of ``current`` (one job.start or a list of them: see :func:`running_at`)."""
    starts = [] if current is None else [current] if isinstance(current, JobStart) \
        else current
    return running_at(starts, specs, position) is not None


def stop(home: Home, run: str, who: str, reason: str = "") -> Stopped:
    """Stop ``run``: a running run by its id (or its queue line, or its ``p<p>:1``), a
    waiting one by ``p<priority>:<position>`` or its queue line.  ClusterError if no such
    run is running or waiting (an archived run says it has finished)."""
    ref = resolve_queued(home, run) or run
    running = _running(home)
    match = status.QUEUED_REF.fullmatch(ref)
    if match is None:
        for lane, start in running.items():
            if start.id == ref:
                abort.request_stop(home, start.id, who, reason)
                return _asked(start, lane)
        if runinfo.is_run_id(ref) and (home.archive / ref / "run.info").is_file():
            outcome = runinfo.parse_info((home.archive / ref / "run.info").read_text(
                encoding="utf-8", errors="replace")).get("outcome", "?")
            raise ClusterError(f"run {ref} has already finished (outcome {outcome}); "
                               f"nothing to stop")
        raise ClusterError(f"run {ref!r} is neither running nor waiting (see clusteradmin "
                           f"stat)")
    priority, queue, specs, position = queue_place(home, ref, int(match.group(1)),
                                                   int(match.group(2)))
    spec = specs[position - 1]
    starts = _of(running, priority)
    current = running_at(starts, specs, position)
    if current is not None:
        abort.request_stop(home, current.id, who, reason)
        return _asked(current, next(lane for lane, s in running.items() if s is current))
    # Withdraw that line (every waiting copy of it: the same run), never a running one.
    gone = queue.withdraw(lambda s: s == spec, running=runinfo.start_specs(starts))
    if not gone:
        raise ClusterError(f"{ref} ({spec.line()}) left queue {priority} meanwhile")
    return Stopped("withdrawn", ref, priority, spec.line())


def stop_all(home: Home, who: str, reason: str = "") -> list[Stopped]:
    """Stop every running run and withdraw every waiting run; return what was done."""
    done: list[Stopped] = []
    running = _running(home)
    for lane, start in running.items():
        abort.request_stop(home, start.id, who, reason)
        done.append(_asked(start, lane))
    for p in PRIORITIES:
        queue = QueueFile.for_priority(home, p)
        for spec in queue.withdraw(lambda s: True, running=runinfo.start_specs(_of(running, p))):
            done.append(Stopped("withdrawn", f"p{p}", p, spec.line()))
    # A run that started while the queues were emptied (its line was the head): stop it.
    for lane, late in _running(home).items():
        if lane not in running or running[lane].id != late.id:
            abort.request_stop(home, late.id, who, reason)
            done.append(_asked(late, lane))
    return done


def stop_group(home: Home, group: str, who: str, reason: str = "") -> list[Stopped]:
    """Stop every run placed on group ``group`` (prun's stopg): each running run whose
    ``groups=`` names it is asked to stop, each waiting one withdrawn.  ClusterError for a
    group that does not exist and is named by no run."""
    groups.check_name(group)

    def placed(spec: RunSpec) -> bool:
        for word in spec.options:
            key, _, value = word.partition("=")
            if key == "groups" and group in value.split(","):
                return True
        return False

    done: list[Stopped] = []
    running = _running(home)
    for lane, start in running.items():
        if any(placed(spec) for spec in runinfo.start_specs([start])):
            abort.request_stop(home, start.id, who, reason)
            done.append(_asked(start, lane))
    for p in PRIORITIES:
        keep = runinfo.start_specs(_of(running, p))
        for spec in QueueFile.for_priority(home, p).withdraw(placed, running=keep):
            done.append(Stopped("withdrawn", f"p{p}", p, spec.line()))
    if not done and not home.group(group).is_file():
        raise ClusterError(f"there is no group {group!r} and no run names it (see "
                           "clusteradmin group ls)")
    return done


def wait_finished(home: Home, run_id: str, timeout: float,
                  sleep: Callable[[float], None] = time.sleep) -> str | None:
    """The outcome of run ``run_id`` once its archive has its run.info, or None after
    ``timeout`` seconds."""
    end = time.monotonic() + timeout
    info = home.archive / run_id / "run.info"
    while True:
        with contextlib.suppress(FileNotFoundError):
            return runinfo.parse_info(info.read_text(encoding="utf-8",
                                                    errors="replace")).get("outcome", "?")
        if time.monotonic() >= end:
            return None
        sleep(0.2)


# ---------------------------------------------------------------------------------- nodes
def known_node(home: Home, name: str) -> bool:
    """Whether ``name`` was ever seen: a file of it in nodes/, or a running run names it."""
    if any((home.nodes / f"{name}.{ext}").exists() for ext in nodelist.NODE_FILES):
        return True
    for lane in lanes.ALL_LANES:
        live = status.live_status(home, lane)
        if live is not None and name in (live.get("nodes") or {}):
            return True
    return False


def _check_node(home: Home, name: str) -> None:
    if not valid_node_name(name):
        raise ClusterError(f"{name!r} is not a node name (letters, digits, '.', '_', '-')")
    if not known_node(home, name):
        raise ClusterError(f"node {name} is unknown: no file of it in {home.nodes} (it has "
                           f"never sent a heartbeat)")


def disable_node(home: Home, name: str, who: str, reason: str = "") -> str:
    """Write ``nodes/<name>.down``; return what was done.  ClusterError for an unknown
    node.  One already disabled stays so, its file unchanged."""
    _check_node(home, name)
    path = home.node_down(name)
    if path.exists():
        first = runinfo.small_text(str(path)).partition("\n")[0]
        return f"node {name} is already disabled ({first})"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = f"disabled by {_one_line(who)} at {stamp}\n"
    if reason.strip():
        text += _one_line(reason) + "\n"
    fsutil.atomic_write(path, text)
    return f"node {name} disabled: the master gives it no work until `node enable {name}`"


# ---------------------------------------------------------------------------------- groups
def group_ls(home: Home, name: str | None = None) -> JSON:
    """Every group and its nodes, or only group ``name`` (ClusterError if there is none)."""
    if name is not None:
        return {"groups": {name: list(groups.members(home, name))}}
    return {"groups": {g: list(nodes) for g, nodes in groups.all_groups(home).items()}}


def format_group_ls(data: JSON) -> list[str]:
    found = data["groups"]
    if not found:
        return ["no groups (clusteradmin group create NAME)"]
    return [f"{name}: {' '.join(nodes) or '(empty)'}" for name, nodes in found.items()]


def enable_node(home: Home, name: str) -> str:
    """Remove ``nodes/<name>.down``; return what was done (also when it was not disabled).
    ClusterError for an unknown node."""
    _check_node(home, name)
    try:
        home.node_down(name).unlink()
    except FileNotFoundError:
        return f"node {name} is not disabled"
    return f"node {name} enabled"


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


# ---------------------------------------------------------------------------------- history
def history(home: Home, test: str) -> JSON:
    """The runs in which ``test`` changed (:func:`cluster.console.history.history`, each
    blessing of it counted: :mod:`cluster.console.bless`), its blessings newest first, and
    the runs in which it was found indeterminate (docs/results.md, "Differences confirmed,
    indeterminate tests named"; ``tables/indeterminate.tsv``)."""
    name = test_history.test_id(test)
    blessings = blessed.of_test(home.tables, name)
    changes = test_history.history(home, test, [
        test_history.Blessed(b.when, b.run, test_history.Result(b.error, b.md5, "", ""),
                             b.tables) for b in blessings])
    return {"test": name, "changes": [c.to_json() for c in changes],
            "blessings": [b.to_json() for b in reversed(blessings)],
            "indeterminate": [f.to_json() for f in indeterminate.read(home.tables)
                              if f.test == name]}


def flaky(home: Home) -> JSON:
    """The tests found indeterminate (docs/results.md, "Differences confirmed, indeterminate
    tests named"), newest first: when, in which run, on which nodes, with which digests
    (``tables/indeterminate.tsv``)."""
    return {"flaky": [f.to_json() for f in indeterminate.read(home.tables)]}


def format_flaky(data: JSON) -> list[str]:
    found = data["flaky"]
    if not found:
        return ["no test has been found indeterminate"]
    lines = [f"{len(found)} indeterminate finding(s), newest first:"]
    lines += [f"  {f['when']}  {f['test']}  run {f['run']}  nodes {', '.join(f['nodes'])}"
              f"  md5s {', '.join(f['digests'])}" for f in found]
    return lines


def history_times(home: Home, test: str) -> JSON:
    """``test``'s times across the archived runs (:func:`cluster.console.history.times`)."""
    found = test_history.times(home, test)
    return {"test": test_history.test_id(test), "times": [t.to_json() for t in found]}


def format_history_times(data: JSON) -> list[str]:
    rows = data["times"]
    lines = [f"test {data['test']}: its times in {len(rows)} archived run(s), newest first "
             f"(seconds: time1 + time2 + time3)"]
    for t in rows:
        who = {"git": "commit", "user": "user", "auto": "schedule"}.get(t["kind"], t["kind"])
        line = (f"  {t['run']}  {who} {t['who']}  {t['seconds']:.2f} s "
                f"({t['time1']:.2f} {t['time2']:.2f} {t['time3']:.2f})")
        if t["error"]:
            line += f"  error {t['error']}"
        if t["machine"]:
            line += f"  on {t['machine']}"
        lines.append(line)
    return lines


def format_history(data: JSON) -> list[str]:
    changes = data["changes"]
    lines = [f"test {data['test']}: {len(changes)} run(s) in which it changed, newest first"]
    for c in changes:
        after = c["after"]
        before = c["before"]
        who = {"git": "commit", "user": "user", "auto": "schedule"}.get(c["kind"], c["kind"])
        line = f"  {c['run']}  {who} {c['who']}"
        if c.get("author"):
            line += f" ({c['author']})"
        if before is None:
            line += f"  new: error {after['error']} md5 {after['md5']}"
        else:
            # Only what changed: "error 0 -> 0" says nothing.
            parts = [f"{key} {before[key]} -> {after[key]}" for key in ("error", "md5")
                     if before[key] != after[key]]
            line += f"  {c['change']}: {', '.join(parts)} (against {c['against']})"
        lines.append(line)
    for b in data.get("blessings", []):
        lines.append(f"  blessed by {b['who']} at {b['when']}: {b['reason']} (run {b['run']})")
    for f in data.get("indeterminate", []):
        lines.append(f"  {f['run']}  indeterminate ({f['when']}): md5s "
                     f"{', '.join(f['digests'])} on {', '.join(f['nodes'])}")
    return lines
