"""The stream tables of a run's end: staged beside the run, then installed in ``tables/``.

The report step stages each stream's new table (:func:`stage_stream`: the merge of the
run into the stream's table, and for the baseline its rotation current -> previous ->
previous2 as hard links); the tables step installs them (:func:`install_tables`), the
oldest first, under ``tables/``'s lock, rebasing a staged table on a rewrite made since it
was staged (``clusteradmin bless``).  Both are idempotent across a master killed half way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

from cluster.report import tab
from cluster.runtime import fsutil

log = logging.getLogger("cluster.collate")

#: The order in which staged tables replace the old ones: the oldest first, so every
#: moment's set of tables is a consistent rotation (or the old one).
INSTALL_ORDER = ("previous2.tab", "previous.tab", "current.tab")
#: The name suffix of a staged table's base: the stream's table it was made from.
BASE_SUFFIX = ".base"


def stage_stream(stage: Path, stream: Path, previous: tab.Previous | None,
                 current: Mapping[str, tab.TabRow], products: tuple[str, ...],
                 run_tab: Path, not_run: AbstractSet[str] = frozenset()) -> None:
    """Write into ``stage`` the stream's new table(s) after the run (tab.merged_lines).

    The baseline (``current.tab``) rotates: current -> previous -> previous2 (ARTIFEX
    §2.8); the two older ones are staged as hard links of the present files (no data is
    copied, so a full disk cannot cut them).  With no previous table the merge is the
    run's own table.  Nothing outside ``stage`` is changed: :func:`install_tables` does.
    The tests ``not_run`` keep their lines of the previous table.
    """
    staged = stage / stream.name
    if stream.exists():
        # What the staged table was made from: install_tables rebases on a rewrite since.
        _link(stream, stage / (stream.name + BASE_SUFFIX))
    if previous is not None:
        tab.write_tab_lines(staged, tab.merged_lines(previous, current, products, not_run))
    else:
        with open(run_tab, encoding="utf-8") as fh:
            tab.write_tab_lines(staged, (line.rstrip("\n") for line in fh))
    if stream.name == "current.tab" and stream.exists():
        _link(stream, stage / "previous.tab")
        older = stream.with_name("previous.tab")
        if older.exists():
            _link(older, stage / "previous2.tab")


def _link(source: Path, dest: Path) -> None:
    """``dest`` becomes another name of ``source``'s file (a copy across devices)."""
    try:
        os.link(source, dest)
    except OSError:
        tab.write_tab_lines(dest, (line.rstrip("\n") for line in
                                   open(source, encoding="utf-8", errors="replace")))


def install_tables(stage: Path, tables: Path) -> list[str]:
    """Move the staged tables into ``tables``; return the names moved.

    Idempotent: a table already moved is no longer in ``stage``, so a master killed half
    way and started again moves only the rest, and the baseline rotates exactly once.

    Under ``tables/``'s lock (:data:`cluster.report.tab.TABLES_LOCK`).  A table rewritten
    since it was staged (``clusteradmin bless``: docs/operating.md, "Accepting an
    intended change") keeps that rewrite: the staged table is rebased on it
    (:func:`_rebase`), so a blessing made while a run ended is not undone by it.
    """
    if not stage.is_dir():
        return []
    tables.mkdir(parents=True, exist_ok=True)
    with fsutil.flocked(tables / tab.TABLES_LOCK):
        names = sorted((p.name for p in stage.iterdir() if p.name.endswith(".tab")),
                       key=lambda n: (INSTALL_ORDER.index(n) if n in INSTALL_ORDER
                                      else len(INSTALL_ORDER), n))
        for name in names:
            _rebase(stage, name, tables / name)
        for name in names:
            os.replace(stage / name, tables / name)
        if names:
            fsutil.fsync_dir(tables)
    return names


def _rebase(stage: Path, name: str, live: Path) -> None:
    """Rebase the staged table ``name`` on ``live`` if ``live`` is no longer the table it
    was staged from (its base link): the run's rows win, the rewrite keeps the others
    (:func:`cluster.report.tab.rebased_lines`).  The baseline's rotation then keeps the
    rewritten table as ``previous.tab``."""
    base = stage / (name + BASE_SUFFIX)
    staged = stage / name
    if not base.exists() or not live.exists() or os.path.samefile(base, live):
        return
    log.info("%s was rewritten since the run's tables were staged: rebasing on it", live)
    tab.write_tab_lines(staged, tab.rebased_lines(tab.TabFile(base), tab.TabFile(staged),
                                                  tab.TabFile(live)))
    if name == "current.tab" and (stage / "previous.tab").exists():
        (stage / "previous.tab").unlink()
        _link(live, stage / "previous.tab")
    base.unlink()
