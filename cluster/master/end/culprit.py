"""The end step ``culprit``: culprit searches started, narrowed and reported
(docs/results.md, "Finding the culprit commit").

At the end of a complete commit run with confirmed differences (after the confirm phase:
``confirm.tsv`` in its archive), :func:`after_run` finds the stream's last tested commit
(the newest earlier complete commit run of the same tree that is no bisection run) and
the commits between (``git rev-list``).  When some were never tested, it writes the
search's record (:mod:`cluster.master.files.culprits`) and queues its first bisection run
at priority 1: ``git <sha> <products> tree=<tree> culprit=<run>.<step> confirm=no``,
which runs only the tests of that step (:mod:`cluster.master.run.runsetup` hands build.py
the list; the result cache serves what it can of them).

At the end of a bisection run, :func:`after_run` takes its results into the search
(:mod:`cluster.master.model.bisect`), queues the next steps, and once every changed test
is pinned writes the follow-up report (``archive/<run>/culprit.txt``,
:mod:`cluster.report.culpritreport`) and mails it like the run's own report.

Each part is safe to redo after a crash: the record is written before the queue lines,
a queue line already queued is not queued twice, a step already taken is not taken again,
and the report is mailed once the record says it is not (a crash between the mail and the
record's write mails it again, as the end's own ``mail`` step does).
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster import datatypes
from cluster.config import Config
from cluster.defaults import COMMIT_PRIORITY
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.cache.resultcache import CACHED_ERRORS
from cluster.master.end.finish import archived_runs
from cluster.master.files import culprits
from cluster.master.files.culprits import ChangedTest, Search
from cluster.master.files.ending import Outcome
from cluster.master.model import bisect
from cluster.queue import QueueFile
from cluster.report import culpritreport, indeterminate, mail
from cluster.report.culpritreport import CommitFacts, Finding
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec, outside_stream
from cluster.runtime import fsutil
from cluster.triggers.git.clone import configured_url, ensure_commit
from cluster.triggers.git.gitcmd import GitFailed, rev_list
from cluster.triggers.git.info import read_commit
from cluster.triggers.git.ledger import repo_files
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: The tests a bisection run runs, in its run folder (build.py's ``--only``).
TESTS_FILE = "culprit.lst"


def after_run(cfg: Config, home: Home, start: JobStart, spec: RunSpec,
              outcome: Outcome, reason: str = "") -> None:
    """The step for a run that ended so (``reason``: why, when it did not complete): a
    bisection run's results taken, or a commit run's search started; nothing for other
    runs.  Problems are logged, never raised: a search that cannot go on must not keep a
    run from ending."""
    try:
        if spec.culprit is not None:
            _bisection_ended(cfg, home, start, spec, outcome, reason)
        elif (spec.kind == "git" and outcome is Outcome.DONE and spec.sweep_file is None
              and not spec.outside_stream
              and spec.tree in datatypes.parse_repositories(cfg.repositories)):
            _maybe_start(cfg, home, start, spec)
    except (ClusterError, OSError, ValueError, GitFailed) as exc:
        log.error("run %s: culprit search: %s", start.id, exc)


def confirmed(archive: Path) -> list[tuple[str, str, str]]:
    """(test, old digest, new digest) of each confirmed difference of the run archived in
    ``archive`` (its ``confirm.tsv``), in report order."""
    try:
        text = (archive / indeterminate.VERDICTS_NAME).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        try:
            verdict = indeterminate.Verdict.parse(line)
        except ValueError:
            continue
        if verdict.kind is indeterminate.Kind.CONFIRMED and len(verdict.digests) >= 2:
            found.append((verdict.test, verdict.digests[0], verdict.digests[1]))
    return found


def last_tested(home: Home, run_id: str, tree: str) -> tuple[str, str] | None:
    """(run id, commit) of the stream's last tested commit before run ``run_id``: the
    newest earlier commit run of ``tree`` that completed and is part of the stream (no
    bisection or repro run: :func:`cluster.runspec.outside_stream`)."""
    for folder, start in archived_runs(home):
        if folder.name >= run_id or start.kind != "git" or start.tree != tree \
                or outside_stream(start.options):
            continue
        try:
            info = (folder / "run.info").read_text(encoding="utf-8")
        except OSError:
            continue
        if f"\noutcome {Outcome.DONE.value}\n" in "\n" + info:
            return folder.name, start.ref
    return None


def _maybe_start(cfg: Config, home: Home, start: JobStart, spec: RunSpec) -> None:
    search = culprits.load(home, start.id)
    if search is None:
        changed = confirmed(home.archive / start.id)
        if not changed:
            return
        previous = last_tested(home, start.id, spec.tree)
        if previous is None:
            return
        good_run, good_ref = previous
        files = repo_files(home, spec.tree)
        url = configured_url(cfg, spec.tree)
        good = ensure_commit(files, spec.tree, url, good_ref)
        bad = ensure_commit(files, spec.tree, url, spec.ref)
        between = rev_list(files.clone, good, bad)
        if len(between) < 2 or between[-1] != bad:
            return  # nothing untested between (or the commit is no descendant)
        search = Search(start.id, spec.tree, list(spec.products), good_run,
                        [good, *between], [ChangedTest(t, old, new, 0, len(between))
                                           for t, old, new in changed])
        bisect.plan(search)
        culprits.save(home, search)
        log.info("run %s: %d confirmed difference(s), %d untested commit(s) since run %s: "
                 "culprit search started", start.id, len(changed), len(between) - 1, good_run)
    _queue_steps(home, search)


def _queue_steps(home: Home, search: Search) -> None:
    """Every queued step's bisection run in the priority-1 queue (once)."""
    queue = QueueFile.for_priority(home, COMMIT_PRIORITY)
    for number, step in enumerate(search.steps):
        if step.state == culprits.QUEUED:
            line = step_spec(search, number)
            if queue.append(line):
                log.info("culprit search %s: queued %s (%d test(s))", search.run, line,
                         len(step.tests))


