"""bmpcmp jobs run for real: two demo builds of gs (and of mutool) that differ in one option,
the generated job commands run through ``sh``, the images checked, then the HTML page."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import bmpcmp
from cluster.config import Config
from cluster.demotree import write_demo_tree
from cluster.jobs import bmpcmp as bmpcmp_jobgen
from cluster.node import readlog
from cluster.records import BASELINE, BIN, PYTHON, TEMP, TESTS, Job
from tests.helpers import REPO
from tests.unit.test_bmpcmp import read_png

CORPUS_ROOT = REPO / "corpus"
COLORCIR = "ghostpdl-examples__colorcir.ps"
GOLFER = "ghostpdl-examples__golfer.eps"
TEXT_PDF = "ghostpdl-examples__text_graphic_image.pdf"

#: -dBlackText paints text black: it changes colorcir.ps (coloured text) and
#: text_graphic_image.pdf, directly and through pdfwrite, but not golfer.eps (checked with
#: gs 10.0).  (-dTextAlphaBits would not do: pdfwrite refuses it.)  mutool's -A 0 turns
#: anti-aliasing off.
GS_OPTION = "-dBlackText"
GS_TESTS = [
    (f"{COLORCIR}.ppmraw.72.0", "gs"),
    (f"{GOLFER}.ppmraw.72.0", "gs"),
    (f"{COLORCIR}.pdf.ppmraw.72.0", "pdfwrite"),
    (f"{COLORCIR}.pbmraw.72.1", "gs"),            # P4, banded
    (f"{TEXT_PDF}.pgmraw.72.0", "gs"),            # P5
]
MUPDF_TESTS = [(f"{TEXT_PDF}.ppmraw.72.0", "mupdf")]
CHANGED = {name for name, _ in GS_TESTS + MUPDF_TESTS if GOLFER not in name}


def built(tree: Path, product: str, options: list[str]) -> Path:
    write_demo_tree(tree, product, options)
    subprocess.run(["make", "-s"], cwd=tree, check=True, capture_output=True)
    return tree / "bin"


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("builds")
    return {
        "gs-base": built(root / "gs-base", "gs", []),
        "gs-cand": built(root / "gs-cand", "gs", [GS_OPTION]),
        "mu-base": built(root / "mu-base", "mupdf", []),
        "mu-cand": built(root / "mu-cand", "mupdf", ["-A", "0"]),
    }


def run_job(job: Job, temp: Path, bin_dir: Path, baseline: Path, cwd: Path) -> None:
    """Substitute the placeholders as a node does and run the command with sh."""
    command = job.command
    for word, value in ((TEMP, str(temp)), (BIN, str(bin_dir)), (BASELINE, str(baseline)),
                        (TESTS, str(CORPUS_ROOT)), (PYTHON, shlex.quote(sys.executable))):
        command = command.replace(word, value)
    # The node puts the project on PYTHONPATH; run elsewhere to show that is what counts.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(["sh", "-c", command], cwd=cwd, env=env, check=False, timeout=300)


def result_of(name: str, temp: Path) -> tuple[int, str, str]:
    log = (temp / f"{name}.log").read_text()
    md5 = (temp / f"{name}.md5").read_text()
    r = readlog.classify(name, log, md5, killed=False)
    return r.error, r.md5, log


def red_and_changed(base: bmpcmp.Image, cand: bmpcmp.Image, diff: bmpcmp.Image
                    ) -> tuple[set[int], set[int]]:
    """Pixel indexes that are red in the diff image / differ between base and cand."""
    red, changed = set(), set()
    for i in range(diff.width * diff.height):
        if diff.data[3 * i:3 * i + 3] == b"\xff\x00\x00":
            red.add(i)
        if base.data[3 * i:3 * i + 3] != cand.data[3 * i:3 * i + 3]:
            changed.add(i)
    return red, changed


def test_bmpcmp_jobs_render_compare_and_page(builds: dict[str, Path], tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    cfg = Config()
    gs_jobs = bmpcmp_jobgen.bmpcmp_jobs(cfg, GS_TESTS, CORPUS_ROOT)
    mu_jobs = bmpcmp_jobgen.bmpcmp_jobs(cfg, MUPDF_TESTS, CORPUS_ROOT)
    assert [j.name for j in gs_jobs + mu_jobs] == [t for t, _ in GS_TESTS + MUPDF_TESTS]
    for job in gs_jobs:
        run_job(job, temp, builds["gs-cand"], builds["gs-base"], tmp_path)
    for job in mu_jobs:
        run_job(job, temp, builds["mu-cand"], builds["mu-base"], tmp_path)

    images = temp / "bmpcmp"
    total_sets = 0
    for name, product in GS_TESTS + MUPDF_TESTS:
        error, md5, log = result_of(name, temp)
        assert error == 0, log
        label = {"gs": "gs", "pdfwrite": "gs pdfwrite", "mupdf": "mupdf"}[product]
        assert log.splitlines()[0] == label
        sets = sorted(images.glob(f"{name}.*.meta"))
        if name not in CHANGED:
            assert sets == [] and not list(images.glob(f"{name}.*"))
            assert md5 == hashlib.md5(b"identical\n").hexdigest()
            assert "identical" in log
            continue
        assert sets, f"{name}: no image set\n{log}"
        total_sets += len(sets)
        for meta_path in sets:
            stem = meta_path.name[:-len(".meta")]
            meta = bmpcmp.parse_meta(meta_path.read_text())
            base = read_png(images / f"{stem}.base.png")
            cand = read_png(images / f"{stem}.cand.png")
            diff = read_png(images / f"{stem}.diff.png")
            assert (diff.width, diff.height) == (int(meta["W"]), int(meta["H"]))
            assert (base.width, base.height) == (cand.width, cand.height) == \
                (diff.width, diff.height)
            # 72 dpi letter or A4 pages.
            assert int(meta["PW"]) in (595, 612) and int(meta["PH"]) in (792, 842)
            red, changed = red_and_changed(base, cand, diff)
            # Red exactly where the two renderings differ, and nowhere else.
            assert red == changed and len(red) == int(meta["COUNT"]) > 0
        # Renderings and intermediates are gone; only the log and md5 stay in temp.
        assert sorted(p.name for p in temp.glob(f"{name}.*")) == [f"{name}.log",
                                                                  f"{name}.md5"]

    page = tmp_path / "site" / "index.html"
    assert bmpcmp.write_html(images, page, "bmpcmp demo") == total_sets
    text = page.read_text()
    for meta_path in images.glob("*.meta"):
        stem = meta_path.name[:-len(".meta")]
        for kind in ("base", "cand", "diff"):
            assert f'src="../temp/bmpcmp/{stem}.{kind}.png"' in text
    assert GOLFER not in text


def test_a_rendering_that_fails_is_an_error(builds: dict[str, Path], tmp_path: Path) -> None:
    """No baseline build where __baseline__ points: the job's result is an error."""
    temp = tmp_path / "temp"
    temp.mkdir()
    (job,) = bmpcmp_jobgen.bmpcmp_jobs(Config(), GS_TESTS[:1], CORPUS_ROOT)
    run_job(job, temp, builds["gs-cand"], tmp_path / "no-such-build" / "bin", tmp_path)
    error, md5, log = result_of(job.name, temp)
    assert error != 0 and md5 == "0", log


