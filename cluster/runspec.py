"""The grammar of a queued run: one line of a queue file as a :class:`RunSpec`.

A master home holds one queue per priority (:mod:`cluster.queue`).  Each line is one run
waiting to be done (ARTIFEX.md §2.1/§2.2)::

    <kind> <ref> <products> [option ...]

``kind``
    ``user`` (``ref`` = a user name, a clusterpush run, usually priority 0), ``git`` (``ref``
    = a commit sha of 7 to 40 hex digits, priority 1) or ``auto`` (``ref`` = an auto job name,
    priority 2).  The master does not care which kind sits in which queue.
``ref``
    ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``; a git sha is lower-cased.
``products``
    comma-separated, each of ``gs``, ``pdfwrite``, ``ps2write``, ``xpswrite``, ``pcl``,
    ``xps``, ``mupdf``, ``shell``, ``sweep``, no duplicates; ``mupdf`` must be alone
    (Artifex rule: mupdf is pushed alone), and so must ``shell`` (a list of shell commands,
    see cluster.jobs.commands) and ``sweep`` (a program over a parameter table,
    docs/sweeps.md).  Canonical order is the order of :data:`PRODUCTS`.
``option``
    a flag (``lowres``, ``highres``, ``relaxtimeout``, ``bmpcmp``; ``lowres`` and ``highres``
    exclude each other) or ``key=value`` with key ``filter``, ``ifilter``, ``extras``, ``rev``,
    ``tree``, ``sweep``, ``resume`` or ``culprit``; or a per-run option (docs/runoptions.md;
    the flags ``exclusive``, ``no_reschedule``, ``every_node`` and the keys ``job_timeout``,
    ``queue_timeout``, ``task_timeout``, ``max_failed_nodes``, ``max_worker_instances``,
    ``max_cluster_instances``, ``groups``, ``exclude``, ``name``, ``after``: their grammar
    is :mod:`cluster.runoptions`', and any run, a sweep too, may have them; but
    ``num_execution`` goes with product ``shell`` only).
    ``sweep=<file>`` names a sweep run's sweep file in the top of its folder
    (:data:`SWEEP_FILE`; default :data:`DEFAULT_SWEEP_FILE`);
    ``resume=<run id>`` (:data:`RESUME_RUN`, the name of a folder of ``archive/``) makes a
    sweep run run only the tasks without a valid result in that earlier run
    (docs/sweeps.md, section 8).  Both go with product ``sweep`` only; a sweep run takes no
    other option but ``relaxtimeout``.  ``culprit=<run id>.<step>`` (:data:`CULPRIT_STEP`,
    git runs only) makes a commit run a bisection run of a culprit search (docs/results.md,
    "Finding the culprit commit").  ``repro=<run id>:<test id>`` (:data:`REPRO_JOB`) makes
    a run a repro run: the one job of that archived run, as its archived line says
    (docs/operating.md, "Reproducing one job: `clusteradmin repro`").  Bisection and repro
    runs never become part of the stream (:func:`outside_stream`).  Each flag or key at
    most once; canonical order is sorted.

Fields are separated by spaces or tabs; a line holds at most :data:`MAX_LINE` characters and
no control characters.  Blank lines and lines starting with ``#`` are ignored.

:class:`RunSpec` is always valid and canonical (its constructor checks and normalizes), and
``RunSpec.parse(spec.line()) == spec``.  Usage::

    spec = RunSpec.parse("git 0123abc gs,pdfwrite")
    spec.tree, spec.option("rev"), spec.line()
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from cluster import runoptions
from cluster.datatypes import ALONE, PRODUCTS, TREE
from cluster.errors import QueueLineError
from cluster.runoptions import RunOptionError, check_word, check_words

KINDS = ("user", "git", "auto")
# PRODUCTS, ALONE and TREE (the grammar of ``tree=``) are cluster.datatypes': the commit
# triggers' path -> products map and the configuration check the same names.
FLAGS = ("lowres", "highres", "relaxtimeout", "bmpcmp") + runoptions.FLAGS
OPTION_KEYS = ("filter", "ifilter", "extras", "rev", "tree", "sweep", "resume", "culprit",
               "repro") + runoptions.VALUE_KEYS
EXCLUSIVE_FLAGS = (("lowres", "highres"),)
MAX_LINE = 4096

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA = re.compile(r"[0-9A-Fa-f]{7,40}")
#: ``rev=`` goes to git: it may not start with ``-`` (it would read as an option).
REV = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/~^@{}-]{0,127}")
_SEPARATORS = re.compile(r"[ \t]+")
#: ``sweep=``: the sweep file's name in the top of the sweep folder (a file name, no path).
SWEEP_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The sweep file of a sweep run without ``sweep=``.
DEFAULT_SWEEP_FILE = "sweep.toml"
#: The product whose runs are sweeps.
SWEEP = "sweep"
#: ``resume=``: the id of the earlier run a sweep run resumes, the name of its folder in
#: ``archive/`` (a run id of the master: ``20260101020304-p0-1a2b``; no ``/``, never ``.``
#: or ``..``).
RESUME_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: ``culprit=``: a bisection run's search and step, ``<run id>.<step>`` (docs/results.md,
#: "Finding the culprit commit"): the commit run whose confirmed differences are searched
#: for and the number of the step in its record ``culprits/<run id>.toml``.
CULPRIT_STEP = re.compile(r"([A-Za-z0-9][A-Za-z0-9_-]{0,58})\.([0-9]{1,4})")
#: ``repro=``: a repro run's archived run and test, ``<run id>:<test id>``: the run id as
#: ``culprit=``'s (no ``/``, no ``.``), the test id any word (a job line's first word).
REPRO_JOB = re.compile(r"([A-Za-z0-9][A-Za-z0-9_-]{0,58}):([^\s/][^\s]*)")
#: The options that make a run one that never becomes part of the stream: a bisection run
#: (``culprit=``), a repro run (``repro=``).
OUTSIDE_STREAM = ("culprit", "repro")
#: The options a sweep run may have (the corpus's selection words and bmpcmp mean nothing
#: to a sweep).
SWEEP_OPTIONS = ("sweep", "resume", "relaxtimeout") + runoptions.KEYS
#: The product whose jobs are the corpus's command lines, and the option that runs each of
#: them N times (docs/runoptions.md section 7): product shell only.
SHELL = "shell"
RANKED = "num_execution"
#: The options that go with product ``sweep`` only.
SWEEP_ONLY_OPTIONS = ("sweep", "resume")


class _Problem(Exception):
    """What is wrong with a run description; turned into QueueLineError by the caller."""


def _check_text(text: str) -> None:
    """Refuse control, undecodable and exotic whitespace characters (tab is a separator)."""
    for ch in text:
        if ch in " \t":
            continue
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cs"):
            raise _Problem(f"control or undecodable character {ch!r}; expected printable "
                           "words separated by spaces or tabs")


def _normalize(kind: str, ref: str, products: Iterable[str],
               options: Iterable[str]) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """Validate the fields of a run; return them in canonical form or raise _Problem."""
    if kind not in KINDS:
        raise _Problem(f"unknown run kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "git":
        if not SHA.fullmatch(ref):
            raise _Problem(f"bad commit {ref!r}; expected a sha of 7 to 40 hex digits")
        ref = ref.lower()
    elif not REF.fullmatch(ref):
        what = "user name" if kind == "user" else "auto job name"
        raise _Problem(f"bad {what} {ref!r}; expected letters, digits, '.', '_' or '-' "
                       "(starting with a letter or digit, at most 64)")

    prods = tuple(products)
    if not prods:
        raise _Problem(f"no products; expected a comma-separated list of {', '.join(PRODUCTS)}")
    seen: set[str] = set()
    for p in prods:
        if p not in PRODUCTS:
            raise _Problem(f"unknown product {p!r}; expected one of {', '.join(PRODUCTS)}")
        if p in seen:
            raise _Problem(f"product {p!r} listed twice; expected each product at most once")
        seen.add(p)
    for p in ALONE:
        if p in seen and len(prods) > 1:
            raise _Problem(f"product {p!r} must be queued alone; got {','.join(prods)}")
    prods = tuple(p for p in PRODUCTS if p in seen)

    opts: list[str] = []
    names: set[str] = set()
    for opt in options:
        _check_text(opt)
        if not opt or " " in opt or "\t" in opt:
            raise _Problem(f"bad option {opt!r}; expected one word")
        key, eq, value = opt.partition("=")
        if eq:
            if key in FLAGS:
                raise _Problem(f"option {key} is a flag; expected {key} without '='")
            if key not in OPTION_KEYS:
                raise _Problem(f"unknown option {key!r}; expected a flag "
                               f"({', '.join(FLAGS)}) or key=value with key one of "
                               f"{', '.join(OPTION_KEYS)}")
            if not value:
                raise _Problem(f"option {key}= has no value; expected {key}=<value>")
            if key == "tree" and not TREE.fullmatch(value):
                raise _Problem(f"bad tree {value!r}; expected a directory name (letters, "
                               "digits, '.', '_' or '-')")
            if key == "rev" and not REV.fullmatch(value):
                raise _Problem(f"bad rev {value!r}; expected a git revision not starting "
                               "with '-'")
            if key in SWEEP_ONLY_OPTIONS and prods != (SWEEP,):
                raise _Problem(f"option {key}= goes with product {SWEEP} only; got "
                               f"{','.join(prods)}")
            if key == "resume" and not RESUME_RUN.fullmatch(value):
                raise _Problem(f"bad resume run {value!r}; expected the id of an archived "
                               "run (letters, digits, '.', '_' or '-', starting with a "
                               "letter or digit, at most 64)")
            if key == "culprit" and (kind != "git" or not CULPRIT_STEP.fullmatch(value)):
                raise _Problem(f"bad culprit step {value!r}; expected <run id>.<step> on a "
                               "git run (a bisection run the master queues)")
            if key == "repro" and (prods == (SWEEP,) or not REPRO_JOB.fullmatch(value)):
                raise _Problem(f"bad repro job {value!r}; expected <run id>:<test id> on a "
                               "run that is no sweep (a repro run clusteradmin queues)")
            if key == "sweep":
                if not SWEEP_FILE.fullmatch(value):
                    raise _Problem(f"bad sweep file {value!r}; expected a file name in the "
                                   "top of the sweep folder (letters, digits, '.', '_' or "
                                   "'-', starting with a letter or digit)")
        elif key not in FLAGS:
            raise _Problem(f"unknown option {key!r}; expected a flag ({', '.join(FLAGS)}) or "
                           f"key=value with key one of {', '.join(OPTION_KEYS)}")
        try:
            check_word(key, value if eq else None)
        except RunOptionError as exc:
            raise _Problem(str(exc)) from None
        if key in names:
            raise _Problem(f"option {key!r} given twice; expected it at most once")
        names.add(key)
        opts.append(opt)
    try:
        check_words(opts)  # together: after= may not name the run's own name=
    except RunOptionError as exc:
        raise _Problem(str(exc)) from None
    if RANKED in names and prods != (SHELL,):
        raise _Problem(f"option {RANKED}= goes with product {SHELL} only (each command run "
                       f"as N ranks); got {','.join(prods)}")
    if prods == (SWEEP,):
        other = sorted(names - set(SWEEP_OPTIONS))
        if other:
            raise _Problem(f"option {other[0]!r} does not go with product {SWEEP}; expected "
                           f"only {' or '.join(SWEEP_OPTIONS)}")
    for group in EXCLUSIVE_FLAGS:
        both = [f for f in group if f in names]
        if len(both) > 1:
            raise _Problem(f"options {' and '.join(both)} exclude each other; expected one")
    return kind, ref, prods, tuple(sorted(opts, key=lambda o: o.partition("=")[0]))


@dataclass(frozen=True)
class RunSpec:
    """One queued run.  Always valid and canonical: the constructor validates and normalizes.

    ``RunSpec.parse(spec.line()) == spec`` for every spec, and two specs are equal exactly
    when their canonical lines are.
    """

    kind: str
    ref: str
    products: tuple[str, ...]
    options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            _check_text(self.kind + self.ref + "".join(self.products))
            kind, ref, products, options = _normalize(self.kind, self.ref, self.products,
                                                      self.options)
        except _Problem as exc:
            shown = " ".join([str(self.kind), str(self.ref), ",".join(map(str, self.products)),
                              *map(str, self.options)])
            raise QueueLineError(shown, str(exc)) from None
        # Frozen dataclass: normalization has to go through object.__setattr__.
        object.__setattr__(self, "ref", ref)
        object.__setattr__(self, "products", products)
        object.__setattr__(self, "options", options)
        text = self.line()
        if len(text) > MAX_LINE:
            raise QueueLineError(text[:100], f"run description is {len(text)} characters; "
                                 f"expected at most {MAX_LINE}")

    @classmethod
    def parse(cls, line: str, source: str = "", lineno: int | None = None) -> RunSpec:
        """Parse one queue line (a trailing newline or CR is ignored).

        Raises QueueLineError naming ``source`` and ``lineno``, the problem and the expected
        form.
        """
        text = line.rstrip("\r\n")
        try:
            if len(text) > MAX_LINE:
                raise _Problem(f"line is {len(text)} characters; expected at most {MAX_LINE}")
            _check_text(text)
            words = [w for w in _SEPARATORS.split(text) if w]
            if len(words) < 3:
                raise _Problem("too few fields; expected '<kind> <ref> <products> [option ...]'")
            kind, ref, products, *options = words
            prods = products.split(",")
            if "" in prods:
                raise _Problem(f"empty product in {products!r}; expected a comma-separated "
                               f"list of {', '.join(PRODUCTS)}")
            kind, ref, prods_t, opts = _normalize(kind, ref, prods, options)
        except _Problem as exc:
            raise QueueLineError(text, str(exc), source, lineno) from None
        return cls(kind, ref, prods_t, opts)

    def line(self) -> str:
        """The canonical queue line (no newline)."""
        return " ".join([self.kind, self.ref, ",".join(self.products), *self.options])

    def option(self, key: str) -> str | None:
        """The value of option ``key=value``, or None when not given."""
        for opt in self.options:
            k, eq, value = opt.partition("=")
            if eq and k == key:
                return value
        return None

    def has_flag(self, flag: str) -> bool:
        """Whether the flag option ``flag`` is given."""
        return flag in self.options

    @property
    def tree(self) -> str:
        """The source tree the run builds: option ``tree=``, else mupdf, shell, sweep (the
        sweep folder) or ghostpdl."""
        explicit = self.option("tree")
        if explicit is not None:
            return explicit
        if self.products in (("mupdf",), ("shell",), (SWEEP,)):
            return self.products[0]
        return "ghostpdl"

    @property
    def culprit(self) -> tuple[str, int] | None:
        """A bisection run's search (the commit run whose differences it searches) and step
        number (option ``culprit=``), or None for any other run."""
        value = self.option("culprit")
        match = CULPRIT_STEP.fullmatch(value) if value is not None else None
        return (match.group(1), int(match.group(2))) if match else None

    @property
    def repro(self) -> tuple[str, str] | None:
        """A repro run's archived run and test (option ``repro=``), or None."""
        value = self.option("repro")
        match = REPRO_JOB.fullmatch(value) if value is not None else None
        return (match.group(1), match.group(2)) if match else None

    @property
    def outside_stream(self) -> bool:
        """Whether the run never becomes part of the stream (:func:`outside_stream`)."""
        return outside_stream(self.options)

    @property
    def resume(self) -> str | None:
        """The run a sweep run resumes (option ``resume=``), or None."""
        return self.option("resume")

    @property
    def sweep_file(self) -> str | None:
        """A sweep run's sweep file in its folder (``sweep=``, else
        :data:`DEFAULT_SWEEP_FILE`); None for any other run."""
        if self.products != (SWEEP,):
            return None
        return self.option("sweep") or DEFAULT_SWEEP_FILE

    def __str__(self) -> str:
        return self.line()


def outside_stream(options: Iterable[str]) -> bool:
    """Whether a run with these queue options never becomes part of the stream: a
    bisection run (``culprit=``) or a repro run (``repro=``).  Its end installs no tables,
    rebuilds no cache, mails no report and adopts no clean tree
    (:mod:`cluster.master.end.endrun`); it is never the stream's last tested commit, a
    baseline table, a user's last run, nor a step of a test's history."""
    return any(o.partition("=")[0] in OUTSIDE_STREAM and "=" in o for o in options)
