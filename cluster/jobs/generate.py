"""Job generation: the port of build.pl (ARTIFEX.md §5).

A *run* tests some products on every file of the test corpus in every configuration of that
product.  :func:`generate` turns (config, products, corpus) into the run's job list, one
:class:`cluster.records.Job` per (test file x configuration); ``build.py`` prints their lines.
A job's name is the test id ``<file id>.<config>``, e.g.
``ghostpdl-examples__golfer.eps.ppmraw.300.1``, unique within one list; its command is made
by :mod:`cluster.jobs.commands` (which states the command's contract) from the test files
:mod:`cluster.jobs.corpus` finds.

Products:

``gs``        raster: gs renders the file, the raster is piped into md5sum (``gs_configs``;
              like build.pl's gs list it may also hold ``pdf.``/``ps.``/``xps.`` two-stage
              configs)
``pdfwrite``  two-stage: gs writes a PDF, then gs rasterises that PDF (``pdfwrite_configs``)
``ps2write``  two-stage: gs writes PostScript, then gs rasterises it (``ps2write_configs``)
``xpswrite``  two-stage: gs writes XPS, then gxps rasterises it (``xpswrite_configs``)
``pcl``       gpcl6 renders PCL and PCL-XL files (``pcl_configs``, ``pcl_extensions``); its
              two-stage configs (``pdf.ppmraw.75.0``) have gpcl6 write the intermediate
``xps``       gxps renders XPS files (``xps_configs``, ``xps_extensions``), likewise
``mupdf``     ``mutool draw`` renders the file to a PNM stream piped into md5sum
``shell``     every line of the corpus's command files is one job (:func:`shell_jobs`)
``sweep``     one job per task of a sweep file (:mod:`cluster.jobs.sweepjobs`, streamed:
              build.py's ``--sweep FILE``; :func:`generate` does not make them)

bmpcmp runs (ARTIFEX.md §5.7) do not walk the corpus: :mod:`cluster.jobs.bmpcmp` makes
their jobs from the tests that differed in an earlier run.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.datatypes import PRODUCTS  # the products build.py knows, in canonical order
from cluster.errors import ConfigError
from cluster.jobs.commands import (
    CONFIG_FORM,
    GS,
    LANGUAGES,
    MUPDF_FORMATS,
    TWO_STAGE,
    JobConfig,
    Language,
    mupdf_command,
    raster_command,
    shell_command,
    two_stage_command,
)
from cluster.jobs.corpus import (
    MAX_TEST_ID,
    QUICK_FILES,
    SLOW_FILES,
    file_id,
    find_test_files,
    id_problem,
    read_list,
)
from cluster.records import TEMP, Job

logger = logging.getLogger("cluster.build")

#: What build.py builds when no product is named: build.pl with no product argument took
#: every non-mupdf product, and its gs list held the pdfwrite configurations too.  pcl, xps
#: and xpswrite are left out: their binaries (gpcl6, gxps) are built only when a run names
#: them, so a default run must not need them.
DEFAULT_PRODUCTS = ("gs", "pdfwrite", "ps2write")
#: Product shell has no configurations: every line of its command files is one job.
SHELL = "shell"
#: Product sweep has none either: one job per task of its sweep file (sweepjobs).
SWEEP = "sweep"
#: The products that are built alone and have no configurations.
_PLAIN = (SHELL, SWEEP)

#: Resolutions kept by the ``lowres`` and ``highres`` words (build.pl: .72./.75. and
#: .300./.600.; later clusterpush docs call 200 dpi "hires" too).
LOWRES = frozenset({72, 75})
HIGHRES = frozenset({150, 200, 300, 600})


@dataclass(frozen=True)
class JobOptions:
    """Selection words of a build.py command line.

    ``lowres``/``highres`` keep configurations of those resolutions (both given: either kind,
    as in build.pl).  Each ``filters`` entry is the value of one ``filter=a,b`` word: a test
    is kept when, for at least one entry, every comma-separated term is a substring of its
    test id.  ``nightly`` keeps the files that ``nightly_only.lst`` reserves for nightly runs.
    """

    lowres: bool = False
    highres: bool = False
    filters: tuple[str, ...] = ()
    nightly: bool = False

    def keeps_resolution(self, res: int) -> bool:
        if not self.lowres and not self.highres:
            return True
        return (self.lowres and res in LOWRES) or (self.highres and res in HIGHRES)

    def keeps_name(self, name: str) -> bool:
        if not self.filters:
            return True
        for entry in self.filters:
            terms = [t for t in entry.split(",") if t]
            if all(t in name for t in terms):
                return True
        return False


@dataclass(frozen=True)
class ProductSpec:
    """Where a product's configurations and test file extensions are in the config."""

    configs_key: str
    extensions_key: str
    kinds: frozenset[str | None]  # allowed JobConfig.two_stage values
    #: The Ghostscript language whose program renders (stage 1 of a two-stage test);
    #: None for mupdf.
    language: Language | None = None


