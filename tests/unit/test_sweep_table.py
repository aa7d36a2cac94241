"""Unit tests of cluster.sweep.table: the parameter table file and [axes], streamed."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tracemalloc
import types
from pathlib import Path

import pytest

from cluster.errors import SweepError
from cluster.sweep import table
from cluster.sweep.table import MAX_NAME_CHARS, Axes, Row, TableFile

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, content: str | bytes, name: str = "params.csv") -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


def rows_of(source: TableFile | Axes) -> list[tuple[str, ...]]:
    return [row.values for row in source]


def error_of(tmp_path: Path, content: str | bytes) -> SweepError:
    """The error reading the whole table raises."""
    with pytest.raises(SweepError) as info:
        rows_of(TableFile(write(tmp_path, content), "params.csv"))
    return info.value


# ---------------------------------------------------------------------------------------
# The header and its separator


@pytest.mark.parametrize(("header", "separator"), [
    ("alpha,n", ","), ("alpha\tn", "\t"), ("alpha|n", "|")])
def test_the_separator_is_found_from_the_header(tmp_path: Path, header: str,
                                                separator: str) -> None:
    path = write(tmp_path, f"{header}\n0.1{separator}10\n0.2{separator}100\n")
    source = TableFile(path)
    assert source.separator == separator
    assert source.header == ("alpha", "n")
    assert rows_of(source) == [("0.1", "10"), ("0.2", "100")]


def test_a_header_without_separator_is_one_column_and_lines_are_whole(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "seed\n1,2|3\tx\n7\n"))
    assert source.separator is None
    assert source.header == ("seed",)
    assert rows_of(source) == [("1,2|3\tx",), ("7",)]


@pytest.mark.parametrize("header", ["a,b|c", "a|b\tc", "a\tb,c"])
def test_a_header_mixing_separators_is_refused(tmp_path: Path, header: str) -> None:
    with pytest.raises(SweepError, match=r"params.csv:1: the header mixes the separators") \
            as info:
        TableFile(write(tmp_path, header + "\n"), "params.csv")
    assert "expected exactly one of ',', TAB or '|'" in str(info.value)


def test_the_other_separators_in_values_are_plain_characters(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "a|b\n1,2|x\ty\n"))
    assert rows_of(source) == [("1,2", "x\ty")]


def test_rows_are_read_after_the_header_only_when_iterated(tmp_path: Path) -> None:
    """The constructor reads the header; a bad row is found only by streaming."""
    source = TableFile(write(tmp_path, "a,b\n1,2\n3\n"), "params.csv")
    assert source.header == ("a", "b")
    rows = iter(source)
    assert next(rows).values == ("1", "2")
    with pytest.raises(SweepError, match="params.csv:3"):
        next(rows)


@pytest.mark.parametrize(("header", "message"), [
    ("a,,b", "column 2 has an empty name"),
    (",a", "column 1 has an empty name"),
    ("a,b,", "column 3 has an empty name"),
    ("a,b,a", "column 3 name 'a' repeats column 1"),
    ("x|y|x", "column 3 name 'x' repeats column 1"),
    ("a, b", "column 2 name ' b' is not usable as a {name} placeholder"),
    ("1a,b", "column 1 name '1a' is not usable"),
    ("a-b", "column 1 name 'a-b' is not usable"),
    ("a.b", "column 1 name 'a.b' is not usable"),
    ("a{b}", "column 1 name 'a{b}' is not usable"),
    ("#", "column 1 name '#' is not usable"),
    ("%", "column 1 name '%' is not usable"),
    ("é", "column 1 name 'é' is not usable"),
    ("a" * (MAX_NAME_CHARS + 1), "is not usable"),
])
def test_bad_column_names_are_refused_naming_the_column(tmp_path: Path, header: str,
                                                        message: str) -> None:
    with pytest.raises(SweepError) as info:
        TableFile(write(tmp_path, header + "\n1\n"), "params.csv")
    text = str(info.value)
    assert text.startswith("params.csv:1: ")
    assert message in text


def test_the_name_rule_is_stated_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(SweepError) as info:
        TableFile(write(tmp_path, "a b\n"), "params.csv")
    assert ("expected letters, digits and '_', not starting with a digit, at most 64 "
            "characters") in str(info.value)


def test_good_names_are_case_sensitive_and_may_start_with_underscore(tmp_path: Path) -> None:
    longest = "N" * MAX_NAME_CHARS
    source = TableFile(write(tmp_path, f"_a|A|a|x9|{longest}\n1|2|3|4|5\n"))
    assert source.header == ("_a", "A", "a", "x9", longest)


def test_too_many_columns_are_refused(tmp_path: Path) -> None:
    names = ",".join(f"c{i}" for i in range(table.MAX_COLUMNS + 1))
    with pytest.raises(SweepError, match=f"at most {table.MAX_COLUMNS}"):
        TableFile(write(tmp_path, names + "\n"))


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="params.csv: the table is empty: expected a header"):
        TableFile(write(tmp_path, ""), "params.csv")


@pytest.mark.parametrize("content", ["\n", "\r\n", "\na,b\n"])
def test_an_empty_header_line_is_refused(tmp_path: Path, content: str) -> None:
    with pytest.raises(SweepError, match="params.csv:1: the header line is empty"):
        TableFile(write(tmp_path, content), "params.csv")


def test_a_missing_table_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="nope.csv: cannot read the table"):
        TableFile(tmp_path / "nope.csv", "nope.csv")


def test_a_byte_order_mark_before_the_header_is_dropped(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "\ufeffalpha,n\n1,2\n"))
    assert source.header == ("alpha", "n")
    assert rows_of(source) == [("1", "2")]


def test_the_where_defaults_to_the_path(tmp_path: Path) -> None:
    path = write(tmp_path, "a,b\n1\n")
    with pytest.raises(SweepError, match=f"{path}:2"):
        rows_of(TableFile(path))


# ---------------------------------------------------------------------------------------
# Rows


def test_rows_are_numbered_from_one_with_their_origin(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "a|b\n1|2\n\n3|4\n"), "p.txt")
    assert list(source) == [Row(1, ("1", "2"), "p.txt:2"), Row(2, ("3", "4"), "p.txt:4")]


@pytest.mark.parametrize(("content", "lineno", "cells"), [
    ("a|b\n1|2\n1|2|3\n", 3, 3),
    ("a|b\n1\n", 2, 1),
    ("a,b,c\n1,2,3\n4,5\n", 3, 2),
    ("a\tb\n1\t2\n\n\n1\t2\t\n", 5, 3),   # blank lines count for the number
    ('a,b\n"1,2"\n', 2, 1),               # a quoted comma is no separator
])
def test_a_ragged_line_is_refused_with_its_line_number(tmp_path: Path, content: str,
                                                       lineno: int, cells: int) -> None:
    error = error_of(tmp_path, content)
    assert error.where == f"params.csv:{lineno}"
    assert f"the line has {cells} cells, the header has" in str(error)
    assert "every line must have as many cells as the header" in str(error)


def test_the_ragged_message_names_the_separator(tmp_path: Path) -> None:
    assert "(separator TAB)" in str(error_of(tmp_path, "a\tb\n1,2\n"))
    assert "(separator '|')" in str(error_of(tmp_path, "a|b\n1\n"))


def test_values_are_kept_exactly_as_written(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "a|b\n  x | y \n'q'|\"r\"\n|\n"))
    assert rows_of(source) == [("  x ", " y "), ("'q'", '"r"'), ("", "")]


def test_blank_lines_are_skipped_and_crlf_is_a_line_end(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "a,b\r\n1,2\r\n\r\n\n3,4\r\n\n"))
    assert rows_of(source) == [("1", "2"), ("3", "4")]


def test_the_last_line_needs_no_line_end(tmp_path: Path) -> None:
    assert rows_of(TableFile(write(tmp_path, "a|b\n1|2\n3|4"))) == [("1", "2"), ("3", "4")]


def test_a_header_only_table_has_no_rows(tmp_path: Path) -> None:
    assert rows_of(TableFile(write(tmp_path, "a|b\n"))) == []


@pytest.mark.parametrize(("value", "said"), [
    (b"x\0y", "NUL"), (b"x\ry", "a carriage return")])
def test_values_with_nul_or_a_carriage_return_are_refused(tmp_path: Path, value: bytes,
                                                          said: str) -> None:
    error = error_of(tmp_path, b"a|b\n1|2\n1|" + value + b"\n")
    assert error.where == "params.csv:3"
    assert f"the value of 'b' {value.decode()!r} holds {said}" in str(error)


def test_a_line_that_is_not_utf8_is_refused_with_its_number(tmp_path: Path) -> None:
    lines = b"a|b\n" + b"x|y\n" * 5000 + b"1|\xff\xfe\n"
    error = error_of(tmp_path, lines)
    assert error.where == "params.csv:5002"
    assert "not UTF-8 text (byte 3)" in str(error)


def test_a_header_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="params.csv:1: the line is not UTF-8"):
        TableFile(write(tmp_path, b"\xffa|b\n"), "params.csv")


def test_utf8_values_are_kept(tmp_path: Path) -> None:
    assert rows_of(TableFile(write(tmp_path, "a|b\nÄ|日本\n"))) == [("Ä", "日本")]


def test_a_line_too_long_is_refused_before_it_is_held(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "MAX_LINE_BYTES", 100)
    error = error_of(tmp_path, "a|b\n" + "1|" + "x" * 200 + "\n")
    assert error.where == "params.csv:2"
    assert "longer than 100 bytes" in str(error)


def test_a_line_of_exactly_the_limit_is_taken(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "MAX_LINE_BYTES", 100)
    line = "1|" + "x" * 97 + "\n"
    assert len(line) == 100
    assert rows_of(TableFile(write(tmp_path, "a|b\n" + line))) == [("1", "x" * 97)]


def test_more_rows_than_allowed_are_refused(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "MAX_ROWS", 3)
    source = TableFile(write(tmp_path, "a\n1\n2\n3\n"), "params.csv")
    assert len(rows_of(source)) == 3
    error = error_of(tmp_path, "a\n1\n2\n3\n4\n")
    assert error.where == "params.csv:5"
    assert "more than 3 rows" in str(error)


def test_each_iteration_is_a_fresh_stream(tmp_path: Path) -> None:
    source = TableFile(write(tmp_path, "a,b\n1,2\n3,4\n"))
    rows = iter(source)
    assert isinstance(rows, types.GeneratorType)
    assert rows_of(source) == rows_of(source) == [("1", "2"), ("3", "4")]
    assert next(rows).values == ("1", "2")


#: What a child process reading the million-row table prints: rows, the last row, and its
#: peak resident memory.
MILLION_READER = """
import sys
from pathlib import Path
from cluster.sweep.table import TableFile
count, last = 0, None
for last in TableFile(Path(sys.argv[1])):
    count += 1
