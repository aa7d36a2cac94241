"""The provisioner's decisions: how many batch jobs to submit and which to cancel.

docs/provisioning.md, "The provisioner".  Pure logic: no subprocess, no file; time comes
from the :class:`~cluster.runtime.clock.Clock` passed in and the batch system from the
:class:`~cluster.provision.engine.Engine` passed in, so the unit tests drive both.

Each look (:meth:`Provisioner.step`) lists the engine's jobs of the provisioner's prefix,
decides (:meth:`Scaler.decide`) and acts, and says what it did in one log line::

    wanted W pending P running R: <what it did and why>

The rules, with W the nodes wanted (bounded by ``max_nodes``) and P + R the jobs pending
and running:

* **submit** when W > P + R: W - (P + R) jobs, but never more than ``max_nodes`` jobs in
  all (pending, running and ending ones) and at most ``slurm_max_submit_rate`` a minute (a
  sliding window: in any minute at most that many submits; below one a minute, one per
  1/rate minutes);
* **cancel** only when W stayed below P + R for two looks in a row (hysteresis: a count that
  wobbles by one never cancels, so it never submits again what it just cancelled), and then
  only the excess both looks saw.  Pending jobs go first (newest first): they do no work.
  Running ones are cancelled only when the master is gone (the resource file is stale,
  missing or unreadable): while it lives, a running node beyond the count leaves by itself
  when nothing is wanted of it (``ephemeral_idle``), because the provisioner cannot see
  which node is idle and cancelling a busy one throws its jobs away;
* jobs of other names are never counted nor touched; jobs found at start are adopted by
  their name, so a restarted provisioner submits nothing twice;
* pending jobs are reported with the engine's reason (``pending: 3 Resources``), so a job
  the batch system cannot place is seen, not waited on silently.

A :class:`JobsSeen` hook, when given, is told the job ids listed at each look and each id
submitted (clusterscale makes the nodes' keys with it); nothing here touches a file.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from cluster.config import Config
from cluster.provision.engine import Engine, EngineError, EngineJob
from cluster.provision.pilots import PilotEnd, PilotWatch
from cluster.runtime.clock import Clock

logger = logging.getLogger("cluster.provision")

#: The submit rate is counted over this window [seconds] ("a minute").
RATE_WINDOW = 60.0
#: Looks in a row that must see fewer nodes wanted than jobs before any is cancelled.
BELOW_LOOKS = 2
#: The job ids a log line names at most (a shrink from 1,000 nodes stays one short line).
IDS_SHOWN = 10


@dataclass(frozen=True)
class ScaleSettings:
    """The provisioner's settings (master.conf)."""

    max_nodes: int       # the most jobs it keeps (0 = none)
    submit_rate: float   # the most submits a minute (> 0)
    prefix: str          # its jobs are named <prefix>-*
    slots: int           # the CPUs of each job (an ephemeral node's slots)

    @classmethod
    def from_config(cls, cfg: Config) -> ScaleSettings:
        return cls(max_nodes=cfg.max_nodes, submit_rate=cfg.slurm_max_submit_rate,
                   prefix=cfg.node_prefix, slots=cfg.node_slots)

    @property
    def job_name(self) -> str:
        """The name of each job it submits (the node names itself <prefix>-<job id>)."""
        return f"{self.prefix}-node"

    def node_name(self, job_id: str) -> str:
        """The name the ephemeral node of job ``job_id`` gives itself (cluster.node.ephemeral:
        ``<prefix>-<job id>``, ``$SLURM_JOB_ID`` being the job id)."""
        return f"{self.prefix}-{job_id}"


@dataclass(frozen=True)
class Demand:
    """What the master's resource file asks for at one look."""

    wanted: int              # nodes wanted (0 when no run waits, or the master is gone)
    master_alive: bool       # False: the file is stale, missing or unreadable
    command: tuple[str, ...]  # the argv of an ephemeral node (() when unknown)
    note: str = ""           # why the master counts as gone, for the log line


