"""Component tests: generated jobs run under sh with the real gs and mutool, read by readlog.

Each job's placeholders are replaced the way a node does it (``__bin__`` -> a directory of
symlinks to /usr/bin/gs and /usr/bin/mutool, ``__tests__`` -> a copy of the corpus,
``__temp__`` -> a temp directory), the command runs with ``sh -c``, and
:func:`cluster.node.readlog.classify` must report error 0 and the md5 of the same rendering done
directly, outside the job machinery.  Broken, missing and crashing cases must give their
error codes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.jobs.commands import MAX_BITMAP, MUPDF_BAND_HEIGHT, MUPDF_FORMATS, JobConfig
from cluster.jobs.generate import generate
from cluster.node.readlog import classify
from cluster.records import BIN, TEMP, TESTS, Job, JobResult
from tests.helpers import REPO

CORPUS = REPO / "corpus" / "ghostpdl-examples"
GS = "/usr/bin/gs"
MUTOOL = "/usr/bin/mutool"
CFG = Config().with_changes(gs_configs=Config().gs_configs + ("bitrgb.72.0",),
                            pdfwrite_configs=Config().pdfwrite_configs + ("pdf.psdcmyk.72.0",))
ALL_PRODUCTS = ("gs", "pdfwrite", "ps2write")


@dataclass(frozen=True)
class Node:
    """The directories a node substitutes for the placeholders."""

    bin: Path
    tests: Path
    temp: Path

    def command(self, job: Job) -> str:
        return (job.command.replace(TEMP, str(self.temp)).replace(BIN, str(self.bin))
                .replace(TESTS, str(self.tests)))

    def run(self, job: Job) -> JobResult:
        """Run ``job`` as a node would and classify what it left behind."""
        subprocess.run(["sh", "-c", self.command(job)], cwd=self.temp, timeout=120,
                       check=False, env={**os.environ, "LC_ALL": "C"})
        log = self.temp / f"{job.name}.log"
        md5 = self.temp / f"{job.name}.md5"
        return classify(job.name, log.read_text(errors="replace") if log.exists() else "",
                        md5.read_text(errors="replace") if md5.exists() else "", False,
                        machine="test")


def _bin_dir(path: Path, gs_script: str | None = None) -> Path:
    """A __bin__ with mutool and gs (real, or a shell script standing in for it)."""
    path.mkdir()
    (path / "mutool").symlink_to(MUTOOL)
    if gs_script is None:
        (path / "gs").symlink_to(GS)
    else:
        (path / "gs").write_text("#!/bin/sh\n" + gs_script)
        (path / "gs").chmod(0o755)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the corpus plus a two-page PDF and broken files, as the node's mirror."""
    root = tmp_path_factory.mktemp("tests")
    shutil.copytree(CORPUS, root / "ghostpdl-examples")
    extra = root / "extra"
    extra.mkdir()
    subprocess.run([GS, "-q", "-sDEVICE=pdfwrite", "-o", str(extra / "twopage.pdf"),
                    str(CORPUS / "golfer.eps"), str(CORPUS / "snowflak.ps")], check=True,
                   stdout=subprocess.DEVNULL)
    (extra / "broken.ps").write_text("%!PS\n/foo bar baz\nshowpage\n")
    (extra / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf at all\n")
    return root


@pytest.fixture(scope="module")
def jobs(corpus: Path) -> dict[str, Job]:
    """The gs, pdfwrite and ps2write jobs by name (mupdf ones share names with gs ones)."""
    return {j.name: j for j in generate(CFG, ALL_PRODUCTS, corpus)}


@pytest.fixture(scope="module")
def mupdf_jobs(corpus: Path) -> dict[str, Job]:
    return {j.name: j for j in generate(CFG, ["mupdf"], corpus)}


def make_node(tmp_path: Path, corpus: Path, gs_script: str | None = None) -> Node:
    temp = tmp_path / "temp"
    temp.mkdir()
    return Node(_bin_dir(tmp_path / "bin", gs_script), corpus, temp)


# --- independent reference renderings ---------------------------------------------------------

def _file_md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _gs_raster_md5(source: Path, tc: JobConfig, out: Path) -> str:
    """Render with gs straight to a file (no stdin, no pipe, no JOBSERVER) and hash it.

    Not ``-o -``: gs then mixes PostScript stdout text into the raster stream.
    """
    args = [GS, "-q", f"-sOutputFile={out}", f"-dMaxBitmap={MAX_BITMAP[tc.band]}",
            f"-sDEVICE={tc.device}", f"-r{tc.res}", "-sDEFAULTPAPERSIZE=letter",
            "-dNOPAUSE", "-dBATCH", "-K1000000"]
    if tc.device == "bitrgb":
        args.append("-dGrayValues=256")
    if tc.device == "cups":
        args.append("-dcupsColorSpace=0")
    subprocess.run([*args, str(source)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return _file_md5(out)


def reference_md5(product: str, source: Path, tc: JobConfig, work: Path) -> str:
    """The md5 a job of ``product`` in configuration ``tc`` on ``source`` must report."""
    work.mkdir(exist_ok=True)
    if product == "mupdf":
        args = [MUTOOL, "draw", "-q", f"-r{tc.res}"]
        if tc.band:
            args += ["-B", str(MUPDF_BAND_HEIGHT)]
        raster = subprocess.run([*args, "-F", MUPDF_FORMATS[tc.device], "-o", "-", str(source)],
                                check=True, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL).stdout
        assert raster
        return hashlib.md5(raster).hexdigest()
    if tc.two_stage is not None:
        device = {"pdf": "pdfwrite", "ps": "ps2write"}[tc.two_stage]
        mid = work / f"ref.{tc.two_stage}"
        subprocess.run([GS, "-q", f"-sOutputFile={mid}", f"-sDEVICE={device}", f"-r{tc.res}",
                        "-sDEFAULTPAPERSIZE=letter", "-dNOPAUSE", "-dBATCH", str(source)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        source = mid
    return _gs_raster_md5(source, tc, work / "ref.raster")


SAMPLES = [
    ("gs", "ghostpdl-examples/golfer.eps", "ppmraw.72.0"),
    ("gs", "ghostpdl-examples/spots2.pdf", "pgmraw.300.1"),
    ("gs", "ghostpdl-examples/alphabet.ps", "pbmraw.300.0"),
    ("gs", "ghostpdl-examples/text_graphic_image.pdf", "pam.72.0"),
    ("gs", "ghostpdl-examples/colorcir.ps", "psdcmyk.72.0"),  # a seeking device: no pipe
    ("gs", "ghostpdl-examples/golfer.eps", "pkmraw.300.1"),
    ("gs", "ghostpdl-examples/transparency_example.ps", "ppmraw.72.0"),  # prints to stdout
    ("gs", "ghostpdl-examples/golfer.eps", "cups.300.1"),
    ("gs", "ghostpdl-examples/grayalph.ps", "bitrgb.72.0"),
    ("gs", "extra/twopage.pdf", "ppmraw.72.0"),
    ("pdfwrite", "ghostpdl-examples/spots2.pdf", "pdf.ppmraw.72.0"),
    ("pdfwrite", "ghostpdl-examples/golfer.eps", "pdf.pkmraw.300.0"),
    ("pdfwrite", "ghostpdl-examples/golfer.eps", "pdf.psdcmyk.72.0"),  # seeking device
    ("ps2write", "ghostpdl-examples/golfer.eps", "ps.ppmraw.72.0"),
    ("ps2write", "ghostpdl-examples/text_graphic_image.pdf", "ps.ppmraw.72.0"),
    ("mupdf", "ghostpdl-examples/spots2.pdf", "ppmraw.72.0"),
    ("mupdf", "ghostpdl-examples/text_graphic_image.pdf", "ppmraw.300.1"),
    ("mupdf", "extra/twopage.pdf", "ppmraw.72.0"),
]


@pytest.mark.parametrize(("product", "relpath", "config"), SAMPLES,
                         ids=[f"{p}-{Path(r).name}-{c}" for p, r, c in SAMPLES])
def test_job_md5_matches_direct_rendering(tmp_path: Path, corpus: Path, jobs: dict[str, Job],
                                          mupdf_jobs: dict[str, Job], product: str,
                                          relpath: str, config: str) -> None:
    """A generated job reports error 0 and the md5 of the same rendering done directly."""
    name = f"{relpath.replace('/', '__')}.{config}"
    node = make_node(tmp_path, corpus)
    result = node.run((mupdf_jobs if product == "mupdf" else jobs)[name])
    log = (node.temp / f"{name}.log").read_text()
    assert result.error == 0, log
    expected = reference_md5(product, corpus / relpath, JobConfig.parse(config),
                             tmp_path / "ref")
    assert result.md5 == expected, log
    assert result.product == {"gs": "gs", "pdfwrite": "gs pdfwrite",
                              "ps2write": "gs ps2write", "mupdf": "mupdf"}[product]
    assert result.machine == "test"
    # Only the log and the md5 are left: intermediate files are removed.
    assert sorted(p.name for p in node.temp.iterdir()) == [f"{name}.log", f"{name}.md5"]
    if product in ("pdfwrite", "ps2write"):
        assert "\n---\n" in log


# --- failures ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "code"), [
    ("extra__broken.ps.ppmraw.72.0", 1),
    ("extra__broken.pdf.ppmraw.300.1", 1),  # gs 10 exits 0 here: "Couldn't initialise"
    ("extra__broken.ps.pdf.ppmraw.72.0", 1),
    ("extra__broken.ps.ps.ppmraw.72.0", 1),
])
def test_broken_input_is_an_error(tmp_path: Path, corpus: Path, jobs: dict[str, Job],
                                  name: str, code: int) -> None:
    """An input the interpreter rejects is a read error with md5 0."""
    result = make_node(tmp_path, corpus).run(jobs[name])
    assert (result.error, result.md5) == (code, "0")


def test_broken_pdf_under_mupdf_is_an_error(tmp_path: Path, corpus: Path,
                                            mupdf_jobs: dict[str, Job]) -> None:
    """mutool failing is seen although md5sum still digests its empty output."""
    job = mupdf_jobs["extra__broken.pdf.ppmraw.72.0"]
    node = make_node(tmp_path, corpus)
    result = node.run(job)
    assert "d41d8cd98f00b204e9800998ecf8427e" in (node.temp / f"{job.name}.md5").read_text()
    assert (result.error, result.md5) == (1, "0")


@pytest.mark.parametrize("config_product", [
    ("golfer.eps", "ppmraw.72.0", "gs"),            # fed on stdin: sh reports it
    ("spots2.pdf", "ppmraw.300.1", "gs"),           # a gs argument: gs reports it
    ("golfer.eps", "pdf.ppmraw.72.0", "pdfwrite"),
    ("spots2.pdf", "ppmraw.72.0", "mupdf"),         # mutool reports it
], ids=["gs-stdin", "gs-argument", "pdfwrite", "mupdf"])
def test_missing_input_is_error_5(tmp_path: Path, corpus: Path,
                                  config_product: tuple[str, str, str]) -> None:
    """A job whose test file has vanished from the node's mirror reports error 5."""
    filename, config, product = config_product
    mirror = tmp_path / "mirror"
    (mirror / "ghostpdl-examples").mkdir(parents=True)
    shutil.copy(corpus / "ghostpdl-examples" / filename, mirror / "ghostpdl-examples")
    job = {j.name: j for j in generate(CFG, [product], mirror)}[
        f"ghostpdl-examples__{filename}.{config}"]
    (mirror / "ghostpdl-examples" / filename).unlink()
    (tmp_path / "node").mkdir()
    result = make_node(tmp_path / "node", mirror).run(job)
    assert (result.error, result.md5) == (5, "0")


# Stand-ins for gs: crash (like a segfault) or misbehave in one stage only, so that the
# error codes of crashes and of a missing intermediate file are checked end to end.
CRASH = "kill -SEGV $$\n"
CRASH_STAGE2 = ('case "$*" in *-sDEVICE=pdfwrite*) exec ' + GS + ' "$@" ;; esac\n' + CRASH)
NO_OUTPUT_STAGE1 = ('case "$*" in *-sDEVICE=pdfwrite*) exit 0 ;; esac\nexec ' + GS
                    + ' "$@"\n')


@pytest.mark.parametrize(("script", "config", "code"), [
    (CRASH, "ppmraw.72.0", 8),
    (CRASH, "pdf.ppmraw.72.0", 7),
    (CRASH_STAGE2, "pdf.ppmraw.72.0", 9),
    (NO_OUTPUT_STAGE1, "pdf.ppmraw.72.0", 6),
], ids=["segfault", "segfault-stage1", "segfault-stage2", "no-intermediate"])
def test_crashes_and_missing_intermediate(tmp_path: Path, corpus: Path, jobs: dict[str, Job],
                                          script: str, config: str, code: int) -> None:
    """A crashing interpreter gives 7/8/9 and a stage 1 without output gives 6."""
    job = jobs[f"ghostpdl-examples__golfer.eps.{config}"]
    result = make_node(tmp_path, corpus, gs_script=script).run(job)
    assert (result.error, result.md5) == (code, "0")
