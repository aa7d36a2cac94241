"""The comparison report: a port of ``compare.pl`` (ARTIFEX.md §2.9).

:func:`analyse` compares the table of this run with the previous one and returns a
:class:`Comparison` that says which tests differ, which started or stopped producing errors,
which were added or removed, which show a new banded/page-mode mismatch and which segfault.
:func:`compare` renders that as the text of the report email, in compare.pl's order and
wording::

    [header lines]
    [segfault block]
    ran N tests in T seconds on M nodes
    Differences in X of Y non-pdfwrite/ps2write test(s):   (then pdfwrite, then ps2write)
    The following X regression file(s) have started producing errors:
    The following X regression file(s) have stopped producing errors:
    The following X regression file(s) have been removed:          \\
    The following X regression file(s) have been added:             > not when skip_missing
    The following files are showing a new mismatch between banded...  /
    ---------------------------------------------------------------- (103 dashes, then the
    The following X regression file(s) had differences but matched   seen-before list, also
        at least once in the previous 50 runs:                       with skip_missing)
    Nodes lost during the run:
    N late duplicate result(s) ignored.

The "seen before" list comes from the ``md5sum.cache`` (:mod:`cluster.report.md5cache`): pass the
loaded cache as ``seen``.  A test whose md5 changed, but whose new digest (its md5, or its
error code if it errored) is in the cache, is listed there instead of under Differences, and
its error transition is not listed either (§2.9 "unless archive-matched").  The cache is
looked up once per test whose md5 changed, never for the others.

The source is compare.pl at ghostpdl ``a9f881c0`` (2011-01-08), the last public version.
Where this module departs from it, a comment says so and why.  Not ported yet, with the place
they go: ``skip.lst`` (at the top of :func:`analyse`, drop skipped tests that did not error
from both tables, and never list skipped tests as added/removed) and the icc_work "all
errors" list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from cluster.records import ERROR_NAMES, SEGFAULTS
from cluster.report.md5cache import Seen, SeenCache, digest_of
from cluster.report.tab import Entry, Previous, TabRow, entries, product_columns

#: Difference groups, in report order, with the words compare.pl uses for them.
RASTER = "raster"
PDFWRITE = "pdfwrite"
PS2WRITE = "ps2write"
GROUPS = (RASTER, PDFWRITE, PS2WRITE)
GROUP_LABELS = {RASTER: "non-pdfwrite/ps2write", PDFWRITE: "pdfwrite", PS2WRITE: "ps2write"}

STARS = "*" * 77  # compare.pl's segfault block rule, same width
DASHES = "-" * 103  # compare.pl's rule before the seen-before list, same width


def group_of(product: str) -> str:
    """The difference group of a product column (compare.pl tests "pdfwrite" first)."""
    if "pdfwrite" in product:
        return PDFWRITE
    if "ps2write" in product:
        return PS2WRITE
    return RASTER


def display_name(name: str) -> str:
    """A test id as the report shows it: ``__`` back to ``/`` (ARTIFEX.md §2.5)."""
    return name.replace("__", "/")


def error_description(code: int) -> str:
    """The words for an error code; ``unknown`` for a code outside ERROR_NAMES."""
    return ERROR_NAMES.get(code, "unknown")


def _effective_md5(row: TabRow) -> str:
    # compare.pl: an errored test "is" md5 0 whatever the column says, so two errored runs of
    # a test compare equal and an error <-> digest change compares different.
    return row.md5 if row.error == 0 else "0"


def _sorted(names: Iterable[str]) -> list[str]:
    # compare.pl turns __ into / while reading and then sorts, so sort by the shown name
    # ('/' sorts before letters, '_' after capitals): the report order matches the Perl's.
    # Ties (a__b and a/b) go by the name: sorting by name, then stably by the shown name,
    # orders as the key (shown, name) would.  Usually the name order already is the shown
    # order; that is checked first, without a list of a million shown names.
    out = sorted(names)
    last = ""
    for name in out:
        shown = display_name(name)
        if shown < last:
            out.sort(key=display_name)
            break
        last = shown
    return out


@dataclass(frozen=True)
class RunFacts:
    """What the master knows of the run besides its results.

    ``lost_nodes`` are ``"name (reason)"`` strings; ``duplicates`` counts late duplicate
    results that were ignored; ``header`` is text put before everything else (e.g. the
    "User regression: user alice ..." line of a user report).
    """

    tests: int
    seconds: float
    nodes: int
    lost_nodes: tuple[str, ...] = ()
    duplicates: int = 0
    header: str = ""


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing a run's table with the previous one.

    Every list holds test ids as they are in the table (with ``__``), ordered by shown name.
    ``differences`` maps each of :data:`GROUPS` to the tests whose md5 changed; ``counts``
    maps each group to the number of current tests in it.  ``started_errors`` lists first the
    tests present in both tables that went from OK to an error, then the added tests that
    error (compare.pl's order).  ``baseline`` is true when there was no previous table; then
    every current test counts as added.  ``archive_matches`` lists the tests whose md5
    changed to a digest the md5 cache has seen before; ``archive_seen`` says where, for each.
    Such a test is in none of ``differences``, ``started_errors`` and ``stopped_errors``.
    ``listed`` holds the previous table's entry of every test a list above names that was
    in it: the report's lines show its product, machine and error (:meth:`previous_row`).
    ``seen_window`` is the number of runs the md5 cache covered, None without a cache.
    """

    differences: dict[str, list[str]]
    started_errors: list[str]
    stopped_errors: list[str]
    added: list[str]
    removed: list[str]
    band_mismatches: list[str]
    segfaults: list[str]
    counts: dict[str, int] = field(default_factory=dict)
    baseline: bool = False
    archive_matches: list[str] = field(default_factory=list)
    archive_seen: dict[str, Seen] = field(default_factory=dict)
    listed: dict[str, Entry] = field(default_factory=dict)
    seen_window: int | None = None  # the md5 cache's window (None: compared without one)

    def differing(self) -> list[str]:
        """Every test in ``differences``, all groups together, ordered by shown name."""
        return _sorted(n for names in self.differences.values() for n in names)

    def previous_row(self, name: str) -> TabRow:
        """The previous table's row of a listed test (KeyError for any other)."""
        return self.listed[name].row()

    def changed(self) -> list[str]:
        """Every test whose md5 changed, seen before or not, ordered by shown name."""
        return _sorted([*(n for names in self.differences.values() for n in names),
                        *self.archive_matches])


