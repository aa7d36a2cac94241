"""Job generation: the port of build.pl (ARTIFEX.md §5).

A *run* tests some products on every file of the test corpus in every configuration of that
product.  :func:`generate` turns (config, products, corpus) into the run's job list, one
:class:`cluster.records.Job` per (test file x configuration); ``build.py`` prints their lines.

Contract of a job (seed 000 and ARTIFEX.md §4.6, §5.4, §5.5):

* its name is the test id ``<relative path with / as __>.<config>``, e.g.
  ``ghostpdl-examples__golfer.eps.ppmraw.300.1``; names are unique within one list;
* its command is for ``sh``, uses the placeholders ``__temp__``, ``__bin__`` and ``__tests__``
  that the node replaces, and leaves exactly two files behind: ``__temp__/<id>.log`` (first
  line the product label, then echoed commands, interpreter output and ``/usr/bin/time``
  lines, with a ``---`` line between the stages of a two-stage test) and ``__temp__/<id>.md5``
  (the md5sum of the final raster stream).  :mod:`cluster.readlog` reads those two files.

Products:

``gs``        raster: gs renders the file, the raster is piped into md5sum (``gs_configs``;
              like build.pl's gs list it may also hold ``pdf.``/``ps.`` two-stage configs)
``pdfwrite``  two-stage: gs writes a PDF, then gs rasterises that PDF (``pdfwrite_configs``)
``ps2write``  two-stage: gs writes PostScript, then gs rasterises it (``ps2write_configs``)
``mupdf``     ``mutool draw`` renders the file to a PNM stream piped into md5sum

Deliberate differences from build.pl (each also noted where it is implemented):

* test files are found by walking the corpus directory (build.pl ran ``svn list``), and only
  files with one of the product's configured extensions are used (build.pl took every file of
  a gs directory);
* files whose test id would not be a valid :data:`cluster.records.TEST_ID` (spaces, quotes,
  shell metacharacters, control characters, a placeholder word) are skipped with a warning;
  build.pl pasted names into the shell unquoted;
* no ``nice``: the node owns the priority of its jobs;
* CET files (``.PS``) get ``-dCETMODE`` instead of ``%rom%Resource/Init/gs_cet.ps``;
* the shell redirections put the log before the input (``>> log 2>&1 < file``) so that a
  missing input file is reported in the log;
* two-stage tests record the md5 of the intermediate file in the log, rasterise with ``gs``
  whatever the product, and delete the intermediate file;
* devices that seek in their output (psd*, tiff*; gs 10 fails on a pipe) write a temporary
  file that is md5summed and removed, instead of the md5sum pipe;
* mupdf uses ``mutool draw`` streaming all pages to md5sum (build.pl: ``pdfdraw`` writing one
  file per page, then ``cat`` and ``md5sum``), band 1 is ``-B 64`` (was ``-b20``).

bmpcmp runs (ARTIFEX.md §5.7) do not walk the corpus: :func:`bmpcmp_jobs` makes one job per
test that differed in an earlier run, which renders the test with the baseline build
(``__baseline__``) and the candidate build (``__bin__``) and writes difference images with
:mod:`cluster.bmpcmp`; see :func:`bmpcmp_command` for its contract.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.errors import ConfigError
from cluster.records import BASELINE, BIN, PLACEHOLDERS, PYTHON, TEMP, TEST_ID, TESTS, Job

logger = logging.getLogger("cluster.build")

#: The products build.py knows, in the order usage text lists them.
PRODUCTS = ("gs", "pdfwrite", "ps2write", "mupdf", "shell")
#: What build.py builds when no product is named: build.pl with no product argument took
#: every non-mupdf product, and its gs list held the pdfwrite configurations too.
DEFAULT_PRODUCTS = ("gs", "pdfwrite", "ps2write")

#: ``/usr/bin/time`` output format; readlog takes the user CPU time (%U) from these lines.
TIME_COMMAND = '/usr/bin/time -f "%U %S %E %P"'
#: -dMaxBitmap for band 0 (page mode) and band 1 (forced banding), as in build.pl.
MAX_BITMAP = {0: 30000000, 1: 10000}
#: gs devices that seek in their output (PSD, TIFF): gs 10 fails on a pipe with "Illegal
#: seek", so they write __temp__/<id>.raster, which is md5summed and removed.  (The 2011 gs
#: could pipe psdcmyk; build.pl always piped.)
SEEKING_DEVICE_PREFIXES = ("psd", "tiff")
#: mutool draw band height for band 1 (pdfdraw's -b20 no longer exists).
MUPDF_BAND_HEIGHT = 64
#: gs raster device -> the nearest mutool draw -F format (pkm gives a CMYK PAM: mupdf has no
#: gs-style pkm; mupdf results are only ever compared with mupdf results).
MUPDF_FORMATS = {"ppmraw": "ppm", "pgmraw": "pgm", "pbmraw": "pbm", "pkmraw": "pkm",
                 "pam": "pam", "pamraw": "pam"}
#: Resolutions kept by the ``lowres`` and ``highres`` words (build.pl: .72./.75. and
#: .300./.600.; later clusterpush docs call 200 dpi "hires" too).
LOWRES = frozenset({72, 75})
HIGHRES = frozenset({150, 200, 300, 600})
#: Files that steer build.py rather than being tests.
NIGHTLY_ONLY = "nightly_only.lst"
SLOW_FILES = "slowfiles.lst"
QUICK_FILES = "quickfiles.lst"
#: Two-stage config prefix -> (stage-1 device, intermediate file suffix).
TWO_STAGE = {"pdf": ("pdfwrite", "pdf"), "ps": ("ps2write", "ps")}

_CONFIG = re.compile(r"(?:(pdf|ps)\.)?([a-z][a-z0-9_]*)\.([1-9][0-9]{0,4})\.([01])")
_PLACEHOLDERS = PLACEHOLDERS
CONFIG_FORM = ("[pdf.|ps.]device.res.band with band 0 (page mode) or 1 (banded), "
               "e.g. ppmraw.300.1 or pdf.ppmraw.72.0")
_ALLOWED = "letters, digits and _ . + , @ % = - (first character a letter or digit)"
#: The longest test id records.TEST_ID accepts.
MAX_TEST_ID = 401


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
class JobConfig:
    """One parsed configuration: ``[pdf.|ps.]device.res.band``."""

    text: str
    device: str
    res: int
    band: int
    two_stage: str | None = None  # "pdf" or "ps" for two-stage tests

    @classmethod
    def parse(cls, text: str) -> JobConfig:
        """Parse a config word; ValueError says what the form is."""
        m = _CONFIG.fullmatch(text)
        if m is None:
            raise ValueError(f"configuration {text!r} is not {CONFIG_FORM}")
        prefix, device, res, band = m.groups()
        return cls(text, device, int(res), int(band), prefix)


@dataclass(frozen=True)
class _ProductSpec:
    configs_key: str
    extensions_key: str
    kinds: frozenset[str | None]  # allowed JobConfig.two_stage values


_SPECS = {
    "gs": _ProductSpec("gs_configs", "gs_extensions", frozenset({None, "pdf", "ps"})),
    "pdfwrite": _ProductSpec("pdfwrite_configs", "gs_extensions", frozenset({"pdf"})),
    "ps2write": _ProductSpec("ps2write_configs", "gs_extensions", frozenset({"ps"})),
    "mupdf": _ProductSpec("mupdf_configs", "mupdf_extensions", frozenset({None})),
}
#: Product shell has no configurations: every line of its command files is one job.
SHELL = "shell"


# ----------------------------------------------------------------------------------------------
# Test files

def file_id(relpath: str) -> str:
    """The test id stem of a test file: its relative path with ``/`` written as ``__``."""
    return relpath.replace("/", "__")


def _id_problem(test_id: str) -> str | None:
    """Why ``test_id`` cannot be used, or None when it can."""
    if not TEST_ID.fullmatch(test_id):
        return f"its test id may only contain {_ALLOWED}, at most 401 characters"
    for word in _PLACEHOLDERS:
        if word in test_id:
            # The node replaces placeholders everywhere in the command, file names included.
            return f"its test id contains the placeholder {word}"
    return None


def _read_list(path: Path) -> set[str]:
    """Non-blank, non-comment lines of an optional list file (missing file: empty set)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return set()
    except OSError as exc:
        logger.warning("build: cannot read %s (%s); ignoring it", path, exc.strerror)
        return set()
    out = set()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line)
    return out


