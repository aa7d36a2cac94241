"""``clusteradmin repro RUN TEST [--node N [--queue] | --here]``: what it prints and its
exit status (docs/operating.md, "Reproducing one job: `clusteradmin repro`"); the work is
:mod:`cluster.console.repro` (finding the job), :mod:`cluster.console.reprorun` (building,
running, comparing here or in a node's work folder on this machine) and
:mod:`cluster.console.reproqueue` (a repro run queued for a node on any machine, its end
waited for here: :func:`cluster.cli.pushwait.wait_for_archive`)."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.cli import progname, pushwait
from cluster.config import Config
from cluster.console import repro, reproqueue, reprorun
from cluster.console.repro import NotHere, ReproCannot, ReproUsage
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.node.runcontext import build_key
from cluster.records import BIN, ERROR_NAMES, TEMP, TESTS, TREE_DIR
from cluster.report.tab import TabRow
from cluster.runtime.proc import ProcessError

PROG = progname.prog("clusteradmin.py")
#: The job could not be run (no job list kept, a failed build, a repro run that failed,
#: whose node never came, or that did not end in time).
EXIT_CANNOT = 3
#: How long a repro run may wait and run by default [s] (``--wait-timeout``): a node's
#: build of a tree it has not built is some minutes.
WAIT_TIMEOUT = 3600.0
#: How much longer than its own job_timeout clusteradmin waits for a repro run's end [s]:
#: the master ends a run past its limit at its next look, then writes its archive.
END_MARGIN = 120.0
#: The longest ``--wait-timeout`` [s] (a run's longest job_timeout).
MAX_WAIT = reproqueue.MAX_WAIT


def main(home: Home, cfg: Config, run_id: str, test: str, node: str | None, here: bool,
         work: Path | None, queued: bool = False, wait: float = WAIT_TIMEOUT) -> int:
    """Find, print, run, compare; the exit status (0 same, 1 different, 2 unknown run,
    test or node, 3 could not run).  ``queued``: as a repro run even when the node's work
    folder is on this machine; ``wait``: the repro run's bound [s]."""
    try:
        found = repro.find(home, run_id, test)
    except ReproUsage as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ReproCannot as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    work = work if work is not None else reprorun.default_work()
    for line in describe(found, cfg):
        print(line)
    target = "here" if here else (node or found.node)
    try:
        if here:
            place = reprorun.here(found, home, cfg, work)
        elif queued:
            return _as_run(home, found, target, wait, "asked with --queue")
        else:
            try:
                place = reprorun.on_node(found, target, cfg)
            except NotHere as exc:
                return _as_run(home, found, target, wait, str(exc))
        print(f"where {place.label}")
        for note in place.notes:
            print(f"  {note}")
        for program, digest in place.digests or ((p, "") for p in
                                                 repro.programs(found.job.command)):
            print(repro.key_line(f"build digest {program}", digest or None,
                                 dict(found.keys.digests).get(program)))
        print(repro.key_line("environment digest", place.environment, found.keys.environment))
        folder = work / "out" / found.run / found.job.name / target
        ran = reprorun.run(found, place, folder, cfg)
    except ReproCannot as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    except (ClusterError, ProcessError, OSError) as exc:
        print(f"{PROG}: the job could not be run: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    print(f"ran   {ran.command}")
    print(f"log   {ran.log}")
    print(f"output {ran.output if ran.output is not None else 'none kept (the job wrote none)'}")
    new = ran.result
    new_md5 = new.md5 if new.error == 0 else "0"
    same = compared(new.error, new.md5, found.row)
    baseline = reprorun.baseline_md5(home, found.job.name)
    if baseline is None:
        print("baseline: no row in tables/current.tab; nothing to compare with bmpcmp")
    elif new.error == 0 and new_md5 != baseline:
        print(f"baseline md5 {baseline} differs")
        for line in reprorun.bmpcmp(found, home, cfg, work, ran, baseline):
            print(line)
    return EXIT_OK if same else EXIT_FAILED


def compared(new_error: int, new_md5: str, old: TabRow) -> bool:
    """Print the new result beside the run's (``md5 <new>  run <old>  same|DIFFERENT``,
    and the error codes when they differ); whether they are the same."""
    if new_error != old.error:
        words = ERROR_NAMES.get(new_error, "unknown")
        print(f"error {new_error} ({words})  run {old.error}  DIFFERENT")
    new_md5 = new_md5 if new_error == 0 else "0"
    print(repro.compare_line(new_md5, old.md5))
    return new_md5 == old.md5 and new_error == old.error


def _as_run(home: Home, found: repro.Found, node: str, wait: float, why: str) -> int:
    """The job run as a repro run on ``node`` (:mod:`cluster.console.reproqueue`): queued,
    its end waited for (``wait`` seconds and :data:`END_MARGIN`), its result compared."""
    try:
        reproqueue.check_node(home, found, node)
    except ReproUsage as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    spec = reproqueue.repro_spec(found, node, wait)
    before = pushwait.archived(home)
    added = reproqueue.queue(home, spec)
    print(f"where node {node}, as a repro run ({why})")
    print(f"queued {spec.line()}  (priority {reproqueue.REPRO_PRIORITY}"
          f"{'' if added else ', already waiting there'})")
    sys.stdout.flush()
    archive = pushwait.wait_for_archive(home, spec.line(), before, wait + END_MARGIN)
    if archive is None:
        print(f"{PROG}: repro run {spec.line()!r} did not end within {wait + END_MARGIN:g} "
              "s; it leaves its queue by its queue_timeout, or ends by its job_timeout",
              file=sys.stderr)
        return EXIT_CANNOT
    ended = reproqueue.result(archive, found.job.name, node)
    print(f"repro run {ended.run} ended {ended.outcome}, archived in {archive}")
    for program, digest in ended.keys.digests or ((p, "") for p in
                                                  repro.programs(found.job.command)):
        print(repro.key_line(f"build digest {program}", digest or None,
                             dict(found.keys.digests).get(program)))
    print(repro.key_line("environment digest", ended.keys.environment,
                         found.keys.environment))
    if not ended.complete or ended.row is None:
        print(f"{PROG}: {reproqueue.why_not(ended, node)}", file=sys.stderr)
        return EXIT_CANNOT
    print(f"ran   {found.job.line}")
    print(f"log   {archive / 'logs' / (node + '.log')}")
    for line in ended.log_block.rstrip("\n").splitlines():
        print(f"  {line}")
    print("output none kept: a node sends back its logs only (the job's folder is removed "
          "after the job); run repro with --here to keep the raster")
    if ended.row.machine != node:
        print(f"{PROG}: repro run {ended.run}'s row names node {ended.row.machine}, not "
              f"{node}", file=sys.stderr)
        return EXIT_CANNOT
    same = compared(ended.row.error, ended.row.md5, found.row)
    return EXIT_OK if same else EXIT_FAILED


def describe(found: repro.Found, cfg: Config) -> list[str]:
    """The run's facts of the job: its row, the node and run that made it, the job line
    with the node's values for the placeholders (``__temp__`` was its job folder), the
    build key and the keys the node said."""
    row, start = found.row, found.start
    made = (f"node {found.node}" if not found.reused else
            f"node {found.node} in run {found.made_in} (reused by run {found.run} from the "
            "result cache)")
    lines = [f"run   {found.run} ({start.kind} {start.ref}), test {found.job.name}",
             f"result md5 {row.md5} error {row.error}, made by {made}"]
    line = found.job.line
    if found.keys.build_dir is not None:
        build_dir = Path(found.keys.build_dir)
        work = build_dir.parent.parent
        line = repro.fill(line, {TESTS: str(work / "tests"), TREE_DIR: str(build_dir),
                                 BIN: str(reprorun.bin_dir(build_dir, found.start, cfg))})
    lines.append(f"job   {line}")
    if TEMP in line:
        lines.append(f"      ({TEMP}: the node's job folder in its runs/{found.made_in}/temp)")
    lines.append(f"build key {build_key(start)}")
    return lines


