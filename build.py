#!/usr/bin/env python3
"""build.py -- port of build.pl; prints a run's job list. See cluster/cli/build.py for usage.

One more form, for bmpcmp runs (ARTIFEX.md §5.7)::

    build.py [--config FILE] [--home DIR] [--tests DIR] [--set key=value ...] \\
             bmpcmp --from FILE

prints the bmpcmp jobs (:func:`cluster.jobgen.bmpcmp_jobs`) of the tests FILE lists, one
``<test id> <product>`` per line (the master writes it from the previous run's
differences), in FILE's order, at most 1000.  Tests that cannot be used are skipped with a
warning on stderr.  Exit status: 0 with the list on stdout, 2 for bad arguments or
configuration, 1 when FILE or the corpus cannot be read.  Every other command line goes to
cluster/cli/build.py unchanged.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cluster.cli import build, common
from cluster.errors import ClusterError
from cluster.jobs import generate as jobgen

BMPCMP_WORD = "bmpcmp"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _bmpcmp_parser(add_help: bool = True) -> _Parser:
    p = _Parser(prog="build.py", description="Print the bmpcmp jobs of the listed tests.",
                add_help=add_help)
    common.add_config_options(p)
    p.add_argument("--tests", type=Path, help="test corpus root")
    p.add_argument("--seed", help="accepted for symmetry; bmpcmp jobs keep FILE's order")
    p.add_argument("--from", dest="from_file", type=Path, metavar="FILE",
                   help="the tests to compare: '<test id> <product>' per line")
    p.add_argument("words", nargs="*", metavar="WORD")
    return p


def _wants_bmpcmp(argv: list[str]) -> bool:
    """Whether ``argv`` is the bmpcmp form (``bmpcmp`` among the positional words)."""
    try:
        args, _ = _bmpcmp_parser(add_help=False).parse_known_args(argv)
    except (_UsageError, SystemExit):
        return False  # let cluster/cli/build.py report the bad command line
    return BMPCMP_WORD in args.words


def bmpcmp_main(argv: list[str]) -> int:
    """The bmpcmp form of build.py; returns the exit status."""
    if not logging.getLogger().handlers:
        common.setup_logging()
        logging.getLogger().setLevel(logging.WARNING)
    try:
        args = _bmpcmp_parser().parse_args(argv)  # --help prints and exits 0
        others = [w for w in args.words if w != BMPCMP_WORD]
        if others:
            raise _UsageError(f"unexpected word(s) {' '.join(others)!r} with bmpcmp; expected "
                              "bmpcmp --from FILE")
        if args.from_file is None:
            raise _UsageError("bmpcmp needs --from FILE ('<test id> <product>' per line)")
        cfg = common.load_config(args)
    except (_UsageError, ValueError, ClusterError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 2
    tests_root = args.tests if args.tests is not None else cfg.home / cfg.tests_dir
    try:
        tests = jobgen.read_bmpcmp_list(args.from_file)
    except OSError as exc:
        print(f"build.py: cannot read the bmpcmp list {args.from_file}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        jobs = jobgen.bmpcmp_jobs(cfg, tests, tests_root)
    except OSError as exc:
        print(f"build.py: cannot read the test corpus {exc.filename or tests_root}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(job.line + "\n" for job in jobs))
    sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    if _wants_bmpcmp(argv):
        return bmpcmp_main(argv)
    return build.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
