"""``clusteradmin repro`` keeps a job's output without changing its md5 (docs/operating.md,
"Reproducing one job: `clusteradmin repro`"): each kind of command, changed by
:func:`cluster.console.repro.keeping_output`, runs with the real gs and mutool, gives the
same result as the command the node runs, and leaves a raster whose md5 is that result."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from cluster.console import repro
from cluster.jobs.commands import JobConfig, mupdf_command, raster_command, two_stage_command
from cluster.node.readlog import classify
from cluster.records import BIN, TEMP, TESTS, JobResult
from tests.helpers import CORPUS

NAME = "golfer"


def run(command: str, temp: Path, bin_dir: Path) -> JobResult:
    temp.mkdir()
    filled = repro.fill(command, {TEMP: str(temp), BIN: str(bin_dir), TESTS: str(CORPUS)})
    subprocess.run(["sh", "-c", filled], cwd=temp, timeout=120, check=False,
                   env={**os.environ, "LC_ALL": "C"})
    return classify(NAME, (temp / f"{NAME}.log").read_text(errors="replace"),
                    (temp / f"{NAME}.md5").read_text(errors="replace"), False)


@pytest.mark.parametrize("config,make,relpath", [
    ("ppmraw.72.0", raster_command, "golfer.eps"),
    ("psdcmyk.72.0", raster_command, "golfer.eps"),  # a seeking device (no dates)
    ("pdf.pgmraw.72.0", two_stage_command, "golfer.eps"),
    ("ppmraw.72.0", mupdf_command, "spots2.pdf"),
])
def test_the_kept_raster_is_the_output_whose_md5_the_job_reports(
        tmp_path: Path, config: str, make: object, relpath: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gs").symlink_to("/usr/bin/gs")
    (bin_dir / "mutool").symlink_to("/usr/bin/mutool")
    tc = JobConfig.parse(config)
    args = (NAME, relpath, tc) if make is mupdf_command else (NAME, relpath, tc, 100000)
    command = make(*args)  # type: ignore[operator]
    plain = run(command, tmp_path / "plain", bin_dir)
    kept = run(repro.keeping_output(command, NAME), tmp_path / "kept", bin_dir)
    assert plain.error == kept.error == 0
    assert kept.md5 == plain.md5
    raster = tmp_path / "kept" / f"{NAME}.raster"
    assert hashlib.md5(raster.read_bytes()).hexdigest() == kept.md5