def find_test_files(tests_root: Path, extensions: Sequence[str], nightly: bool = False
                    ) -> list[str]:
    """Every test file under ``tests_root`` with one of ``extensions``, sorted.

    Returns relative POSIX paths.  Matching of extensions ignores case (build.pl's mupdf list
    took ``.pdf`` and ``.PDF``).  Skipped, as build.pl skipped them: dot files (and dot
    directories), ``*.disabled``, anything that is not a file, and the names listed in the
    ``nightly_only.lst`` of their directory unless ``nightly``.  Also skipped, with a warning
    on the ``cluster.build`` logger: paths whose test id would be invalid (see
    :data:`cluster.records.TEST_ID`) and paths whose id repeats an earlier one (``a/b__c`` and
    ``a__b/c``).  Never raises for odd names; raises FileNotFoundError when ``tests_root``
    is not a directory.
    """
    root = Path(tests_root)
    if not root.is_dir():
        raise FileNotFoundError(2, "tests root is not a directory", str(root))
    wanted = {e.lower().lstrip(".") for e in extensions}
    found: dict[str, str] = {}  # test id stem -> relative path

    def onerror(exc: OSError) -> None:
        logger.warning("build: cannot list %s (%s); its tests are left out",
                       exc.filename, exc.strerror)

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        reldir = os.path.relpath(dirpath, root)
        reldir = "" if reldir == "." else reldir.replace(os.sep, "/") + "/"
        nightly_only = set() if nightly else _read_list(Path(dirpath) / NIGHTLY_ONLY)
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(".disabled") or name == NIGHTLY_ONLY:
                continue
            if not reldir and name in (SLOW_FILES, QUICK_FILES):
                continue
            if name in nightly_only:
                continue
            ext = name.rpartition(".")[2].lower() if "." in name else ""
            if ext not in wanted:
                continue
            if not os.path.isfile(os.path.join(dirpath, name)):
                continue  # broken symlink, fifo, socket...
            rel = reldir + name
            stem = file_id(rel)
            problem = _id_problem(stem)
            if problem is not None:
                logger.warning("build: skipping test file %r: %s", rel, problem)
                continue
            if stem in found:
                logger.warning("build: skipping test file %r: its test id %s is already used "
                               "by %r", rel, stem, found[stem])
                continue
            found[stem] = rel
    return sorted(found.values())


