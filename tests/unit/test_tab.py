"""Unit tests of cluster.report.tab: the 10-column .tab format, reading, writing and merging."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
from pathlib import Path

import pytest

from cluster.records import JobResult
from cluster.report.tab import (
    MAX_LOGGED,
    TabFile,
    TabRow,
    collate,
    merge_baseline,
    merged_lines,
    product_column,
    product_columns,
    read_tab,
    write_tab,
    write_tab_lines,
)

MD5_A = "0123456789abcdef0123456789abcdef"
MD5_B = "fedcba9876543210fedcba9876543210"


def row(name: str, md5: str = MD5_A, error: int = 0, product: str = "gs",
        machine: str = "node1", rev: str = "100") -> TabRow:
    return TabRow(name=name, error=error, time1=1.5, time2=0.25, time3=0.0, md5=md5, rev=rev,
                  product=product, machine=machine)


def test_line_has_ten_tab_separated_columns_in_order() -> None:
    """A row's line is name, error, three times, 0, md5, rev, product, machine."""
    r = row("tests__a.pdf.ppmraw.72.0", product="gs pdfwrite")
    assert r.line() == ("tests__a.pdf.ppmraw.72.0\t0\t1.50\t0.25\t0.00\t0\t" + MD5_A
                        + "\t100\tgs pdfwrite\tnode1")
    assert len(r.line().split("\t")) == 10


def test_line_forces_md5_to_zero_on_error() -> None:
    """An errored row writes md5 0 whatever its md5 field holds."""
    assert row("t", error=3).line().split("\t")[6] == "0"


def test_from_result_matches_jobresult_tab_line() -> None:
    """TabRow.from_result(r, rev).line() is exactly JobResult.tab_line(rev)."""
    for r in (JobResult("t.1", 0, 1.234, 2.0, 0.0, MD5_A, "gs", "nodeA"),
              JobResult("t.2", 8, 0.5, 0.0, 0.0, MD5_B, "gs ps2write", "nodeB"),
              JobResult("t.3", 0, 0.0, 0.0, 0.0, MD5_A, "mupdf")):
        tr = TabRow.from_result(r, "r42")
        assert tr.line() == r.tab_line("r42")
        assert tr.rev == "r42"
    assert TabRow.from_result(JobResult("x", 8, 0, 0, 0, MD5_B, "gs"), "1").md5 == "0"


def test_parse_round_trips_a_line() -> None:
    """parse(line()) gives back the same row."""
    r = row("tests__b.ps.pbmraw.300.1", md5=MD5_B, product="gs ps2write", machine="")
    assert TabRow.parse(r.line() + "\n") == r


def test_parse_accepts_nine_columns_as_empty_machine() -> None:
    """A line whose empty machine column lost its trailing TAB still parses."""
    line = "\t".join(["t", "0", "1", "2", "3", "0", MD5_A, "7", "gs"])
    assert TabRow.parse(line).machine == ""


@pytest.mark.parametrize("line, words", [
    ("only\tthree\tcolumns", "10 TAB-separated columns"),
    ("t\tx\t1\t2\t3\t0\tmd5\t1\tgs\tm", "error column"),
    ("t\t0\tslow\t2\t3\t0\tmd5\t1\tgs\tm", "time1 column"),
    ("\t0\t1\t2\t3\t0\tmd5\t1\tgs\tm", "test name"),
    ("t\t0\t1\t2\t3\t0\t\t1\tgs\tm", "md5 column"),
])
def test_parse_rejects_malformed_lines_saying_why(line: str, words: str) -> None:
    """parse raises ValueError naming the bad column."""
    with pytest.raises(ValueError, match=words):
        TabRow.parse(line)


def test_write_then_read_round_trips_sorted(tmp_path: Path) -> None:
    """write_tab writes rows sorted by name and read_tab reads back the same table."""
    rows = [row("b"), row("a", md5=MD5_B, product="mupdf"), row("a_b", error=9, md5="0"),
            row("a__c", product="gs pdfwrite")]
    path = tmp_path / "current.tab"
    write_tab(path, rows)
    names = [line.split("\t")[0] for line in path.read_text().splitlines()]
    assert names == sorted(names) == ["a", "a__c", "a_b", "b"]
    assert read_tab(path) == {r.name: r for r in rows}


def test_read_missing_file_is_empty(tmp_path: Path) -> None:
    """A missing .tab reads as an empty table."""
    assert read_tab(tmp_path / "nope.tab") == {}


