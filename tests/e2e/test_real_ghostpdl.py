"""End to end with the real product: Debian's ghostpdl 10.0.0 tree, pushed by a
developer to a local cluster of two nodes, built by each node with its own build system and
tested with the gs it built.

One cluster serves the module's tests, in order (one xdist worker): the tree is pushed
(both nodes configure and compile it, taking turns and sharing a compiler cache:
tests/realsources.py, both_nodes_build; every md5 equals each
node's built ``bin/gs`` run by hand); a one-line change of the pgmraw device's maxval in
``devices/gdevpbm.c`` is pushed (the report names exactly the pgmraw tests; each node's
build compiles only that source file); a push with a syntax error aborts the run on both
nodes with the compiler's ``file:line: error:`` line and leaves every table as it was; and
a pcl push runs ghostpdl's ``pcl/examples`` through the built gpcl6, which Debian's tree
leaves without its fonts: every outcome is what gpcl6 does by hand, no node is dropped.

The sources come from ``etc/fetch-sources`` (tests/realsources.py): under CI their absence
fails the module.  The build times the nodes' logs give are printed (``-s`` shows them).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.report.tab import read_tab
from tests.helpers import CORPUS
from tests.realsources import (
    NODES,
    RealCluster,
    build_log,
    build_seconds,
    config_of,
    extract_files,
    real_cluster,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("real-ghostpdl")]

#: Every ghostpdl example of the repository's corpus: enough jobs that the node whose build
#: ends first does not end the run before the other's build has ended.
FILES = tuple(sorted(p.name for p in CORPUS.iterdir() if p.suffix in (".ps", ".eps", ".pdf")))
CONFIGS = ("pgmraw.72.0", "ppmraw.72.0", "pbmraw.72.0")
#: The pcl configurations of the pcl push (two of the Artifex list's devices).
PCL_CONFIGS = ("pbmraw.75.0", "ppmraw.75.0")
#: Longest a run may take here [s]: a first build of ghostpdl on two busy cores.
RUN_TIMEOUT = 900.0
#: The one-line change: the pgmraw device's maxval (pbm_prn_device's max_gray).
PGMRAW_LINE = 'pbm_prn_device(pgm_initialize_device_procs, "pgmraw", \'5\', 1, 1, 8, 255, 0, 0,'
PGMRAW_CHANGED = PGMRAW_LINE.replace("8, 255,", "8, 127,")
#: The C files of the tree a build log shows compiled (gcc ... -c ./<dir>/<file>.c).
_COMPILED = re.compile(r" -c \./((?:base|psi|devices|pdf|pcl|xps|contrib|gpdl)/\S+\.c)\b")


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    root = tmp_path_factory.mktemp("realgs")
    corpus = root / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    # The pcl push's files: ghostpdl's own PCL and PCL-XL examples.
    assert extract_files("ghostscript", "pcl/examples", (".pcl", ".pxl"), corpus)
    settings = {"gs_configs": " ".join(CONFIGS), "pcl_configs": " ".join(PCL_CONFIGS),
                "build_timeout": "1200"}
    with real_cluster(root, "ghostscript", "ghostpdl", corpus, settings) as real:
        yield real


def _by_hand(gs: Path, test_file: Path, device: str, res: str) -> str:
    """The md5 of ``gs`` rendering ``test_file`` as a person would run it, into a file (gs
    prints some warnings on stdout, so the raster is not taken from there)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "page"
        subprocess.run([str(gs), "-q", f"-sDEVICE={device}", f"-r{res}",
                        "-sDEFAULTPAPERSIZE=letter", "-dNOPAUSE", "-dBATCH",
                        f"-sOutputFile={out}", str(test_file)],
                       capture_output=True, timeout=60, check=True)
        return hashlib.md5(out.read_bytes()).hexdigest()


def _tables(home: Path) -> dict[Path, bytes]:
    """Every ``.tab`` of the master home with its bytes: the baselines, the users' and the
    archived tables (not in the source trees, the runs' working folders or the nodes')."""
    skipped = {"runs", "node-work", "ghostpdl", "mupdf", "tests", "node-code"}
    found = {}
    for folder, dirs, files in os.walk(home):
        dirs[:] = [d for d in dirs if d not in skipped]
        for name in files:
            if name.endswith(".tab"):
                path = Path(folder) / name
                found[path] = path.read_bytes()
    return found


def test_both_nodes_build_the_pushed_ghostpdl_and_its_md5s_are_the_built_gs(
        real: RealCluster) -> None:
    run = real.runs["first"] = real.push("gs", RUN_TIMEOUT)
    table = read_tab(run / f"{run.name}.tab")
    assert len(table) == len(FILES) * len(CONFIGS), sorted(table)  # no pcl file: gs's only
    assert all(row.error == 0 for row in table.values()), table
    for node in NODES:
        log = build_log(run, node)
        assert "ghostpdl tree, build command from job.start build_ghostpdl" in log, log[:3000]
        assert "config.status: creating Makefile" in log  # configured: there was no Makefile
        assert re.search(r"^\$ .*make -j\d+ gs\b", log, re.M), log[:3000]
        assert "compiler cache" in log
        assert len(_COMPILED.findall(log)) > 500, log[-3000:]  # the whole graphics library
        real.first_builds[node] = build_seconds(log)
    print(f"\nfirst builds of ghostpdl, one node after the other (each time includes its "
          f"turns at the lock and the barrier) [s]: {real.first_builds}")
    # Every md5 is what the gs each node built gives by hand.
    for node in NODES:
        gs = real.built(node, "gs")
        for name, row in table.items():
            assert row.md5 == _by_hand(gs, real.test_file(name), *config_of(name)), (node, name)


