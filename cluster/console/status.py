"""The status model: what the cluster is doing, read from the files of the master home.

Two entry points, both JSON-able dicts (the status page's API, clusteradmin's ``--json``,
clustermonitor's input):

* :func:`snapshot` -- the queues, the running runs (their ``live[.lane].json``, one per busy
  lane: :mod:`cluster.lanes`), the nodes and the 20 newest archived runs;
* :func:`run_detail` -- one run, queued, running or finished: its description, which node
  ran which tests and which failed (seed 002's statistics).

Nothing here writes to the home; the master and the monitor own every file read.

Schema of :func:`snapshot` (version 1; keys may be added, never renamed)::

    {"version": 1, "now": <epoch>, "master": "<hostname>",
     "queues": [{"priority": 0, "runs": [{"line", "kind", "who", "products", "queued",
                 "running", "id", "options", "waits", "order"}]}],
     "running": [<live.json dict> + "lane", "lane_name", "elapsed", "state",
                 "stop_requested", "status", "order"],
     "nodes": [{"name", "caps", "status", "last_heard", "down_since", "disabled", "run",
                "done", "errors", "timeouts", "down", "disabled_reason"}],
     "recent": [{"run", "kind", "what", "who", "started", "ended", "elapsed", "outcome",
                 "nodes", "differences", "errors", "indeterminate", "priority",
                 "links": {"report", "tab", "bmpcmp"}}],
     "status": [{"priority", "lane", "line"}],
     "provision": None | {"summary", "jobs", "trouble", "stale", ...}}

Where the facts come from, and the decisions made:

* ``queues[].runs[].who`` is the line's ref: a user run's user, a commit run's commit, an
  auto run's schedule name.  ``running``: a lane's job.start holds the line (each lane's
  run holds the first equal line no other holds; priority 0's queue may have several
  running lines, at its front).  ``id`` is the run id of a running line, else
  ``p<priority>:<position>`` (1-based), the name :func:`run_detail` and ``clusteradmin``
  take for a waiting run.
* ``waits``: what a waiting run that cannot start waits for (its ``after=`` runs, a bmpcmp
  run's compared run), or why it leaves its queue; "" otherwise (:func:`cluster.deps.waits`).
* ``queued``: a queue line carries no time, and the dropping it came from is gone once it
  is queued.  So the time is the queue file's mtime when this process first saw the line:
  a long-running reader (the status server) sees a new line at its next look, right after
  the append that changed the mtime, so the time is exact unless the queue changed again
  in between; a line already queued when the process started gets the mtime of that first
  look, an upper bound ("waiting since at least").
* ``running``: the ``live[.lane].json`` of each lane whose ``job[.lane].start`` names the
  same run (a live file left by a killed master is ignored), in lane order
  (:data:`cluster.lanes.ALL_LANES`: priority 0 may have several), plus ``lane`` and
  ``lane_name`` (:func:`cluster.lanes.describe`: ``priority 0 (lane 3)``), ``elapsed`` (now -
  started), ``state`` ("running"), ``stop_requested`` (the first line of
  ``runs/<id>/stop`` or None) and ``status`` (the lane's ``status[.lane]`` line).  A run
  whose job.start exists but whose master has not written its live file yet (it is
  building the job list) is listed with the same keys, zero counts and ``state``
  "starting".
* ``nodes``: every name with a ``.up``, ``.down``, ``.status`` or ``.caps`` file in
  ``nodes/``, and every node a running run's live file names.  ``last_heard`` is the
  ``.up`` mtime; a node not heard from for ``node_down_after`` seconds (300) is down since
  ``last_heard + node_down_after`` (``down_since``, and ``down`` true).  ``run``, ``done``,
  ``errors``, ``timeouts`` come from the live file of the run the node takes part in.
* ``provision``: the provisioner's status file ``provision.json`` (docs/provisioning.md,
  "The provisioner's status file"), None when there is none; its schema and its lines are
  :mod:`cluster.console.provisioning`'s.  A node that a batch job of it runs (the job's
  ``node`` is the node's name) carries ``batch_job``: ``{"engine", "id"}``.
* ``recent``: the 20 newest folders of ``archive/`` that hold a ``run.info`` (run ids start
  with their UTC start time, so the name order is the time order).  ``ended`` is
  run.info's mtime (it is written last), ``elapsed`` and ``outcome`` its lines, and
  ``nodes``, ``differences``, ``errors``, ``indeterminate`` (tests whose second run gave
  another output; docs/results.md) its summary lines when the master wrote them
  (None otherwise: the .tab is never read for the list).  ``bmpcmp`` links the bmpcmp page
  (``bmpcmp/index.html``) of a bmpcmp run, ``tab`` the run's table when it has one.

Speed (bench/console_status.py): with 200 archived runs and 1,000 nodes a snapshot takes
about a millisecond when nothing changed, and a few more after the running run's live file
was rewritten.  What is read from ``archive/`` is cached per folder by the folder's (inode,
mtime) -- an archived run's files are written by rename, which changes the folder's mtime --
and the ``.tab`` is never read for the list; small files (job.start, live files, queues,
status lines) are re-read only when their (inode, mtime, size) changed; ``nodes/`` is listed
(one stat per node) at most every ``nodes_ttl`` seconds (1 s), and a node's ``.status`` and
``.caps`` are re-read only when its ``.up`` mtime changed (the monitor rewrites them before
it touches ``.up``).  The caches live in a :class:`StatusReader`, one per process by
default, safe to share between threads; what :func:`snapshot` returns shares nested values
with them, so callers serialize it and never change it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from cluster import deps, lanes
from cluster.config import Config
from cluster.console import nodelist, provisioning, sweepdetail
from cluster.console.runinfo import (
    first_line,
    given_options,
    is_run_id,
    lane_starts,
    queue_ref,
    queued_info,
    recorded_order,
    run_options,
    running_lines,
    running_order,
    small_text,
    start_info,
    with_run_options,
)
from cluster.console.runrecords import Journal, archive_entry, finished, read_journal
from cluster.defaults import PRIORITIES
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files import ending
from cluster.queue import QueueFile
from cluster.runoptions import ORDER_KEY, order_of
from cluster.runspec import SWEEP, RunSpec
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.console")

VERSION = 1
#: How many archived runs the snapshot lists.
RECENT = 20
#: A waiting run's name: ``p<priority>:<position in its queue, from 1>``.
QUEUED_REF = re.compile(r"p([0-9]+):([1-9][0-9]*)")
#: Finished runs whose per-node tables run_detail keeps (a .tab can be large).
DETAIL_CACHE = 4

#: How long a listing of nodes/ (and the nodes' heartbeat times) is reused [seconds]:
#: a stat per node costs milliseconds with 1,000 nodes, and liveness is judged in minutes.
NODES_TTL = 1.0

JSON = dict[str, Any]
T = TypeVar("T")


# ---------------------------------------------------------------------------------- caches


class StatusReader:
    """The caches behind :func:`snapshot` and :func:`run_detail`; thread-safe."""

    def __init__(self, nodes_ttl: float = NODES_TTL) -> None:
        self._lock = threading.Lock()
        #: archive folder -> ((inode, mtime_ns), its recent-runs entry or None)
        self._archives: dict[Path, tuple[tuple[int, int], JSON | None]] = {}
        #: (nodes folder, node) -> ((.up mtime, files it has), (status, caps))
        self._files: dict[tuple[str, str], tuple[tuple[int | None, frozenset[str]],
                                                 tuple[str, str]]] = {}
        #: (queue file, line, occurrence) -> the time it was first seen
        self._queued: dict[tuple[Path, str, int], float | None] = {}
        self._journals: dict[Path, Journal] = {}
        #: archive folder and its (inode, mtime_ns) -> its run_detail (a few, newest used)
        self._details: OrderedDict[tuple[Path, tuple[int, int]], JSON] = OrderedDict()
        #: file -> ((inode, mtime_ns, size), what it parsed to): job.start, live.json, ...
        self._parses: dict[Path, tuple[tuple[int, int, int], object]] = {}
        #: nodes folder -> (when it was listed [monotonic], its listing)
        self._listings: dict[str, tuple[float, nodelist.Listing]] = {}
        #: nodes folder -> the nodes list made last
        self._made: dict[str, nodelist.Made] = {}
        self.nodes_ttl = nodes_ttl
        self.archive_reads = 0  # how many archive folders were read (the cache's test)
        self.host = socket.gethostname()

    def _parsed(self, path: Path, parse: Callable[[Path], T]) -> T | None:
        """``parse(path)``, redone only when the file changed (by inode, mtime and size);
        None while the file does not exist.  The value is shared with the cache: callers
        never change it."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            self._parses.pop(path, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._parses.get(path)
        if hit is not None and hit[0] == key:
            return cast(T, hit[1])
        try:
            value = parse(path)
        except FileNotFoundError:
            return None
        self._parses[path] = (key, value)
        return value

    # ------------------------------------------------------------------ snapshot
    def snapshot(self, home: Home, cfg: Config, now: float | None = None) -> JSON:
        now = time.time() if now is None else now
        with self._lock:
            running, starts = self._running(home, now)
            provision = self._provision(home, now)
            return {
                "version": VERSION, "now": now, "master": self.host,
                "queues": self._queues(home, list(starts.values())),
                "running": running,
                "nodes": provisioning.mark_nodes(self._nodes(home, cfg, running, now),
                                                 provision),
                "recent": self._recent(home),
                "status": [{"priority": lanes.priority_of(lane), "lane": lane, "line": line}
                           for lane in lanes.ALL_LANES
                           if (line := self._parsed(home.status(lane), first_line))],
                "provision": provision,
            }

    def _provision(self, home: Home, now: float) -> JSON | None:
        """The provisioner's status file as the snapshot's entry, or None without one."""
        path = home.provision_status
        loaded = self._parsed(path, provisioning.load)
        return None if loaded is None else provisioning.entry(path, loaded, now)

    def _running(self, home: Home, now: float) -> tuple[list[JSON], dict[int, JobStart]]:
        """The running runs, one per busy lane (cluster.lanes) in lane order, and lane ->
        job.start."""
        running: list[JSON] = []
        starts: dict[int, JobStart] = {}
        for lane in lanes.ALL_LANES:
            start = self._parsed(home.job_start(lane), _job_start)
            if start is None:
                continue
            starts[lane] = start
            live = self._live(home, lane, start.id)
            if live is None:
                live = {"version": VERSION, "run": start.id, "priority": start.priority,
                        "kind": start.kind, "queue": start.queue,
                        "products": list(start.products), "started": None, "updated": None,
                        "jobs": {"total": 0, "done": 0, "running": 0, "left": 0},
                        "rate": 0.0, "eta": None, "nodes": {}, "lost": [], "fatal": "",
                        "stopping": "", "waiting": "", "state": "starting"}
            else:
                live.setdefault("state", "running")
            live["lane"] = lane
            live["lane_name"] = lanes.describe(lane)
            started = live.get("started")
            live["elapsed"] = max(0.0, now - started) if isinstance(started, int | float) \
                else None
            live["stop_requested"] = first_line(home.stop_request(start.id))
            live["status"] = self._parsed(home.status(lane), first_line) or ""
            live["run_options"] = run_options(start.queue)
            # clusteradmin order on a running run: recorded beside it, shown (not preempting).
            live["order"] = running_order(home, start)
            if recorded_order(home, start.id) is not None:
                live["run_options"] = sorted(
                    [w for w in live["run_options"] if not w.startswith(f"{ORDER_KEY}=")]
                    + [f"{ORDER_KEY}={live['order']}"])
            running.append(live)
        return running, starts

    def live_file(self, home: Home, lane: int) -> JSON | None:
        with self._lock:
            return self._parsed(home.live(lane), _live_json)

    def _live(self, home: Home, lane: int, run_id: str) -> JSON | None:
        """A shallow copy of the live file of the run ``lane`` serves (its nested values
        are the cache's)."""
        live = self._parsed(home.live(lane), _live_json)
        if live is None or live.get("run") != run_id:
            return None  # none yet, or another run's, left by a master that was killed
        return dict(live)

    def _queues(self, home: Home, starts: list[JobStart]) -> list[JSON]:
        queues: list[JSON] = []
        by_priority: dict[int, list[RunSpec]] = {}
        for p in PRIORITIES:
            queue = QueueFile.for_priority(home, p)
            try:
                read = self._parsed(queue.path, _queue_reader(queue))
            except (OSError, ClusterError) as exc:
                log.warning("%s: %s", queue.path, exc)
                read = None
            specs, mtime = read if read is not None else ([], None)
            by_priority[p] = specs
            # Its running runs: one per busy lane of the priority, at the queue's front.
            held = running_lines([s for s in starts if s.priority == p], specs)
            counts: dict[str, int] = {}
            runs: list[JSON] = []
            for position, spec in enumerate(specs, start=1):
                line = spec.line()
                counts[line] = counts.get(line, 0) + 1
                key = (queue.path, line, counts[line])
                queued = self._queued.setdefault(key, mtime)
                start = held.get(position - 1)
                runs.append({"line": line, "kind": spec.kind, "who": spec.ref,
                             "products": list(spec.products), "options": list(spec.options),
                             "run_options": given_options(spec.options), "queued": queued,
                             "order": order_of(spec.options),
                             "running": start is not None,
                             "id": start.id if start is not None
                             else queue_ref(p, position)})
            # Forget lines that left this queue (a line queued again later is new).
            for key in [k for k in self._queued if k[0] == queue.path
                        and counts.get(k[1], 0) < k[2]]:
                del self._queued[key]
            queues.append({"priority": p, "runs": runs})
        # What each run that cannot start waits for (after=, bmpcmp; cluster.deps).
        waiting = deps.waits(home, by_priority)
        for q in queues:
            for index, run in enumerate(q["runs"]):
                run["waits"] = "" if run["running"] else waiting.get((q["priority"], index), "")
        return queues

    def _node_files(self, folder: str, name: str, up_mtime: int | None,
                    has: frozenset[str]) -> tuple[str, str]:
        """(status, caps) of a node, re-read only when its heartbeat time changed: the
        monitor rewrites ``.status`` and ``.caps`` before it touches ``.up``, so an
        unchanged ``.up`` mtime means unchanged files (one stat per node, not three)."""
        key = (up_mtime, has)
        hit = self._files.get((folder, name))
        if hit is not None and hit[0] == key:
            return hit[1]
        texts = (small_text(os.path.join(folder, name + ".status")) if "status" in has else "",
                 small_text(os.path.join(folder, name + ".caps")) if "caps" in has else "")
        self._files[(folder, name)] = (key, texts)
        return texts

    def _nodes(self, home: Home, cfg: Config, running: list[JSON], now: float) -> list[JSON]:
        """The nodes list.  Made again only when nodes/ was listed again (at most every
        ``nodes_ttl``), a live file changed, or ``now`` crossed a node's down time; else
        the list made last is returned (shared: callers never change it)."""
        folder = str(home.nodes)
        clock = time.monotonic()
        listed = self._listings.get(folder)
        if listed is None or clock - listed[0] >= self.nodes_ttl:
            listed = (clock, self._list(folder))
            self._listings[folder] = listed
        lives = tuple(live.get("nodes") for live in running)
        after = cfg.node_down_after
        made = self._made.get(folder)
        if made is not None and made.listing is listed[1] and made.after == after \
                and len(made.lives) == len(lives) \
                and all(a is b for a, b in zip(made.lives, lives, strict=True)) \
                and made.valid_from <= now < made.valid_until:
            return made.nodes
        nodes, valid_from, valid_until = nodelist.node_list(listed[1], running, after, now)
        self._made[folder] = nodelist.Made(listed[1], lives, after, valid_from, valid_until, nodes)
        # Forget nodes that are gone (the cache stays the size of nodes/).
        if len(self._files) > len(listed[1]) + 64:
            for key in [k for k in self._files if k[0] == folder and k[1] not in listed[1]]:
                del self._files[key]
        return nodes

    def _list(self, folder: str) -> nodelist.Listing:
        """nodes/ now: each node's files, heartbeat time, status, caps and down file."""
        listing: nodelist.Listing = {}
        found = nodelist.list_nodes(folder)
        for name in sorted(found):  # the listing's order is the snapshot's
            has, mtime, mtime_ns = found[name]
            status, caps = self._node_files(folder, name, mtime_ns, has)
            down = small_text(os.path.join(folder, name + ".down")) if "down" in has else None
            files = nodelist.NodeFiles(has, mtime, status, caps, down)
            listing[name] = dataclasses.replace(files, base=nodelist.base_entry(name, files))
        return listing

    def _recent(self, home: Home) -> list[JSON]:
        try:
            names = sorted((n for n in os.listdir(home.archive) if not n.startswith(".")),
                           reverse=True)
        except FileNotFoundError:
            return []
        recent: list[JSON] = []
        for name in names:
            entry = self.archived(home, name)
            if entry is not None:
                recent.append(entry)
                if len(recent) >= RECENT:
                    break
        return recent

    def archived(self, home: Home, run_id: str) -> JSON | None:
        """The recent-runs entry of archived run ``run_id`` (None: no such finished run).
        Callers hold the lock, or accept a race on the cache (it only ever re-reads)."""
        folder = home.archive / run_id
        try:
            st = folder.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        key = (st.st_ino, st.st_mtime_ns)
        hit = self._archives.get(folder)
        if hit is not None and hit[0] == key:
            return None if hit[1] is None else dict(hit[1])
        self.archive_reads += 1
        entry = archive_entry(folder, run_id)
        self._archives[folder] = (key, entry)
        return None if entry is None else dict(entry)

    # ------------------------------------------------------------------ one run
    def run_detail(self, home: Home, run_id: str) -> JSON:
        with self._lock:
            return self._run_detail(home, run_id)

    def _run_detail(self, home: Home, run_id: str) -> JSON:
        match = QUEUED_REF.fullmatch(run_id)
        if match is not None:
            return self._queued_detail(home, int(match.group(1)), int(match.group(2)), run_id)
        if not is_run_id(run_id):
            raise ClusterError(f"{run_id!r} is not a run id (expected a run id such as "
                               f"20250101120000-p0-ab12, or p<priority>:<position> for a "
                               f"waiting run)")
        for lane, start in lane_starts(home).items():
            if start.id == run_id:
                return self._running_detail(home, lane, start)
        record = home.run_dir(run_id) / ending.FILE_NAME
        if record.exists() and not (home.archive / run_id / "run.info").exists():
            try:
                end = ending.EndRecord.load(record)
            except (OSError, ValueError) as exc:
                raise ClusterError(f"run {run_id}: its end record is unreadable: {exc}"
                                   ) from None
            detail = self._journal_detail(home, end.start.lane, run_id)
            info = with_run_options(start_info(end.start))
            info.update({"outcome": end.outcome.value, "reason": end.reason,
                         "elapsed": f"{end.elapsed:.1f}"})
            if end.start.products == (SWEEP,):
                detail["sweep"] = sweepdetail.running(home.run_dir(run_id))
            return {"run": run_id, "state": "running", "ending": True, "info": info,
                    **detail}
        if (home.archive / run_id / "run.info").is_file():
            return self._finished_detail(home, run_id)
        raise ClusterError(f"run {run_id} is not queued, running or archived in "
                           f"{home.root} (see clusteradmin stat)")

    def _queued_detail(self, home: Home, priority: int, position: int, ref: str) -> JSON:
        if priority not in PRIORITIES:
            raise ClusterError(f"{ref}: there is no priority {priority} (expected one of "
                               f"{', '.join(map(str, PRIORITIES))})")
        specs = QueueFile.for_priority(home, priority).read()
        if position > len(specs):
            raise ClusterError(f"{ref}: queue {priority} holds {len(specs)} run(s), not "
                               f"{position}")
        spec = specs[position - 1]
        starts = lane_starts(home, priority)
        start = running_lines(starts.values(), specs).get(position - 1)
        if start is not None:
            return self._running_detail(home, next(lane for lane, s in starts.items()
                                                   if s is start), start)
        return {"run": ref, "state": "queued",
                "info": queued_info(spec, priority, position),
                "by_node": {}, "failed": [], "counts": {}}

    def _running_detail(self, home: Home, lane: int, start: JobStart) -> JSON:
        detail = self._journal_detail(home, lane, start.id)
        live = self._live(home, lane, start.id)
        if live is not None:
            jobs = live.get("jobs") or {}
            detail["counts"].update({k: jobs.get(k) for k in ("total", "running", "left")})
        info = with_run_options(start_info(start))
        if start.products == (SWEEP,):
            detail["sweep"] = sweepdetail.running(home.run_dir(start.id))
        return {"run": start.id, "state": "running", "info": info, "live": live,
                "stop_requested": first_line(home.stop_request(start.id)), **detail}

    def _journal_detail(self, home: Home, lane: int, run_id: str) -> JSON:
        """by_node, failed and counts of a run from the results journal of the lane that
        serves it (read on from where the last call stopped: the journal only grows while
        its run lasts)."""
        path = home.results(lane)
        try:
            st = path.stat()
        except FileNotFoundError:
            return {"by_node": {}, "failed": [], "counts": {"done": 0, "failed": 0,
                                                            "nodes": 0}}
        state = self._journals.get(path)
        if state is None or state.identity != (st.st_ino, st.st_dev) or st.st_size < \
                state.offset:
            state = Journal((st.st_ino, st.st_dev))
            self._journals[path] = state
        read_journal(path, state)
        if state.run_id != run_id:
            by_node: dict[str, list[str]] = {}
            failed: list[JSON] = []
        else:
            by_node, failed = state.by_node, state.failed
        return {"by_node": {n: list(t) for n, t in sorted(by_node.items())},
                "failed": list(failed),
                "counts": {"done": sum(len(t) for t in by_node.values()),
                           "failed": len(failed), "nodes": len(by_node)}}

    def _finished_detail(self, home: Home, run_id: str) -> JSON:
        folder = home.archive / run_id
        st = folder.stat()
        key = (folder, (st.st_ino, st.st_mtime_ns))
        cached = self._details.get(key)
        if cached is None:
            cached = finished(folder, run_id)
            self._details[key] = cached
            while len(self._details) > DETAIL_CACHE:
                self._details.popitem(last=False)
        else:
            self._details.move_to_end(key)
        return json.loads(json.dumps(cached))  # a copy the caller may change