#: Raster configs and every two-stage kind: what a Ghostscript language's own list may hold.
_ALL_KINDS: frozenset[str | None] = frozenset({None, *TWO_STAGE})

#: The products with configurations (all but shell).
PRODUCT_SPECS = {
    "gs": ProductSpec("gs_configs", "gs_extensions", _ALL_KINDS, GS),
    "pdfwrite": ProductSpec("pdfwrite_configs", "gs_extensions", frozenset({"pdf"}), GS),
    "ps2write": ProductSpec("ps2write_configs", "gs_extensions", frozenset({"ps"}), GS),
    "xpswrite": ProductSpec("xpswrite_configs", "gs_extensions", frozenset({"xps"}), GS),
    "pcl": ProductSpec("pcl_configs", "pcl_extensions", _ALL_KINDS, LANGUAGES["pcl"]),
    "xps": ProductSpec("xps_configs", "xps_extensions", _ALL_KINDS, LANGUAGES["xps"]),
    "mupdf": ProductSpec("mupdf_configs", "mupdf_extensions", frozenset({None})),
}


def check_products(products: Iterable[str]) -> list[str]:
    """``products`` without repeats; ValueError names an unknown one and lists the known."""
    out: list[str] = []
    given = list(products)
    for p in given:
        if p in _PLAIN:
            if given != [p]:
                raise ValueError(f"product {p} must be built alone")
            out.append(p)
            continue
        if p not in PRODUCT_SPECS:
            raise ValueError(f"unknown product {p!r}; known products: {', '.join(PRODUCTS)}")
        if p not in out:
            out.append(p)
    return out


def product_configs(cfg: Config, product: str) -> list[JobConfig]:
    """The parsed configurations of ``product``; ConfigError names a bad one."""
    spec = PRODUCT_SPECS[product]
    out = []
    for text in getattr(cfg, spec.configs_key):
        try:
            tc = JobConfig.parse(text)
        except ValueError:
            raise ConfigError(spec.configs_key, text, CONFIG_FORM) from None
        if tc.two_stage not in spec.kinds:
            wanted = " or ".join(sorted("raster (device.res.band)" if k is None else f"{k}.*"
                                        for k in spec.kinds))
            raise ConfigError(spec.configs_key, text, f"a {wanted} configuration")
        if product == "mupdf" and tc.device not in MUPDF_FORMATS:
            raise ConfigError(spec.configs_key, text,
                              "a device mutool draw can produce: " + ", ".join(MUPDF_FORMATS))
        out.append(tc)
    return out


#: The program of mupdf's jobs (``__bin__/mutool``).
MUTOOL = "mutool"


def required_programs(cfg: Config, products: Iterable[str]) -> list[str]:
    """The programs (``__bin__/<name>``) the jobs of ``products`` run, sorted: what a build
    for them must make.  A product needs its language's program and, for each two-stage
    configuration, the rasteriser of the intermediate (pcl's ``pdf.*`` tests need gs,
    xpswrite needs gxps); mupdf needs mutool; shell and sweep none.  ValueError for an unknown
    product, ConfigError for a malformed configuration."""
    programs: set[str] = set()
    for product in check_products(products):
        if product in _PLAIN:
            continue
        lang = PRODUCT_SPECS[product].language
        if lang is None:
            programs.add(MUTOOL)
            continue
        programs.add(lang.program)
        programs.update(TWO_STAGE[tc.two_stage].rasteriser.program
                        for tc in product_configs(cfg, product) if tc.two_stage is not None)
    return sorted(programs)


def job_for(product: str, relpath: str, tc: JobConfig, cfg: Config) -> Job:
    """The job testing ``relpath`` in configuration ``tc`` of ``product``."""
    name = f"{file_id(relpath)}.{tc.text}"
    lang = PRODUCT_SPECS[product].language
    if lang is None:
        command = mupdf_command(name, relpath, tc)
    elif tc.two_stage is not None:
        command = two_stage_command(name, relpath, tc, cfg.gs_memory_kb, lang)
    else:
        command = raster_command(name, relpath, tc, cfg.gs_memory_kb, lang)
    return Job(name, f"{TEMP}/{name}.log", command)


