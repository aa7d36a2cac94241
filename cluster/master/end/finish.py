"""What a finished run leaves behind: its table, its report, the stream tables, the cache.

:func:`finish` is called by the master once every job of a run has a result (or a node's
fatal failure stopped the run).  By kind of run:

* ``git`` and ``auto`` runs are compared with the baseline ``tables/current.tab``, which
  then rotates (current -> previous -> previous2) and takes the run's rows, merged per
  product so a run of one product keeps the others' baseline (ARTIFEX.md §2.8).  After
  the run (:func:`rebuild_cache`) the "seen before" cache ``tables/md5sum.cache`` is
  rebuilt from the newest 50 archived tables of these runs; every report consults it.
  A commit run's report starts with the commit: its author, date, log message, changed
  files and the products tested.
* ``user`` runs are compared with the baseline and with the user's previous push
  (``tables/user-<name>.tab``), and their report ends with the source diff against the
  master's clean tree (:mod:`cluster.report.userreport`).  ``changed.lst`` in the archive lists
  the tests that differ (from the baseline, or from the previous push when there is no
  baseline): a later ``bmpcmp`` run of that user renders them.
* ``sweep`` runs (product sweep; docs/sweeps.md) get a sweep report instead
  (:mod:`cluster.report.sweepreport`): their tasks by status, the failed parameter sets,
  the tries per node, the collected files and the tasks whose results changed since the
  previous run of the same sweep: the same comparison with the sweep's own table
  ``tables/sweep.<kind>.<ref>.<sweep file>.tab`` (:func:`sweep_table`; a resume run keeps
  the rows of the tasks it did not run), never the baseline: no baseline comparison, no
  source diff, no ``changed.lst``, and a nightly sweep's table never enters the "seen
  before" cache.  A sweep run that did not
  complete gets its usual report with the sweep's section after it: what came home is
  archived whatever the outcome (:mod:`cluster.master.end.sweepend`).
* ``bmpcmp`` user runs compare no tables: the difference images the nodes uploaded are
  put on one HTML page in the archive (:mod:`cluster.bmpcmp`), and the report says where.
* Tests not run because no node's build made their program
  (:attr:`RunState.not_run`): the report says so once per program, near its top
  (:func:`unbuilt_lines`); their lines of the baseline (and of the user's previous push)
  are kept as they were, and they are neither changed nor removed.
* A run stopped by a node's failure (a build failure) gets the failure report with the
  failing nodes' log excerpts (:mod:`cluster.master.end.buildfailure`); one its user
  aborted says so, and one an admin stopped names who (and why).  No table is touched.

Everything is written into ``archive/<run id>/``: ``report.txt``, ``<id>.tab`` and the
node logs.  :func:`finish` also returns the counts the report states (:class:`Report`),
which the master adds to ``run.info`` so the console need not read the ``.tab``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster import bmpcmp
from cluster.defaults import BMPCMP_DIR
from cluster.home import Home
from cluster.jobs.bmpcmp import BMPCMP_PRODUCTS
from cluster.jobs.generate import MUTOOL, PRODUCT_SPECS, SHELL
from cluster.master.cache import reuse, reuseverify
from cluster.master.end import samebuild, streamtables, sweepend
from cluster.master.end.buildfailure import failure_report
from cluster.master.files import confirmplan
from cluster.master.files.abort import STOPPED_BY
from cluster.master.files.ending import BASELINE_KINDS, Outcome
from cluster.master.model.unbuilt import ABSENT
from cluster.master.state.runstate import RunState
from cluster.report import (
    ciresult,
    indeterminate,
    md5cache,
    slowdowns,
    sweepreport,
    tab,
    userreport,
)
from cluster.report import compare as report
from cluster.runspec import SWEEP, RunSpec, outside_stream
from cluster.runtime import fsutil
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.collate")

#: Runs read into the "seen before" cache (cachearchive.pl's window).
CACHE_WINDOW = 50
#: Where a user run lists the tests that differed, for a later bmpcmp run.
CHANGED_LIST = "changed.lst"


@dataclass(frozen=True)
class FinishedRun:
    """A run whose serving is over, as :func:`finish` needs it."""

    spec: RunSpec
    start: JobStart
    state: RunState
    elapsed: float  # the whole run's, across takeovers
    archive: Path
    header: str  # the report's first lines (run_header, or the commit header)
    stage: Path  # where the stream tables are staged (streamtables.install_tables moves them in)
    outcome: Outcome = Outcome.DONE
    reason: str = ""  # why a run that is not DONE ended so
    lost_nodes: tuple[str, ...] = ()  # every node the run lost, across takeovers
    indeterminate_keep: int = 2000  # records kept of the indeterminate tests (config)
    slowdown: slowdowns.SlowdownRule = slowdowns.SlowdownRule()  # the Slower tests rule


@dataclass(frozen=True)
class Report:
    """A finished run's report text and the counts it states.

    ``differences``: tests whose output changed, against the baseline (a user run: against
    the user's previous push when there is no baseline); None when the run was compared
    with nothing (a first run, a bmpcmp run, a run that did not complete).  ``errors``:
    tests of the run that ended with an error code; None when the run did not complete.
    """

    text: str
    differences: int | None = None
    errors: int | None = None
    indeterminate: int | None = None  # tests whose second run differed (None: none run)
    ci: ciresult.CiResult | None = None  # the CI files' facts (None: no CI files)


def is_bmpcmp(spec: RunSpec) -> bool:
    return spec.kind == "user" and spec.has_flag("bmpcmp")


def finish(home: Home, run: FinishedRun) -> Report:
    """Collate, compare and archive ``run``; return its report (the text also goes into
    report.txt, by the caller).

    Tables are not changed here: a complete run's new stream tables are written into
    ``run.stage``, whole and fsync'ed, and
    :func:`~cluster.master.end.streamtables.install_tables` moves them in, so a full disk or
    a kill leaves the old tables whole and a redo rotates the baseline once.
    """
    state, spec = run.state, run.spec
    if run.outcome is Outcome.ABORTED:
        return Report(aborted_report(run, state) + sweep_section(run))
    if run.outcome is Outcome.FAILED:
        return Report(failure_report(run.header, state, run.archive / "logs",
                                     run.start.build) + sweep_section(run))
    if run.outcome is not Outcome.DONE:
        return Report(incomplete_report(run, state) + sweep_section(run))
    if is_bmpcmp(spec):
        return Report(bmpcmp_report(home, run), errors=state.errors)
    # The table is made from the results' journal lines as it is read: a million rows as
    # objects would not fit the master's memory budget.
    current = state.results.table(state.run_id)
    run_tab = run.archive / f"{state.run_id}.tab"
    tab.write_tab_lines(run_tab, current.lines())
    not_run = state.not_run_names()
    cached = reused_report(home, state)
    unbuilt = unbuilt_lines(state, spec.products) + cached.lines
    facts = report.RunFacts(tests=len(current), seconds=run.elapsed,
                            nodes=len(state.machines),
                            lost_nodes=run.lost_nodes, duplicates=state.duplicates,
                            header="\n".join([run.header, "", *unbuilt]) if unbuilt
                            else run.header)
    baseline_path = home.tables / "current.tab"
    # The previous tables are streamed from their files (tab.TabFile), for the same reason.
    baseline = tab.TabFile(baseline_path) if baseline_path.exists() else None
    seen = md5cache.load(cache_path(home))
    shutil.rmtree(run.stage, ignore_errors=True)  # a half staging of an earlier try
    run.stage.mkdir(parents=True)
    if spec.sweep_file is not None:
        # A sweep's own stream: never the baseline, nor the user's pushed trees' table.
        push_path = home.tables / sweep_table(spec)
        previous_push = tab.TabFile(push_path) if push_path.exists() else None
        vs_push = report.analyse(current, previous_push) if previous_push is not None \
            else None
        text, counted = sweep_report(run, facts, vs_push, len(current))
        # A resume run ran only some tasks: the others keep their rows of the table.
        tested = () if spec.option("resume") else spec.products
        streamtables.stage_stream(run.stage, push_path, previous_push, current,
                                  tested, run_tab, not_run)
        changed = vs_push.changed() if vs_push is not None else None
        return Report(text, differences=None if changed is None else len(changed),
                      errors=counted.not_ok)
    # The changed tests run a second time (docs/results.md, "Differences confirmed,
    # indeterminate tests named"): the indeterminate ones are no change.
    verdicts = confirmplan.verdicts(home.run_dir(state.run_id), state.run_id)
    flaky = indeterminate.indeterminate(verdicts)
    if spec.kind == "user":
        push_path = home.tables / f"user-{spec.ref}.tab"
        previous_push = tab.TabFile(push_path) if push_path.exists() else None
        clean = home.root / spec.tree
        # Each previous table is compared once: the report and changed.lst share it.
        vs_baseline, vs_push = userreport.comparisons(current, baseline, previous_push, seen)
        vs_baseline = indeterminate.without(vs_baseline, flaky)
        if vs_push is not None:
            vs_push = indeterminate.without(vs_push, flaky)
        text = userreport.render_user_report(current, vs_baseline, vs_push, facts,
                                             clean if clean.is_dir() else None,
                                             home.root / run.start.source)
        against = vs_baseline if baseline is not None else vs_push
        write_changed_list(run.archive / CHANGED_LIST, current, against)
        streamtables.stage_stream(run.stage, push_path, previous_push, current,
                                  spec.products, run_tab, not_run)
    else:
        against = indeterminate.without(
            report.analyse(current, baseline, seen=seen, not_run=not_run), flaky)
        text = report.render(against, current, facts)  # what report.compare does
        streamtables.stage_stream(run.stage, baseline_path, baseline, current,
                                  spec.products, run_tab, not_run)
    text = confirmed_report(home, run, text, facts.header, against, verdicts)
    text = after_header(text, facts.header, cached.section)
    slower, runs = find_slower(home, run, run_tab)
    if runs is not None:
        text += slowdowns.section(slower, run.slowdown, runs)
    return Report(text, differences=differences(against), errors=state.errors,
                  indeterminate=len(flaky) if verdicts else None,
                  ci=ci_facts(run, against, verdicts, slower))


def ci_facts(run: FinishedRun, against: report.Comparison | None,
             verdicts: list[indeterminate.Verdict],
             slower: list[slowdowns.Slowdown]) -> ciresult.CiResult:
    """What the CI files say of a complete run (:mod:`cluster.report.ciresult`): the
    tests the report lists as differing or as having started to error fail; a run
    compared with nothing has none that fail."""
    if against is None or against.baseline:
        return ciresult.ci_result(run.state.run_id, run.elapsed, {}, (), (), verdicts,
                                  slower)
    previous = {name: against.previous_row(name) for name in against.listed}
    return ciresult.ci_result(run.state.run_id, run.elapsed, previous, against.differing(),
                              against.started_errors, verdicts, slower)


def confirmed_report(home: Home, run: FinishedRun, text: str, header: str,
                     against: report.Comparison | None,
                     verdicts: list[indeterminate.Verdict]) -> str:
    """``text`` with what the confirm phase found (docs/results.md, "Differences confirmed,
    indeterminate tests named"): after its header, the line saying the run differs only in
    tests known to be indeterminate (when it does), then the section on the tests run twice,
    then the tests whose output differs from an earlier run's of the same job
    (:mod:`cluster.master.end.samebuild`).  The indeterminate ones (both kinds) are added to the
    record ``tables/indeterminate.tsv``, and every verdict is kept in the archive's
    ``confirm.tsv`` (the status page and ``clusteradmin history`` read it)."""
    known = indeterminate.known(home.tables)
    top = indeterminate.known_only_line(against, known) if against is not None else ""
    run_id = run.state.run_id
    # The same job (build, test file, command) as an earlier run's, another output.
    across = samebuild.changed_under_same_key(
        run.state, home.run_dir(run_id), home.result_cache, home.root / run.start.tests,
        against.changed() if against is not None else [])
    if verdicts:
        fsutil.atomic_write(run.archive / indeterminate.VERDICTS_NAME,
                            "".join(v.line() + "\n" for v in verdicts))
    when = time.time()
    indeterminate.record(home.tables, [
        indeterminate.Flaky(when, run_id, v.test, v.nodes, v.digests)
        for v in verdicts if v.kind is indeterminate.Kind.INDETERMINATE] + [
        indeterminate.Flaky(when, run_id, test, (node,), (old, new))
        for test, node, old, new in across], run.indeterminate_keep)
    added = ((top + "\n\n" if top else "") + indeterminate.section(verdicts)
             + indeterminate.same_build_section(across))
    return after_header(text, header, added)


def find_slower(home: Home, run: FinishedRun, run_tab: Path
                ) -> tuple[list[slowdowns.Slowdown], int | None]:
    """The slower tests of the report's ``Slower tests`` section (docs/results.md, "Slowest
    tests first, and slowdowns named"; :mod:`cluster.report.slowdowns`) and how many runs
    they were compared with (None: the rule is off): the run's table against the newest
    ``slowdown_runs`` archived baseline runs (this run's own archive left out: a redone end
    step finds it there)."""
    rule = run.slowdown
    if rule.runs <= 0:
        return [], None
    previous = [table for run_id, table in baseline_tabs(home, rule.runs + 1)
                if run_id != run.state.run_id][:rule.runs]
    return slowdowns.find(run_tab, previous, rule), len(previous)


def sweep_table(spec: RunSpec) -> str:
    """The name of a sweep's own table in ``tables/``, which each complete run of that
    sweep replaces and the next compares with: ``sweep.<kind>.<ref>.<sweep file>.tab``
    (a user's sweep, or a nightly one, per sweep file)."""
    return f"sweep.{spec.kind}.{spec.ref}.{spec.sweep_file}.tab"


def sweep_report(run: FinishedRun, facts: report.RunFacts, vs_push: report.Comparison | None,
                 tasks_run: int) -> tuple[str, sweepreport.Tally]:
    """A complete sweep run's report (:mod:`cluster.report.sweepreport`) from its archive.

    ``vs_push`` is the run's table compared with the user's previous run's; when it shares
    no task with this run (every task of the run is new to it: the previous run was of
    another sweep) the report says there is no previous run of this sweep."""
    changed: list[str] | None = None
    if vs_push is not None and (tasks_run == 0 or len(vs_push.added) < tasks_run):
        changed = vs_push.changed()
    return sweepreport.render(facts.header, _sweep_facts(run, facts, changed),
                              *_sweep_files(run.archive))


def sweep_section(run: FinishedRun) -> str:
    """For a sweep run that did not complete: its sweep report's body (what came home),
    after the run's own report; '' for any other run."""
    if run.spec.sweep_file is None:
        return ""
    facts = report.RunFacts(tests=0, seconds=run.elapsed, nodes=len(run.state.machines),
                            lost_nodes=run.lost_nodes)
    text, _ = sweepreport.render("What came home of the sweep:",
                                 _sweep_facts(run, facts, None), *_sweep_files(run.archive))
    return "\n" + text


def _sweep_facts(run: FinishedRun, facts: report.RunFacts,
                 changed: list[str] | None) -> sweepreport.SweepFacts:
    kept = sweepend.read_summary(run.archive) or sweepend.SweepEnd(
        run.spec.sweep_file or "", error="the sweep end step left no summary")
    return sweepreport.SweepFacts(
        sweep_file=kept.sweep_file or run.spec.sweep_file or "", seconds=facts.seconds,
        nodes=facts.nodes, lost_nodes=facts.lost_nodes, resumed=kept.resumed,
        taken=kept.taken, collect=kept.collect, error=kept.error, changed=changed,
        script=kept.script)


def _sweep_files(archive: Path) -> tuple[Path, Path, Path]:
    """results.tsv, sweep-attempts.tsv and collected/ of an archived sweep run."""
    return (archive / sweepend.RESULTS_TSV, archive / sweepend.ATTEMPTS_FILE,
            archive / sweepend.COLLECTED_DIR)


def unbuilt_lines(state: RunState, products: tuple[str, ...]) -> list[str]:
    """One line per program no node's build made whose jobs were not run, e.g.
    ``product pcl not tested: no node's build made gpcl6 (built on node1, node2; 12 tests
    not run)``.  The products named are those of the run whose own program it is; a program
    only some tests of a product call (gs for pcl's ``pdf.*`` tests) names those products'
    tests."""
    lines: list[str] = []
    for program, nodes in state.unbuilt.not_built.items():
        count = state.unbuilt.by_program.get(program, 0)
        if not count:
            continue
        if program == ABSENT:  # an every_node run's jobs whose node was not there
            lines.append(f"not run on node{'s' if len(nodes) > 1 else ''} "
                         f"{', '.join(nodes)}: not up or left the run (every_node; {count} "
                         f"test{'s' if count != 1 else ''} not run)")
            continue
        owners = [p for p in products if p != SHELL and p in PRODUCT_SPECS
                  and _program_of(p) == program]
        what = (f"product{'s' if len(owners) > 1 else ''} {', '.join(owners)} not tested"
                if owners else f"some tests of {', '.join(products)} not run")
        lines.append(f"{what}: no node's build made {program} (built on "
                     f"{', '.join(nodes) or 'no node'}; {count} test"
                     f"{'s' if count != 1 else ''} not run)")
    return lines


def reused_report(home: Home, state: RunState) -> reuseverify.ReuseReport:
    """What the report says of the result cache (:func:`cluster.master.cache.reuseverify.report`):
    the reused results (their rows' machine column is ``cache:<node>@<run>``, the node and
    run that made them), the key changes the nodes named, and the section on the checks
    of the reused results, from the run's folder (whichever master served it)."""
    run_dir = home.run_dir(state.run_id)
    return reuseverify.report(state, run_dir,
                              reuse.load_builds(run_dir / reuse.BUILDS_FILE),
                              reuse.load_keychanges(run_dir / reuse.KEYCHANGES_FILE))


def after_header(text: str, header: str, section: str) -> str:
    """``text`` with ``section`` right after its ``header`` lines (at its top when the
    text does not start with them)."""
    if not section:
        return text
    head = header.rstrip("\n") + "\n\n" if header else ""
    if not text.startswith(head):
        head = ""
    return head + section + text[len(head):]


def _program_of(product: str) -> str:
    """The program a product's own tests call (its language's; mutool for mupdf)."""
    language = PRODUCT_SPECS[product].language
    return language.program if language is not None else MUTOOL


def differences(comparison: report.Comparison | None) -> int | None:
    """How many tests the report lists as differing (None: compared with nothing)."""
    if comparison is None or comparison.baseline:
        return None
    return sum(len(names) for names in comparison.differences.values())


def aborted_report(run: FinishedRun, state: RunState) -> str:
    """The report of a run its user aborted, or an admin stopped (the reason says who)."""
    done = f"{state.results.count} of {len(state.jobs)} tests"
    if run.reason.startswith(STOPPED_BY):
        return (f"{run.header}\n\nThe run was {run.reason}.\nIt was stopped after {done}; "
                f"no table was changed.\n")
    return (f"{run.header}\n\nThe run was aborted by its user (clusterpush abort) after "
            f"{done}; no table was changed.\n")


def write_changed_list(path: Path, current: Mapping[str, tab.TabRow],
                       against: report.Comparison | None) -> int:
    """List ``<test id> <product word>`` of every test that differs; return how many.

    *against* is the run's comparison with the baseline (or with the user's previous push
    when there is no baseline); every test whose md5 changed is listed, seen before or not.
    The product word is the tested product the test belongs to (:func:`product_word`),
    what build.py's bmpcmp jobs need.  No comparison: an empty list.
    """
    names = against.changed() if against is not None else []
    lines = [f"{name} {product_word(current[name].product)}\n" for name in names]
    fsutil.atomic_write(path, lines)  # fsync'ed like the rest of the archive
    return len(lines)


def product_word(column: str) -> str:
    """The product a table column is: ``gs pdfwrite`` -> ``pdfwrite``, ``gs`` -> ``gs``,
    and gpcl6's and gxps's two-stage tests stay theirs (``pcl pdfwrite`` -> ``pcl``), so
    that bmpcmp renders them with their own program.  A column of no product with
    configurations (``shell``, ``unknown``) is kept as it is."""
    return BMPCMP_PRODUCTS.get(column, column)


# ---------------------------------------------------------------------------- the cache
def cache_path(home: Home) -> Path:
    return home.tables / "md5sum.cache"


def archived_runs(home: Home) -> Iterator[tuple[Path, JobStart]]:
    """(archive folder, its run.info) of every finished run, newest first.

    Run ids start with their UTC start time, so the name order is the time order.  A
    folder whose run.info is missing or unreadable is skipped (the latter logged).
    """
    if not home.archive.is_dir():
        return
    for folder in sorted(home.archive.iterdir(), key=lambda p: p.name, reverse=True):
        info = folder / "run.info"
        try:
            yield folder, JobStart.parse(info.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); run left out", info, exc)


def baseline_tabs(home: Home, window: int = CACHE_WINDOW) -> list[tuple[str, Path]]:
    """(run id, archived table) of the newest ``window`` git and auto runs, newest first
    (a bisection or repro run's few tests never made a baseline: left out)."""
    found: list[tuple[str, Path]] = []
    for folder, start in archived_runs(home):
        table = folder / f"{folder.name}.tab"
        if start.kind in BASELINE_KINDS and SWEEP not in start.products and table.is_file() \
                and not outside_stream(start.options):
            found.append((folder.name, table))
            if len(found) >= window:
                break
    return found


def last_user_run(home: Home, user: str) -> Path | None:
    """The archive of ``user``'s newest run with a changed list (not a bmpcmp run, nor a
    repro run: :func:`cluster.runspec.outside_stream`)."""
    for folder, start in archived_runs(home):
        if start.kind == "user" and start.ref == user and "bmpcmp" not in start.options \
                and not outside_stream(start.options) and (folder / CHANGED_LIST).is_file():
            return folder
    return None


def rebuild_cache(home: Home) -> None:
    """Rebuild ``tables/md5sum.cache`` from the archived baseline runs (cachearchive.pl)."""
    tabs = baseline_tabs(home)
    if tabs:
        md5cache.rebuild(tabs, cache_path(home), window=CACHE_WINDOW)


# ---------------------------------------------------------------------------- bmpcmp
def bmpcmp_report(home: Home, run: FinishedRun) -> str:
    """Put the nodes' difference images on one page; the report says where it is."""
    state = run.state
    uploaded = home.run_dir(state.run_id) / BMPCMP_DIR
    folder = run.archive / BMPCMP_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if uploaded.is_dir():
        shutil.copytree(uploaded, folder, dirs_exist_ok=True)
    page = folder / "index.html"
    sets = bmpcmp.write_html(folder, page, f"bmpcmp {run.spec.line()} run {state.run_id}")
    table = state.results.table(state.run_id)
    errors = sum(1 for r in table.values() if r.error)
    lines = [run.header, "", f"bmpcmp finished: {sets} difference image set(s) from "
             f"{len(table)} test(s)"
             + (f", {errors} of them failed to render" if errors else "") + ".",
             f"See {page}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- failures
#: Tests listed by name in the report of a run that did not finish; the rest are counted.
MAX_LISTED = 2000


def incomplete_report(run: FinishedRun, state: RunState) -> str:
    """The report of a run that ran out of time or lost its nodes: no table was changed."""
    missing = [name for name in state.jobs.names if name not in state.results]
    what = {
        Outcome.TIMED_OUT: "The run ran out of time",
        Outcome.RETRY: "The run lost its nodes; it is queued again",
        Outcome.GAVE_UP: "The run lost its nodes on its last attempt and is reported as failed",
        Outcome.NODES_LOST: "The run was stopped (not queued again)",
    }.get(run.outcome, "The run did not finish")
    lines = [run.header, "", f"{what}: {run.reason}.",
             f"After {run.elapsed:.0f} seconds {state.results.count} of {len(state.jobs)} "
             f"tests had a result; no table was changed.", ""]
    if run.lost_nodes:
        lines += ["Nodes lost:", *(f"  {n}" for n in run.lost_nodes), ""]
    lines.append(f"{len(missing)} tests did not run:")
    lines += [f"  {report.display_name(name)}" for name in missing[:MAX_LISTED]]
    if len(missing) > MAX_LISTED:
        lines.append(f"  ... and {len(missing) - MAX_LISTED} more")
    return "\n".join(lines) + "\n"
