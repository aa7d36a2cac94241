"""End to end: a result is reused only while what made it is unchanged, including what the
product loads from outside its tree (docs/results.md, "A job's key").

localcluster's demo tree, whose ``bin/gs`` is the wrapper ``exec <installed gs> "$@"``
around the gs it finds on the node's PATH at build time.  Here that "installed gs" is a
program of the test's own, in its temporary folder (the system's /usr/bin/gs is never
touched): compiled with gcc, linking a shared library of the test's own (``libgsopt.so``,
rpath), it runs /usr/bin/gs with the option the library gives.  With the result cache on:

1. the first push runs every job;
2. the same push again reuses every job (the key is stable);
3. the library changed in place (as a distribution update does: same path, new bytes, and
   another option, so the outputs really change): every job runs again, none is reused,
   and the outputs differ from the first run's -- a reused result would have been wrong;
   the nodes name the library as what changed in gs's key;
4. the same push again: reused;
5. the installed program changed in place (the wrapper and the tree unchanged): every job
   runs again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS

pytestmark = pytest.mark.e2e

FILES = ("alphabet.ps", "colorcir.ps")
GS_CONFIGS = "pgmraw.72.0"
LIB_C = 'const char *gs_option(void) { return "%s"; }\n'
PROG_C = """\
#include <stdio.h>
#include <unistd.h>
const char *gs_option(void);
int main(int argc, char **argv) {
    char *args[256];
    int n = 0;
    args[n++] = "/usr/bin/gs";
    args[n++] = (char *)gs_option();
    %s
    for (int i = 1; i < argc && n < 254; i++) args[n++] = argv[i];
    args[n] = 0;
    execv(args[0], args);
    perror("execv /usr/bin/gs");
    return 127;
}
"""


def build_in_place(dest: Path, argv: list[str]) -> None:
    """Run ``argv`` (a gcc command writing ``-o <dest>.new``), then write its output over
    ``dest``'s bytes in place: same path, same inode, new content."""
    new = dest.with_name(dest.name + ".new")
    subprocess.run([*argv, "-o", str(new)], check=True)
    with open(dest, "ab") as fh:
        fh.truncate(0)
        fh.write(new.read_bytes())
    new.unlink()


def make_library(folder: Path, option: str) -> None:
    src = folder / "gsopt.c"
    src.write_text(LIB_C % option, encoding="utf-8")
    build_in_place(folder / "libgsopt.so", ["gcc", "-shared", "-fPIC", str(src)])


def make_installed_gs(folder: Path, libdir: Path, extra: str = "") -> None:
    src = folder / "gs.c"
    src.write_text(PROG_C % extra, encoding="utf-8")
    gs = folder / "gs"
    build_in_place(gs, ["gcc", str(src), f"-L{libdir}", "-lgsopt", f"-Wl,-rpath,{libdir}"])
    gs.chmod(0o755)


def push(cluster: LocalCluster, tree: Path) -> Path:
    before = cluster.archives()
    spec = cluster.push(tree, "bob", ["gs"], [])
    return cluster.wait_for_run(spec, before, 120)


def ran_and_reused(archive: Path) -> tuple[dict[str, str], set[str]]:
    """The md5 of each job a node ran, and the names of those taken from the cache."""
    rows = read_tab(archive / f"{archive.name}.tab")
    assert rows and all(r.error == 0 for r in rows.values()), archive
    reused = {n for n, r in rows.items() if r.machine.startswith("cache:")}
    return {n: r.md5 for n, r in rows.items() if n not in reused}, reused


def node_logs(cluster: LocalCluster) -> str:
    """The nodes' run.py logs, together."""
    return "".join(log.read_text(encoding="utf-8", errors="replace")
                   for log in sorted(cluster.home_dir.glob("node-work/*/log/run.log")))


