"""The shell command of one job, and the configuration word it is made for.

Contract of a job's command (seed 000 and ARTIFEX.md §4.6, §5.4, §5.5): it is for ``sh``,
uses the placeholders ``__temp__``, ``__bin__`` and ``__tests__`` that the node replaces, and
leaves exactly two files behind: ``__temp__/<id>.log`` (first line the product label, then
echoed commands, interpreter output and ``/usr/bin/time`` lines, with a ``---`` line between
the stages of a two-stage test) and ``__temp__/<id>.md5`` (the md5sum of the final raster
stream).  :mod:`cluster.node.readlog` reads those two files.

A configuration (:class:`JobConfig`) is ``[pdf.|ps.|xps.]device.res.band``: the device (or
for mupdf the nearest ``mutool draw`` format), the resolution, band 0 (page mode) or 1
(forced banding), and for two-stage tests the stage-1 device (``pdf.`` pdfwrite, ``ps.``
ps2write, ``xps.`` xpswrite).

The Ghostscript languages (:data:`LANGUAGES`) are three interpreters built from one ghostpdl
tree: ``gs`` (PostScript and PDF), ``gpcl6`` (PCL and PCL-XL, product ``pcl``) and ``gxps``
(XPS, product ``xps``).  They take the same device options; only gs gets
``-sDEFAULTPAPERSIZE=letter``, ``-dJOBSERVER`` and its input on stdin (build.pl: "gs only").
Stage 1 of a two-stage test runs the product's own interpreter; stage 2 runs the interpreter
of the intermediate file: gs for PDF and PostScript (ARTIFEX.md §5.5: "always gs"), gxps for
the XPS that xpswrite writes (gs cannot read XPS).

Deliberate differences from build.pl's commands:

* no ``nice``: the node owns the priority of its jobs;
* CET files (``.PS``) get ``-dCETMODE`` instead of ``%rom%Resource/Init/gs_cet.ps``;
* the shell redirections put the log before the input (``>> log 2>&1 < file``) so that a
  missing input file is reported in the log;
* two-stage tests record the md5 of the intermediate file in the log, rasterise PDF and
  PostScript with ``gs`` whatever the product (XPS with ``gxps``), and delete the
  intermediate file;
* gpcl6 and gxps take their input as an argument (gxps needs a seekable file: XPS is a zip);
* devices that seek in their output (psd*, tiff*; gs 10 fails on a pipe) write a temporary
  file that is md5summed and removed, instead of the md5sum pipe;
* mupdf uses ``mutool draw`` streaming all pages to md5sum (build.pl: ``pdfdraw`` writing one
  file per page, then ``cat`` and ``md5sum``), band 1 is ``-B 64`` (was ``-b20``).

The gs and mutool argument builders are public because bmpcmp jobs
(:mod:`cluster.jobs.bmpcmp`) render the same way, twice.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.records import BIN, TEMP, TESTS

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


@dataclass(frozen=True)
class Language:
    """A Ghostscript language interpreter: the word its logs start with (the ``.tab`` product
    column) and its program, ``__bin__/<program>`` in the node's build."""

    label: str
    program: str


#: The Ghostscript languages by product (the binaries ghostpdl's ``make gs gpcl6 gxps``
#: puts in ``bin/``; Artifex's were ``gs``, ``pcl6`` and ``gxps``).
LANGUAGES = {"gs": Language("gs", "gs"), "pcl": Language("pcl", "gpcl6"),
             "xps": Language("xps", "gxps")}
GS = LANGUAGES["gs"]


@dataclass(frozen=True)
class TwoStage:
    """A two-stage config prefix: the stage-1 device, the suffix of the intermediate file it
    writes and the language that rasterises that file in stage 2."""

    device: str
    suffix: str
    rasteriser: Language


#: Two-stage config prefix -> what the two stages do.
TWO_STAGE = {"pdf": TwoStage("pdfwrite", "pdf", GS), "ps": TwoStage("ps2write", "ps", GS),
             "xps": TwoStage("xpswrite", "xps", LANGUAGES["xps"])}

_CONFIG = re.compile(r"(?:(pdf|ps|xps)\.)?([a-z][a-z0-9_]*)\.([1-9][0-9]{0,4})\.([01])")
CONFIG_FORM = ("[pdf.|ps.|xps.]device.res.band with band 0 (page mode) or 1 (banded), "
               "e.g. ppmraw.300.1 or pdf.ppmraw.72.0")


@dataclass(frozen=True)
class JobConfig:
    """One parsed configuration: ``[pdf.|ps.|xps.]device.res.band``."""

    text: str
    device: str
    res: int
    band: int
    two_stage: str | None = None  # "pdf", "ps" or "xps" for two-stage tests

    @classmethod
    def parse(cls, text: str) -> JobConfig:
        """Parse a config word; ValueError says what the form is."""
        m = _CONFIG.fullmatch(text)
        if m is None:
            raise ValueError(f"configuration {text!r} is not {CONFIG_FORM}")
        prefix, device, res, band = m.groups()
        return cls(text, device, int(res), int(band), prefix)