class _BandCheck:
    """compare.pl's banding check, fed one test at a time in name order.

    A banded test ``*.1`` whose md5 differs from its page-mode sibling ``*.0`` is a new
    mismatch, unless both were in the previous table and differed there already.  The
    sibling sorts just before its banded test, so its md5s are remembered from the step
    before; when another name sorts between the two, the sibling's previous md5 is looked
    up once, after the pass (:meth:`found`).
    """

    def __init__(self, sibling_md5: Callable[[str], str | None]) -> None:
        self._sibling_md5 = sibling_md5  # a test's current md5, None if it has no result
        self._page_mode: tuple[str, str, str | None] = ("", "", None)  # name, md5, prev md5
        self._new: list[str] = []
        self._deferred: list[tuple[str, str, str | None]] = []  # banded, sibling, prev md5

    def see(self, name: str, md5: str, prev_md5: str | None) -> None:
        """One current test, its effective md5 and the previous one (None: not there)."""
        if name.endswith(".0"):
            self._page_mode = (name, md5, prev_md5)
            return
        if not name.endswith(".1") or len(name) < 3:
            return
        sibling = name[:-1] + "0"
        page_name, page_md5, page_prev = self._page_mode
        if page_name != sibling:
            sibling_md5 = self._sibling_md5(sibling)
            if sibling_md5 is not None and sibling_md5 != md5:
                self._deferred.append((name, sibling, prev_md5))
        elif page_md5 != md5 and _is_new(prev_md5, page_prev):
            self._new.append(name)

    def found(self, previous: Previous | None) -> list[str]:
        """The new mismatches (not in report order)."""
        if self._deferred and previous is not None:
            wanted = {sibling for _name, sibling, _md5 in self._deferred}
            before = {e.name: e.md5 for e in entries(previous) if e.name in wanted}
        else:
            before = {}
        return self._new + [name for name, sibling, md5 in self._deferred
                            if _is_new(md5, before.get(sibling))]