def step_spec(search: Search, number: int) -> RunSpec:
    """The queue line of step ``number``'s bisection run."""
    sha = search.commits[search.steps[number].commit]
    return RunSpec("git", sha, tuple(search.products),
                   (f"tree={search.tree}", f"{culprits.OPTION}={search.run}.{number}",
                    "confirm=no"))


def step_tests(home: Home, spec: RunSpec) -> list[str]:
    """The tests bisection run ``spec`` runs (ClusterError when its search or step is
    gone: the run cannot start)."""
    assert spec.culprit is not None
    run, number = spec.culprit
    try:
        search = culprits.load(home, run)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    if search is None or number >= len(search.steps):
        raise ClusterError(f"bisection run {spec.line()}: no step {number} of a culprit "
                           f"search for run {run} ({culprits.path(home, run)})")
    return search.steps[number].tests


def _bisection_ended(cfg: Config, home: Home, start: JobStart, spec: RunSpec,
                     outcome: Outcome, reason: str) -> None:
    if outcome is Outcome.RETRY:
        return  # queued again: its step waits for the next attempt
    assert spec.culprit is not None
    run, number = spec.culprit
    search = culprits.load(home, run)
    if search is None or number >= len(search.steps):
        log.warning("run %s: no step %d of a culprit search for run %s", start.id, number,
                    run)
        return
    if search.steps[number].state == culprits.QUEUED:
        digests: dict[str, str] | None = None
        why = ""
        if outcome is Outcome.DONE:
            table = read_tab(home.archive / start.id / f"{start.id}.tab")
            # A timeout, an internal error or a lost job says nothing of the commit's
            # output (as the result cache, which never keeps them): no result, a skip.
            digests = {name: indeterminate.digest(row.error, row.md5)
                       for name, row in table.items() if str(row.error) in CACHED_ERRORS}
        else:
            why = outcome.value + (f": {' '.join(reason.split())[:200]}" if reason else "")
        bisect.take(search, number, digests, start.id, why)
        bisect.plan(search)
        if bisect.finished(search):
            search.state = culprits.DONE
        culprits.save(home, search)
    _queue_steps(home, search)
    if search.state == culprits.DONE and not search.mailed:
        _follow_up(cfg, home, search)


def _follow_up(cfg: Config, home: Home, search: Search) -> None:
    """The follow-up report archived beside the commit run's report, and mailed."""
    files = repo_files(home, search.tree)

    def facts(index: int) -> CommitFacts:
        sha = search.commits[index]
        try:
            info = read_commit(files.clone, sha, search.tree)
        except ClusterError:
            return CommitFacts(sha)
        return CommitFacts(sha, info.author, info.date, info.subject)

    groups: dict[tuple[int, ...], list[str]] = {}
    for test in search.tests:
        certain = all(i not in test.skipped for i in range(test.good + 1, test.bad))
        key = (test.bad,) if certain else tuple(test.suspects())
        groups.setdefault(key, []).append(test.name)
    findings = [Finding(tuple(names), facts(key[-1]),
                        tuple(facts(i) for i in key) if len(key) > 1 else ())
                for key, names in sorted(groups.items())]
    report = culpritreport.SearchFacts(
        search.run, search.tree, facts(0), search.good_run, facts(len(search.commits) - 1),
        len(search.commits) - 2,
        [(search.commits[s.commit], s.run, s.state + (f" ({s.why})" if s.why else ""))
         for s in search.steps])
    text = culpritreport.render(report, findings)
    archive = home.archive / search.run
    archive.mkdir(parents=True, exist_ok=True)
    where = archive / culpritreport.REPORT_NAME
    fsutil.atomic_write(where, text)
    search.report = str(where.relative_to(home.root))
    if cfg.smtp_host:
        names = ", ".join(f.culprit.sha[:12] for f in findings if not f.suspects)
        subject = f"Culprit found for git {search.commits[-1]}: {names or 'see report'}"
        try:
            mail.send_report(cfg, home, "git", search.commits[-1], subject, text)
        except mail.MailError as exc:
            log.error("culprit search %s: report not mailed: %s", search.run, exc)
    search.mailed = True
    culprits.save(home, search)
    log.info("culprit search %s: done, report in %s", search.run, where)
