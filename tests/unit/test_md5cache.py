"""Unit tests of cluster.report.md5cache (cachearchive.pl's md5sum.cache) and its use."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cluster.report.compare import DASHES, RunFacts, analyse, compare
from cluster.report.md5cache import (
    DEFAULT_WINDOW,
    Seen,
    SeenCache,
    digest_of,
    load,
    rebuild,
)
from cluster.report.tab import Table, TabRow, write_tab

A = "a" * 32
B = "b" * 32
C = "c" * 32
D = "d" * 32

FACTS = RunFacts(tests=3, seconds=60, nodes=2)
SEEN_TITLE = ("The following {n} regression file(s) had differences but matched at least "
              "once in the previous {w} runs:")


def r(name: str, md5: str = A, error: int = 0, product: str = "gs", machine: str = "m1",
      rev: str = "1") -> TabRow:
    return TabRow(name=name, error=error, time1=1.0, time2=0.0, time3=0.0,
                  md5=md5 if error == 0 else "0", rev=rev, product=product, machine=machine)


def table(*rows: TabRow) -> Table:
    return {row.name: row for row in rows}


def archive(tmp_path: Path, *tables: Table) -> list[tuple[str, Path]]:
    """Write *tables* (oldest first) as archived runs r1, r2, ...; return them newest first."""
    out = []
    for i, t in enumerate(tables, start=1):
        path = tmp_path / f"r{i}.tab"
        write_tab(path, t.values())
        out.append((f"r{i}", path))
    return out[::-1]


def section(text: str, title: str) -> list[str]:
    ls = text.split("\n")
    start = ls.index(title) + 1
    return ls[start:ls.index("", start)]


def test_digest_of_is_md5_or_error_code() -> None:
    """A row that ran is cached under its md5, an errored one under its error code."""
    assert digest_of(0, A) == A
    assert digest_of(8, "0") == "8"


def test_flip_back_to_an_older_digest_is_seen_before(tmp_path: Path) -> None:
    """A test flipping A, B, A lists a return to B as seen before (rev r2, 2 runs ago)."""
    cache = tmp_path / "md5sum.cache"
    tabs = archive(tmp_path,
                   table(r("flip", A, machine="n1"), r("stable"), r("new", A)),
                   table(r("flip", B, machine="n2", product="gs"), r("stable"), r("new", A)),
                   table(r("flip", A, machine="n3"), r("stable"), r("new", A)))
    rebuild(tabs, cache)
    seen = load(cache)
    assert seen.window == DEFAULT_WINDOW
    # Perl's ages: the newest table is 1 run ago, so r2 is 2 and r1 is 3; r1's A for "flip"
    # is today's digest, so it is not in the cache at all.
    assert seen.lookup("flip", B) == Seen("r2", "gs", "n2", 2)
    assert seen.lookup("flip", A) is None
    assert len(seen) == 1

    previous = table(r("flip", A, machine="n3"), r("stable"), r("new", A))
    current = table(r("flip", B, machine="n9"), r("stable"), r("new", C, machine="n9"))
    c = analyse(current, previous, seen=seen)
    assert c.archive_matches == ["flip"]
    assert c.archive_seen == {"flip": Seen("r2", "gs", "n2", 2)}
    assert c.differing() == ["new"]  # C was never seen: a real difference

    text = compare(current, previous, FACTS, seen=seen)
    assert section(text, "Differences in 1 of 3 non-pdfwrite/ps2write test(s):") == \
        ["new gs m1 n9"]
    lines = text.split("\n")
    title = SEEN_TITLE.format(n=1, w=50)
    at = lines.index(title)
    assert lines[at - 2:at] == [DASHES, ""]
    assert len(DASHES) == 103 and set(DASHES) == {"-"}
    # name, product and machine where last seen, this run's machine, rev, runs ago
    assert section(text, title) == ["flip gs n2 n9 r2 2"]


def test_without_a_cache_nothing_is_seen_before(tmp_path: Path) -> None:
    """With seen=None, or an empty cache, a changed md5 is a difference as before."""
    previous = table(r("t", A))
    current = table(r("t", B))
    for seen in (None, SeenCache(), load(tmp_path / "missing.cache")):
        c = analyse(current, previous, seen=seen)
        assert c.differing() == ["t"] and c.archive_matches == []
        assert "had differences but matched" not in compare(current, previous, FACTS, seen=seen)


def test_window_limits_what_is_seen(tmp_path: Path) -> None:
    """Only the newest window tables count: a digest seen 51 runs ago is not matched."""
    tables = [table(r("old", A), r("edge", A)) for _ in range(DEFAULT_WINDOW + 1)]
    tables[0] = table(r("old", B), r("edge", A))  # r1: 51 runs ago
    tables[1] = table(r("old", A), r("edge", B))  # r2: 50 runs ago
    tabs = archive(tmp_path, *tables)
    assert tabs[-1][0] == "r1" and len(tabs) == 51
    cache = tmp_path / "md5sum.cache"
    rebuild(tabs, cache)
    seen = load(cache)
    assert seen.lookup("old", B) is None
    assert seen.lookup("edge", B) == Seen("r2", "gs", "m1", 50)

    current = table(r("old", B), r("edge", B))
    c = analyse(current, table(r("old", A), r("edge", A)), seen=seen)
    assert c.differing() == ["old"] and c.archive_matches == ["edge"]

    rebuild(tabs, cache, window=3)  # r51 (newest), r50, r49 only
    assert load(cache).window == 3
    assert len(load(cache)) == 0


def test_newest_occurrence_wins(tmp_path: Path) -> None:
    """A pair seen in several older runs is recorded with the newest of them."""
    tabs = archive(tmp_path, table(r("t", B, machine="old")), table(r("t", B, machine="mid")),
                   table(r("t", C)), table(r("t", A)))
    cache = tmp_path / "c"
    rebuild(tabs, cache)
    seen = load(cache)
    assert seen.lookup("t", B) == Seen("r2", "gs", "mid", 3)
    assert seen.lookup("t", C) == Seen("r3", "gs", "m1", 2)


def test_error_code_digest_is_matched(tmp_path: Path) -> None:
    """A test segfaulting again as it did 2 runs ago is seen before, not a started error."""
    tabs = archive(tmp_path,
                   table(r("crash", error=8, machine="n1"), r("fixed", B), r("other")),
                   table(r("crash", A), r("fixed", error=1), r("other")))
    cache = tmp_path / "md5sum.cache"
    rebuild(tabs, cache)
    assert "crash 8 | r1\tgs\tn1\t2" in cache.read_text().split("\n")
    seen = load(cache)
    previous = table(r("crash", A), r("fixed", error=1), r("other"))
    current = table(r("crash", error=8, machine="n5"), r("fixed", B, machine="n5"),
                    r("other", error=3, machine="n5"))
    c = analyse(current, previous, seen=seen)
    assert c.archive_matches == ["crash", "fixed"]
    assert c.started_errors == ["other"]  # timeout never seen before: a real change
    assert c.stopped_errors == []
    assert c.differing() == ["other"]
    assert c.segfaults == ["crash"]  # the segfault block is not affected

    text = compare(current, previous, FACTS, seen=seen)
    assert section(text, "The following 1 regression file(s) have started producing errors:") \
        == ["other gs m1 n5 timeout"]
    assert "stopped producing errors" not in text
    assert section(text, SEEN_TITLE.format(n=2, w=50)) == [
        "crash gs n1 n5 r1 2 segfault", "fixed gs m1 n5 r1 2"]
    assert "Seg faults with current rev:" in text


def test_lookups_only_for_differing_tests(tmp_path: Path) -> None:
    """analyse asks the cache about changed md5s only, once each."""

    class Counting(SeenCache):
        asked: list[tuple[str, str]] = []

        def lookup(self, name: str, digest: str) -> Seen | None:
            self.asked.append((name, digest))
            return super().lookup(name, digest)

    seen = Counting({"b " + B: Seen("r1", "gs", "m", 2)})
    previous = table(*(r(f"t{i}") for i in range(100)), r("b"), r("e", error=1))
    current = table(*(r(f"t{i}") for i in range(100)), r("b", B), r("e", error=3),
                    r("added", C))
    c = analyse(current, previous, seen=seen)
    assert seen.asked == [("b", B)]
    assert c.archive_matches == ["b"]


def test_cache_file_format_and_sorting(tmp_path: Path) -> None:
    """The file is the window line, then sorted '<name> <digest> | rev TAB product TAB
    machine TAB age' lines; an empty machine and a two-word product survive a round trip."""
    tabs = archive(tmp_path,
                   table(r("z__b", B, product="gs pdfwrite", machine=""), r("a", C)),
                   table(r("z__b", A, product="gs pdfwrite"), r("a", A)))
    cache = tmp_path / "md5sum.cache"
    rebuild(tabs, cache)
    assert cache.read_text() == (
        "50\n"
        f"a {C} | r1\tgs\tm1\t2\n"
        f"z__b {B} | r1\tgs pdfwrite\t\t2\n")
    seen = load(cache)
    assert seen.lookup("z__b", B) == Seen("r1", "gs pdfwrite", "", 2)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_rebuild_of_fewer_than_two_tables(tmp_path: Path) -> None:
    """No tables, or only the newest, make a cache of just the window line."""
    cache = tmp_path / "c"
    rebuild([], cache)
    assert cache.read_text() == "50\n"
    rebuild(archive(tmp_path, table(r("t"))), cache, window=7)
    assert cache.read_text() == "7\n"
    with pytest.raises(ValueError):
        rebuild([], cache, window=0)
    with pytest.raises(ValueError):
        rebuild([("bad\tlabel", cache)], cache)


