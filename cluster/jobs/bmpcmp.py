"""The jobs of a bmpcmp run (ARTIFEX.md §5.7): difference images of tests that changed.

A bmpcmp run does not walk the corpus: :func:`bmpcmp_jobs` makes one job per test that
differed in an earlier run (the list :func:`read_bmpcmp_list` reads).  Each job renders the
test with the baseline build (``__baseline__``) and the candidate build (``__bin__``) and
writes difference images with :mod:`cluster.bmpcmp`; see :func:`bmpcmp_command` for its
contract.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from pathlib import Path

from cluster.bmpcmp import MAX_IMAGES
from cluster.config import Config
from cluster.defaults import BMPCMP_DIR
from cluster.jobs.commands import (
    CONFIG_FORM,
    GS,
    LANGUAGES,
    TIME_COMMAND,
    TWO_STAGE,
    JobConfig,
    Language,
    gs_file_name,
    language_argv,
    language_input,
    mutool_draw_argv,
    stage1_argv,
    timed_step,
)
from cluster.jobs.corpus import file_id, find_test_files, id_problem
from cluster.jobs.generate import PRODUCT_SPECS
from cluster.records import BASELINE, BIN, PYTHON, TEMP, Job

logger = logging.getLogger("cluster.build")

#: At most this many bmpcmp jobs (build.pl's master cut the list to its first 1000 lines).
BMPCMP_MAX_JOBS = 1000
#: gs devices whose output already is raw PNM: bmpcmp renders with the test's own device,
#: so the images show exactly the raster the test's md5 was taken of.
BMPCMP_PNM_DEVICES = frozenset({"pbmraw", "pgmraw", "ppmraw", "pkmraw", "pnmraw"})


def _product_words() -> dict[str, str]:
    """Product words of a bmpcmp list -> product: every product with configurations, and the
    ``.tab`` product columns (log labels) of two-stage tests.  gs's (``gs pdfwrite``) are
    the products pdfwrite, ps2write and xpswrite; gpcl6's and gxps's (``pcl pdfwrite``,
    ``xps ps2write``...) belong to pcl and xps, whose own lists hold those configurations."""
    words = {product: product for product in PRODUCT_SPECS}
    for stages in TWO_STAGE.values():
        for name, lang in LANGUAGES.items():
            words[f"{lang.label} {stages.device}"] = stages.device if lang == GS else name
    return words


#: Product words of a bmpcmp list -> product (:func:`_product_words`).
BMPCMP_PRODUCTS = _product_words()


def bmpcmp_device(device: str) -> str:
    """The gs device a bmpcmp job renders a test of ``device`` with.

    bmpcmp reads raw PNM only.  The PNM devices (pbmraw, pgmraw, ppmraw, pkmraw -- whose
    CMYK halftone comes out as P6 -- and pnmraw) are used as they are; other grey devices
    (a name with ``gray``/``grey``) map to pgmraw; monochrome ones (``mono``, fax ``g3``/
    ``g4``) to pbmraw; everything else (pam, psdcmyk, cups, bitrgb, tiff24nc, png16m...) is
    colour and maps to ppmraw.
    """
    if device in BMPCMP_PNM_DEVICES:
        return device
    if "gray" in device or "grey" in device:
        return "pgmraw"
    if "mono" in device or device.endswith(("g3", "g4")):
        return "pbmraw"
    return "ppmraw"


def bmpcmp_mupdf_format(device: str) -> str:
    """The ``mutool draw -F`` format of a mupdf bmpcmp job: pgm for pgmraw, pbm for pbmraw,
    ppm otherwise (mupdf's pkm and pam are PAM files, which bmpcmp does not read)."""
    return {"pgmraw": "pgm", "pbmraw": "pbm"}.get(device, "ppm")


def read_bmpcmp_list(path: Path) -> list[tuple[str, str]]:
    """The ``(test id, product)`` pairs of a bmpcmp list file.

    One test per line: ``<test id> <product>``, the product a word of
    :data:`BMPCMP_PRODUCTS` (``gs``, ``pdfwrite``, ``pcl``, ``mupdf``..., or a .tab
    product column such as ``gs pdfwrite`` or ``pcl pdfwrite``).  Blank and ``#`` lines
    are ignored; a line without a product is skipped with a warning.  OSError when the file
    cannot be read.
    """
    out: list[tuple[str, str]] = []
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < 2:
            logger.warning("build: %s line %d: %r has no product; expected "
                           "'<test id> <product>'", path, lineno, line.strip())
            continue
        out.append((words[0], " ".join(words[1:])))
    return out


def _id_splits(test_id: str) -> list[tuple[str, JobConfig]]:
    """Every (file id, config) split of ``test_id``: configs have 3 or 4 dotted parts."""
    parts = test_id.split(".")
    out = []
    for n in (4, 3):
        if len(parts) > n:
            try:
                tc = JobConfig.parse(".".join(parts[-n:]))
            except ValueError:
                continue
            out.append((".".join(parts[:-n]), tc))
    return out


def bmpcmp_jobs(cfg: Config, tests: Sequence[tuple[str, str]], tests_root: Path,
                max_jobs: int = BMPCMP_MAX_JOBS) -> list[Job]:
    """The jobs of a bmpcmp run: one per ``(test id, product)`` of ``tests``, in order.

    ``tests`` are the tests that differed in an earlier run; ``product`` is a word of
    :data:`BMPCMP_PRODUCTS`.  A test id is split into ``<file id>.<config>`` (trying the
    two-stage ``pdf.``/``ps.``/``xps.`` form and the raster form, keeping the one the
    product allows whose file, of the product's extensions, exists in ``tests_root``;
    nightly-only files count).  Skipped with a warning
    naming them: unknown products, ids that do not parse, ids whose test file is no longer
    in the corpus, repeated ids.  At most ``max_jobs`` jobs are made (a warning says how many
    were left out).  FileNotFoundError when ``tests_root`` is not a directory.
    """
    root = Path(tests_root)
    stems: dict[tuple[str, ...], dict[str, str]] = {}

    def stem_map(product: str) -> dict[str, str]:
        exts = tuple(getattr(cfg, PRODUCT_SPECS[product].extensions_key))
        if exts not in stems:
            stems[exts] = {file_id(rel): rel for rel in find_test_files(root, exts, True)}
        return stems[exts]

    jobs: list[Job] = []
    seen: set[str] = set()
    left_out = 0
    for test_id, product_word in tests:
        product = BMPCMP_PRODUCTS.get(" ".join(product_word.split()))
        if product is None:
            logger.warning("build: bmpcmp: skipping %s: unknown product %r (expected one of "
                           "%s)", test_id, product_word, ", ".join(BMPCMP_PRODUCTS))
            continue
        problem = id_problem(test_id)
        if problem is not None:
            logger.warning("build: bmpcmp: skipping %r: %s", test_id, problem)
            continue
        if test_id in seen:
            logger.warning("build: bmpcmp: skipping %s: listed twice", test_id)
            continue
        splits = [(stem, tc) for stem, tc in _id_splits(test_id)
                  if tc.two_stage in PRODUCT_SPECS[product].kinds]
        if not splits:
            logger.warning("build: bmpcmp: skipping %s: not <file id>.<config> of product %s "
                           "(config: %s)", test_id, product, CONFIG_FORM)
            continue
        files = stem_map(product)
        found = [(files[stem], tc) for stem, tc in splits if stem in files]
        if not found:
            logger.warning("build: bmpcmp: skipping %s: its test file %s is no longer in "
                           "the corpus %s", test_id, splits[-1][0].replace("__", "/"), root)
            continue
        if len(jobs) >= max_jobs:
            left_out += 1
            continue
        seen.add(test_id)
        relpath, tc = found[0]
        jobs.append(Job(test_id, f"{TEMP}/{test_id}.log",
                        bmpcmp_command(test_id, relpath, tc, product, cfg.gs_memory_kb)))
    if left_out:
        logger.warning("build: bmpcmp: %d more test(s) left out: at most %d bmpcmp jobs",
                       left_out, max_jobs)
    logger.info("build: %d bmpcmp jobs", len(jobs))
    return jobs


def bmpcmp_command(name: str, relpath: str, tc: JobConfig, product: str,
                   memory_kb: int) -> str:
    """The command of the bmpcmp job of test ``name`` (file ``relpath``, config ``tc``).

    Contract (the log/md5 contract of every job, so readlog classifies it as usual):

    * ``__temp__/<id>.log``: the product label the test's own job writes (``gs``, ``pcl``,
      ``gs pdfwrite``, ``pcl pdfwrite``, ``gs xpswrite``, ``mupdf``...), then every step
      echoed and run under ``/usr/bin/time`` appending to the log: the baseline rendering,
      the candidate rendering, and for two-stage tests first both stage-1 runs, ``---``,
      both stage-2 runs; then the comparison.  A failing rendering or comparison is an
      error as usual.
    * The programs are the test's own: the product's language (gs, gpcl6 or gxps) renders
      a one-stage test and writes a two-stage test's intermediate file, which the
      rasteriser of its format (gs for PDF and PostScript, gxps for XPS) renders; each of
      ``__baseline__`` and ``__bin__`` runs both stages with its own programs.
    * Renderings go to ``__temp__/<id>.base.pnm`` and ``.cand.pnm`` (raw PNM, all pages in
      one file, the device of :func:`bmpcmp_device`, the test's resolution and banding)
      and are removed at the end, as are two-stage intermediates.  Both are created empty
      first, so a test without pages compares as identical instead of missing.
    * ``__python__ -m cluster.bmpcmp BASE CAND __temp__/bmpcmp/<id> 100`` writes the image
      sets ``__temp__/bmpcmp/<id>.<NNNNN>.*``; its summary (a line per set, or
      ``identical``) goes to the log and into md5sum: ``__temp__/<id>.md5`` is the md5 of
      that summary.
    """
    log = f"{TEMP}/{name}.log"
    base_out, cand_out = f"{TEMP}/{name}.base.pnm", f"{TEMP}/{name}.cand.pnm"
    parts = [f"touch {TEMP}/{name}.md5", f": > {base_out}", f": > {cand_out}"]
    cleanup = [base_out, cand_out]
    if product == "mupdf":
        parts.append(f"echo mupdf >> {log}")
        for bin_dir, out in ((BASELINE, base_out), (BIN, cand_out)):
            text = " ".join(mutool_draw_argv(bin_dir, tc, bmpcmp_mupdf_format(tc.device),
                                             relpath))
            parts.append(f"echo {shlex.quote(text + ' > ' + out)} >> {log}")
            parts.append(f"{TIME_COMMAND} {text} 2>> {log} > {out}")
    else:
        lang = PRODUCT_SPECS[product].language
        assert lang is not None  # only mupdf has none
        raster = JobConfig(tc.text, bmpcmp_device(tc.device), tc.res, tc.band, tc.two_stage)

        def render(renderer: Language, bin_dir: str, out: str,
                   inputs: Sequence[str]) -> list[str]:
            return language_argv(renderer, bin_dir, f"-sOutputFile={gs_file_name(out)}",
                                 raster, inputs, memory_kb)

        input_args, stdin = language_input(lang, relpath)
        if tc.two_stage is None:
            parts.append(f"echo {lang.label} >> {log}")
            for bin_dir, out in ((BASELINE, base_out), (BIN, cand_out)):
                parts.append(timed_step(log, render(lang, bin_dir, out, input_args), stdin))
        else:
            stages = TWO_STAGE[tc.two_stage]
            parts.append(f"echo '{lang.label} {stages.device}' >> {log}")
            mids = (f"{TEMP}/{name}.base.{stages.suffix}",
                    f"{TEMP}/{name}.cand.{stages.suffix}")
            cleanup += mids
            for bin_dir, mid in zip((BASELINE, BIN), mids, strict=True):
                parts.append(timed_step(log, stage1_argv(lang, bin_dir, mid, tc, input_args),
                                        stdin))
            parts.append(f"echo --- >> {log}")
            for bin_dir, mid, out in zip((BASELINE, BIN), mids, (base_out, cand_out),
                                         strict=True):
                parts.append(timed_step(log, render(stages.rasteriser, bin_dir, out, [mid])))
    compare = (f"{PYTHON} -m cluster.bmpcmp {base_out} {cand_out} "
               f"{TEMP}/{BMPCMP_DIR}/{name} {MAX_IMAGES}")
    parts.append(f"echo {shlex.quote(compare)} >> {log}")
    parts.append(f"{TIME_COMMAND} {compare} 2>> {log} | tee -a {log} "
                 f"| md5sum >> {TEMP}/{name}.md5")
    parts.append("rm -f " + " ".join(cleanup))
    return " ; ".join(parts)
