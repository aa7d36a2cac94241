"""The confirm phase of a run (docs/results.md, "Differences confirmed, indeterminate tests
named"): differences run a second time.

When the last result of a run is in, and before any node is told to upload, the master
compares the run's results with the baseline the report will use (:func:`baseline_table`:
``tables/current.tab``; a user run without one, the user's previous push) and hands the
changed tests out again, as a second phase of the same run: the nodes are still connected
and built.  Each is given preferably to a node other than the one whose result it was
(:meth:`RunState.prefer_others`).  The report then judges each test from its digests
(:mod:`cluster.report.indeterminate`; the files and verdicts:
:mod:`cluster.master.files.confirmplan`): a change that reproduces is confirmed, one that does
not is indeterminate and not reported as a change.

Bounded: at most ``confirm_max`` tests are run again (the rest are reported as changed,
unconfirmed), and the phase lasts at most ``confirm_timeout``, or ``heartbeat_timeout``
without a live node; then the tests left are unconfirmed (:data:`END_FILE` says why).

Durable like the first phase: the plan (which tests, their first digests and nodes, their
baseline's) is written to ``runs/<id>/confirm.plan`` before any is handed out, and every
confirm result to ``runs/<id>/confirm.journal`` (:class:`cluster.master.files.journal.Journal`)
before the node hears back, so a master that takes the run over continues the phase.
The phase's :class:`RunState` has ``confirming`` set: its jobs are re-runs, never to be
answered from a results cache.

Off for sweep and bmpcmp runs and every_node runs (nothing to confirm against), and when
``confirm_differences`` is false; a run's own ``confirm=yes`` or ``confirm=no``
(:mod:`cluster.runoptions`) overrides that setting.
"""

from __future__ import annotations

import enum
import logging
from pathlib import Path

from cluster.config import Config
from cluster.home import Home
from cluster.master.files import journal
from cluster.master.files.confirmplan import END_FILE, JOURNAL_FILE, PLAN_FILE, Plan, choose
from cluster.master.serve.handler import RequestHandler, RunSession
from cluster.master.state.runstate import RunState
from cluster.records import Job
from cluster.report import compare as report
from cluster.report import md5cache, tab
from cluster.report.indeterminate import digest
from cluster.runspec import RunSpec
from cluster.runtime import fsutil

log = logging.getLogger("cluster.master")


def baseline_table(home: Home, spec: RunSpec) -> Path | None:
    """The table a run's report compares it with first, if there is one: the baseline
    (``tables/current.tab``); for a user run without one, the user's previous push.  None
    for a sweep or bmpcmp run (never confirmed)."""
    if spec.sweep_file is not None or (spec.kind == "user" and spec.has_flag("bmpcmp")):
        return None
    current = home.tables / "current.tab"
    if current.exists():
        return current
    if spec.kind == "user":
        pushed = home.tables / f"user-{spec.ref}.tab"
        return pushed if pushed.exists() else None
    return None


def make_plan(home: Home, spec: RunSpec, state: RunState, cap: int) -> Plan:
    """The plan of ``state``'s run, all of whose results are in: its tests whose output
    changed against :func:`baseline_table` (those the report lists as differences; the
    "seen before" ones are not), at most ``cap`` of them run again."""
    path = baseline_table(home, spec)
    if path is None:
        return Plan()
    current = state.results.table(state.run_id)
    cache = home.tables / md5cache.CACHE_NAME
    seen = md5cache.load(cache) if cache.exists() else None
    compared = report.analyse(current, tab.TabFile(path), seen=seen,
                              not_run=state.not_run_names())
    changed = compared.differing()
    tests, over = choose(changed, cap)
    first: dict[str, tuple[str, str]] = {}
    baseline: dict[str, str] = {}
    for name in changed:
        error, md5, _product = current.brief(name)
        first[name] = (digest(error, md5), current[name].machine or "-")
        before = compared.listed[name]
        baseline[name] = digest(before.error, before.md5)
    return Plan(tuple(tests), tuple(over), cap, first, baseline)


class Phase(enum.Enum):
    OFF = "off"          # no confirm phase for this run
    FIRST = "first"      # the run's own jobs are served
    CONFIRM = "confirm"  # the changed tests are run again
    OVER = "over"        # decided: nothing to confirm, or the phase is served to its end