#: gxps is on no machine here (Debian's ghostscript ships gs only, and its source lacks
#: jpegxr: docs/deviations.md).  This stand-in does what a bmpcmp job asks of gxps in stage 2:
#: it draws the XPS named last with MuPDF's ``mutool draw`` (which reads XPS) at ``-r`` into
#: the ``-sOutputFile`` file, as the ``-sDEVICE``'s PNM.
GXPS_STAND_IN = """#!/bin/sh
out= dev= res= input=
for arg in "$@"; do
  case $arg in
    -sOutputFile=*) out=${arg#-sOutputFile=} ;;
    -sDEVICE=*) dev=${arg#-sDEVICE=} ;;
    -r*) res=${arg#-r} ;;
    -*) ;;
    *) input=$arg ;;
  esac
done
case $dev in
  ppmraw) fmt=ppm ;;
  pgmraw) fmt=pgm ;;
  pbmraw) fmt=pbm ;;
  *) echo "gxps stand-in: no device $dev" >&2; exit 1 ;;
esac
exec mutool draw -q -r "$res" -F "$fmt" -o - "$input" > "$out"
"""


def with_gxps(gs_bin: Path, dest: Path) -> Path:
    """A bin folder holding ``gs_bin``'s gs and the gxps stand-in."""
    dest.mkdir()
    (dest / "gs").symlink_to(gs_bin / "gs")
    (dest / "gxps").write_text(GXPS_STAND_IN)
    (dest / "gxps").chmod(0o755)
    return dest


def test_bmpcmp_of_xpswrite_tests_has_gs_write_the_xps_and_gxps_render_it(
        builds: dict[str, Path], tmp_path: Path) -> None:
    """An xpswrite test (the ``gs xpswrite`` column of a changed list): each build's real gs
    writes XPS, each build's gxps renders it; colorcir's coloured text turned black by the
    candidate's -dBlackText is an image set, golfer is identical; readlog reads the log as
    the test's own (``gs xpswrite``, error 0)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    base = with_gxps(builds["gs-base"], tmp_path / "base-bin")
    cand = with_gxps(builds["gs-cand"], tmp_path / "cand-bin")
    tests = [(f"{COLORCIR}.xps.ppmraw.72.0", "gs xpswrite"),
             (f"{GOLFER}.xps.ppmraw.72.0", "xpswrite")]
    jobs = bmpcmp_jobgen.bmpcmp_jobs(Config(), tests, CORPUS_ROOT)
    assert [j.name for j in jobs] == [name for name, _ in tests]
    for job in jobs:
        run_job(job, temp, cand, base, tmp_path)
    for name, _ in tests:
        error, md5, log = result_of(name, temp)
        assert error == 0, log
        assert log.splitlines()[0] == "gs xpswrite"
        assert f"{base}/gs -sOutputFile={temp}/{name}.base.xps -sDEVICE=xpswrite" in log
        assert f"{cand}/gxps -sOutputFile={temp}/{name}.cand.pnm" in log
        sets = sorted((temp / "bmpcmp").glob(f"{name}.*.meta"))
        assert (md5 == hashlib.md5(b"identical\n").hexdigest()) == (GOLFER in name), log
        assert bool(sets) == (COLORCIR in name), log
        assert sorted(p.name for p in temp.glob(f"{name}.*")) == [f"{name}.log",
                                                                  f"{name}.md5"]
