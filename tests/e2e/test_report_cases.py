"""End to end: the report's "seen before" list and banding check, from real runs.

Nightly auto runs of the master's clean tree make the baseline stream.  The tree changes
between runs the way real code does:

1. plain gs (the first baseline);
2. text antialiasing: some tests differ;
3. plain again (the change reverted): those tests differ from run 2, but each digest was
   seen two runs ago, so the report lists them as "matched at least once in the previous
   50 runs" instead of as differences;
4. a banding bug: the product antialiases text only when gs is forced to band
   (``-dMaxBitmap=10000``): the banded tests of text files now differ from their
   page-mode siblings, a new mismatch;
5. the same bug again: the mismatch is old news and is not listed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster

pytestmark = pytest.mark.e2e

SPEC = RunSpec.parse("auto nightly-plain gs")
SEEN_TITLE = "had differences but matched at least once in the previous 50 runs:"
BAND_TITLE = "The following files are showing a new mismatch between banded and page mode:"

#: A product whose banded rendering differs from its page-mode rendering on text.
BANDING_BUG = """\
all:
\tmkdir -p bin
\tprintf '#!/bin/sh\\ncase " $$* " in *" -dMaxBitmap=10000 "*) exec %s -dTextAlphaBits=4 "$$@";; \
esac\\nexec %s "$$@"\\n' "$$(command -v gs)" "$$(command -v gs)" > bin/gs
\tchmod +x bin/gs
"""


def nightly(cluster: LocalCluster) -> Path:
    before = cluster.archives()
    QueueFile(cluster.home.queue(2), cluster.home.queue_lock(2)).append(SPEC)
    return cluster.wait_for_run(SPEC, before, 240, priority=2)


def md5s(archive: Path) -> dict[str, str]:
    return {n: r.md5 for n, r in read_tab(archive / f"{archive.name}.tab").items()}


def listed_after(text: str, title: str) -> list[str]:
    body = text.split(title + "\n", 1)[1].split("\n\n", 1)[0]
    return sorted(line.split()[0].replace("/", "__") for line in body.splitlines())


def test_seen_before_and_banding_mismatch(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0 ppmraw.72.1")
    clean = cluster.home_dir / "ghostpdl"
    cluster.start()
    run1 = nightly(cluster)

    write_demo_tree(clean, "gs", ["-dTextAlphaBits=4"])
    run2 = nightly(cluster)
    flipped = sorted(n for n, m in md5s(run2).items() if m != md5s(run1)[n])
    assert flipped and len(flipped) < 30
    assert SEEN_TITLE not in (run2 / "report.txt").read_text()

    write_demo_tree(clean, "gs", [])  # the change is reverted
    run3 = nightly(cluster)
    assert md5s(run3) == md5s(run1)
    text3 = (run3 / "report.txt").read_text()
    assert "No differences in 30 non-pdfwrite/ps2write tests" in text3
    assert listed_after(text3, f"The following {len(flipped)} regression file(s) "
                               f"{SEEN_TITLE}") == flipped
    assert (cluster.home.tables / "md5sum.cache").exists()

    for name in ("Makefile", "make_wrapper.sh", "options"):
        (clean / name).unlink()
    (clean / "Makefile").write_text(BANDING_BUG, encoding="utf-8")
    run4 = nightly(cluster)
    now = md5s(run4)
    mismatched = sorted(n for n in now if n.endswith(".1") and now[n] != now[n[:-1] + "0"])
    assert mismatched and len(mismatched) < 15
    assert listed_after((run4 / "report.txt").read_text(), BAND_TITLE) == mismatched
    # Only banded tests changed: the page-mode ones render as before.
    assert all(now[n] == md5s(run3)[n] for n in now if n.endswith(".0"))

    run5 = nightly(cluster)
    assert md5s(run5) == now
    assert BAND_TITLE not in (run5 / "report.txt").read_text()