def _is_new(banded_before: str | None, page_before: str | None) -> bool:
    # Old news only when the previous table had both and they differed there already.
    return banded_before is None or page_before is None or banded_before == page_before


def analyse(current: Mapping[str, TabRow], previous: Previous | None,
            products: Iterable[str] | None = None,
            seen: SeenCache | None = None,
            not_run: AbstractSet[str] = frozenset()) -> Comparison:
    """Compare *current* with *previous* (None: no previous run, this run is the baseline).

    *previous* is a table in memory or a :class:`~cluster.report.tab.TabFile`: the two are merged
    in one pass in name order, so a million-row previous table is never held in memory,
    only the entries of the tests the lists name.  *products*, tested-product words as for
    :func:`cluster.report.tab.merge_baseline`, limits the per-group ``counts`` to those products'
    tests, as compare.pl's ``products`` argument does; None counts every current test.
    *seen* is the md5 cache: a test whose md5 changed to a digest it holds goes to
    ``archive_matches`` (None: no cache, nothing matches).  *not_run* names tests of the
    run that were not run (their program was not built): absent from *current*,
    they are not listed as removed.
    """
    differences: dict[str, list[str]] = {g: [] for g in GROUPS}
    started: list[str] = []
    stopped: list[str] = []
    counted = product_columns(products) if products is not None else None
    counts = {g: 0 for g in GROUPS}
    added: list[str] = []
    added_errors: list[str] = []
    segfaults: list[str] = []
    archive: list[str] = []
    archive_seen: dict[str, Seen] = {}
    listed: dict[str, Entry] = {}
    removed: list[str] = []
    # One pass over the current tests in name order, merged with the previous table's
    # entries (also in name order), each row looked at once (a run's table makes its rows
    # on demand; brief() gives what is needed here without a row).  The lists are put in
    # report order (by shown name) at the end.
    brief = getattr(current, "brief", None)

    def md5_of(name: str) -> str | None:
        if name not in current:
            return None
        return brief(name)[1] if brief is not None else _effective_md5(current[name])
    band = _BandCheck(md5_of)
    old = entries(previous) if previous is not None else iter(())
    pending = next(old, None)
    for name in sorted(current):
        if brief is not None:
            error, md5, product = brief(name)
        else:
            row = current[name]
            error, md5, product = row.error, _effective_md5(row), row.product
        while pending is not None and pending.name < name:
            if pending.name not in not_run:
                removed.append(pending.name)
                listed[pending.name] = pending
            pending = next(old, None)
        before = None
        if pending is not None and pending.name == name:
            before, pending = pending, next(old, None)
        if before is None:
            added.append(name)
            if error != 0:
                added_errors.append(name)
        else:
            differs = md5 != before.md5
            # The cache is asked only about a changed md5: one lookup per differing test.
            # An errored test is looked up by its error code, the digest the cache stores
            # for it (see cluster.report.md5cache on compare.pl's "0" key, which never matched).
            hit = seen.lookup(name, digest_of(error, md5)) if differs and seen is not None else None
            if hit is not None:
                # compare.pl lists an archive-matched test once, in @archiveMatch, and
                # neither as a difference nor as an error transition.  (The Perl could
                # push a transition's match twice; one entry per test here.)
                archive.append(name)
                archive_seen[name] = hit
            else:
                if error != 0 and before.error == 0:
                    started.append(name)  # OK -> error
                    listed[name] = before
                elif error == 0 and before.error != 0:
                    stopped.append(name)  # error -> OK
                    listed[name] = before
                # Decision (faithful to compare.pl a9f881c0): the md5 test is NOT in an
                # else branch of the error transitions.  The Perl once had it there
                # (c8579a08) and then commented the "} else {" out ("##    } else {"), so a
                # test that started or stopped producing errors - md5 "0" on one side, a
                # digest on the other - is listed both under its error transition and as a
                # difference.  A test erroring in both runs, even with another error code,
                # is md5 "0" twice: neither a difference nor a transition.
                if differs:
                    differences[group_of(product)].append(name)
                    listed[name] = before
        if error in SEGFAULTS:
            segfaults.append(name)
        if counted is None or product in counted:
            counts[group_of(product)] += 1
        band.see(name, md5, before.md5 if before is not None else None)
    while pending is not None:
        if pending.name not in not_run:
            removed.append(pending.name)
            listed[pending.name] = pending
        pending = next(old, None)

    # compare.pl appends the added tests that error after the transitions found above.
    started = _sorted(started) + _sorted(added_errors)
    return Comparison(
        differences={g: _sorted(names) for g, names in differences.items()},
        started_errors=started,
        stopped_errors=_sorted(stopped),
        added=_sorted(added),
        removed=_sorted(removed),
        band_mismatches=_sorted(band.found(previous)),
        segfaults=_sorted(segfaults),
        counts=counts,
        baseline=previous is None,
        archive_matches=_sorted(archive),
        archive_seen=archive_seen,
        listed=listed,
        seen_window=seen.window if seen is not None else None,
    )


