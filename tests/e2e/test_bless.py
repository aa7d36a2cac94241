"""Accepting an intended change (docs/operating.md, "Accepting an intended change:
`clusteradmin bless`"), end to end.

A local cluster of two nodes running real gs over two PostScript pages of text.  The
first push's table becomes the baseline ``tables/current.tab`` (as a nightly run leaves
it: a user run never changes the baseline).  The second push's build adds
``-dTextAlphaBits=4``: both tests differ from the baseline.  ``clusteradmin bless`` accepts
that run; a third push of the same build then reports no difference, and a fourth,
without the option, differs from the blessed outputs again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.e2e.conftest import MakeCluster
from tests.e2e.textpages import push_gs, text_cluster
from tests.helpers import REPO

pytestmark = pytest.mark.e2e

#: A page of text: -dTextAlphaBits=4 changes its pixels, nothing else does.
TEXT_PS = """%!PS
/Helvetica findfont 36 scalefont setfont
72 600 moveto (Blessed, {n}) show 72 500 moveto (once) show showpage
"""


def admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "USER": "tester"})


def differences(folder: Path) -> str:
    info = (folder / "run.info").read_text()
    return next(line.split()[1] for line in info.splitlines()
                if line.startswith("differences "))


def test_a_blessed_change_is_no_difference_in_later_runs(tmp_path: Path,
                                                         make_cluster: MakeCluster) -> None:
    cluster = text_cluster(tmp_path, make_cluster, TEXT_PS)

    def push(options: list[str]) -> Path:
        return push_gs(cluster, options)

    first = push([])
    tables = cluster.home.tables
    shutil.copy(first / f"{first.name}.tab", tables / "current.tab")

    second = push(["-dTextAlphaBits=4"])
    assert differences(second) == "2", (second / "report.txt").read_text()

    refused = admin(cluster, "bless", second.name)
    assert refused.returncode == 2 and "--reason" in refused.stderr, refused.stderr
    done = admin(cluster, "bless", second.name, "--reason", "anti-aliased text on purpose")
    assert done.returncode == 0, done.stderr
    assert "blessed 2 test(s)" in done.stdout, done.stdout
    blessed = read_tab(second / f"{second.name}.tab")
    baseline = read_tab(tables / "current.tab")
    assert {n: r.md5 for n, r in baseline.items()} == {n: r.md5 for n, r in blessed.items()}

    third = push(["-dTextAlphaBits=4"])
    assert differences(third) == "0", (third / "report.txt").read_text()
    fourth = push([])
    assert differences(fourth) == "2", (fourth / "report.txt").read_text()

    test = next(iter(blessed))
    history = admin(cluster, "history", test)
    assert history.returncode == 0, history.stderr
    assert ("blessed by tester@" in history.stdout
            and f": anti-aliased text on purpose (run {second.name})" in history.stdout), \
        history.stdout
