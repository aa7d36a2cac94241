"""``clusteradmin repro RUN TEST [--node N | --here]``: what it prints and its exit status
(docs/operating.md, "Reproducing one job: `clusteradmin repro`"); the work is
:mod:`cluster.console.repro` (finding the job) and :mod:`cluster.console.reprorun`
(building, running, comparing)."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.cli import progname
from cluster.config import Config
from cluster.console import repro, reprorun
from cluster.console.repro import ReproCannot, ReproUsage
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.node.runcontext import build_key
from cluster.records import BIN, ERROR_NAMES, TEMP, TESTS, TREE_DIR
from cluster.runtime.proc import ProcessError

PROG = progname.prog("clusteradmin.py")
#: The job could not be run (no job list kept, the node not here, a failed build).
EXIT_CANNOT = 3


def main(home: Home, cfg: Config, run_id: str, test: str, node: str | None, here: bool,
         work: Path | None) -> int:
    """Find, print, run, compare; the exit status (0 same, 1 different, 2 unknown run or
    test, 3 could not run)."""
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
        else:
            place = reprorun.on_node(found, target, cfg)
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
    new, old = ran.result, found.row
    if new.error != old.error:
        words = ERROR_NAMES.get(new.error, "unknown")
        print(f"error {new.error} ({words})  run {old.error}  DIFFERENT")
    new_md5 = new.md5 if new.error == 0 else "0"
    print(repro.compare_line(new_md5, old.md5))
    same = new_md5 == old.md5 and new.error == old.error
    baseline = reprorun.baseline_md5(home, found.job.name)
    if baseline is None:
        print("baseline: no row in tables/current.tab; nothing to compare with bmpcmp")
    elif new.error == 0 and new_md5 != baseline:
        print(f"baseline md5 {baseline} differs")
        for line in reprorun.bmpcmp(found, home, cfg, work, ran, baseline):
            print(line)
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


