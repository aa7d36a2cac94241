"""Pilots: the batch job that runs an ephemeral node, and what its end tells.

docs/provisioning.md, "Pilots that cannot start".  A pilot is the small shell script
:func:`pilot_argv` makes: it names its node ``<prefix>-<job id>`` (the engine's
``job_id_shell``), sends all its output to ``<pilot_log>/<node>.log``, writes a first line
``pilot: start <epoch> host <host> job <id> python <python>``, checks that the Python it was
given can import the node's modules (a site's ``/usr/bin/python3`` without psutil says so in
one line and exits 2, before the node ever calls the master), runs the node with that
Python (``node_python``, else the provisioner's own interpreter: never the ``#!/usr/bin/env
python3`` of a cron PATH), passes on a stop signal, and writes a last line ``pilot: end
<epoch> exit <status>``.

:class:`PilotWatch` is told the jobs listed at each look, those submitted and those the
provisioner cancelled.  A job that left the listing ended: its log says on which host, how
long it lived and how it exited (:func:`read_pilot_log`).  A pilot that lived less than
``pilot_min_life``, unless it exited 0 (nothing was wanted of it) or was stopped by a
signal (a cancel, a time limit), *failed*.  Failures in a row make a *streak*: the first
one is a WARNING with the job's last lines (once per streak), submits are held back by a
pause that doubles with each failure (``pilot_backoff`` up to ``pilot_backoff_max``) and
only one pilot is tried at a time; ``pilot_exclude_after`` failures on one host exclude it
(:mod:`cluster.provision.exclusions`).  A pilot that lives past ``pilot_min_life`` ends the
streak.  A job whose log cannot be read (a folder the batch nodes do not share) is judged
by the looks that saw it: its life is the time from its submit (or first listing) to the
look that missed it, its exit and host unknown.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.provision.engine import RUNNING, EngineJob
from cluster.provision.exclusions import Exclusions
from cluster.runtime.clock import Clock

logger = logging.getLogger("cluster.provision")

#: The pilot's exit status when its Python cannot import the node's modules.
EXIT_CANNOT_START = 2
#: Exit statuses of a pilot stopped by a signal (128 + SIGHUP, SIGINT, SIGKILL, SIGTERM):
#: a cancel or a time limit, not a failure.
SIGNALLED = frozenset({129, 130, 137, 143})
#: The last lines of a pilot's log a WARNING and the console quote.
TAIL_LINES = 8
#: How much of the end of a pilot's log is read [bytes]; an ended pilot's log is cut to it.
TAIL_BYTES = 65_536
#: How much of its start is read for the first line [bytes].
HEAD_BYTES = 4096

PILOT_SCRIPT = r"""dir=$1; prefix=$2; py=$3; check=$4; shift 4
CHECK='import sys; sys.path.insert(0, sys.argv[1]); import cluster.cli.clusterpull'
id=@JOB_ID@
name="$prefix-$id"
if mkdir -p "$dir" 2>/dev/null && : >>"$dir/$name.log" 2>/dev/null; then
  exec >>"$dir/$name.log" 2>&1 </dev/null
fi
echo "pilot: start $(date +%s) host $(hostname) job $id python ${py:-none}"
if [ -n "$check" ]; then
  if ! out=$("$py" -c "$CHECK" "$check" 2>&1); then
    printf '%s\n' "$out" | tail -n 5
    echo "pilot: $py cannot import the node's modules;" \
      "set node_python in master.conf to a Python that can"
    echo "pilot: end $(date +%s) exit @CANNOT@"
    exit @CANNOT@
  fi