@dataclass(frozen=True)
class Decision:
    """One look's decision; :meth:`Provisioner.step` carries it out."""

    wanted: int                   # nodes wanted, bounded by max_nodes
    pending: tuple[EngineJob, ...]
    running: tuple[EngineJob, ...]
    ending: tuple[EngineJob, ...]
    submit: int                   # jobs to submit now
    cancel: tuple[EngineJob, ...]  # jobs to cancel now
    why: str                      # the reason, or what held it back

    @property
    def head(self) -> str:
        """The log line's start: ``wanted W pending P running R``."""
        return f"wanted {self.wanted} pending {len(self.pending)} running {len(self.running)}"

    def pending_reasons(self) -> str:
        """``3 Resources, 1 PartitionDown`` (the pending jobs by reason), or "" with none."""
        counts = Counter(job.reason or "no reason given" for job in self.pending)
        return ", ".join(f"{n} {reason}" for reason, n in counts.most_common())


def job_number(job_id: str) -> tuple[int, tuple[int, ...], str]:
    """A sort key that orders job ids as a batch system numbers them, upwards: Slurm's
    ``42``, Grid Engine's tasks ``42.3``; an id of another form after them, by its text."""
    parts = job_id.split(".")
    if all(part.isdigit() for part in parts):
        return (0, tuple(int(part) for part in parts), "")
    return (1, (), job_id)


def _newest_first(jobs: list[EngineJob]) -> list[EngineJob]:
    """``jobs`` newest first: a batch system numbers its jobs upwards (Slurm does)."""
    numbered = [job for job in jobs if job_number(job.job_id)[0] == 0]
    others = [job for job in jobs if job_number(job.job_id)[0] == 1]
    return (sorted(numbered, key=lambda job: job_number(job.job_id), reverse=True)
            + sorted(others, key=lambda job: job.job_id, reverse=True))


def _ids(jobs: tuple[EngineJob, ...] | list[EngineJob]) -> str:
    shown = ", ".join(job.job_id for job in jobs[:IDS_SHOWN])
    return shown + (f" and {len(jobs) - IDS_SHOWN} more" if len(jobs) > IDS_SHOWN else "")