class ConfirmPhase:
    """The master's side of the confirm phase of one run; :meth:`serving`, called once per
    turn of the serving loop, says which state and journal are served."""

    def __init__(self, cfg: Config, home: Home, spec: RunSpec, first: RunState,
                 handler: RequestHandler, session: RunSession) -> None:
        self.cfg, self.home, self.spec, self.first = cfg, home, spec, first
        self.handler, self.session = handler, session
        self.run_dir = home.run_dir(first.run_id)
        wanted = first.options.confirm  # the run's confirm=yes|no, else master.conf's
        on = ((cfg.confirm_differences if wanted is None else wanted)
              and not first.policy.every_node and baseline_table(home, spec) is not None)
        self.phase = Phase.FIRST if on else Phase.OFF
        first.hold_end = on
        #: The confirm phase's state and journal, once it started.
        self.state: RunState | None = None
        self.journal: journal.Journal | None = None
        self.started = 0.0
        self.last_live = 0.0

    def serving(self, state: RunState, jrnl: journal.Journal,
                now: float) -> tuple[RunState, journal.Journal]:
        """The state and journal to serve now (``state``, ``jrnl``: those served so far).
        Starts the confirm phase when the first's results are all in, and gives it up when
        it runs past its bounds."""
        if self.phase is Phase.FIRST and self.first.all_results_in and not self.first.fatal:
            self._start(now)
        if self.phase is Phase.CONFIRM and self.state is not None:
            self._bound(self.state, now)
        if self.state is not None and self.journal is not None:
            return self.state, self.journal
        return state, jrnl

    def _start(self, now: float) -> None:
        first, run_id = self.first, self.first.run_id
        plan_path = self.run_dir / PLAN_FILE
        plan = Plan.load(plan_path)
        if plan is None:
            began = self.handler.monotonic()
            plan = make_plan(self.home, self.spec, first, self.cfg.confirm_max)
            plan.save(plan_path)
            # A million results compared take seconds: no node's silence counts them.
            first.pause(self.handler.monotonic() - began)
        first.hold_end = False
        if not plan.tests:
            self.phase = Phase.OVER
            return
        index = first.jobs.index
        lines = first.jobs.lines([index[t] for t in plan.tests if t in index])
        jrnl = journal.Journal(self.run_dir / JOURNAL_FILE, run_id,
                               self.cfg.journal_sync_interval)
        confirm = RunState(run_id, [Job.parse(line) for line in lines], now, first.settings,
                           first.suitable, done=jrnl.lines)
        jrnl.lines = []
        confirm.confirming = True
        confirm.options = first.options
        confirm.adopt_nodes(first)
        confirm.prefer_others({t: first_of[1] for t, first_of in plan.first.items()
                               if t in plan.tests})
        self.state, self.journal = confirm, jrnl
        self.handler.bind(confirm, jrnl, self.session)
        self.phase, self.started, self.last_live = Phase.CONFIRM, now, now
        log.info("run %s: confirm phase: %d changed test(s) run again%s", run_id,
                 len(plan.tests), f" ({len(plan.over_cap)} over confirm_max)"
                 if plan.over_cap else "")
        ended = self.run_dir / END_FILE
        if ended.exists():  # an earlier master gave the phase up
            confirm.settle_rest("confirm phase given up", now)

    def _bound(self, confirm: RunState, now: float) -> None:
        if confirm.all_results_in:
            self.phase = Phase.OVER
            return
        if confirm.live_nodes():
            self.last_live = now
        why = ""
        if now - self.started > self.cfg.confirm_timeout:
            why = f"the confirm phase ran out of time (confirm_timeout " \
                  f"{self.cfg.confirm_timeout:.0f} s)"
        elif now - self.last_live > self.cfg.heartbeat_timeout:
            why = "no node was left to run it again"
        if why:
            fsutil.atomic_write(self.run_dir / END_FILE, why + "\n")
            left = confirm.settle_rest("confirm phase given up", now)
            log.warning("run %s: %s; %d test(s) left unconfirmed", confirm.run_id, why, left)
            self.phase = Phase.OVER

    def sync(self) -> None:
        """fsync the confirm results (before the run's end is recorded)."""
        if self.journal is not None:
            self.journal.sync()

    def close(self) -> None:
        """Sync and close the confirm journal (every confirm result on disk)."""
        if self.journal is not None:
            self.journal.close()
