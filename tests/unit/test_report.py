"""Unit tests of cluster.report.compare: compare.pl's analysis and report, section by section."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from cluster.report.compare import (
    PDFWRITE,
    PS2WRITE,
    RASTER,
    STARS,
    RunFacts,
    analyse,
    compare,
    display_name,
    group_of,
)
from cluster.report.md5cache import Seen, SeenCache
from cluster.report.tab import TabFile, Table, TabRow, write_tab

A = "a" * 32
B = "b" * 32
C = "c" * 32

FACTS = RunFacts(tests=10, seconds=83.9, nodes=3)


def r(name: str, md5: str = A, error: int = 0, product: str = "gs",
      machine: str = "m1") -> TabRow:
    return TabRow(name=name, error=error, time1=1.0, time2=0.0, time3=0.0,
                  md5=md5 if error == 0 else "0", rev="1", product=product, machine=machine)


def table(*rows: TabRow) -> Table:
    return {row.name: row for row in rows}


def lines(text: str) -> list[str]:
    return text.split("\n")


def section(text: str, title: str) -> list[str]:
    """The lines after the line *title*, up to the next blank line."""
    ls = lines(text)
    start = ls.index(title) + 1
    end = ls.index("", start)
    return ls[start:end]


def test_group_of_and_display_name() -> None:
    """Products go to groups by the words pdfwrite/ps2write; __ is shown as /."""
    assert group_of("gs") == RASTER and group_of("mupdf") == RASTER
    assert group_of("gs pdfwrite") == PDFWRITE and group_of("pcl pdfwrite") == PDFWRITE
    assert group_of("gs ps2write") == PS2WRITE
    assert display_name("tests_private__comparefiles__a.pdf.ppmraw.72.0") == \
        "tests_private/comparefiles/a.pdf.ppmraw.72.0"


def test_ran_line_is_exact_with_integer_seconds() -> None:
    """The header line reads 'ran N tests in T seconds on M nodes' with T a whole number."""
    same = table(r("t"))
    text = compare(same, same, RunFacts(tests=1234, seconds=3599.7, nodes=12))
    assert lines(text)[0] == "ran 1234 tests in 3599 seconds on 12 nodes"
    assert lines(text)[1] == ""


def test_no_differences_wording_per_group() -> None:
    """With nothing changed, each group says 'No differences in Y ... tests' with its count."""
    cur = table(r("a"), r("b"), r("c", product="gs pdfwrite"))
    text = compare(cur, dict(cur), FACTS)
    assert lines(text) == [
        "ran 10 tests in 83 seconds on 3 nodes", "",
        "No differences in 2 non-pdfwrite/ps2write tests", "",
        "No differences in 1 pdfwrite tests", "",
        "No differences in 0 ps2write tests", "",
        "",
    ]


def test_differences_split_into_three_groups() -> None:
    """md5 changes are listed per group with '<name> <prevProduct> <prevMachine> <curMachine>'."""
    prev = table(r("x__a.ps.ppmraw.72.0", machine="old"), r("b"), r("c"),
                 r("p1", product="gs pdfwrite"), r("p2", product="gs pdfwrite"),
                 r("s1", product="gs ps2write"))
    cur = table(r("x__a.ps.ppmraw.72.0", md5=B, machine="new"), r("b"), r("c", md5=C),
                r("p1", product="gs pdfwrite"), r("p2", md5=B, product="gs pdfwrite"),
                r("s1", md5=B, product="gs ps2write"))
    c = analyse(cur, prev)
    assert c.differences == {RASTER: ["c", "x__a.ps.ppmraw.72.0"], PDFWRITE: ["p2"],
                             PS2WRITE: ["s1"]}
    assert c.counts == {RASTER: 3, PDFWRITE: 2, PS2WRITE: 1}
    text = compare(cur, prev, FACTS)
    assert section(text, "Differences in 2 of 3 non-pdfwrite/ps2write test(s):") == [
        "c gs m1 m1", "x/a.ps.ppmraw.72.0 gs old new"]
    assert section(text, "Differences in 1 of 2 pdfwrite test(s):") == ["p2 gs pdfwrite m1 m1"]
    assert section(text, "Differences in 1 of 1 ps2write test(s):") == ["s1 gs ps2write m1 m1"]
    assert "started producing errors" not in text


def test_lists_are_sorted_by_shown_name() -> None:
    """Names sort as the report shows them ('/' before letters), like compare.pl."""
    prev = table(r("dirA__z"), r("dir__z"), r("dirZ"))
    cur = table(r("dirA__z", md5=B), r("dir__z", md5=B), r("dirZ", md5=B))
    assert analyse(cur, prev).differences[RASTER] == ["dir__z", "dirA__z", "dirZ"]


def test_error_transitions_are_listed_and_also_differ() -> None:
    """OK->error and error->OK are listed with descriptions, and (as compare.pl) as differences.

    compare.pl compares md5s independently of error transitions, with an errored test's md5
    being "0"; an error in both runs, even with another code, is no change at all.
    """
    prev = table(r("broke", machine="p"), r("fixed", error=3, machine="p"),
                 r("still", error=1), r("other", error=1), r("ok"))
    cur = table(r("broke", error=8, machine="c"), r("fixed", machine="c"),
                r("still", error=1), r("other", error=5), r("ok"))
    c = analyse(cur, prev)
    assert c.started_errors == ["broke"]
    assert c.stopped_errors == ["fixed"]
    assert c.differences[RASTER] == ["broke", "fixed"]
    text = compare(cur, prev, FACTS)
    assert section(text, "The following 1 regression file(s) have started producing errors:") \
        == ["broke gs p c segfault"]
    assert section(text, "The following 1 regression file(s) have stopped producing errors:") \
        == ["fixed gs p c timeout"]
    # started comes before stopped, and both after the difference lists
    ls = lines(text)
    assert ls.index("Differences in 2 of 5 non-pdfwrite/ps2write test(s):") \
        < ls.index("The following 1 regression file(s) have started producing errors:") \
        < ls.index("The following 1 regression file(s) have stopped producing errors:")


def test_unknown_error_code_is_described_as_unknown() -> None:
    """An error code outside ERROR_NAMES is described as 'unknown'."""
    prev = table(r("t"))
    cur = table(r("t", error=42))
    assert "t gs m1 m1 unknown" in lines(compare(cur, prev, FACTS))


def test_added_and_removed_and_added_errors() -> None:
    """Added/removed tests are listed; an added test that errors also started producing errors."""
    prev = table(r("old1", product="mupdf"), r("keep"), r("broke"))
    cur = table(r("keep"), r("broke", error=3, machine="n2"), r("new1", product="gs pdfwrite"),
                r("anew", error=7, machine="n3"))
    c = analyse(cur, prev)
    assert c.removed == ["old1"]
    assert c.added == ["anew", "new1"]
    # tests present in both first, then the added ones (compare.pl's order)
    assert c.started_errors == ["broke", "anew"]
    text = compare(cur, prev, FACTS)
    assert section(text, "The following 2 regression file(s) have started producing errors:") \
        == ["broke gs m1 n2 timeout", "anew n3 segfault during pdfwrite/ps2write/xpswrite"]
    assert section(text, "The following 1 regression file(s) have been removed:") \
        == ["old1 mupdf"]
    assert section(text, "The following 2 regression file(s) have been added:") \
        == ["anew gs", "new1 gs pdfwrite"]
    ls = lines(text)
    assert ls.index("The following 1 regression file(s) have been removed:") \
        < ls.index("The following 2 regression file(s) have been added:")


def test_skip_missing_suppresses_added_removed_but_not_errors() -> None:
    """skip_missing (user runs) drops the added/removed lists but keeps the error lists."""
    prev = table(r("old1"), r("keep"))
    cur = table(r("keep"), r("anew", error=1))
    text = compare(cur, prev, FACTS, skip_missing=True)
    assert "have been removed" not in text
    assert "have been added" not in text
    assert section(text, "The following 1 regression file(s) have started producing errors:") \
        == ["anew m1 error reading input"]


def test_band_mismatch_new_versus_old() -> None:
    """A .1/.0 md5 mismatch is reported only if the previous run had them equal (or lacked one)."""
    prev = table(r("new.ppmraw.300.0"), r("new.ppmraw.300.1"),
                 r("old.ppmraw.300.0"), r("old.ppmraw.300.1", md5=B),
                 r("half.ppmraw.300.0"),
                 r("same.ppmraw.300.0"), r("same.ppmraw.300.1"))
    cur = table(r("new.ppmraw.300.0"), r("new.ppmraw.300.1", md5=B),
                r("old.ppmraw.300.0"), r("old.ppmraw.300.1", md5=C),
                r("half.ppmraw.300.0"), r("half.ppmraw.300.1", md5=B),
                r("same.ppmraw.300.0"), r("same.ppmraw.300.1"),
                r("lonely.ppmraw.300.1", md5=B), r(".1", md5=B), r("0", md5=A))
    c = analyse(cur, prev)
    assert c.band_mismatches == ["half.ppmraw.300.1", "new.ppmraw.300.1"]
    text = compare(cur, prev, FACTS)
    title = "The following files are showing a new mismatch between banded and page mode:"
    assert section(text, title) == ["half.ppmraw.300.1", "new.ppmraw.300.1"]
    assert lines(text)[lines(text).index(title) - 1] == ""


def test_band_mismatch_with_one_side_erroring() -> None:
    """An errored sibling counts as md5 '0', so it mismatches a good one and matches an error."""
    cur = table(r("e.pbmraw.72.0", error=1), r("e.pbmraw.72.1"),
                r("f.pbmraw.72.0", error=1), r("f.pbmraw.72.1", error=3))
    assert analyse(cur, {}).band_mismatches == ["e.pbmraw.72.1"]


def test_skip_missing_also_suppresses_band_check() -> None:
    """As in compare.pl, whose skipMissing block runs to the end, user runs show no band list."""
    prev = table(r("n.ppmraw.300.0"), r("n.ppmraw.300.1"))
    cur = table(r("n.ppmraw.300.0"), r("n.ppmraw.300.1", md5=B))
    assert "banded" in compare(cur, prev, FACTS)
    assert "banded" not in compare(cur, prev, FACTS, skip_missing=True)


def test_segfault_block_is_first_and_exact() -> None:
    """Every current segfault (codes 7, 8, 9) is in a starred block before the 'ran' line."""
    prev = table(r("a"), r("b", error=8), r("c"), r("d"))
    cur = table(r("a", error=7, machine="n1"), r("b", error=8, machine="n2"),
                r("c", error=9, machine="n3"), r("d", error=3))
    assert analyse(cur, prev).segfaults == ["a", "b", "c"]
    text = compare(cur, prev, FACTS)
    assert lines(text)[:12] == [
        "",
        STARS,
        "Seg faults with current rev:",
        "",
        "a n1 segfault during pdfwrite/ps2write/xpswrite",
        "b n2 segfault",
        "c n3 segfault reading the generated PDF/PS/XPS",
        "",
        STARS,
        "",
        "",
        "ran 10 tests in 83 seconds on 3 nodes",
    ]
    assert len(STARS) == 77 and set(STARS) == {"*"}


def test_segfault_block_can_be_turned_off() -> None:
    """segfault_block=False (a user's second comparison) leaves the block out."""
    cur = table(r("a", error=8))
    text = compare(cur, table(r("a")), FACTS, segfault_block=False)
    assert "Seg faults" not in text
    assert lines(text)[0].startswith("ran ")


def test_header_goes_before_everything() -> None:
    """RunFacts.header is printed first, then a blank line, then the segfault block."""
    facts = RunFacts(tests=1, seconds=5, nodes=1,
                     header="User regression: user alice options gs  start now")
    text = compare(table(r("a", error=8)), table(r("a")), facts)
    assert lines(text)[:4] == ["User regression: user alice options gs  start now", "", "",
                               STARS]


def test_lost_nodes_and_duplicates_come_last() -> None:
    """Lost nodes get their own section and the duplicates count a line, after the rest."""
    prev = table(r("gone"), r("n.x.1"))
    cur = table(r("n.x.0"), r("n.x.1", md5=B))
    facts = RunFacts(tests=2, seconds=60, nodes=2,
                     lost_nodes=("nodeB (heartbeat lost)", "nodeC (killed)"), duplicates=3)
    text = compare(cur, prev, facts)
    assert section(text, "Nodes lost during the run:") == ["nodeB (heartbeat lost)",
                                                           "nodeC (killed)"]
    ls = lines(text)
    assert ls.index("The following files are showing a new mismatch between banded and page "
                    "mode:") < ls.index("Nodes lost during the run:")
    assert ls[-3:] == ["3 late duplicate result(s) ignored.", "", ""]


def test_no_lost_nodes_or_duplicates_no_sections() -> None:
    """Without lost nodes or duplicates neither section appears."""
    text = compare(table(r("a")), table(r("a")), FACTS)
    assert "Nodes lost" not in text and "duplicate" not in text


def test_first_run_wording_lists_segfaults_and_errors() -> None:
    """With no previous table the report says so, and still lists segfaults and errors."""
    cur = table(r("a"), r("b", error=8, machine="n2"), r("c", error=5, machine="n3"),
                r("x.ppmraw.72.0"), r("x.ppmraw.72.1", md5=B))
    c = analyse(cur, None)
    assert c.baseline
    assert c.added == ["a", "b", "c", "x.ppmraw.72.0", "x.ppmraw.72.1"]
    assert c.removed == [] and c.stopped_errors == []
    assert all(names == [] for names in c.differences.values())
    text = compare(cur, None, RunFacts(tests=5, seconds=9, nodes=1))
    ls = lines(text)
    ran = ls.index("ran 5 tests in 9 seconds on 1 nodes")
    assert "Seg faults with current rev:" in ls[:ran]
    assert ls[ran + 2] == "No previous results to compare with: this run is the baseline."
    assert section(text, "The following 2 regression file(s) are producing errors:") == [
        "b n2 segfault", "c n3 input missing"]
    assert "Differences in" not in text and "No differences" not in text
    assert "have been added" not in text
    assert "x.ppmraw.72.1" in section(
        text, "The following files are showing a new mismatch between banded and page mode:")


def test_first_run_wording_uses_previous_label() -> None:
    """previous_label names what is missing on a first run."""
    text = compare(table(r("a")), None, FACTS, previous_label="previous clusterpush")
    assert "No previous clusterpush to compare with: this run is the baseline." in lines(text)


def test_products_limit_the_group_counts() -> None:
    """products counts only the tested products' tests in each group's Y."""
    cur = table(r("g"), r("m", product="mupdf"), r("p", product="gs pdfwrite"),
                r("s", product="gs ps2write"))
    c = analyse(cur, dict(cur), products=["gs", "pdfwrite"])
    assert c.counts == {RASTER: 1, PDFWRITE: 1, PS2WRITE: 0}
    assert analyse(cur, dict(cur)).counts == {RASTER: 2, PDFWRITE: 1, PS2WRITE: 1}


def test_differing_collects_all_groups() -> None:
    """Comparison.differing() lists every differing test across groups, sorted."""
    prev = table(r("b"), r("a", product="gs pdfwrite"))
    cur = table(r("b", md5=B), r("a", md5=B, product="gs pdfwrite"))
    assert analyse(cur, prev).differing() == ["a", "b"]


def test_full_report_text() -> None:
    """A report touching every section reads exactly as compare.pl would print it."""
    prev = table(r("t__a.pdf.ppmraw.72.0", machine="p1"), r("t__b.ps.pbmraw.300.0"),
                 r("t__b.ps.pbmraw.300.1"), r("t__c.pdf.pdf.ppmraw.72.0", product="gs pdfwrite"),
                 r("t__d.ps", error=1, machine="p2"), r("t__gone.ps"))
    cur = table(r("t__a.pdf.ppmraw.72.0", md5=B, machine="c1"), r("t__b.ps.pbmraw.300.0"),
                r("t__b.ps.pbmraw.300.1", md5=B),
                r("t__c.pdf.pdf.ppmraw.72.0", error=8, product="gs pdfwrite", machine="c2"),
                r("t__d.ps", machine="c3"), r("t__new.ps", machine="c4"))
    facts = RunFacts(tests=6, seconds=120.5, nodes=4, lost_nodes=("n9 (no heartbeat)",))
    assert compare(cur, prev, facts) == "\n".join([
        "",
        STARS,
        "Seg faults with current rev:",
        "",
        "t/c.pdf.pdf.ppmraw.72.0 c2 segfault",
        "",
        STARS,
        "",
        "",
        "ran 6 tests in 120 seconds on 4 nodes",
        "",
        "Differences in 3 of 5 non-pdfwrite/ps2write test(s):",
        "t/a.pdf.ppmraw.72.0 gs p1 c1",
        "t/b.ps.pbmraw.300.1 gs m1 m1",
        "t/d.ps gs p2 c3",
        "",
        "Differences in 1 of 1 pdfwrite test(s):",
        "t/c.pdf.pdf.ppmraw.72.0 gs pdfwrite m1 c2",
        "",
        "No differences in 0 ps2write tests",
        "",
        "The following 1 regression file(s) have started producing errors:",
        "t/c.pdf.pdf.ppmraw.72.0 gs pdfwrite m1 c2 segfault",
        "",
        "The following 1 regression file(s) have stopped producing errors:",
        "t/d.ps gs p2 c3 error reading input",
        "",
        "The following 1 regression file(s) have been removed:",
        "t/gone.ps gs",
        "",
        "The following 1 regression file(s) have been added:",
        "t/new.ps gs",
        "",
        "",
        "The following files are showing a new mismatch between banded and page mode:",
        "t/b.ps.pbmraw.300.1",
        "",
        "Nodes lost during the run:",
        "n9 (no heartbeat)",
        "",
        "",
    ])


def test_sorting_by_shown_name_breaks_ties_by_name() -> None:
    """a__b is shown as a/b: it sorts before a_B and ties with a real a/b by name."""
    from cluster.report.compare import _sorted

    names = ["a_B", "a__b", "a/b", "b", "a__a", "A"]
    assert _sorted(names) == sorted(names, key=lambda n: (display_name(n), n))
    plain = [f"t{i}.ps" for i in range(30)]  # name order is shown order: no key list
    assert _sorted(reversed(plain)) == sorted(plain)


class _Briefed(dict[str, TabRow]):
    """A table that, like a run's ResultTable, says what analyse needs of a row."""

    briefed = 0

    def brief(self, name: str) -> tuple[int, str, str]:
        self.briefed += 1
        row = self[name]
        return row.error, row.md5 if row.error == 0 else "0", row.product


def test_a_table_with_brief_compares_as_a_dict() -> None:
    previous = table(r("x__1.0"), r("x__1.1", md5=B), r("err", error=3), r("ok"),
                     r("gone"), r("pdf", product="gs pdfwrite"))
    rows = [r("x__1.0"), r("x__1.1"), r("err"), r("ok", error=8), r("new", error=1),
            r("pdf", md5=B, product="gs pdfwrite")]
    briefed = _Briefed(table(*rows))
    assert analyse(briefed, previous) == analyse(table(*rows), previous)
    assert briefed.briefed == len(rows)
    facts = RunFacts(tests=6, seconds=1, nodes=1)
    assert compare(briefed, previous, facts) == compare(table(*rows), previous, facts)


def test_seen_before_list_comes_after_banding_and_before_lost_nodes() -> None:
    """Archive-matched tests follow a dashed rule after the banding check, lost nodes last."""
    from cluster.report.compare import DASHES
    from cluster.report.md5cache import Seen, SeenCache

    seen = SeenCache({f"x__f.ps {C}": Seen("20240101-p1-0001", "gs", "old", 7)}, window=30)
    prev = table(r("x__f.ps"), r("n.x.0"), r("n.x.1"))
    cur = table(r("x__f.ps", md5=C, machine="new"), r("n.x.0"), r("n.x.1", md5=B))
    facts = RunFacts(tests=3, seconds=1, nodes=1, lost_nodes=("n9 (killed)",))
    text = compare(cur, prev, facts, seen=seen)
    title = ("The following 1 regression file(s) had differences but matched at least once in "
             "the previous 30 runs:")
    assert section(text, title) == ["x/f.ps gs old new 20240101-p1-0001 7"]
    ls = lines(text)
    assert ls.index("The following files are showing a new mismatch between banded and page "
                    "mode:") < ls.index(DASHES) < ls.index(title) \
        < ls.index("Nodes lost during the run:")
    assert ls[ls.index(DASHES) + 1] == ""
    assert section(text, "Differences in 1 of 3 non-pdfwrite/ps2write test(s):") == \
        ["n.x.1 gs m1 m1"]


def test_seen_before_list_is_kept_for_user_runs() -> None:
    """With skip_missing the list is still printed (compare.pl dropped it: see report.py)."""
    from cluster.report.md5cache import Seen, SeenCache

    seen = SeenCache({f"t {B}": Seen("r1", "gs", "m", 2)})
    text = compare(table(r("t", md5=B)), table(r("t")), FACTS, skip_missing=True, seen=seen)
    assert "had differences but matched at least once in the previous 50 runs:" in text
    assert "Differences in" not in text


def test_ran_line_and_baseline_note_can_be_changed() -> None:
    """ran_line=False drops the 'ran' line; baseline_note replaces the first-run wording."""
    text = compare(table(r("a")), table(r("a")), FACTS, ran_line=False)
    assert "ran " not in text and lines(text)[0] == "No differences in 1 non-pdfwrite/ps2write " \
        "tests"
    text = compare(table(r("a")), None, FACTS, baseline_note="No baseline yet.")
    assert "No baseline yet." in lines(text) and "this run is the baseline" not in text


def _random_tables(rng: random.Random) -> tuple[Table, Table]:
    """A previous and a current table with every kind of change, and band siblings that
    are adjacent in name order as well as ones something else sorts between."""
    stems = [f"d{rng.randrange(3)}__t{i}.pdf.ppmraw.{rng.choice((72, 300))}" for i in range(40)]
    names = [f"{stem}.{band}" for stem in stems for band in (0, 1)]
    names += [f"{stem}.0x" for stem in rng.sample(stems, 8)]  # sorts between .0 and .1
    names += [f"p{i}" for i in range(10)]
    products = ["gs", "mupdf", "gs pdfwrite", "gs ps2write"]

    def make(name: str) -> TabRow:
        error = rng.choice((0, 0, 0, 0, 1, 3, 8))
        return r(name, md5=rng.choice((A, B, C)), error=error, product=rng.choice(products),
                 machine=rng.choice(("m1", "m2")))
    previous = table(*(make(n) for n in names if rng.random() < 0.9))
    current = table(*(make(n) for n in names if rng.random() < 0.9))
    return previous, current


def test_a_streamed_previous_table_compares_as_one_in_memory(tmp_path: Path) -> None:
    """analyse and compare give the same answer whether the previous table is a dict or a
    TabFile streamed in name order, over random tables with every kind of change."""
    seen = SeenCache({f"{n} {A}": Seen("r1", "gs", "m9", 3) for n in ("p1", "p2", "p3")})
    for seed in range(40):
        rng = random.Random(seed)
        previous, current = _random_tables(rng)
        path = tmp_path / f"{seed}.tab"
        write_tab(path, previous.values())
        streamed = TabFile(path)
        for kwargs in ({}, {"products": ["gs", "pdfwrite"]}, {"seen": seen}):
            got = analyse(current, streamed, **kwargs)
            want = analyse(current, previous, **kwargs)
            assert dataclasses.replace(got, listed={}) == dataclasses.replace(want, listed={})
            assert {n: e.row() for n, e in got.listed.items()} == \
                {n: e.row() for n, e in want.listed.items()}
        for skip in (False, True):
            assert compare(current, streamed, FACTS, skip_missing=skip, seen=seen) == \
                compare(current, previous, FACTS, skip_missing=skip, seen=seen)


def test_band_mismatch_with_a_name_between_the_siblings() -> None:
    """A banded test whose page-mode sibling is not just before it in name order is judged
    the same way (its sibling's previous md5 is looked up after the pass)."""
    prev = table(r("a.ppmraw.72.0"), r("a.ppmraw.72.0x"), r("a.ppmraw.72.1", md5=B),
                 r("b.ppmraw.72.0"), r("b.ppmraw.72.0x"), r("b.ppmraw.72.1"))
    cur = table(r("a.ppmraw.72.0"), r("a.ppmraw.72.0x"), r("a.ppmraw.72.1", md5=C),
                r("b.ppmraw.72.0"), r("b.ppmraw.72.0x"), r("b.ppmraw.72.1", md5=C))
    assert analyse(cur, prev).band_mismatches == ["b.ppmraw.72.1"]
    assert analyse(cur, None).band_mismatches == ["a.ppmraw.72.1", "b.ppmraw.72.1"]