# ----------------------------------------------------------------------------------------------
# Commands

def _gs_name(path_text: str) -> str:
    """A file name as gs -sOutputFile reads it: gs expands %d-style formats, so % is doubled."""
    return path_text.replace("%", "%%")


def _is_pdf_like(relpath: str) -> bool:
    """PDF and AI files are passed to gs as an argument; everything else goes on stdin."""
    return relpath.lower().endswith((".pdf", ".ai"))


def _gs_input(relpath: str) -> tuple[list[str], str]:
    """(gs arguments naming the input, shell redirection feeding it) for a test file."""
    path = f"{TESTS}/{shlex.quote(relpath)}"
    args: list[str] = []
    if relpath.endswith(".PS"):
        # build.pl ran %rom%Resource/Init/gs_cet.ps for the CET suite; since gs 9.5x that
        # file only works during initialisation (.forceput is gone afterwards), which is what
        # -dCETMODE does.
        args.append("-dCETMODE")
    if _is_pdf_like(relpath):
        return [*args, path], ""
    return [*args, "-"], f" < {path}"


def _run(log: str, argv: Sequence[str], stdin: str = "") -> str:
    """Echo ``argv`` into the log, then run it under /usr/bin/time appending to the log.

    The log redirection comes before the input redirection so that a missing input file
    (which makes ``sh`` refuse to start the command) is reported in the log, where readlog
    sees it, rather than on the node's stderr.
    """
    text = " ".join(argv)
    return (f"echo {shlex.quote(text + stdin)} >> {log} ; "
            f"{TIME_COMMAND} {text} >> {log} 2>&1{stdin}")