# ----------------------------------------------------------------------------------------------
# Pieces shared by the commands

def gs_file_name(path_text: str) -> str:
    """A file name as -sOutputFile reads it: the graphics library (gs, gpcl6, gxps alike)
    expands %d-style formats, so % is doubled."""
    return path_text.replace("%", "%%")


def _is_pdf_like(relpath: str) -> bool:
    """PDF and AI files are passed to gs as an argument; everything else goes on stdin."""
    return relpath.lower().endswith((".pdf", ".ai"))


def gs_input(relpath: str) -> tuple[list[str], str]:
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


def language_input(lang: Language, relpath: str) -> tuple[list[str], str]:
    """(arguments naming the input, shell redirection feeding it) of ``lang`` for a test
    file: gs as :func:`gs_input`; gpcl6 and gxps take the file as an argument."""
    if lang == GS:
        return gs_input(relpath)
    return [f"{TESTS}/{shlex.quote(relpath)}"], ""


def timed_step(log: str, argv: Sequence[str], stdin: str = "") -> str:
    """Shell text that echoes ``argv`` into the log, then runs it under /usr/bin/time.

    The log redirection comes before the input redirection so that a missing input file
    (which makes ``sh`` refuse to start the command) is reported in the log, where readlog
    sees it, rather than on the node's stderr.
    """
    text = " ".join(argv)
    return (f"echo {shlex.quote(text + stdin)} >> {log} ; "
            f"{TIME_COMMAND} {text} >> {log} 2>&1{stdin}")


def _raster_options(tc: JobConfig) -> list[str]:
    """The options selecting the device, banding and resolution of ``tc``."""
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


def _gs_only(lang: Language, *options: str) -> list[str]:
    """``options`` for gs, nothing for gpcl6 and gxps (build.pl's "gs only" options)."""
    return list(options) if lang == GS else []


def language_argv(lang: Language, bin_dir: str, output: str, tc: JobConfig,
                  input_args: Sequence[str], memory_kb: int) -> list[str]:
    """``bin_dir``/<program of ``lang``> rendering to ``tc`` with the ``-sOutputFile=``
    argument ``output`` (ARTIFEX.md §5.4)."""
    return [f"{bin_dir}/{lang.program}", output, *_raster_options(tc),
            *_gs_only(lang, "-sDEFAULTPAPERSIZE=letter"), "-dNOPAUSE", "-dBATCH",
            f"-K{memory_kb}",
            # -dJOBSERVER as build.pl; checked on gs 10.0: same rasters as without it,
            # for stdin and for file arguments alike.
            *_gs_only(lang, "-dJOBSERVER"), *input_args]


def gs_argv(bin_dir: str, output: str, tc: JobConfig, input_args: Sequence[str],
            memory_kb: int) -> list[str]:
    """``bin_dir``/gs rendering to ``tc`` with the ``-sOutputFile=`` argument ``output``."""
    return language_argv(GS, bin_dir, output, tc, input_args, memory_kb)


def stage1_argv(lang: Language, bin_dir: str, intermediate: str, tc: JobConfig,
                input_args: Sequence[str]) -> list[str]:
    """Stage 1 of a two-stage test: ``lang``'s program writes the PDF, PostScript or XPS
    file ``intermediate``."""
    assert tc.two_stage is not None
    device = TWO_STAGE[tc.two_stage].device
    # As build.pl: stage 1 has no -K and no -dMaxBitmap, only the resolution.
    return [f"{bin_dir}/{lang.program}", f"-sOutputFile={gs_file_name(intermediate)}",
            f"-sDEVICE={device}", f"-r{tc.res}", *_gs_only(lang, "-sDEFAULTPAPERSIZE=letter"),
            "-dNOPAUSE", "-dBATCH", *_gs_only(lang, "-dJOBSERVER"), *input_args]


def gs_stage1_argv(bin_dir: str, intermediate: str, tc: JobConfig,
                   input_args: Sequence[str]) -> list[str]:
    """Stage 1 of a two-stage test: ``bin_dir``/gs writes the intermediate file."""
    return stage1_argv(GS, bin_dir, intermediate, tc, input_args)


def mutool_draw_argv(bin_dir: str, tc: JobConfig, fmt: str, relpath: str) -> list[str]:
    """``bin_dir``/mutool drawing every page of ``relpath`` as ``fmt`` to stdout.

    To stdout, for the caller to pipe or redirect: ``-o <file>`` would expand a ``%`` in the
    test id.
    """
    argv = [f"{bin_dir}/mutool", "draw", "-q", f"-r{tc.res}"]
    if tc.band == 1:
        argv += ["-B", str(MUPDF_BAND_HEIGHT)]
    return [*argv, "-F", fmt, "-o", "-", f"{TESTS}/{shlex.quote(relpath)}"]


# ----------------------------------------------------------------------------------------------
# The commands