def generate(cfg: Config, products: Sequence[str], tests_root: Path,
             options: JobOptions = JobOptions(), rng: random.Random | None = None) -> list[Job]:
    """The job list of a run of ``products`` over the corpus at ``tests_root``.

    Order (ARTIFEX.md §5.6): the jobs named in ``tests_root/slowfiles.lst``, then the others,
    then those named in ``tests_root/quickfiles.lst``, each group shuffled with ``rng``.  A
    list entry names a job by its test id, its test file's relative path or that path's id
    stem (so one line can cover every configuration of a file).

    Raises ValueError for an unknown product, for product sweep, or when two products
    would produce the same test id (gs and mupdf with the same configuration: build.pl
    never mixed them in one run), ConfigError for a malformed configuration,
    FileNotFoundError for a missing corpus.
    """
    wanted = check_products(products)
    if wanted == [SWEEP]:
        raise ValueError("product sweep takes its jobs from a sweep file, not the corpus: "
                         "build.py sweep --sweep FILE (cluster.jobs.sweepjobs)")
    root = Path(tests_root)
    if wanted == [SHELL]:
        # Command lists keep their order: the user wrote them in the order they want.
        shell = shell_jobs(cfg, root, options)
        logger.info("build: %d jobs for shell", len(shell))
        return shell
    rng = rng if rng is not None else random.Random()
    slow = read_list(root / SLOW_FILES)
    quick = read_list(root / QUICK_FILES)
    files_by_ext: dict[tuple[str, ...], list[str]] = {}
    owner: dict[str, str] = {}  # test id -> product that made it
    groups: tuple[list[Job], list[Job], list[Job]] = ([], [], [])
    for product in wanted:
        spec = PRODUCT_SPECS[product]
        configs = [tc for tc in product_configs(cfg, product)
                   if options.keeps_resolution(tc.res)]
        extensions = tuple(getattr(cfg, spec.extensions_key))
        if extensions not in files_by_ext:
            files_by_ext[extensions] = find_test_files(root, extensions, options.nightly)
        for relpath in files_by_ext[extensions]:
            stem = file_id(relpath)
            for tc in configs:
                name = f"{stem}.{tc.text}"
                if not options.keeps_name(name):
                    continue
                problem = id_problem(name)
                if problem is not None:
                    logger.warning("build: skipping test %r of file %r: %s", name, relpath,
                                   problem)
                    continue
                if name in owner:
                    raise ValueError(
                        f"test id {name} would be made by both product {owner[name]} and "
                        f"product {product}; build them in separate runs or give them "
                        "different configurations")
                owner[name] = product
                keys = (name, relpath, stem)
                group = 0 if any(k in slow for k in keys) else (
                    2 if any(k in quick for k in keys) else 1)
                groups[group].append(job_for(product, relpath, tc, cfg))
    jobs: list[Job] = []
    for group_jobs in groups:
        rng.shuffle(group_jobs)
        jobs.extend(group_jobs)
    logger.info("build: %d jobs (%d slow, %d quick) for %s", len(jobs), len(groups[0]),
                len(groups[2]), " ".join(wanted))
    return jobs


def shell_jobs(cfg: Config, root: Path, options: JobOptions) -> list[Job]:
    """The jobs of product shell: each non-blank, non-# line of each command file, in order.

    Test ids are ``<file id>.<line number>``.  A line with a NUL or a newline cannot occur;
    anything else is the user's own shell command, run as written.
    """
    jobs: list[Job] = []
    for relpath in find_test_files(root, tuple(cfg.shell_extensions), options.nightly):
        stem = file_id(relpath)
        # A valid stem stays valid with ".<digits>" after it (no placeholder can straddle
        # the dot) as long as the id is short enough: a million lines need no regex each.
        stem_ok = id_problem(f"{stem}.1") is None
        text = (root / relpath).read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            command = line.strip()
            if not command or command.startswith("#"):
                continue
            name = f"{stem}.{lineno}"
            if not options.keeps_name(name):
                continue
            if (stem_ok and len(name) <= MAX_TEST_ID) or id_problem(name) is None:
                jobs.append(Job(name, f"{TEMP}/{name}.log", shell_command(name, command)))
    return jobs