def test_read_skips_malformed_lines_and_keeps_the_rest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Malformed lines are logged with file and line number and skipped; the others are kept."""
    path = tmp_path / "current.tab"
    path.write_text(row("a").line() + "\n"
                    + "garbage line\n"
                    + "\n"
                    + row("b").line().replace("\t0\t1.50", "\tX\t1.50", 1) + "\n"
                    + row("c").line() + "\n")
    with caplog.at_level(logging.WARNING, logger="cluster.tab"):
        table = read_tab(path)
    assert sorted(table) == ["a", "c"]
    messages = [rec.getMessage() for rec in caplog.records]
    assert len(messages) == 2
    assert f"{path}:2:" in messages[0]
    assert f"{path}:4:" in messages[1] and "error column" in messages[1]


def test_read_later_duplicate_wins(tmp_path: Path) -> None:
    """A name appearing twice keeps its later line, as compare.pl's hash does."""
    path = tmp_path / "t.tab"
    path.write_text(row("a").line() + "\n" + row("a", md5=MD5_B).line() + "\n")
    assert read_tab(path)["a"].md5 == MD5_B


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    """write_tab replaces the file in one rename and leaves nothing else in the directory."""
    path = tmp_path / "current.tab"
    path.write_text("old\n")
    inode_before = path.stat().st_ino
    write_tab(path, [row("a")])
    assert os.listdir(tmp_path) == ["current.tab"]
    assert path.read_text() == row("a").line() + "\n"
    assert path.stat().st_ino != inode_before  # a new file renamed over, not rewritten in place


def test_write_failure_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    """If writing fails, the old table stays intact and the temp file is removed."""
    path = tmp_path / "current.tab"
    path.write_text("old\n")

    class Boom(TabRow):
        def line(self) -> str:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_tab(path, [Boom(**dataclasses.asdict(row("a")))])
    assert os.listdir(tmp_path) == ["current.tab"]
    assert path.read_text() == "old\n"


def test_write_keeps_mode_of_replaced_file(tmp_path: Path) -> None:
    """A rewritten table keeps its mode; a new one is 0644, readable by dashboards."""
    new = tmp_path / "new.tab"
    write_tab(new, [row("a")])
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    old = tmp_path / "old.tab"
    old.write_text("")
    old.chmod(0o640)
    write_tab(old, [row("a")])
    assert stat.S_IMODE(old.stat().st_mode) == 0o640


def test_collate_keeps_first_result_of_a_test() -> None:
    """collate keys results by name, stamps the rev, and ignores later duplicates."""
    results = [JobResult("a", 0, 1, 0, 0, MD5_A, "gs", "n1"),
               JobResult("b", 3, 1, 0, 0, "", "gs", "n1"),
               JobResult("a", 0, 1, 0, 0, MD5_B, "gs", "n2")]
    table = collate(results, "555")
    assert sorted(table) == ["a", "b"]
    assert table["a"].md5 == MD5_A and table["a"].machine == "n1" and table["a"].rev == "555"
    assert table["b"].md5 == "0"


def test_product_column_maps_variants_to_gs() -> None:
    """pdfwrite/ps2write name gs's two-stage columns; other words are their own column."""
    assert product_column("pdfwrite") == "gs pdfwrite"
    assert product_column("ps2write") == "gs ps2write"
    assert product_column("gs") == "gs"
    assert product_column("mupdf") == "mupdf"
    assert product_column("gs pdfwrite") == "gs pdfwrite"
    assert product_column("xpswrite") == "gs xpswrite"
    assert product_column("pcl") == "pcl"


def test_pcl_and_xps_own_their_two_stage_columns() -> None:
    """A pcl run replaces the baseline's pcl pdfwrite lines (pcl_configs holds them), a gs
    run does not replace gs pdfwrite's (product pdfwrite does)."""
    assert product_columns(["pcl"]) == {"pcl", "pcl pdfwrite", "pcl ps2write", "pcl xpswrite"}
    assert product_columns(["xps", "xpswrite"]) == {"xps", "xps pdfwrite", "xps ps2write",
                                                    "xps xpswrite", "gs xpswrite"}
    assert product_columns(["gs"]) == {"gs"}
    old = {"c1": row("c1", product="pcl"), "c_gone": row("c_gone", product="pcl pdfwrite"),
           "x1": row("x1", product="xps pdfwrite"), "g1": row("g1", product="gs pdfwrite")}
    new = {"c1": row("c1", md5=MD5_B, product="pcl", rev="101")}
    assert sorted(merge_baseline(old, new, ["pcl"])) == ["c1", "g1", "x1"]


def test_merge_baseline_replaces_tested_products_and_keeps_others() -> None:
    """Old lines of tested products go (even tests not rerun); untested products' lines stay."""
    old = {
        "g1": row("g1", product="gs"),
        "g_gone": row("g_gone", product="gs"),
        "p1": row("p1", product="gs pdfwrite"),
        "s1": row("s1", product="gs ps2write"),
        "m1": row("m1", product="mupdf"),
    }
    new = {
        "g1": row("g1", md5=MD5_B, product="gs", rev="101"),
        "p1": row("p1", md5=MD5_B, product="gs pdfwrite", rev="101"),
        "p2": row("p2", product="gs pdfwrite", rev="101"),
    }
    merged = merge_baseline(old, new, ["gs", "pdfwrite"])
    assert sorted(merged) == ["g1", "m1", "p1", "p2", "s1"]
    assert merged["g1"].rev == "101" and merged["p1"].md5 == MD5_B
    assert merged["s1"] == old["s1"] and merged["m1"] == old["m1"]