def _raster_options(tc: JobConfig) -> list[str]:
    """The gs options selecting the device, banding and resolution of ``tc``."""
    opts = [f"-dMaxBitmap={MAX_BITMAP[tc.band]}", f"-sDEVICE={tc.device}"]
    if tc.device == "bitrgb":
        opts.append("-dGrayValues=256")
    if tc.device == "cups":
        opts.append("-dcupsColorSpace=0")
    opts.append(f"-r{tc.res}")
    return opts


def _needs_seekable_output(device: str) -> bool:
    """Devices that seek in their output file and so fail on a pipe ("Illegal seek")."""
    return device.startswith(SEEKING_DEVICE_PREFIXES)


def _gs_raster_argv(name: str, tc: JobConfig, input_args: Sequence[str], memory_kb: int
                    ) -> list[str]:
    """gs rendering to ``tc`` with the raster piped into md5sum (ARTIFEX.md §5.4)."""
    if _needs_seekable_output(tc.device):
        output = f"-sOutputFile={_gs_name(f'{TEMP}/{name}.raster')}"
    else:
        output = f"-sOutputFile='|md5sum >> {_gs_name(f'{TEMP}/{name}.md5')}'"
    return _gs_argv(BIN, output, tc, input_args, memory_kb)


def _gs_argv(bin_dir: str, output: str, tc: JobConfig, input_args: Sequence[str],
             memory_kb: int) -> list[str]:
    """``bin_dir``/gs rendering to ``tc`` with the ``-sOutputFile=`` argument ``output``."""
    return [f"{bin_dir}/gs", output, *_raster_options(tc),
            "-sDEFAULTPAPERSIZE=letter", "-dNOPAUSE", "-dBATCH", f"-K{memory_kb}",
            # -dJOBSERVER as build.pl; checked on gs 10.0: same rasters as without it,
            # for stdin and for file arguments alike.
            "-dJOBSERVER", *input_args]


def _gs_stage1_argv(bin_dir: str, intermediate: str, tc: JobConfig,
                    input_args: Sequence[str]) -> list[str]:
    """Stage 1 of a two-stage test: ``bin_dir``/gs writes the PDF or PostScript file."""
    assert tc.two_stage is not None
    device = TWO_STAGE[tc.two_stage][0]
    # As build.pl: stage 1 has no -K and no -dMaxBitmap, only the resolution.
    return [f"{bin_dir}/gs", f"-sOutputFile={_gs_name(intermediate)}", f"-sDEVICE={device}",
            f"-r{tc.res}", "-sDEFAULTPAPERSIZE=letter", "-dNOPAUSE", "-dBATCH",
            "-dJOBSERVER", *input_args]


def _gs_raster_after(name: str, tc: JobConfig) -> str:
    """What follows the gs run: for a seeking device, the md5 of its file, then removal.

    ``md5sum <`` prints the same "<hex>  -" line as the pipe.  The file is tested first so that
    a run that wrote nothing leaves no md5 (readlog: error 10) instead of a shell complaint.
    """
    if not _needs_seekable_output(tc.device):
        return ""
    raster = f"{TEMP}/{name}.raster"
    return (f" ; test -f {raster} && md5sum < {raster} >> {TEMP}/{name}.md5"
            f" ; rm -f {raster}")


def raster_command(name: str, relpath: str, tc: JobConfig, memory_kb: int) -> str:
    """The command of a one-stage gs test."""
    log = f"{TEMP}/{name}.log"
    input_args, stdin = _gs_input(relpath)
    return (f"touch {TEMP}/{name}.md5 ; echo gs >> {log} ; "
            + _run(log, _gs_raster_argv(name, tc, input_args, memory_kb), stdin)
            + _gs_raster_after(name, tc))