class Scaler:
    """The decisions, and the memory they need between looks: the recent submits (the
    rate) and how many looks in a row wanted fewer nodes than there were jobs."""

    def __init__(self, settings: ScaleSettings, clock: Clock) -> None:
        if not settings.submit_rate > 0:
            raise ValueError(f"submit rate {settings.submit_rate!r}: expected jobs a minute > 0")
        self.settings = settings
        self.clock = clock
        # The rate as "at most `_most` submits in any `_window` seconds".
        if settings.submit_rate >= 1:
            self._window, self._most = RATE_WINDOW, int(settings.submit_rate)
        else:
            self._window, self._most = RATE_WINDOW / settings.submit_rate, 1
        self._submits: deque[float] = deque()  # monotonic times; never more than _most
        self._below_looks = 0
        self._below_excess = 0  # the excess the previous look below saw

    def submit_allowance(self) -> tuple[int, float]:
        """How many submits the rate allows now, and the seconds until it allows one more
        (0 when it allows one now)."""
        now = self.clock.monotonic()
        while self._submits and self._submits[0] <= now - self._window:
            self._submits.popleft()
        allowed = self._most - len(self._submits)
        return allowed, (0.0 if allowed > 0 else self._submits[0] + self._window - now)

    def record_submit(self) -> None:
        """One job was submitted now (counts against the rate)."""
        self._submits.append(self.clock.monotonic())
        while len(self._submits) > self._most:  # bounded, whatever the caller does
            self._submits.popleft()

    def decide(self, demand: Demand, jobs: list[EngineJob]) -> Decision:
        """What to do at this look, given what the resource file wants and the engine's
        ``jobs``.  Updates the hysteresis memory (call once per look)."""
        s = self.settings
        mine = [job for job in jobs if job.name.startswith(f"{s.prefix}-")]
        pending = _newest_first([job for job in mine if job.state == "pending"])
        running = _newest_first([job for job in mine if job.state == "running"])
        ending = [job for job in mine if job.state == "ending"]
        wanted = max(0, min(demand.wanted, s.max_nodes))
        count = len(pending) + len(running)
        base = Decision(wanted, tuple(pending), tuple(running), tuple(ending), 0, (), "")
        if wanted >= count:
            self._below_looks = self._below_excess = 0
        if wanted == count:
            return replace(base, why="nothing to do: as many jobs as nodes wanted")
        if wanted > count:
            return self._grow(wanted - count, count + len(ending), demand, base)
        return self._shrink(count - wanted, pending, running, demand, base)

    def _grow(self, need: int, jobs_in_all: int, demand: Demand, base: Decision) -> Decision:
        s = self.settings
        if not demand.command:
            return replace(base, why=f"submitted 0 of {need} wanted: the resource file gives "
                                     f"no command to start a node")
        room = max(0, s.max_nodes - jobs_in_all)
        allowed, wait = self.submit_allowance()
        held: list[str] = []
        if room < need:
            held.append(f"max_nodes {s.max_nodes} jobs in all ({jobs_in_all} there)")
        if allowed < need and allowed <= room:
            held.append(f"at most {s.submit_rate:g} submits a minute"
                        + (f", the next in {wait:.0f} s" if allowed == 0 else ""))
        why = f"{need} wanted beyond pending + running"
        if held:
            why += f", held back by {' and '.join(held)}"
        return replace(base, submit=min(need, room, allowed), why=why)

    def _shrink(self, excess: int, pending: list[EngineJob], running: list[EngineJob],
                demand: Demand, base: Decision) -> Decision:
        self._below_looks += 1
        gone = "" if demand.master_alive else f"; the master is gone ({demand.note})"
        if self._below_looks < BELOW_LOOKS:
            self._below_excess = excess
            return replace(base, why=f"nothing yet: wanted below the count for "
                                     f"{self._below_looks} look, cancelling after "
                                     f"{BELOW_LOOKS} in a row{gone}")
        # Only what stayed in excess over both looks: a dip of one look cancels nothing.
        shrink = min(excess, self._below_excess)
        self._below_excess = excess
        candidates = pending + (running if not demand.master_alive else [])
        cancel = candidates[:shrink]
        why = f"wanted below the count for {self._below_looks} looks in a row{gone}"
        left_running = min(len(running), excess - len(cancel)) if demand.master_alive else 0
        if left_running:
            why += (f"; {left_running} running beyond the count leave by themselves when "
                    f"nothing is wanted of them")
        if cancel:
            self._below_looks = 0
        return replace(base, cancel=tuple(cancel), why=why)


@dataclass(frozen=True)
class Step:
    """What one look did.

    ``line``: its log line.  ``trouble``: the message of the last call to the engine that
    failed at this look (a warning), or "".  ``wanted``: the nodes wanted, as the line says.
    ``jobs``: the provisioner's own jobs (its prefix) as the engine listed them before it
    acted, or None when they could not be listed.  ``submitted`` and ``cancelled``: the
    job ids it submitted and cancelled."""

    line: str
    trouble: str = ""
    wanted: int = 0
    jobs: tuple[EngineJob, ...] | None = None
    submitted: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    #: The pilots that ended since the last look (:mod:`cluster.provision.pilots`).
    ended: tuple[PilotEnd, ...] = ()

    def count(self, state: str) -> int | None:
        """How many of the listed jobs are in ``state`` (None: they could not be listed)."""
        return None if self.jobs is None else sum(job.state == state for job in self.jobs)


class JobsSeen(Protocol):
    """Told the ids of the provisioner's jobs: every job of its prefix the engine lists, at
    each look (``listed=True``), and each job it submits, right after the submit.  Must
    not raise (clusterscale's :class:`cluster.provision.jobkeys.JobKeys` makes their nodes'
    keys and logs what it cannot)."""

    def __call__(self, job_ids: Iterable[str], *, listed: bool = False) -> object: ...


