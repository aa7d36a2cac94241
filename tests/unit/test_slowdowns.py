"""Slowdowns named (cluster.report.slowdowns): the rule (median, factor, minimum seconds),
the side-by-side walk of the tables, and the report's section."""

from __future__ import annotations

from pathlib import Path

from cluster.report.slowdowns import TITLE, Slowdown, SlowdownRule, find, is_slower, section
from cluster.report.tab import TabRow, write_tab

RULE = SlowdownRule(factor=2.0, min_seconds=1.0, runs=5)


def test_the_rule_is_against_the_median_by_factor_and_seconds() -> None:
    # Median 1.0 (one outlier of 9 s does not move it): 2.5 s is slower.
    assert is_slower(2.5, [1.0, 9.0, 0.9, 1.0, 1.1], RULE)
    # Exactly twice is not more than twice.
    assert not is_slower(2.0, [1.0], RULE)
    # Ten times slower but only 0.9 s more: below slowdown_min_seconds.
    assert not is_slower(1.0, [0.1], RULE)
    # Equal time, or faster, is never slower.
    assert not is_slower(1.0, [1.0, 1.0], RULE)
    assert not is_slower(0.5, [3.0], RULE)
    # Nothing to compare with: a new test is not slower.
    assert not is_slower(100.0, [], RULE)
    # The settings move the line.
    assert is_slower(1.6, [1.0], SlowdownRule(factor=1.5, min_seconds=0.5))
    assert not is_slower(3.0, [1.0], SlowdownRule(factor=2.0, min_seconds=2.5))


def tab(path: Path, times: dict[str, float], errors: frozenset[str] = frozenset()) -> Path:
    write_tab(path, [TabRow(n, 3 if n in errors else 0, t, 0.0, 0.0, "a" * 32, "r", "gs",
                            "n1") for n, t in times.items()])
    return path


def test_find_walks_the_tables_by_name_and_uses_the_newest_runs(tmp_path: Path) -> None:
    old = [tab(tmp_path / f"{i}.tab", {"a": 1.0, "b": 2.0, "c": 0.5, "e": 1.0, "f": 1.0})
           for i in range(2)]
    # A sixth, older run would pull c's median up to 25 s if it were read: only 5 are.
    ancient = tab(tmp_path / "ancient.tab", {"c": 50.0})
    newest = tab(tmp_path / "new.tab", {"a": 1.0, "c": 0.5, "e": 0.8, "f": 1.0},
                 errors=frozenset({"e"}))
    current = tab(tmp_path / "cur.tab",
                  {"a": 1.0, "b": 4.5, "c": 3.0, "d": 9.0, "e": 3.0, "f": 3.0},
                  errors=frozenset({"f"}))
    previous = [newest, *old, ancient, ancient, ancient]
    found = find(current, previous, RULE)
    # a equal: not listed; b 4.5 against 2.0; c 3.0 against 0.5; d new; e's error row
    # left out of its median (1.0 of the other runs); f errs now: not judged.
    assert found == [Slowdown("b", 4.5, 2.0, 2), Slowdown("c", 3.0, 0.5, 5),
                     Slowdown("e", 3.0, 1.0, 2)]
    assert find(current, [], RULE) == []


def test_the_section_lists_each_slower_test_and_is_left_out_when_none() -> None:
    text = section([Slowdown("ex__golfer.eps", 4.0, 1.0, 5)], RULE, 5)
    assert TITLE in text
    assert "ex/golfer.eps 4.00 s, median 1.00 s over 5 runs (4.0x)" in text
    assert "more than 2x and at least 1 s over the median of the last 5 baseline runs" in text
    assert section([], RULE, 2) == ""