def two_stage_command(name: str, relpath: str, tc: JobConfig, memory_kb: int) -> str:
    """The command of a pdfwrite/ps2write test (ARTIFEX.md §5.5).

    Stage 1 writes ``__temp__/<id>.pdf`` (or ``.ps``); a ``---`` line divides the stages in
    the log; the intermediate file's md5 goes into the log (informational only: it changes
    from run to run with embedded dates); stage 2 is always ``gs``, rasterising the
    intermediate into md5sum; the intermediate is then removed.
    """
    assert tc.two_stage is not None
    device, suffix = TWO_STAGE[tc.two_stage]
    log = f"{TEMP}/{name}.log"
    intermediate = f"{TEMP}/{name}.{suffix}"
    input_args, stdin = _gs_input(relpath)
    stage1 = _gs_stage1_argv(BIN, intermediate, tc, input_args)
    stage2 = _gs_raster_argv(name, tc, [intermediate], memory_kb)
    return (f"touch {TEMP}/{name}.md5 ; echo 'gs {device}' >> {log} ; "
            + _run(log, stage1, stdin)
            + f" ; echo --- >> {log} ; md5sum {intermediate} >> {log} 2>&1 ; "
            + _run(log, stage2)
            + _gs_raster_after(name, tc)
            + f" ; rm -f {intermediate}")


def mupdf_command(name: str, relpath: str, tc: JobConfig) -> str:
    """The command of a mupdf test: ``mutool draw`` streams PNM pages into md5sum.

    build.pl wrote one file per page and md5summed their concatenation; writing the stream
    to stdout gives the same bytes without the files.  Only mutool's stderr (and so
    /usr/bin/time's status line) goes to the log, so a failed draw, whose empty output still
    has an md5, shows up there as "Command exited with non-zero status".
    """
    log = f"{TEMP}/{name}.log"
    argv = [f"{BIN}/mutool", "draw", "-q", f"-r{tc.res}"]
    if tc.band == 1:
        argv += ["-B", str(MUPDF_BAND_HEIGHT)]
    argv += ["-F", MUPDF_FORMATS[tc.device], "-o", "-", f"{TESTS}/{shlex.quote(relpath)}"]
    text = " ".join(argv)
    return (f"touch {TEMP}/{name}.md5 ; echo mupdf >> {log} ; "
            f"echo {shlex.quote(text)} >> {log} ; "
            f"{TIME_COMMAND} {text} 2>> {log} | md5sum >> {TEMP}/{name}.md5")


def job_for(product: str, relpath: str, tc: JobConfig, cfg: Config) -> Job:
    """The job testing ``relpath`` in configuration ``tc`` of ``product``."""
    name = f"{file_id(relpath)}.{tc.text}"
    if product == "mupdf":
        command = mupdf_command(name, relpath, tc)
    elif tc.two_stage is not None:
        command = two_stage_command(name, relpath, tc, cfg.gs_memory_kb)
    else:
        command = raster_command(name, relpath, tc, cfg.gs_memory_kb)
    return Job(name, f"{TEMP}/{name}.log", command)


# ----------------------------------------------------------------------------------------------
# The job list

def shell_command(name: str, command: str) -> str:
    """A job of product shell: ``command``'s stdout is the result, hashed by the node.

    The output goes to ``__temp__/<id>.out``, which the node md5s itself (as Artifex's
    Windows nodes hashed a temp file): no md5sum process per job, which matters when jobs
    are as small as ``echo 17 | md5sum``.  A brace group, not a subshell, saves a fork; the
    command's exit status is the job shell's, which the node hands to readlog.
    """
    log = f"{TEMP}/{name}.log"
    return f"echo shell > {log} ; {{ {command} ; }} > {TEMP}/{name}.out 2>> {log}"


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
        stem_ok = _id_problem(f"{stem}.1") is None
        text = (root / relpath).read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            command = line.strip()
            if not command or command.startswith("#"):
                continue
            name = f"{stem}.{lineno}"
            if not options.keeps_name(name):
                continue
            if (stem_ok and len(name) <= MAX_TEST_ID) or _id_problem(name) is None:
                jobs.append(Job(name, f"{TEMP}/{name}.log", shell_command(name, command)))
    return jobs


def check_products(products: Iterable[str]) -> list[str]:
    """``products`` without repeats; ValueError names an unknown one and lists the known."""
    out: list[str] = []
    for p in products:
        if p == SHELL:
            if products != [SHELL] and tuple(products) != (SHELL,):
                raise ValueError("product shell must be built alone")
            out.append(p)
            continue
        if p not in _SPECS:
            raise ValueError(f"unknown product {p!r}; known products: {', '.join(PRODUCTS)}")
        if p not in out:
            out.append(p)
    return out