def test_a_changed_installed_program_or_library_is_never_reused(make_cluster: MakeCluster,
                                                                 tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copyfile(CORPUS / name, corpus / name)
    installed = tmp_path / "installed"
    installed.mkdir()
    make_library(installed, "-dQUIET")
    make_installed_gs(installed, installed)
    cluster = make_cluster(corpus=corpus, gs_configs=GS_CONFIGS, result_cache="yes",
                           reuse_verify="0")  # keys here; the checks: test_reuse_checks
    path = f"{installed}:/usr/local/bin:/usr/bin:/bin"
    cluster.start(node_env={"node1": {"PATH": path}, "node2": {"PATH": path}})
    tree = write_demo_tree(tmp_path / "ghostpdl", "gs", [])

    # 1, 2: everything runs, then everything is reused.
    first, reused = ran_and_reused(push(cluster, tree))
    assert len(first) == len(FILES) and not reused
    ran, reused = ran_and_reused(push(cluster, tree))
    assert not ran and reused == set(first)

    # 3. The library the installed gs links, changed in place: every job runs again, and
    # its output did change (reusing it would have reported a wrong "no differences").
    make_library(installed, "-sPAPERSIZE=a3")
    third = push(cluster, tree)
    ran, reused = ran_and_reused(third)
    assert set(ran) == set(first) and not reused
    assert all(ran[name] != first[name] for name in first), (ran, first)
    # The nodes named what moved (the keychanges they sent with their digests), and the
    # report says it: which part, of which program, on which node, and what it cost.
    assert f"gs's key changed in 1 part(s): {installed / 'libgsopt.so'}" in node_logs(cluster)
    report = (third / "report.txt").read_text(encoding="utf-8")
    assert re.search(rf"gs on node\d: {re.escape(str(installed / 'libgsopt.so'))} changed; "
                     r"\d+ jobs? run again", report), report

    # 4. Nothing changed since: reused again.
    again, reused = ran_and_reused(push(cluster, tree))
    assert not again and reused == set(first)

    # 5. The installed program itself, changed in place: every job runs again.
    make_installed_gs(installed, installed, extra='args[n++] = "-dNOINTERPOLATE";')
    ran, reused = ran_and_reused(push(cluster, tree))
    assert set(ran) == set(first) and not reused
    assert f"gs's key changed in 1 part(s): {installed / 'gs'}" in node_logs(cluster)


#: A tree whose gs wrapper reads a file of the tree at run time (the paper size), by a path
#: it builds when it runs (so only the tree part of the key can see it).
PAPER_MAKEFILE = """\
all:
\tmkdir -p bin
\tprintf '#!/bin/sh\\npaper=$$(cat "$$(dirname "$$0")/../paper")\\n' > bin/gs
\tprintf 'exec /usr/bin/gs -sPAPERSIZE=$$paper "$$@"\\n' >> bin/gs
\tchmod +x bin/gs
"""


def test_a_tree_file_read_at_run_time_is_never_reused(make_cluster: MakeCluster,
                                                      tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copyfile(CORPUS / name, corpus / name)
    cluster = make_cluster(corpus=corpus, gs_configs=GS_CONFIGS, result_cache="yes",
                           reuse_verify="0")  # keys here; the checks: test_reuse_checks
    cluster.start()
    tree = tmp_path / "ghostpdl"
    tree.mkdir()
    (tree / "Makefile").write_text(PAPER_MAKEFILE, encoding="utf-8")
    (tree / "paper").write_text("a4\n", encoding="utf-8")

    first, reused = ran_and_reused(push(cluster, tree))
    assert len(first) == len(FILES) and not reused
    ran, reused = ran_and_reused(push(cluster, tree))
    assert not ran and reused == set(first)

    (tree / "paper").write_text("a3\n", encoding="utf-8")
    ran, reused = ran_and_reused(push(cluster, tree))
    assert set(ran) == set(first) and not reused
    assert all(ran[name] != first[name] for name in first), (ran, first)
    assert "gs's key changed in 1 part(s): tree:paper" in node_logs(cluster)
