"""Component tests: the generated xpswrite job line run under sh with the real gs.

Stage 1 of an xpswrite test is the product's gs writing XPS (``-sDEVICE=xpswrite``); stage 2
is gxps, which no package of this machine has (Debian's ghostscript ships only gs, and its
source lacks jpegxr, so gxps does not build: docs/deviations.md).  Stage 1 therefore runs
for real, with /usr/bin/gs; for stage 2 either nothing is there (what a node without gxps
sees), or a stand-in ``gxps`` script rasterises the XPS with MuPDF's ``mutool draw`` (which
reads XPS) into the ``-sOutputFile`` the line gives it.  That checks what can be checked
here: the line's stage 1, its log and md5 contract end to end through readlog, and that
stage 2 gets a real XPS file; not gxps's rendering.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.jobs.generate import generate
from cluster.node.nodejobs import CANNOT_RUN
from cluster.node.readlog import classify
from cluster.records import BIN, TEMP, TESTS, Job, JobResult
from tests.helpers import REPO

CORPUS = REPO / "corpus" / "ghostpdl-examples"
GS = "/usr/bin/gs"
MUTOOL = "/usr/bin/mutool"
TEST = "ghostpdl-examples__golfer.eps.xps.ppmraw.72.0"
#: A gxps stand-in: reads the device, resolution, -sOutputFile pipe and input of a gxps line
#: and renders the XPS with mutool draw into that pipe (ppmraw -> ppm, pbmraw -> pbm).
GXPS_STAND_IN = f"""#!/bin/sh
out= dev= res= input=
for arg in "$@"; do
  case $arg in
    -sOutputFile=*) out=${{arg#-sOutputFile=}} ;;
    -sDEVICE=*) dev=${{arg#-sDEVICE=}} ;;
    -r*) res=${{arg#-r}} ;;
    -*) ;;
    *) input=$arg ;;
  esac
done
case $dev in
  ppmraw) fmt=ppm ;;
  pbmraw) fmt=pbm ;;
  *) echo "gxps stand-in: no device $dev" >&2; exit 1 ;;
esac
case $out in
  '|'*) {MUTOOL} draw -q -r "$res" -F "$fmt" -o - "$input" | sh -c "${{out#|}}" ;;
  *) echo "gxps stand-in: -sOutputFile is not a pipe: $out" >&2; exit 1 ;;
esac
"""


def _job(corpus: Path) -> Job:
    cfg = Config().with_changes(xpswrite_configs=("xps.ppmraw.72.0",))
    jobs = {j.name: j for j in generate(cfg, ["xpswrite"], corpus)}
    return jobs[TEST]


def _run(job: Job, bin_dir: Path, corpus: Path, temp: Path) -> tuple[str, JobResult]:
    """Run ``job`` as a node does (placeholders replaced, ``sh -c``); its log and result."""
    command = (job.command.replace(TEMP, str(temp)).replace(BIN, str(bin_dir))
               .replace(TESTS, str(corpus)))
    subprocess.run(["sh", "-c", command], cwd=temp, timeout=120, check=False,
                   env={**os.environ, "LC_ALL": "C"})
    log = (temp / f"{job.name}.log").read_text(errors="replace")
    md5 = temp / f"{job.name}.md5"
    return log, classify(job.name, log, md5.read_text() if md5.exists() else "", False,
                         machine="test")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(corpus copy, __bin__ with the real gs only, __temp__)."""
    corpus = tmp_path / "tests"
    shutil.copytree(CORPUS, corpus / "ghostpdl-examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gs").symlink_to(GS)
    temp = tmp_path / "temp"
    temp.mkdir()
    return corpus, bin_dir, temp


def _reference_xps(tmp_path: Path) -> Path:
    """golfer.eps written as XPS by gs by hand, with stage 1's options (gs 10's xpswrite
    output is reproducible)."""
    xps = tmp_path / "reference.xps"
    with (CORPUS / "golfer.eps").open("rb") as source:
        subprocess.run([GS, "-q", f"-sOutputFile={xps}", "-sDEVICE=xpswrite", "-r72",
                        "-sDEFAULTPAPERSIZE=letter", "-dNOPAUSE", "-dBATCH", "-dJOBSERVER",
                        "-"], stdin=source, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    assert xps.read_bytes()[:2] == b"PK"  # XPS is a zip
    return xps


def test_xpswrite_line_writes_xps_with_gs_and_rasterises_it(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Stage 1 (real gs) writes the XPS whose md5 the log records; stage 2 (the stand-in)
    reads it; readlog finds error 0 and the md5 of that XPS's rendering; the XPS is gone."""
    corpus, bin_dir, temp = setup
    gxps = bin_dir / "gxps"
    gxps.write_text(GXPS_STAND_IN)
    gxps.chmod(0o755)
    log, result = _run(_job(corpus), bin_dir, corpus, temp)
    reference = _reference_xps(tmp_path)
    rendering = subprocess.run([MUTOOL, "draw", "-q", "-r", "72", "-F", "ppm", "-o", "-",
                                str(reference)], check=True, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL).stdout
    assert rendering
    assert (result.error, result.product) == (0, "gs xpswrite"), log
    assert result.md5 == hashlib.md5(rendering).hexdigest()
    stage1, divider, stage2 = log.partition("\n---\n")
    assert divider, log
    assert "-sDEVICE=xpswrite" in stage1 and f"{bin_dir}/gxps " in stage2
    intermediate = temp / f"{TEST}.xps"
    assert f"{hashlib.md5(reference.read_bytes()).hexdigest()}  {intermediate}" in stage2
    assert not intermediate.exists()


def test_without_gxps_stage_1_still_runs_and_the_node_sees_a_missing_program(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """With no gxps in the build, stage 1 writes its XPS, and stage 2's failure is the
    "cannot run" a node reads as its own fault (failure 1), not a test result."""
    corpus, bin_dir, temp = setup
    log, result = _run(_job(corpus), bin_dir, corpus, temp)
    xps_md5 = hashlib.md5(_reference_xps(tmp_path).read_bytes()).hexdigest()
    assert f"{xps_md5}  {temp / TEST}.xps" in log
    assert CANNOT_RUN.search(log) is not None, log
    assert result.error != 0