def product_configs(cfg: Config, product: str) -> list[JobConfig]:
    """The parsed configurations of ``product``; ConfigError names a bad one."""
    spec = _SPECS[product]
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


def generate(cfg: Config, products: Sequence[str], tests_root: Path,
             options: JobOptions = JobOptions(), rng: random.Random | None = None) -> list[Job]:
    """The job list of a run of ``products`` over the corpus at ``tests_root``.

    Order (ARTIFEX.md §5.6): the jobs named in ``tests_root/slowfiles.lst``, then the others,
    then those named in ``tests_root/quickfiles.lst``, each group shuffled with ``rng``.  A
    list entry names a job by its test id, its test file's relative path or that path's id
    stem (so one line can cover every configuration of a file).

    Raises ValueError for an unknown product or when two products would produce the same
    test id (gs and mupdf with the same configuration: build.pl never mixed them in one run),
    ConfigError for a malformed configuration, FileNotFoundError for a missing corpus.
    """
    wanted = check_products(products)
    root = Path(tests_root)
    if wanted == [SHELL]:
        # Command lists keep their order: the user wrote them in the order they want.
        jobs = shell_jobs(cfg, root, options)
        logger.info("build: %d jobs for shell", len(jobs))
        return jobs
    rng = rng if rng is not None else random.Random()
    slow = _read_list(root / SLOW_FILES)
    quick = _read_list(root / QUICK_FILES)
    files_by_ext: dict[tuple[str, ...], list[str]] = {}
    owner: dict[str, str] = {}  # test id -> product that made it
    groups: tuple[list[Job], list[Job], list[Job]] = ([], [], [])
    for product in wanted:
        spec = _SPECS[product]
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
                problem = _id_problem(name)
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


# ----------------------------------------------------------------------------------------------
# bmpcmp runs (ARTIFEX.md §5.7)

#: At most this many bmpcmp jobs (build.pl's master cut the list to its first 1000 lines).
BMPCMP_MAX_JOBS = 1000
#: At most this many difference image sets per test (build.pl: ``bmpcmp ... 0 100``).
BMPCMP_MAX_IMAGES = 100
#: Where a bmpcmp job writes its images, under ``__temp__``; the node uploads this folder
#: to ``runs/<run id>/bmpcmp/`` on the master.
BMPCMP_DIR = "bmpcmp"
#: gs devices whose output already is raw PNM: bmpcmp renders with the test's own device,
#: so the images show exactly the raster the test's md5 was taken of.
BMPCMP_PNM_DEVICES = frozenset({"pbmraw", "pgmraw", "ppmraw", "pkmraw", "pnmraw"})
#: Product words of a bmpcmp list -> product; the .tab product columns are accepted too.
BMPCMP_PRODUCTS = {"gs": "gs", "pdfwrite": "pdfwrite", "ps2write": "ps2write",
                   "mupdf": "mupdf", "gs pdfwrite": "pdfwrite", "gs ps2write": "ps2write"}


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
    :data:`BMPCMP_PRODUCTS` (``gs``, ``pdfwrite``, ``ps2write``, ``mupdf``, or a .tab
    product column such as ``gs pdfwrite``).  Blank and ``#`` lines are ignored; a line
    without a product is skipped with a warning.  OSError when the file cannot be read.
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


def _bmpcmp_candidates(test_id: str) -> list[tuple[str, JobConfig]]:
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


def _bmpcmp_kinds(product: str) -> frozenset[str | None]:
    return frozenset({None}) if product == "mupdf" else _SPECS[product].kinds