print(count, last.number, last.origin.rsplit(":", 1)[1], "|".join(last.values))
# VmHWM: this process's own peak resident size, in KiB.  Not getrusage's ru_maxrss, which
# on Linux keeps the peak of the forked copy of the parent before exec (a whole pytest
# worker when the Python forks instead of using vfork, as Debian 12's does).
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def test_a_million_rows_stream_in_bounded_memory(tmp_path: Path) -> None:
    """Seed 002 at scale: a million rows are read in a process of its own whose peak
    memory stays that of an idle Python: holding the rows (some 300 bytes each as Row
    objects) would add about 300 MB."""
    path = tmp_path / "big.csv"
    with path.open("w", encoding="utf-8") as out:
        out.write("alpha|n|name\n")
        for i in range(1_000_000):
            out.write(f"{i / 7:.6f}|{i}|run-{i}\n")
    assert path.stat().st_size > 25_000_000
    done = subprocess.run([sys.executable, "-c", MILLION_READER, str(path)],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    summary, peak_kib = done.stdout.splitlines()
    assert summary == f"1000000 1000000 1000001 {999_999 / 7:.6f}|999999|run-999999"
    assert int(peak_kib) < 80_000, f"peak {peak_kib} KiB"


def test_reading_rows_holds_no_more_than_a_line(tmp_path: Path) -> None:
    """The same bound measured exactly: Python's own allocations while 20,000 rows stream."""
    path = write(tmp_path, "a|b\n" + "".join(f"{i}|{'x' * 40}\n" for i in range(20_000)))
    source = TableFile(path)
    tracemalloc.start()
    try:
        count = sum(1 for _ in source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 20_000
    assert peak < 100_000, f"peak {peak} bytes"


# ---------------------------------------------------------------------------------------
# CSV quoting (',' only)


def test_csv_quotes_hold_commas_and_doubled_quotes(tmp_path: Path) -> None:
    content = 'name,sizes,note\n"a,b","1,2,3","say ""hi"""\nplain,x"y,""\n'
    assert rows_of(TableFile(write(tmp_path, content))) == [
        ("a,b", "1,2,3", 'say "hi"'), ("plain", 'x"y', "")]


def test_a_csv_header_may_be_quoted(tmp_path: Path) -> None:
    assert TableFile(write(tmp_path, '"alpha","n"\n')).header == ("alpha", "n")


@pytest.mark.parametrize("line", ['"a,b,1', '"a"x,1'])
def test_bad_csv_quoting_is_refused_with_the_line(tmp_path: Path, line: str) -> None:
    error = error_of(tmp_path, f"a,b\n1,2\n{line}\n")
    assert error.where == "params.csv:3"
    assert "bad CSV quoting" in str(error)


def test_a_quoted_value_cannot_span_lines(tmp_path: Path) -> None:
    error = error_of(tmp_path, 'a,b\n"x\ny",1\n')
    assert error.where == "params.csv:2"


@pytest.mark.parametrize("separator", ["|", "\t"])
def test_quotes_are_plain_characters_with_tab_and_bar(tmp_path: Path, separator: str) -> None:
    content = f"a{separator}b\n\"x{separator}y\"\n"
    assert rows_of(TableFile(write(tmp_path, content))) == [('"x', 'y"')]


# ---------------------------------------------------------------------------------------
# Axes


def test_axes_are_the_cross_product_first_axis_slowest() -> None:
    axes = Axes.from_toml({"alpha": [0.1, 0.2], "n": [10, 100], "mode": ["x"]}, "s.toml")
    assert axes.header == ("alpha", "n", "mode")
    assert axes.count == 4
    assert list(axes) == [
        Row(1, ("0.1", "10", "x"), "s.toml [axes]"), Row(2, ("0.1", "100", "x"), "s.toml [axes]"),
        Row(3, ("0.2", "10", "x"), "s.toml [axes]"), Row(4, ("0.2", "100", "x"), "s.toml [axes]")]


def test_axis_values_are_written_as_text() -> None:
    axes = Axes.from_toml({"v": [1, -7, 1e3, 0.1, 2.5e-9, True, False, "1e3", " s "]}, "s")
    assert [row.values[0] for row in axes] == [
        "1", "-7", "1000.0", "0.1", "2.5e-09", "true", "false", "1e3", " s "]


def test_axes_stream_without_making_the_product() -> None:
    axes = Axes.from_toml({f"a{i}": list(range(10)) for i in range(7)}, "s")
    assert axes.count == 10_000_000
    assert isinstance(iter(axes), types.GeneratorType)
    first = list(itertools.islice(axes, 2))
    assert [row.values for row in first] == [("0",) * 7, ("0",) * 6 + ("1",)]


@pytest.mark.parametrize(("axes", "key", "message"), [
    ({}, "axes", "has no axis"),
    ({"a": 1}, "axes.a", "got an integer, expected a list of values"),
    ({"a": "x"}, "axes.a", "got a string, expected a list"),
    ({"a": {"b": 1}}, "axes.a", "got a table"),
    ({"a": []}, "axes.a", "the axis has no value"),
    ({"a": [[1, 2]]}, "axes.a", "is a list: expected a string, an integer"),
    ({"a": [{"x": 1}]}, "axes.a", "is a table"),
    ({"a": [1, "1"]}, "axes.a", "the value '1' is there twice"),
    ({"a": ["x\0"]}, "axes.a", "holds NUL"),
    ({"a": ["x\ny"]}, "axes.a", "holds a line feed"),
    ({"a b": [1]}, 'axes."a b"', "name 'a b' is not usable"),
    ({"1a": [1]}, "axes.1a", "name '1a' is not usable"),
])
def test_bad_axes_are_refused_naming_the_key(axes: dict[str, object], key: str,
                                             message: str) -> None:
    with pytest.raises(SweepError) as info:
        Axes.from_toml(axes, "sweep.toml")
    assert info.value.where == "sweep.toml"
    assert info.value.key == key
    assert message in str(info.value)


def test_too_many_combinations_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "MAX_ROWS", 5)
    assert Axes.from_toml({"a": [1, 2], "b": [1, 2]}, "s").count == 4
    with pytest.raises(SweepError, match="the axes make 6 combinations: at most 5"):
        Axes.from_toml({"a": [1, 2], "b": [1, 2, 3]}, "s")


def test_too_many_axes_are_refused() -> None:
    axes = {f"a{i}": [1] for i in range(table.MAX_COLUMNS + 1)}
    with pytest.raises(SweepError, match=f"at most {table.MAX_COLUMNS}"):
        Axes.from_toml(axes, "s")