def test_rebuild_skips_bad_tab_lines_and_missing_tables(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A malformed .tab line is logged with its line number and skipped; a missing archived
    table counts as an empty run (ages stay by position)."""
    newest = tmp_path / "r3.tab"
    write_tab(newest, [r("t", A)])
    broken = tmp_path / "r1.tab"
    broken.write_text("\n".join([
        r("t", B).line(),
        "only\ttwo",
        "x\tnot-a-number\t0\t0\t0\t0\t0\t1\tgs\tm",
        r("u", C).line(),
        "",
    ]))
    with caplog.at_level(logging.WARNING, logger="cluster.md5cache"):
        rebuild([("r3", newest), ("r2", tmp_path / "r2.tab"), ("r1", broken)],
                tmp_path / "c")
    seen = load(tmp_path / "c")
    assert seen.lookup("t", B) == Seen("r1", "gs", "m1", 3)
    assert seen.lookup("u", C) == Seen("r1", "gs", "m1", 3)
    assert len(seen) == 2
    assert "r2.tab: archived table is missing" in caplog.text
    assert "r1.tab:2:" in caplog.text and "r1.tab:3:" in caplog.text


def test_load_skips_corrupt_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A corrupt cache line is logged with its line number and skipped; the rest is kept."""
    cache = tmp_path / "md5sum.cache"
    cache.write_text("\n".join([
        "12",
        f"good {A} | r7\tgs\tm1\t3",
        "garbage",
        f"short {A} | r7\tgs\tm1",
        f"age {A} | r7\tgs\tm1\tsoon",
        f"zero {A} | r7\tgs\tm1\t0",
        "nodigest | r7\tgs\tm1\t3",
        f"norev {A} | \tgs\tm1\t3",
        "",
        f"also {B} | r8\tgs ps2write\tm2\t4",
        "",
    ]))
    with caplog.at_level(logging.WARNING, logger="cluster.md5cache"):
        seen = load(cache)
    assert seen.window == 12
    assert len(seen) == 2
    assert seen.lookup("good", A) == Seen("r7", "gs", "m1", 3)
    assert seen.lookup("also", B) == Seen("r8", "gs ps2write", "m2", 4)
    for lineno in (3, 4, 5, 6, 7, 8):
        assert f"md5sum.cache:{lineno}:" in caplog.text
    assert "md5sum.cache:9:" not in caplog.text  # blank lines are not corrupt


def test_load_without_window_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A first line that is not the window is logged and read as an entry; window is 50."""
    cache = tmp_path / "md5sum.cache"
    cache.write_text(f"t {A} | r1\tgs\tm\t2\n")
    with caplog.at_level(logging.WARNING, logger="cluster.md5cache"):
        seen = load(cache)
    assert seen.window == DEFAULT_WINDOW
    assert seen.lookup("t", A) == Seen("r1", "gs", "m", 2)
    assert "md5sum.cache:1:" in caplog.text


def test_rebuild_of_big_tables_is_exact(tmp_path: Path) -> None:
    """20,000-row tables, read as streams, give exactly the pairs a naive rebuild gives."""
    n = 20_000
    tables = []
    for run in range(4):
        rows = []
        for i in range(n):
            # every 7th test changes each run, every 11th errors in run 1, the rest stay
            if i % 7 == 0:
                md5 = f"{run:02d}{i:030d}"
            else:
                md5 = f"{i:032d}"
            error = 3 if (i % 11 == 0 and run == 1) else 0
            rows.append(r(f"dir__t{i}.pdf.ppmraw.72.0", md5, error=error, machine=f"n{run}"))
        tables.append(table(*rows))
    tabs = archive(tmp_path, *tables)
    cache = tmp_path / "md5sum.cache"
    rebuild(tabs, cache)

    # The naive version: every pair of every older table minus the newest's, newest wins.
    newest = {(row.name, digest_of(row.error, row.md5)) for row in tables[-1].values()}
    expected: dict[str, Seen] = {}
    for age, run in enumerate(reversed(range(3)), start=2):
        for row in tables[run].values():
            pair = (row.name, digest_of(row.error, row.md5))
            key = f"{pair[0]} {pair[1]}"
            if pair not in newest and key not in expected:
                expected[key] = Seen(f"r{run + 1}", "gs", f"n{run}", age)
    seen = load(cache)
    assert len(seen) == len(expected)
    for key, where in expected.items():
        name, digest = key.split(" ")
        assert seen.lookup(name, digest) == where
    # spot checks: test 0 changes every run; test 11 errored (code 3) in run 1 only
    assert seen.lookup("dir__t0.pdf.ppmraw.72.0", f"00{0:030d}") == Seen("r1", "gs", "n0", 4)
    assert seen.lookup("dir__t11.pdf.ppmraw.72.0", "3") == Seen("r2", "gs", "n1", 3)
    lines = cache.read_text().split("\n")
    assert lines[0] == "50" and lines[1:-1] == sorted(lines[1:-1])
