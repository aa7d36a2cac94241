"""``clusteradmin order RUN N``: change a run's ``order=`` (docs/runoptions.md, "Order
within a queue"; prun's per-job priority, seed 003).

* A **waiting** run (``p<priority>:<position>``, its queue line, as ``stop`` names one):
  its queue line is rewritten with ``order=N`` in its place, in one transaction under the
  queue's lock (:meth:`cluster.queue.QueueFile.replace`: an atomic rewrite, never a torn
  file); its master looks at the waiting runs lowest ``order=`` first the next time it
  picks a run.  ``order=0``, the default, leaves the word out.
* A **running** run (its id): its queue line stays as it is (a queue's running runs, one
  per busy lane at its front, are found by their lanes' job.start lines), and
  ``runs/<id>/order`` records the value, who and when; ``stat`` and the status page show
  it.  Nothing in the master reads it: a run once started is not preempted.

``N`` is checked first (:func:`cluster.runoptions.parse_order`): a bad one is a
RunOptionError and nothing changes.  Every change is one line of ``log/admin.log`` (who,
when, which run, from what to what), as ``stop`` and ``node disable`` record who did it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

from cluster import runoptions
from cluster.console import runinfo, status
from cluster.console.admin import queue_place, resolve_queued, running_at
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.wire.jobstart import JobStart


@dataclass(frozen=True)
class Reordered:
    """What ``order`` did: the run (its id, or the waiting run's ``p<p>:<n>``), its
    priority, its queue line (the new one for a waiting run), the old and new value."""

    run: str
    priority: int
    line: str
    old: int
    new: int
    running: bool

    def message(self) -> str:
        if self.running:
            return (f"run {self.run} runs already: order {self.old} -> {self.new} recorded "
                    f"(shown by stat; a started run is not preempted)")
        return (f"{self.run} in queue {self.priority}: order {self.old} -> {self.new} "
                f"({self.line})")


def with_order(spec: RunSpec, value: int) -> RunSpec:
    """``spec`` with ``order=value`` (without the word for the default)."""
    words = [w for w in spec.options if w.partition("=")[0] != runoptions.ORDER_KEY]
    if value != runoptions.ORDER_DEFAULT:
        words.append(f"{runoptions.ORDER_KEY}={value}")
    try:
        return dataclasses.replace(spec, options=tuple(words))
    except QueueLineError as exc:
        raise ClusterError(f"{spec.line()!r} with order={value}: {exc}") from exc


def set_order(home: Home, run: str, value: str, who: str) -> Reordered:
    """Give ``run`` (a run id, ``p<priority>:<position>`` or a queue line) ``order=value``;
    see the module docstring.  RunOptionError for a bad ``value``, ClusterError for a run
    neither running nor waiting; nothing changes then."""
    new = runoptions.parse_order(value)
    ref = resolve_queued(home, run) or run  # admin's reference rule, as stop
    starts = runinfo.lane_starts(home)  # every busy lane's run (cluster.lanes)
    match = status.QUEUED_REF.fullmatch(ref)
    if match is None:
        for start in starts.values():
            if start.id == ref:
                return _record_running(home, start.priority, start, new, who)
        raise ClusterError(f"run {ref!r} is neither running nor waiting (see clusteradmin "
                           "stat)")
    priority, queue, specs, position = queue_place(home, ref, int(match.group(1)),
                                                   int(match.group(2)))
    spec = specs[position - 1]
    mine = [s for s in starts.values() if s.priority == priority]
    current = running_at(mine, specs, position)
    if current is not None:
        return _record_running(home, priority, current, new, who)
    old = runoptions.order_of(spec.options)
    changed = with_order(spec, new)
    if changed != spec and not queue.replace(spec, changed, running=runinfo.start_specs(mine)):
        raise ClusterError(f"{ref} ({spec.line()}) left queue {priority} or started "
                           "meanwhile; nothing changed")
    done = Reordered(ref, priority, changed.line(), old, new, running=False)
    _audit(home, who, f"order {ref} {spec.line()!r} {old} -> {new}")
    return done


def _record_running(home: Home, priority: int, start: JobStart, new: int,
                    who: str) -> Reordered:
    old = runinfo.running_order(home, start)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    home.run_dir(start.id).mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write(home.run_order(start.id), f"{new}\nset by {_one_line(who)} at "
                        f"{stamp}\n")
    _audit(home, who, f"order {start.id} (running) {old} -> {new}")
    return Reordered(start.id, priority, start.queue, old, new, running=True)


def _audit(home: Home, who: str, what: str) -> None:
    """One line of ``log/admin.log``, appended in one write (O_APPEND: lines of two admins
    never mix)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    home.log_dir.mkdir(parents=True, exist_ok=True)
    line = f"{stamp} {_one_line(who)} {_one_line(what)}\n".encode()
    fd = os.open(home.admin_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())
