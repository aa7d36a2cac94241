"""End to end: a pushed ghostpdl-kind C tree is built by the nodes with its own build system
(configure once, then ``make -j<slots> gs``), and the next push recompiles only what changed.

The tree is ghostpdl's shape in small (``base/``, ``psi/``, ``configure.ac``, a ``configure``
that writes the Makefile); its ``bin/gs`` is a real program compiled from two C files that
execs the installed gs, so the run's jobs really run through the built binary.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.helpers import CORPUS

pytestmark = pytest.mark.e2e

CONFIGURE = """#!/bin/sh
echo "small-configure: configuring with $*"
cat > Makefile <<'EOF'
gs: bin/gs
bin/gs: obj/a.o obj/b.o
\tmkdir -p bin
\t$(CC) -o bin/gs obj/a.o obj/b.o
obj/a.o: base/a.c
\tmkdir -p obj
\t$(CC) -c -o obj/a.o base/a.c
obj/b.o: psi/b.c
\tmkdir -p obj
\t$(CC) -c -o obj/b.o psi/b.c
EOF
echo "small-configure: wrote Makefile"
"""
A_C = """#include <stdio.h>
#include <unistd.h>
int helper(void);
int main(int argc, char **argv) {
    (void)argc;
    if (helper() < 0) return 2;
    argv[0] = "gs";
    execvp("gs", argv);
    perror("execvp gs");
    return 127;
}
"""


def b_c(value: int) -> str:
    return f"int helper(void) {{ return {value}; }}\n"


def write_small_ghostpdl(root: Path) -> Path:
    """A ghostpdl-kind tree: the node recognises it by base/, psi/ and configure.ac."""
    (root / "base").mkdir(parents=True)
    (root / "psi").mkdir()
    (root / "configure.ac").write_text("AC_INIT([small], [1])\n")
    (root / "configure").write_text(CONFIGURE)
    (root / "configure").chmod(0o755)
    (root / "base" / "a.c").write_text(A_C)
    (root / "psi" / "b.c").write_text(b_c(1))
    return root


def compiled(log: str) -> list[str]:
    """The C files the build log shows compiled (``-c -o obj/x.o <file>``)."""
    return re.findall(r"-c -o obj/\w+\.o (\S+\.c)$", log, re.M)


def push_and_wait(cluster: LocalCluster, tree: Path) -> Path:
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    return cluster.wait_for_run(spec, before, 300)


def test_a_ghostpdl_tree_is_configured_once_and_rebuilt_incrementally(
        make_cluster, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(CORPUS / "tiger.eps", corpus / "tiger.eps")
    cluster = make_cluster(corpus=corpus, gs_configs="ppmraw.72.0 pbmraw.72.0")
    cluster.start()
    tree = write_small_ghostpdl(tmp_path / "tree" / "ghostpdl")

    first = push_and_wait(cluster, tree)
    table = read_tab(first / f"{first.name}.tab")
    assert len(table) == 2 and all(r.error == 0 for r in table.values()), table
    for node in ("node1", "node2"):
        log = (first / "logs" / f"{node}.build.log").read_text()
        assert "ghostpdl tree, build command from job.start build_ghostpdl" in log, log
        assert "small-configure: configuring with --without-x" in log, log
        assert re.search(r"^\$ .*make -j\d+ gs$", log, re.M), log
        assert sorted(compiled(log)) == ["base/a.c", "psi/b.c"], log

    (tree / "psi" / "b.c").write_text(b_c(2))
    second = push_and_wait(cluster, tree)
    table = read_tab(second / f"{second.name}.tab")
    assert len(table) == 2 and all(r.error == 0 for r in table.values()), table
    for node in ("node1", "node2"):
        log = (second / "logs" / f"{node}.build.log").read_text()
        assert "small-configure" not in log, log  # the Makefile stayed: no configure
        assert compiled(log) == ["psi/b.c"], log
        assert "-o bin/gs obj/a.o obj/b.o" in log, log  # relinked with the new b.o
