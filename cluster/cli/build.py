"""build.py -- print the job list of a run (port of build.pl, ARTIFEX.md §5).

Usage::

    build.py [--config FILE] [--home DIR] [--tests DIR] [--set key=value ...] [--seed N]
             [--only FILE] [PRODUCT ...] [lowres|highres] [nightly] [filter=a,b ...]

    build.py [--config FILE] [--home DIR] [--tests DIR] [--set key=value ...] \\
             bmpcmp --from FILE

    build.py [--config FILE] [--home DIR] [--set key=value ...] sweep --sweep FILE \\
             [--resume DIR]

PRODUCT is one of gs, pdfwrite, ps2write, xpswrite, pcl, xps, mupdf, shell; with none, gs
pdfwrite ps2write (build.pl with no product built every non-mupdf product; pcl, xps and
xpswrite need the gpcl6 and gxps binaries, so they are made only when named).  One job
line ``<test> <logfile> true ; <command>`` is printed per (test file x configuration),
slowfiles.lst jobs first and quickfiles.lst jobs last, each group in random order
(``--seed`` makes the order repeatable).

The bmpcmp form (ARTIFEX.md §5.7) prints the bmpcmp jobs
(:func:`cluster.jobs.bmpcmp.bmpcmp_jobs`) of the tests FILE lists, one ``<test id>
<product>`` per line (the master writes it from the previous run's differences), in FILE's
order, at most 1000.  Tests that cannot be used are skipped with a warning on stderr.

The sweep form (docs/sweeps.md) prints one job per task of the sweep file FILE
(:mod:`cluster.jobs.sweepjobs`), in table order, streamed as the table is read: the job's
test name is the task id.  A bad sweep file, table row or task stops it with exit status 2
and one line naming the file, the line and the key (the master then keeps no job list).
With ``--resume DIR`` (the archive folder of the run a ``resume=`` run resumes) it leaves
out the tasks valid there (:mod:`cluster.sweep.resume`) and says on stderr how many it
keeps: ``resume: 12 of 64 tasks to run, 52 valid in run <id>``.

Words:
  lowres        keep only 72 and 75 dpi configurations
  highres       keep only 150, 200, 300 and 600 dpi configurations
  nightly       include the files listed in the nightly_only.lst files
  filter=a,b    keep tests whose id contains a and b; several filter= words are OR'ed
  bmpcmp        with --from FILE and no other word: the bmpcmp form
  sweep         with --sweep FILE and no other word: the sweep form

Options:
  --config FILE   INI configuration (see etc/master.conf)
  --home DIR      master home (overrides the config's home)
  --tests DIR     test corpus (default: <home>/<tests_dir>)
  --set key=value override one configuration key (repeatable)
  --seed N        seed of the shuffle (ignored by bmpcmp: its jobs keep FILE's order)
  --only FILE     keep only the jobs of the test ids FILE lists, one a line (a bisection
                  run's tests, docs/results.md "Finding the culprit commit")
  --from FILE     the tests of a bmpcmp run: '<test id> <product>' per line
  --sweep FILE    the sweep file of a sweep run
  --resume DIR    sweep only: the archive folder of the run being resumed

Exit status: 0 with the list on stdout, 2 for bad arguments or configuration, 1 when the
corpus (or FILE) cannot be read.  Differences from build.pl: see cluster/jobs/corpus.py and
cluster/jobs/commands.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from cluster.cli import common
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.jobs import bmpcmp as bmpcmp_jobgen
from cluster.jobs import generate as jobgen
from cluster.jobs.sweepjobs import sweep_jobs
from cluster.records import Job
from cluster.sweep import spec as sweep_spec
from cluster.sweep.resume import RESULTS_TSV, ResumeFilter

logger = logging.getLogger("cluster.build")

PROG = "build.py"
WORDS = ("lowres", "highres", "nightly", "filter=a,b")
#: The word that selects the bmpcmp form.
BMPCMP_WORD = "bmpcmp"
#: The word that selects the sweep form.
SWEEP_WORD = jobgen.SWEEP
#: Job lines written at once.
BLOCK = 4096


class _Parser(argparse.ArgumentParser):
    """argparse that returns usage errors instead of exiting, so main() keeps its exit codes."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def _parser() -> _Parser:
    p = _Parser(prog=PROG, add_help=True, description="Print the job list of a run.",
                epilog=__doc__.split("Words:", 1)[1] if __doc__ else None,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(p)
    p.add_argument("--tests", type=Path, help="test corpus root")
    p.add_argument("--seed", help="shuffle seed (an integer)")
    p.add_argument("--from", dest="from_file", type=Path, metavar="FILE",
                   help="bmpcmp only: the tests to compare, '<test id> <product>' per line")
    p.add_argument("--sweep", dest="sweep_file", type=Path, metavar="FILE",
                   help="sweep only: the sweep file")
    p.add_argument("--only", type=Path, metavar="FILE",
                   help="keep only the jobs of the test ids FILE lists, one a line")
    p.add_argument("--resume", type=Path, metavar="DIR",
                   help="sweep only: the archive folder of the run this run resumes")
    p.add_argument("words", nargs="*", metavar="WORD", help="products and selection words")
    return p


def parse_words(words: list[str]) -> tuple[list[str], jobgen.JobOptions]:
    """Split positional words into products and options; ValueError names a bad word."""
    products: list[str] = []
    lowres = highres = nightly = False
    filters: list[str] = []
    for word in words:
        if word in jobgen.PRODUCTS:
            products.append(word)
        elif word == "lowres":
            lowres = True
        elif word == "highres":
            highres = True
        elif word == "nightly":
            nightly = True
        elif word.startswith("filter="):
            value = word[len("filter="):]
            if not any(value.split(",")):
                raise ValueError(f"empty filter in {word!r}; expected filter=a[,b...]")
            filters.append(value)
        else:
            raise ValueError(f"unknown word {word!r}; expected a product "
                             f"({', '.join(jobgen.PRODUCTS)}) or one of {', '.join(WORDS)}")
    options = jobgen.JobOptions(lowres=lowres, highres=highres, filters=tuple(filters),
                                nightly=nightly)
    return products or list(jobgen.DEFAULT_PRODUCTS), options


def main(argv: list[str] | None = None) -> int:
    """Run build.py with ``argv`` (default: sys.argv[1:]); return the exit status."""
    if not logging.getLogger().handlers:
        common.setup_logging()
        # Warnings only: the master logs whatever build.py writes on stderr as a warning.
        logging.getLogger().setLevel(logging.WARNING)
    args_in = sys.argv[1:] if argv is None else argv
    try:
        args = _parser().parse_args(args_in)
    except _UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help printed the usage
        return exc.code if isinstance(exc.code, int) else 0
    if args.resume is not None and args.sweep_file is None:
        print(f"{PROG}: --resume is for the sweep form only: {SWEEP_WORD} --sweep FILE "
              "--resume DIR", file=sys.stderr)
        return EXIT_USAGE
    if BMPCMP_WORD in args.words:
        return _bmpcmp_main(args)
    if SWEEP_WORD in args.words or args.sweep_file is not None:
        return _sweep_main(args)
    try:
        if args.from_file is not None:
            raise ValueError(f"--from is for the bmpcmp form only: {BMPCMP_WORD} --from FILE")
        products, options = parse_words(args.words)
        seed = None
        if args.seed is not None:
            try:
                seed = int(args.seed)
            except ValueError:
                raise ValueError(f"--seed {args.seed!r}: expected an integer") from None
        cfg = common.load_config(args)
    except (ValueError, ClusterError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    tests_root = args.tests if args.tests is not None else cfg.home / cfg.tests_dir
    rng = random.Random(seed)
    try:
        jobs = jobgen.generate(cfg, products, tests_root, options, rng)
        if args.only is not None:
            keep = set(args.only.read_text(encoding="utf-8").split())
            jobs = [job for job in jobs if job.name in keep]
    except (ValueError, ClusterError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"{PROG}: cannot read the test corpus {exc.filename or tests_root}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    return _print_jobs(jobs)


def _bmpcmp_main(args: argparse.Namespace) -> int:
    """The bmpcmp form: the jobs of the tests ``--from FILE`` lists; returns the exit status."""
    try:
        others = [w for w in args.words if w != BMPCMP_WORD]
        if others:
            raise ValueError(f"unexpected word(s) {' '.join(others)!r} with {BMPCMP_WORD}; "
                             f"expected {BMPCMP_WORD} --from FILE")
        if args.from_file is None:
            raise ValueError(f"{BMPCMP_WORD} needs --from FILE ('<test id> <product>' per line)")
        cfg = common.load_config(args)
    except (ValueError, ClusterError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    tests_root = args.tests if args.tests is not None else cfg.home / cfg.tests_dir
    try:
        tests = bmpcmp_jobgen.read_bmpcmp_list(args.from_file)
    except OSError as exc:
        print(f"{PROG}: cannot read the bmpcmp list {args.from_file}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_FAILED
    try:
        jobs = bmpcmp_jobgen.bmpcmp_jobs(cfg, tests, tests_root)
    except OSError as exc:
        print(f"{PROG}: cannot read the test corpus {exc.filename or tests_root}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    return _print_jobs(jobs)


def _sweep_main(args: argparse.Namespace) -> int:
    """The sweep form: one job per task of ``--sweep FILE``, streamed; the exit status."""
    try:
        others = [w for w in args.words if w != SWEEP_WORD]
        if others:
            raise ValueError(f"unexpected word(s) {' '.join(others)!r} with {SWEEP_WORD}; "
                             f"expected {SWEEP_WORD} --sweep FILE")
        if SWEEP_WORD not in args.words:
            raise ValueError(f"--sweep FILE goes with the word {SWEEP_WORD}")
        if args.sweep_file is None:
            raise ValueError(f"{SWEEP_WORD} needs --sweep FILE (the sweep file)")
        if args.from_file is not None:
            raise ValueError(f"--from is for the bmpcmp form only: {BMPCMP_WORD} --from FILE")
        # A bad configuration is refused as in the other forms; its max_result_bytes
        # bounds what each task writes (the job line's ulimit).
        cfg = common.load_config(args)
        spec = sweep_spec.load(args.sweep_file)
        if args.resume is None:
            return _print_jobs(sweep_jobs(spec, cfg.max_result_bytes))
        keep = _resume_filter(args.resume, spec)
        status = _print_jobs(sweep_jobs(spec, cfg.max_result_bytes, keep))
        # The master logs build.py's stderr as a warning: the count lands in its log.
        print(keep.summary(), file=sys.stderr)
        return status
    except (ValueError, ClusterError) as exc:  # a SweepError names file, line and key
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"{PROG}: cannot read the sweep's table {exc.filename or ''}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED


def _resume_filter(archive: Path, spec: sweep_spec.SweepSpec) -> ResumeFilter:
    """The selection of a resume run from the archive folder of the run it resumes;
    ValueError (a usage error) naming what is missing there."""
    try:
        return ResumeFilter(archive, spec.rows().header)
    except FileNotFoundError:
        raise ValueError(f"--resume {archive}: no {RESULTS_TSV} there; expected the "
                         "archive folder of an earlier run of this sweep") from None


def _blocks(jobs: Iterable[Job]) -> Iterator[list[Job]]:
    """``jobs`` in lists of at most :data:`BLOCK` (a stream stays a stream)."""
    block: list[Job] = []
    for job in jobs:
        block.append(job)
        if len(block) == BLOCK:
            yield block
            block = []
    if block:
        yield block


def _print_jobs(jobs: Iterable[Job]) -> int:
    """Write the job lines to stdout; 0 (a reader that stops early is no error)."""
    out = sys.stdout
    try:
        # In blocks: one write() per line would be a system call per job when stdout is
        # unbuffered (PYTHONUNBUFFERED), a million of them for a big run.
        for block in _blocks(jobs):
            out.write("".join(job.line + "\n" for job in block))
        out.flush()
    except BrokenPipeError:
        # `build.py ... | head` is fine.  Point stdout at /dev/null so the interpreter's
        # final flush does not complain (the recipe of the signal module's docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    return EXIT_OK