def compare(current: Mapping[str, TabRow], previous: Previous | None,
            facts: RunFacts, skip_missing: bool = False, previous_label: str = "previous run",
            *, products: Iterable[str] | None = None, segfault_block: bool = True,
            seen: SeenCache | None = None, ran_line: bool = True,
            baseline_note: str | None = None) -> str:
    """The report text comparing *current* with *previous* (None: first run of a stream).

    :func:`analyse` (with *products* and *seen*, the md5 cache), then :func:`render` (with
    the other arguments).
    """
    return render(analyse(current, previous, products=products, seen=seen), current, facts,
                  skip_missing, previous_label, segfault_block=segfault_block,
                  ran_line=ran_line, baseline_note=baseline_note)


def render(c: Comparison, current: Mapping[str, TabRow], facts: RunFacts,
           skip_missing: bool = False, previous_label: str = "previous run", *,
           segfault_block: bool = True, ran_line: bool = True,
           baseline_note: str | None = None) -> str:
    """The report text of the comparison *c* of the table *current*.

    *skip_missing* (user runs) suppresses the removed/added lists and, as in compare.pl,
    the banding check after them.  *previous_label* says what the previous table is
    ("previous run", "previous clusterpush"); it shows in the wording used when there was
    none, unless *baseline_note* gives that line's whole text.  *segfault_block* False
    drops the starred block; compare.pl does that when the previous table is the user's
    own earlier push (the second comparison of a user report), where it also leaves out
    the "ran" line (*ran_line* False).  Tests the md5 cache matched are listed last, after
    a dashed rule.  The text ends with a newline.
    """
    prev = c.previous_row
    out: list[str] = []

    if facts.header:
        out.append(facts.header.rstrip("\n") + "\n\n")

    if segfault_block and c.segfaults:
        out.append(f"\n{STARS}\nSeg faults with current rev:\n\n")
        for name in c.segfaults:
            row = current[name]
            out.append(f"{display_name(name)} {row.machine} {error_description(row.error)}\n")
        out.append(f"\n{STARS}\n\n\n")

    if ran_line:
        # compare.pl prints the seconds it was given, which the master counts in whole
        # seconds.
        out.append(f"ran {facts.tests} tests in {int(facts.seconds)} seconds on "
                   f"{facts.nodes} nodes\n\n")

    if c.baseline:
        # Not in compare.pl, which always had a previous table: the first run of a stream.
        # "No previous results to compare with: ..." by default, or e.g. "No previous
        # clusterpush to compare with: ..." for a user's first push.
        if baseline_note is None:
            missing = "previous results" if previous_label == "previous run" else previous_label
            baseline_note = f"No {missing} to compare with: this run is the baseline."
        out.append(baseline_note.rstrip("\n") + "\n\n")
        if c.started_errors:
            # Every erroring test is new here; compare.pl's words for the complete error list.
            out.append(f"The following {len(c.started_errors)} regression file(s) are producing"
                       " errors:\n")
            out.extend(_added_error_line(name, current[name]) for name in c.started_errors)
            out.append("\n")
    else:
        for group in GROUPS:
            names = c.differences[group]
            label = GROUP_LABELS[group]
            count = c.counts[group]
            if names:
                out.append(f"Differences in {len(names)} of {count} {label} test(s):\n")
                for n in names:
                    before = prev(n)
                    out.append(f"{display_name(n)} {before.product} {before.machine} "
                               f"{current[n].machine}\n")
                out.append("\n")
            else:
                out.append(f"No differences in {count} {label} tests\n\n")

        if c.started_errors:
            out.append(f"The following {len(c.started_errors)} regression file(s) have started "
                       "producing errors:\n")
            for name in c.started_errors:
                now = current[name]
                if name not in c.listed:
                    out.append(_added_error_line(name, now))
                else:
                    before = prev(name)
                    out.append(f"{display_name(name)} {before.product} {before.machine} "
                               f"{now.machine} {error_description(now.error)}\n")
            out.append("\n")

        if c.stopped_errors:
            out.append(f"The following {len(c.stopped_errors)} regression file(s) have stopped "
                       "producing errors:\n")
            for n in c.stopped_errors:
                before = prev(n)
                out.append(f"{display_name(n)} {before.product} {before.machine} "
                           f"{current[n].machine} {error_description(before.error)}\n")
            out.append("\n")

    # compare.pl's "if (!$skipMissing ...) {" block runs to the end of its report: besides
    # removed/added it also holds the banding check and the archive-match list.
    if not skip_missing:
        if c.removed:
            out.append(f"The following {len(c.removed)} regression file(s) have been removed:\n")
            out.extend(f"{display_name(n)} {c.listed[n].product}\n" for n in c.removed)
            out.append("\n")
        if c.added and not c.baseline:
            # On a first run every test is "added"; listing them all would bury the report.
            out.append(f"The following {len(c.added)} regression file(s) have been added:\n")
            out.extend(f"{display_name(n)} {current[n].product}\n" for n in c.added)
            out.append("\n")
        if c.band_mismatches:
            out.append("\nThe following files are showing a new mismatch between banded and "
                       "page mode:\n")
            out.extend(f"{display_name(n)}\n" for n in c.band_mismatches)
            out.append("\n")

    # Departure: compare.pl prints the archive-match list inside its skipMissing block, so
    # a user run's matched tests, taken out of Differences, were printed nowhere.  Here the
    # list is printed whenever it is not empty, at the place compare.pl gives it (after the
    # banding check, which user runs do not have).
    if c.archive_matches and c.seen_window is not None:
        out.append(f"{DASHES}\n\n")
        out.append(f"The following {len(c.archive_matches)} regression file(s) had differences "
                   f"but matched at least once in the previous {c.seen_window} runs:\n")
        out.extend(_archive_line(name, current[name], c.archive_seen[name])
                   for name in c.archive_matches)
        out.append("\n")

    # Not in compare.pl: the 2011 master had no way to say a node was lost mid-run.
    if facts.lost_nodes:
        out.append("Nodes lost during the run:\n")
        out.extend(f"{node}\n" for node in facts.lost_nodes)
        out.append("\n")
    if facts.duplicates > 0:
        out.append(f"{facts.duplicates} late duplicate result(s) ignored.\n\n")

    return "".join(out)


def _archive_line(name: str, row: TabRow, where: Seen) -> str:
    # compare.pl's "$t $a[1] $a[2] $currentMachine{$t} $a[0] $a[3] $message": the product
    # and machine of the run the digest was last seen in, this run's machine, that run's
    # revision, how many runs ago, and the error description if the test errors now
    # (without the Perl's trailing space when there is none).
    line = f"{display_name(name)} {where.product} {where.machine} {row.machine} {where.rev} " \
           f"{where.age}"
    if row.error != 0:
        line += f" {error_description(row.error)}"
    return line + "\n"


def _added_error_line(name: str, row: TabRow) -> str:
    # compare.pl's shorter line for a test with no previous result: no previous product or
    # machine to show.
    return f"{display_name(name)} {row.machine} {error_description(row.error)}\n"