fi
[ -n "$py" ] && set -- "$py" "$@"
"$@" --name "$name" --quiet &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT HUP
wait $child; st=$?
while kill -0 $child 2>/dev/null; do wait $child; st=$?; done
echo "pilot: end $(date +%s) exit $st"
exit $st
"""


def pilot_log_dir(cfg: Config, home: Path) -> Path:
    """Where the pilots write their logs: ``pilot_log``, else ``<home>/log/pilots``."""
    return Path(cfg.pilot_log) if cfg.pilot_log else Path(home) / "log" / "pilots"


def node_python(cfg: Config, python: str) -> str:
    """The Python that runs the node: ``node_python``, else ``python`` (the provisioner's
    ``sys.executable``)."""
    return cfg.node_python or python


def pilot_argv(command: Sequence[str], python: str, log_dir: Path, prefix: str,
               job_id_shell: str) -> list[str]:
    """The pilot's command line: ``sh -c SCRIPT pilot DIR PREFIX PYTHON CHECK COMMAND...``.
    A ``command`` that starts with a ``.py`` script is run by ``python`` (and its imports
    checked from the script's folder); any other command as it is."""
    script_first = bool(command) and command[0].endswith(".py")
    py = python if script_first else ""
    check = os.path.dirname(os.path.abspath(command[0])) if script_first else ""
    script = (PILOT_SCRIPT.replace("@JOB_ID@", job_id_shell)
              .replace("@CANNOT@", str(EXIT_CANNOT_START)))
    return ["/bin/sh", "-c", script, "pilot", str(log_dir), prefix, py, check, *command]


@dataclass(frozen=True)
class PilotEnd:
    """What is known of an ended pilot."""

    job_id: str
    node: str
    host: str = ""                 # "" when unknown
    started: float | None = None   # epoch seconds (its first line)
    ended: float | None = None     # epoch seconds (its last line)
    status: int | None = None      # its exit status (None: no last line)
    tail: tuple[str, ...] = ()
    seen_life: float = 0.0         # the life the looks saw [seconds]
    log: str = ""                  # the log's path, "" when there is none

    @property
    def life(self) -> float:
        if self.started is not None and self.ended is not None:
            return max(0.0, self.ended - self.started)
        return self.seen_life

    def failed(self, min_life: float) -> bool:
        """Ended within ``min_life``, other than by exit 0 or a stop signal."""
        return self.life < min_life and self.status != 0 and self.status not in SIGNALLED

    def describe(self) -> str:
        """``job 42 (node slurm-42) on host vm exited 1 after 0 s``."""
        where = f" on host {self.host}" if self.host else ""
        how = (f"exited {self.status}" if self.status is not None
               else "ended without a last line (killed, or its log is not readable here)")
        return f"job {self.job_id} (node {self.node}){where} {how} after {self.life:.0f} s"


def read_pilot_log(path: Path, job_id: str, node: str, seen_life: float) -> PilotEnd:
    """The pilot log at ``path`` read (its first line and last :data:`TAIL_BYTES`)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES).decode("utf-8", "replace")
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - TAIL_BYTES))
            end = fh.read(TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return PilotEnd(job_id, node, seen_life=seen_life)
    host, started, ended, status = "", None, None, None
    first = head.splitlines()[0] if head.splitlines() else ""
    words = first.split()
    if words[:2] == ["pilot:", "start"] and len(words) >= 5:
        started = _number(words[2])
        host = words[4] if words[3] == "host" else ""
    lines = [line.rstrip() for line in end.splitlines() if line.strip()]
    if lines:
        last = lines[-1].split()
        if last[:2] == ["pilot:", "end"] and len(last) == 5 and last[3] == "exit":
            ended = _number(last[2])
            status = int(last[4]) if last[4].isdigit() else None
    return PilotEnd(job_id, node, host, started, ended, status, tuple(lines[-TAIL_LINES:]),
                    seen_life, str(path))


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def cut_log(path: Path) -> None:
    """Keep only the last :data:`TAIL_BYTES` of an ended pilot's log (bounded)."""
    try:
        with open(path, "r+b") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= TAIL_BYTES:
                return
            fh.seek(size - TAIL_BYTES)
            kept = fh.read()
            fh.seek(0)
            fh.write(kept)
            fh.truncate()
    except OSError:
        pass


def prune_logs(folder: Path, keep: int) -> int:
    """Remove the oldest ``*.log`` of ``folder`` beyond ``keep``; how many went."""
    try:
        entries = [(e.stat().st_mtime, e.path) for e in os.scandir(folder)
                   if e.name.endswith(".log") and e.is_file()]
    except OSError:
        return 0
    if len(entries) <= keep:
        return 0
    entries.sort()
    gone = 0
    for _mtime, path in entries[:len(entries) - keep]:
        try:
            os.unlink(path)
            gone += 1
        except OSError:
            pass
    return gone


@dataclass(frozen=True)
class PilotSettings:
    min_life: float
    backoff: float
    backoff_max: float
    exclude_after: int
    log_keep: int

    @classmethod
    def from_config(cls, cfg: Config) -> PilotSettings:
        return cls(cfg.pilot_min_life, cfg.pilot_backoff, cfg.pilot_backoff_max,
                   cfg.pilot_exclude_after, cfg.pilot_log_keep)


class PilotWatch:
    """Follows the provisioner's jobs from look to look (module docstring)."""

    def __init__(self, settings: PilotSettings, clock: Clock, log_dir: Path, prefix: str,
                 python: str, exclusions: Exclusions | None = None) -> None:
        self.settings = settings
        self.python = python
        self.clock = clock
        self.log_dir = Path(log_dir)
        self.prefix = prefix
        self.exclusions = exclusions
        self.first_seen: dict[str, float] = {}     # job id -> monotonic
        self.running_since: dict[str, float] = {}  # job id -> monotonic
        self.cancelled: set[str] = set()
        self.streak = 0                # failed pilots in a row
        self.pause_until = 0.0         # monotonic: no submit before
        self.last_failure: PilotEnd | None = None
        self.host_failures: Counter[str] = Counter()  # in a row, per host
        self.ended: list[PilotEnd] = []  # those the last look found
        #: The nodes of every job that left the listing at the last look (also those
        #: the provisioner cancelled): they leave the node lists.
        self.gone_nodes: list[str] = []

    def node(self, job_id: str) -> str:
        return f"{self.prefix}-{job_id}"

    def argv(self, command: Sequence[str], job_id_shell: str) -> list[str]:
        """The pilot that runs ``command`` (:func:`pilot_argv`)."""
        return pilot_argv(command, self.python, self.log_dir, self.prefix, job_id_shell)

    def submitted(self, job_ids: Iterable[str]) -> None:
        now = self.clock.monotonic()
        for job_id in job_ids:
            self.first_seen.setdefault(job_id, now)

    def was_cancelled(self, job_ids: Iterable[str]) -> None:
        self.cancelled.update(job_ids)

    def look(self, jobs: Sequence[EngineJob]) -> list[PilotEnd]:
        """The jobs of the prefix listed now; the pilots that ended since the last look
        (each judged, the streak and the pause updated)."""
        now = self.clock.monotonic()
        listed = {job.job_id: job for job in jobs}
        ended: list[PilotEnd] = []
        self.gone_nodes = []
        for job_id in [j for j in self.first_seen if j not in listed]:
            since = self.first_seen.pop(job_id)
            self.running_since.pop(job_id, None)
            self.gone_nodes.append(self.node(job_id))
            if job_id in self.cancelled:
                self.cancelled.discard(job_id)
                continue
            end = read_pilot_log(self.log_dir / f"{self.node(job_id)}.log", job_id,
                                 self.node(job_id), now - since)
            if end.log:
                cut_log(Path(end.log))
            ended.append(end)
            self._judge(end)
        for job_id, job in listed.items():
            self.first_seen.setdefault(job_id, now)
            if job.state == RUNNING:
                since = self.running_since.setdefault(job_id, now)
                if self.streak and now - since >= self.settings.min_life:
                    self._recovered(f"job {job_id} has run {now - since:.0f} s")
        self.cancelled &= set(self.first_seen)
        self.ended = ended
        if ended:
            prune_logs(self.log_dir, self.settings.log_keep)
        return ended

    def _judge(self, end: PilotEnd) -> None:
        s = self.settings
        if not end.failed(s.min_life):
            if end.host:
                self.host_failures.pop(end.host, None)
            if self.streak and (end.status == 0 or end.life >= s.min_life):
                self._recovered(end.describe())
            return
        self.streak += 1
        self.last_failure = end
        pause = min(s.backoff_max, s.backoff * 2 ** (self.streak - 1))
        self.pause_until = self.clock.monotonic() + pause
        lines = "\n".join(f"    {line}" for line in end.tail) or "    (no output)"
        if self.streak == 1:
            logger.warning("pilot failed: %s, within pilot_min_life %g s; submits pause %.0f "
                           "s, doubling while pilots fail; its last lines (%s):\n%s",
                           end.describe(), s.min_life, pause, end.log or "no log", lines)
        else:
            logger.info("pilot failed (%d in a row): %s; the next submit in %.0f s",
                        self.streak, end.describe(), pause)
        if end.host and s.exclude_after:
            self.host_failures[end.host] += 1
            count = self.host_failures[end.host]
            if count >= s.exclude_after and self.exclusions is not None \
                    and end.host not in self.exclusions.hosts():
                last = end.tail[-1] if end.tail else end.describe()
                try:
                    self.exclusions.add(end.host, self.clock.time(), count, last)
                except OSError as exc:
                    logger.warning("cannot exclude host %s in %s: %s", end.host,
                                   self.exclusions.path, exc.strerror or exc)
                    return
                logger.warning("host %s excluded from the submissions: %d pilots failed "
                               "there in a row (the last: %s); clear it with clusterscale.py "
                               "--clear-host %s", end.host, count, end.describe(), end.host)

    def probed(self) -> None:
        """A pilot was submitted while pilots fail: the next waits a pause again."""
        if self.streak:
            s = self.settings
            pause = min(s.backoff_max, s.backoff * 2 ** (self.streak - 1))
            self.pause_until = self.clock.monotonic() + pause

    def _recovered(self, how: str) -> None:
        logger.info("pilots work again (%s) after %d failed in a row", how, self.streak)
        self.streak = 0
        self.pause_until = 0.0

    def hold(self) -> tuple[int | None, str]:
        """How many submits the failures allow now (None: no limit) and why."""
        if not self.streak:
            return None, ""
        left = self.pause_until - self.clock.monotonic()
        why = f"{self.streak} pilot{'s' if self.streak > 1 else ''} failed in a row"
        if left > 0:
            # The time of day, not a countdown: the line stays the same from look to look
            # (logged once, then at DEBUG), however long the pause.
            at = time.strftime("%H:%M:%S", time.localtime(self.clock.time() + left))
            return 0, f"held back by the back-off ({why}, the next submit at {at})"
        return 1, f"one at a time while pilots fail ({why})"

    def excluded(self) -> list[str]:
        return sorted(self.exclusions.hosts()) if self.exclusions is not None else []
