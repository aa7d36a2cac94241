"""End to end with the real product: Debian's MuPDF 1.21.1 tree, pushed by a
developer to a local cluster of two nodes, built by each node with MuPDF's own Makefile and
tested with the mutool it built.

Debian's source keeps neither MuPDF's third-party libraries nor its font files, so the
master's ``build_mupdf`` is Debian's way of building it (tests/realsources.py,
MUPDF_DEBIAN_BUILD; docs/deviations.md): the system's libraries, the 14 base fonts from
``generated/``.  The tree is pushed (both nodes build it; every md5 equals each node's built
``build/release/mutool`` run by hand); then a one-line change of the PNM writer's grey
header in ``source/fitz/output-pnm.c`` is pushed: the report names exactly the pgmraw tests
and each node's build compiles only that file.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.report.tab import read_tab
from tests.helpers import CORPUS
from tests.realsources import (
    MUPDF_DEBIAN_BUILD,
    NODES,
    RealCluster,
    build_log,
    build_seconds,
    config_of,
    md5_of_output,
    real_cluster,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("real-mupdf")]

#: The PDF files of the repository's corpus (mupdf's extensions).
FILES = tuple(sorted(p.name for p in CORPUS.iterdir() if p.suffix == ".pdf"))
CONFIGS = ("ppmraw.72.0", "pgmraw.72.0", "ppmraw.150.1")
RUN_TIMEOUT = 600.0
#: The one-line change: a comment in the header of every grey PNM page mutool writes.
GREY_HEADER = 'fz_write_printf(ctx, out, "P5\\n");'
GREY_HEADER_CHANGED = 'fz_write_printf(ctx, out, "P5\\n# grey\\n");'
#: The C files a build log shows compiled (MuPDF's quiet rules: ``    CC build/.../x.o``).
_COMPILED = re.compile(r"^\s+CC build/release/(\S+)\.o$", re.M)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    root = tmp_path_factory.mktemp("realmupdf")
    corpus = root / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    settings = {"mupdf_configs": " ".join(CONFIGS), "build_mupdf": MUPDF_DEBIAN_BUILD,
                "build_timeout": "900"}
    with real_cluster(root, "mupdf", "mupdf", corpus, settings) as real:
        yield real


def _by_hand(mutool: Path, name: str, test_file: Path) -> str:
    """The md5 of ``mutool draw`` of ``test_file`` as a person would run it (banded when the
    test's band is 1, as the job line is: mutool's -B)."""
    device, res = config_of(name)
    band = ["-B", "64"] if name.endswith(".1") else []
    return md5_of_output([str(mutool), "draw", "-q", f"-r{res}", *band, "-F",
                          device.removesuffix("raw"), "-o", "-", str(test_file)])


def test_both_nodes_build_the_pushed_mupdf_and_its_md5s_are_the_built_mutool(
        real: RealCluster) -> None:
    run = real.runs["first"] = real.push("mupdf", RUN_TIMEOUT)
    table = read_tab(run / f"{run.name}.tab")
    assert FILES and len(table) == len(FILES) * len(CONFIGS), sorted(table)
    assert all(row.error == 0 for row in table.values()), table
    for node in NODES:
        log = build_log(run, node)
        assert "mupdf tree, build command from job.start build_mupdf" in log, log[:3000]
        assert len(_COMPILED.findall(log)) > 200, log[-3000:]
        real.first_builds[node] = build_seconds(log)
    print(f"\nfirst builds of MuPDF, one node after the other (each time includes its "
          f"turns at the lock and the barrier) [s]: {real.first_builds}")
    for node in NODES:
        mutool = real.built(node, "mutool")
        for name, row in table.items():
            assert row.md5 == _by_hand(mutool, name, real.test_file(name)), (node, name)


def test_a_one_line_change_in_mupdf_is_rebuilt_alone_and_changes_exactly_its_tests(
        real: RealCluster) -> None:
    run = real.push_change("mupdf", "source/fitz/output-pnm.c", GREY_HEADER,
                           GREY_HEADER_CHANGED, RUN_TIMEOUT)
    full = min(real.first_builds.values())
    rebuilds = {}
    for node in NODES:
        log = build_log(run, node)
        assert _COMPILED.findall(log) == ["source/fitz/output-pnm"], log[-3000:]
        rebuilds[node] = build_seconds(log)
        assert rebuilds[node] < full / 3, (rebuilds[node], full)
    print(f"\nMuPDF rebuilds after the one-line change [s]: {rebuilds}")