def bmpcmp_jobs(cfg: Config, tests: Sequence[tuple[str, str]], tests_root: Path,
                max_jobs: int = BMPCMP_MAX_JOBS) -> list[Job]:
    """The jobs of a bmpcmp run: one per ``(test id, product)`` of ``tests``, in order.

    ``tests`` are the tests that differed in an earlier run; ``product`` is a word of
    :data:`BMPCMP_PRODUCTS`.  A test id is split into ``<file id>.<config>`` (trying the
    two-stage ``pdf.``/``ps.`` form and the raster form, keeping the one the product allows
    whose file exists in ``tests_root``; nightly-only files count).  Skipped with a warning
    naming them: unknown products, ids that do not parse, ids whose test file is no longer
    in the corpus, repeated ids.  At most ``max_jobs`` jobs are made (a warning says how many
    were left out).  FileNotFoundError when ``tests_root`` is not a directory.
    """
    root = Path(tests_root)
    stems: dict[tuple[str, ...], dict[str, str]] = {}

    def stem_map(product: str) -> dict[str, str]:
        key = "mupdf_extensions" if product == "mupdf" else "gs_extensions"
        exts = tuple(getattr(cfg, key))
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
        problem = _id_problem(test_id)
        if problem is not None:
            logger.warning("build: bmpcmp: skipping %r: %s", test_id, problem)
            continue
        if test_id in seen:
            logger.warning("build: bmpcmp: skipping %s: listed twice", test_id)
            continue
        splits = [(stem, tc) for stem, tc in _bmpcmp_candidates(test_id)
                  if tc.two_stage in _bmpcmp_kinds(product)]
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

    * ``__temp__/<id>.log``: the product label the test's own job writes (``gs``,
      ``gs pdfwrite``, ``gs ps2write``, ``mupdf``), then every step echoed and run under
      ``/usr/bin/time`` appending to the log: the baseline rendering, the candidate
      rendering, and for two-stage tests first both stage-1 runs, ``---``, both stage-2
      runs; then the comparison.  A failing rendering or comparison is an error as usual.
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
            argv = [f"{bin_dir}/mutool", "draw", "-q", f"-r{tc.res}"]
            if tc.band == 1:
                argv += ["-B", str(MUPDF_BAND_HEIGHT)]
            # To stdout, redirected: -o <file> would expand a % in the test id.
            argv += ["-F", bmpcmp_mupdf_format(tc.device), "-o", "-",
                     f"{TESTS}/{shlex.quote(relpath)}"]
            text = " ".join(argv)
            parts.append(f"echo {shlex.quote(text + ' > ' + out)} >> {log}")
            parts.append(f"{TIME_COMMAND} {text} 2>> {log} > {out}")
    else:
        raster = JobConfig(tc.text, bmpcmp_device(tc.device), tc.res, tc.band, tc.two_stage)
        input_args, stdin = _gs_input(relpath)
        if tc.two_stage is None:
            parts.append(f"echo gs >> {log}")
            for bin_dir, out in ((BASELINE, base_out), (BIN, cand_out)):
                parts.append(_run(log, _gs_argv(bin_dir, f"-sOutputFile={_gs_name(out)}",
                                                raster, input_args, memory_kb), stdin))
        else:
            device, suffix = TWO_STAGE[tc.two_stage]
            parts.append(f"echo 'gs {device}' >> {log}")
            mids = (f"{TEMP}/{name}.base.{suffix}", f"{TEMP}/{name}.cand.{suffix}")
            cleanup += mids
            for bin_dir, mid in zip((BASELINE, BIN), mids, strict=True):
                parts.append(_run(log, _gs_stage1_argv(bin_dir, mid, tc, input_args), stdin))
            parts.append(f"echo --- >> {log}")
            for bin_dir, mid, out in zip((BASELINE, BIN), mids, (base_out, cand_out),
                                         strict=True):
                parts.append(_run(log, _gs_argv(bin_dir, f"-sOutputFile={_gs_name(out)}",
                                                raster, [mid], memory_kb)))
    compare = (f"{PYTHON} -m cluster.bmpcmp {base_out} {cand_out} "
               f"{TEMP}/{BMPCMP_DIR}/{name} {BMPCMP_MAX_IMAGES}")
    parts.append(f"echo {shlex.quote(compare)} >> {log}")
    parts.append(f"{TIME_COMMAND} {compare} 2>> {log} | tee -a {log} | md5sum >> {TEMP}/{name}.md5")
    parts.append("rm -f " + " ".join(cleanup))
    return " ; ".join(parts)