def test_a_one_line_device_change_is_rebuilt_alone_and_changes_exactly_its_tests(
        real: RealCluster) -> None:
    run = real.push_change("gs", "devices/gdevpbm.c", PGMRAW_LINE, PGMRAW_CHANGED,
                           RUN_TIMEOUT)
    report = (run / "report.txt").read_text(encoding="utf-8")
    assert "devices/gdevpbm.c" in report and "8, 127," in report  # the pushed diff
    full = min(real.first_builds.values())
    rebuilds = {}
    for node in NODES:
        log = build_log(run, node)
        assert "config.status: creating Makefile" not in log  # the Makefile stayed
        assert _COMPILED.findall(log) == ["devices/gdevpbm.c"], log[-3000:]
        rebuilds[node] = build_seconds(log)
        assert rebuilds[node] < full / 3, (rebuilds[node], full)
    print(f"\nrebuilds after the one-line change [s]: {rebuilds}")


def test_a_syntax_error_aborts_the_run_on_both_nodes_and_changes_no_table(
        real: RealCluster) -> None:
    assert "second" in real.runs, "the second push did not run"
    home = real.cluster.home_dir
    tables_before = _tables(home)
    source = real.tree / "devices" / "gdevpbm.c"
    good = source.read_text(encoding="latin-1")
    broken = good.replace(PGMRAW_CHANGED, PGMRAW_CHANGED.replace("127, 0, 0,", "127, 0 0,"))
    assert broken != good
    source.write_text(broken, encoding="latin-1")
    try:
        run = real.push("gs", RUN_TIMEOUT)
    finally:
        source.write_text(good, encoding="latin-1")
    report = (run / "report.txt").read_text(encoding="utf-8")
    assert re.search(r"node node\d failed with code -1", report), report
    assert re.search(r"devices/gdevpbm\.c:\d+:\d+: error: ", report), report
    # Each node's build log: uploaded with its failure, or -- a node told ABORT while it
    # built uploads nothing -- in its own work folder on this machine.
    # A node told ABORT at its turn to build (tests/realsources.py, both_nodes_build)
    # writes its last line as it stops, which may be just after the run's report.
    logs: dict[str, str] = {}
    for node in NODES:
        uploaded = run / "logs" / f"{node}.build.log"
        local = home / "node-work" / node / "runs" / run.name / f"{node}.build.log"
        path = uploaded if uploaded.exists() else local
        if path.exists():
            logs[node] = _ended_log(path, node, time.monotonic() + 30)
        else:  # the run was over before this node began to build it
            assert not (local.parent / "built").exists(), node
    print(f"\nends of the broken push's build logs: "
          f"{ {node: text.splitlines()[-2:] for node, text in logs.items()} }")
    assert any(re.search(r"gdevpbm\.c:\d+:\d+: error: ", text) for text in logs.values())
    # The run is aborted on both nodes: neither ended with a build of its own that
    # succeeded; each build failed on the error, or was stopped when the other's failed.
    for node, text in logs.items():
        last = [line for line in text.splitlines() if line.startswith(f"node {node}: ")][-1]
        assert _BUILD_END.search(last), (node, last)
    assert not read_tab(run / f"{run.name}.tab")
    assert {p: data for p, data in _tables(home).items() if run not in p.parents} \
        == tables_before


#: The last line a node writes into a build log that did not succeed.
_BUILD_END = re.compile(r" exited with status | stopped: ")


def _ended_log(path: Path, node: str, deadline: float) -> str:
    """The text of ``node``'s build log ``path`` once its last line of the node's own says
    how the build ended (or at ``deadline``, monotonic: as it then is)."""
    while True:
        text = path.read_text(errors="replace")
        own = [line for line in text.splitlines() if line.startswith(f"node {node}: ")]
        if (own and _BUILD_END.search(own[-1])) or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def test_the_pcl_examples_run_through_the_built_gpcl6_without_failing_a_node(
        real: RealCluster) -> None:
    assert "second" in real.runs, "the earlier pushes did not run"
    run = real.push("pcl", RUN_TIMEOUT)
    report = (run / "report.txt").read_text(encoding="utf-8")
    assert "Nodes lost" not in report, report
    table = read_tab(run / f"{run.name}.tab")
    examples = sorted(p for p in (real.cluster.home_dir / "tests" / "corpus").iterdir()
                      if p.suffix in (".pcl", ".pxl"))
    assert examples and len(table) == len(examples) * len(PCL_CONFIGS), sorted(table)
    for node in NODES:
        log = build_log(run, node)
        assert re.search(r"^\$ .*make -j\d+ gpcl6\b", log, re.M), log[-2000:]
        # Only the PCL interpreter is new: the graphics library is the gs pushes' build
        # (but for gdevpbm.c, which the broken push rewrote and this push rewrote back).
        compiled = _COMPILED.findall(log)
        assert "pcl/pl/pldict.c" in compiled, compiled
        assert all(c.startswith("pcl/") or c == "devices/gdevpbm.c" for c in compiled), compiled
    # Each outcome is what the built gpcl6 does by hand: an error exactly where it fails
    # (without its fonts, Debian's gpcl6 crashes on most files).
    gpcl6 = real.built("node1", "gpcl6")
    outcomes = {name: row.error for name, row in table.items()}
    print(f"\npcl examples through Debian's gpcl6 (error codes): {outcomes}")
    for name, error in outcomes.items():
        device, res = config_of(name)
        by_hand = subprocess.run([str(gpcl6), f"-sDEVICE={device}", f"-r{res}", "-dNOPAUSE",
                                  "-dBATCH", "-sOutputFile=/dev/null",
                                  str(real.test_file(name))], capture_output=True, timeout=60)
        assert (error == 0) == (by_hand.returncode == 0), (name, error, by_hand.returncode)