def _raster_argv(lang: Language, name: str, tc: JobConfig, input_args: Sequence[str],
                 memory_kb: int) -> list[str]:
    """``lang`` rendering to ``tc`` with the raster piped into md5sum (ARTIFEX.md §5.4)."""
    if _needs_seekable_output(tc.device):
        output = f"-sOutputFile={gs_file_name(f'{TEMP}/{name}.raster')}"
    else:
        output = f"-sOutputFile='|md5sum >> {gs_file_name(f'{TEMP}/{name}.md5')}'"
    return language_argv(lang, BIN, output, tc, input_args, memory_kb)


def _raster_after(name: str, tc: JobConfig) -> str:
    """What follows the rendering: for a seeking device, the md5 of its file, then removal.

    ``md5sum <`` prints the same "<hex>  -" line as the pipe.  The file is tested first so that
    a run that wrote nothing leaves no md5 (readlog: error 10) instead of a shell complaint.
    """
    if not _needs_seekable_output(tc.device):
        return ""
    raster = f"{TEMP}/{name}.raster"
    return (f" ; test -f {raster} && md5sum < {raster} >> {TEMP}/{name}.md5"
            f" ; rm -f {raster}")


def raster_command(name: str, relpath: str, tc: JobConfig, memory_kb: int,
                   lang: Language = GS) -> str:
    """The command of a one-stage test of ``lang`` (gs, gpcl6 or gxps); the log's label is
    ``lang``'s (``gs``, ``pcl``, ``xps``)."""
    log = f"{TEMP}/{name}.log"
    input_args, stdin = language_input(lang, relpath)
    return (f"touch {TEMP}/{name}.md5 ; echo {lang.label} >> {log} ; "
            + timed_step(log, _raster_argv(lang, name, tc, input_args, memory_kb), stdin)
            + _raster_after(name, tc))


def two_stage_command(name: str, relpath: str, tc: JobConfig, memory_kb: int,
                      lang: Language = GS) -> str:
    """The command of a pdfwrite/ps2write/xpswrite test of ``lang`` (ARTIFEX.md §5.5).

    The log's label is ``'<lang label> <device>'`` (``gs pdfwrite``, ``pcl pdfwrite``,
    ``gs xpswrite``).  Stage 1, ``lang``'s program, writes ``__temp__/<id>.pdf`` (``.ps``,
    ``.xps``); a ``---`` line divides the stages in the log; the intermediate file's md5 goes
    into the log (informational only: it changes from run to run with embedded dates);
    stage 2 rasterises the intermediate into md5sum with the rasteriser of its format (gs
    for PDF and PostScript, gxps for XPS); the intermediate is then removed.
    """
    assert tc.two_stage is not None
    stages = TWO_STAGE[tc.two_stage]
    log = f"{TEMP}/{name}.log"
    intermediate = f"{TEMP}/{name}.{stages.suffix}"
    input_args, stdin = language_input(lang, relpath)
    stage1 = stage1_argv(lang, BIN, intermediate, tc, input_args)
    stage2 = _raster_argv(stages.rasteriser, name, tc, [intermediate], memory_kb)
    return (f"touch {TEMP}/{name}.md5 ; echo '{lang.label} {stages.device}' >> {log} ; "
            + timed_step(log, stage1, stdin)
            + f" ; echo --- >> {log} ; md5sum {intermediate} >> {log} 2>&1 ; "
            + timed_step(log, stage2)
            + _raster_after(name, tc)
            + f" ; rm -f {intermediate}")


def mupdf_command(name: str, relpath: str, tc: JobConfig) -> str:
    """The command of a mupdf test: ``mutool draw`` streams PNM pages into md5sum.

    build.pl wrote one file per page and md5summed their concatenation; writing the stream
    to stdout gives the same bytes without the files.  Only mutool's stderr (and so
    /usr/bin/time's status line) goes to the log, so a failed draw, whose empty output still
    has an md5, shows up there as "Command exited with non-zero status".
    """
    log = f"{TEMP}/{name}.log"
    text = " ".join(mutool_draw_argv(BIN, tc, MUPDF_FORMATS[tc.device], relpath))
    return (f"touch {TEMP}/{name}.md5 ; echo mupdf >> {log} ; "
            f"echo {shlex.quote(text)} >> {log} ; "
            f"{TIME_COMMAND} {text} 2>> {log} | md5sum >> {TEMP}/{name}.md5")


def shell_command(name: str, command: str) -> str:
    """A job of product shell: ``command``'s stdout is the result, hashed by the node.

    The output goes to ``__temp__/<id>.out``, which the node md5s itself (as Artifex's
    Windows nodes hashed a temp file): no md5sum process per job, which matters when jobs
    are as small as ``echo 17 | md5sum``.  A brace group, not a subshell, saves a fork; the
    command's exit status is the job shell's, which the node hands to readlog.
    """
    log = f"{TEMP}/{name}.log"
    return f"echo shell > {log} ; {{ {command} ; }} > {TEMP}/{name}.out 2>> {log}"