def _job_start(path: Path) -> JobStart | None:
    try:
        return JobStart.parse(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as exc:
        log.warning("%s: %s", path, exc)
        return None


def _live_json(path: Path) -> JSON | None:
    try:
        live = json.loads(path.read_bytes())
    except ValueError as exc:
        log.warning("%s is not JSON (%s); ignored", path, exc)
        return None
    return live if isinstance(live, dict) else None


def _queue_reader(queue: QueueFile) -> Callable[[Path], tuple[list[RunSpec], float]]:
    """What :meth:`StatusReader._parsed` calls for a queue: its runs (read under its lock)
    and the file's mtime."""
    def read(path: Path) -> tuple[list[RunSpec], float]:
        return queue.read(), path.stat().st_mtime
    return read


#: The reader :func:`snapshot` and :func:`run_detail` use (one per process).
READER = StatusReader()


def live_status(home: Home, lane: int) -> JSON | None:
    """The ``live[.lane].json`` of ``lane`` (cluster.lanes: a priority's own lane is its
    number) as it is (any run's), or None.  Shared with the cache: callers never change
    it."""
    return READER.live_file(home, lane)


def snapshot(home: Home, cfg: Config, now: float | None = None) -> JSON:
    """The cluster now, as a JSON-able dict (schema in the module's docstring).

    ``now``: wall-clock epoch seconds (default: the system clock); node liveness is judged
    against it.  Never raises for a missing or half-written file: what cannot be read is
    logged and left out.
    """
    return READER.snapshot(home, cfg, now)


def run_detail(home: Home, run_id: str) -> JSON:
    """One run: ``{"run", "state" ("queued"|"running"|"finished"), "info", "by_node",
    "failed", "counts"}`` and, by state, ``live``/``stop_requested`` (running),
    ``ending`` (its end steps are being done), ``links``/``report_head`` (finished), and
    for a sweep run ``sweep``: its tasks by status and failed parameter sets
    (:mod:`cluster.console.sweepdetail`: from ``results.tsv`` once archived, from the tries
    so far while it runs); for a finished run whose changed tests were run twice (issue
    26) ``confirm``: each one's verdict (``test``, ``kind``, ``nodes``, ``digests``, ``why``).

    ``run_id``: a run id (running or archived), or ``p<priority>:<position>`` for a waiting
    run.  ``by_node`` maps each machine to the tests it ran (a running run's from its
    results journal, a finished one's from its .tab); ``failed`` lists ``{"test", "error",
    "machine"}`` of every test with a non-zero error code.  ClusterError naming the run if
    it is not queued, running or archived.
    """
    return READER.run_detail(home, run_id)