def test_merge_baseline_mupdf_only_keeps_all_gs_lines() -> None:
    """A mupdf run leaves gs and its pdfwrite/ps2write lines untouched."""
    old = {"g": row("g"), "p": row("p", product="gs pdfwrite"), "m": row("m", product="mupdf")}
    merged = merge_baseline(old, {"m2": row("m2", product="mupdf")}, ["mupdf"])
    assert sorted(merged) == ["g", "m2", "p"]


def test_write_tab_lines_streams_many_lines(tmp_path: Path) -> None:
    path = tmp_path / "big.tab"
    lines = [row(f"t{i:05d}").line() for i in range(20000)]
    write_tab_lines(path, iter(lines))
    assert path.read_text() == "".join(line + "\n" for line in lines)
    write_tab_lines(path, [])
    assert path.read_text() == ""


def test_merged_lines_are_the_lines_of_merge_baseline() -> None:
    old = {r.name: r for r in (row("a", product="gs"), row("b", product="mupdf"),
                               row("c", product="gs pdfwrite"), row("e", product="gs"))}
    new = {r.name: r for r in (row("a", md5=MD5_B), row("d", product="gs pdfwrite"))}
    merged = merge_baseline(old, new, ["gs", "pdfwrite"])
    assert list(merged_lines(old, new, ["gs", "pdfwrite"])) == [
        merged[name].line() for name in sorted(merged)]


# ------------------------------------------------------------------- TabFile (streamed)
def test_tabfile_streams_entries_in_name_order_and_skips_bad_lines(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Good rows come back as entries (effective md5, product, the line); bad ones are
    logged with their line number and skipped, the rest kept."""
    path = tmp_path / "t.tab"
    good = [row("a"), row("b", md5="0", error=3), row("c", product="gs pdfwrite")]
    path.write_text(good[0].line() + "\nnot a table line\n\n" + good[1].line() + "\n"
                    + good[2].line() + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cluster.tab"):
        got = list(TabFile(path).entries())
    assert [(e.name, e.error, e.md5, e.product) for e in got] == [
        ("a", 0, MD5_A, "gs"), ("b", 3, "0", "gs"), ("c", 0, MD5_A, "gs pdfwrite")]
    assert [e.row() for e in got] == good
    assert [e.line() for e in got] == [r.line() for r in good]
    assert "t.tab:2" in caplog.text and "expected 10 TAB-separated columns" in caplog.text


def test_tabfile_out_of_order_or_repeated_is_read_whole_like_read_tab(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A hand-edited file (unsorted, a name twice) gives what read_tab gives: sorted, the
    later line of a repeated name winning, with a warning naming the line."""
    path = tmp_path / "t.tab"
    path.write_text("\n".join([row("b").line(), row("a").line(), row("b", MD5_B).line()])
                    + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cluster.tab"):
        got = list(TabFile(path).entries())
    assert [(e.name, e.md5) for e in got] == [("a", MD5_A), ("b", MD5_B)]
    assert "t.tab:2" in caplog.text and "out of name order" in caplog.text
    # A malformed line in such a file is logged once, by the check, not again by the
    # whole-file read.
    path.write_text("\n".join([row("b").line(), "junk", row("a").line()]) + "\n",
                    encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cluster.tab"):
        assert [e.name for e in TabFile(path).entries()] == ["a", "b"]
    assert caplog.text.count("skipping malformed") == 1 and "t.tab:2" in caplog.text
    path.write_text(row("a").line() + "\n" + row("a", MD5_B).line() + "\n", encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cluster.tab"):
        assert [(e.name, e.md5) for e in TabFile(path).entries()] == [("a", MD5_B)]
    assert "repeats a test" in caplog.text


def test_tabfile_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert list(TabFile(tmp_path / "none.tab").entries()) == []


def test_merged_lines_from_a_tabfile_equal_the_in_memory_merge(tmp_path: Path) -> None:
    """The streamed merge gives the lines of merge_baseline, whatever interleaving."""
    old = {r.name: r for r in (row("a"), row("b", product="mupdf"), row("d"),
                               row("e", product="mupdf"), row("g", product="gs pdfwrite"))}
    new = {r.name: r for r in (row("b", MD5_B), row("c", MD5_B), row("f", MD5_B))}
    path = tmp_path / "old.tab"
    write_tab(path, old.values())
    for products in (["gs"], ["gs", "pdfwrite"], ["mupdf"], []):
        expected = [r.line() for _, r in sorted(merge_baseline(old, new, products).items())]
        assert list(merged_lines(TabFile(path), new, products)) == expected
        assert list(merged_lines(old, new, products)) == expected


def test_many_bad_lines_are_summed_up_not_each_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A mangled table logs its first bad lines and then one summary line."""
    path = tmp_path / "t.tab"
    path.write_text("junk\n" * 100 + row("a").line() + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cluster.tab"):
        assert [e.name for e in TabFile(path).entries()] == ["a"]
        assert list(read_tab(path)) == ["a"]
    assert caplog.text.count("skipping malformed") == 2 * MAX_LOGGED
    assert caplog.text.count("100 malformed .tab lines skipped in all") == 2