class Provisioner:
    """One look at a time: list the engine's jobs, decide, act; ``jobs_seen`` (if given)
    is told the job ids listed and submitted."""

    def __init__(self, engine: Engine, settings: ScaleSettings, clock: Clock,
                 jobs_seen: JobsSeen | None = None, pilots: PilotWatch | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.scaler = Scaler(settings, clock)
        self.jobs_seen = jobs_seen
        #: Judges the pilots that end, and holds submits back while they fail.
        self.pilots = pilots

    def step(self, demand: Demand) -> Step:
        """One look; never raises EngineError (a failure is in the line, ``trouble``)."""
        try:
            jobs = self.engine.jobs(self.settings.prefix)
        except EngineError as exc:
            wanted = max(0, min(demand.wanted, self.settings.max_nodes))
            return Step(f"wanted {wanted} pending ? running ?: did nothing, the jobs "
                        f"cannot be listed: {exc}", trouble=str(exc), wanted=wanted)
        mine = [job for job in jobs if job.name.startswith(f"{self.settings.prefix}-")]
        if self.jobs_seen is not None:
            self.jobs_seen([job.job_id for job in mine], listed=True)
        ended = tuple(self.pilots.look(mine)) if self.pilots is not None else ()
        decision = self.scaler.decide(demand, jobs)
        exclude: list[str] = []
        if self.pilots is not None:
            exclude = self.pilots.excluded()
            allowed, why = self.pilots.hold()
            if allowed is not None and decision.submit > allowed:
                decision = replace(decision, submit=allowed, why=f"{decision.why}, {why}")
        submitted: list[str] = []
        cancelled: list[EngineJob] = []
        errors: list[str] = []
        trouble = ""
        if decision.submit:
            command = list(demand.command)
            if self.pilots is not None:
                command = self.pilots.argv(command, self.engine.job_id_shell)
            try:
                self._submit(command, decision.submit, exclude, submitted)
            except EngineError as exc:
                # The next look tries again; a refusal now is likely a refusal again.
                errors.append(f"submit failed: {exc}")
                trouble = str(exc)
                if self.pilots is not None:
                    self.pilots.probed()  # while pilots fail, a refusal waits its pause too
        for job in decision.cancel:
            try:
                self.engine.cancel(job.job_id)
            except EngineError as exc:
                errors.append(f"cancel of job {job.job_id} failed: {exc}")
                trouble = str(exc)
                continue
            cancelled.append(job)
        if self.pilots is not None:
            self.pilots.was_cancelled(job.job_id for job in cancelled)
        return Step(self._line(decision, submitted, cancelled, errors), trouble=trouble,
                    wanted=decision.wanted,
                    jobs=decision.pending + decision.running + decision.ending,
                    submitted=tuple(submitted), cancelled=tuple(j.job_id for j in cancelled),
                    ended=ended)

    def _submit(self, command: list[str], count: int, exclude: list[str],
                done: list[str]) -> None:
        """Submit ``count`` jobs (at once when the engine has ``submit_many``: Grid
        Engine's array job), each id added to ``done`` and told to the hooks at once: the
        job may start within a second.  EngineError from the first refusal."""
        name, slots = self.settings.job_name, self.settings.slots
        many = getattr(self.engine, "submit_many", None)
        while len(done) < count:  # bounded by count
            if many is not None:
                ids = list(many(name, command, slots, count - len(done), exclude=exclude))
            else:
                ids = [self.engine.submit(name, command, slots, exclude=exclude)]
            for job_id in ids:
                done.append(job_id)
                self.scaler.record_submit()
                if self.jobs_seen is not None:
                    self.jobs_seen([job_id])
            if self.pilots is not None:
                self.pilots.submitted(ids)
                self.pilots.probed()

    @staticmethod
    def _line(decision: Decision, submitted: list[str], cancelled: list[EngineJob],
              errors: list[str]) -> str:
        if decision.wanted > len(decision.pending) + len(decision.running):
            did = f"submitted {len(submitted)}"
            if len(submitted) < decision.submit:
                did += f" of {decision.submit}"
            did = decision.why if decision.why.startswith("submitted") else (
                f"{did} ({decision.why})")
        elif decision.cancel:
            kinds = Counter(job.state for job in cancelled)
            what = " and ".join(f"{n} {state}" for state, n in sorted(kinds.items()))
            did = f"cancelled {what or 'none'}"
            if cancelled:
                did += f" (jobs {_ids(cancelled)})"
            did += f" ({decision.why})"
        else:
            did = decision.why
        reasons = decision.pending_reasons()
        parts = [did] + errors + ([f"pending: {reasons}"] if reasons else [])
        return f"{decision.head}: {'; '.join(parts)}"
