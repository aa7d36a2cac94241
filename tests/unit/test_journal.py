"""The results journal: what a master accepted survives it, torn tails are dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.master.files import journal
from cluster.records import JobResult

MD5 = "0123456789abcdef0123456789abcdef"


def res(i: int, machine: str = "n1") -> JobResult:
    return JobResult(f"t{i}.ps.ppmraw.72.0", 0, 0.25, 0, 0, MD5, "gs pdfwrite", machine)


def test_results_survive_reopening_for_the_same_run(tmp_path: Path) -> None:
    path = tmp_path / "results"
    j = journal.Journal(path, "run-a")
    j.append([res(1), res(2)])
    j.append([res(3, "n2")])
    j.close()
    again = journal.Journal(path, "run-a")
    assert again.loaded == [res(1), res(2), res(3, "n2")]
    again.close()


def test_results_are_on_disk_before_close(tmp_path: Path) -> None:
    """append() writes through at once: a master killed now has lost nothing."""
    path = tmp_path / "results"
    j = journal.Journal(path, "run-a")
    j.append([res(1)])
    assert journal.load(path, "run-a") == [res(1)]
    j.close()


def test_another_runs_journal_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "results"
    journal.Journal(path, "old").append([res(1)])
    j = journal.Journal(path, "new")
    assert j.loaded == []
    assert path.read_text() == "run new\n"
    j.close()


def test_torn_last_line_is_dropped_and_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "results"
    j = journal.Journal(path, "r")
    j.append([res(1)])
    j.close()
    with open(path, "a") as fh:
        fh.write("n1 result t9.ps.ppm")  # the machine died mid-write
    again = journal.Journal(path, "r")
    assert again.loaded == [res(1)]
    again.append([res(2)])
    again.close()
    assert journal.load(path, "r") == [res(1), res(2)]


def test_bad_lines_are_skipped_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "results"
    path.write_text("run r\ngarbage line\nn1 result t1.ps.ppmraw.72.0 0 0.25 0.00 0.00 "
                    f"{MD5} gs\n")
    assert [r.name for r in journal.load(path, "r") or []] == ["t1.ps.ppmraw.72.0"]


def test_missing_journal_loads_as_none(tmp_path: Path) -> None:
    assert journal.load(tmp_path / "nothing", "r") is None


def test_lines_are_canonical_and_write_appends_them(tmp_path: Path) -> None:
    path = tmp_path / "results"
    j = journal.Journal(path, "r")
    j.write(b"n1 result t1.ps.ppmraw.72.0 0 0.25 0.00 0.00 " + MD5.encode() + b" gs\n")
    j.append([res(2)])
    j.close()
    with open(path, "a") as fh:
        fh.write(f"n2 result t3.ps.ppmraw.72.0 0 .5 0 0 {MD5} gs\n")  # valid, not canonical
    assert journal.load_lines(path, "r") == [
        f"n1 result t1.ps.ppmraw.72.0 0 0.25 0.00 0.00 {MD5} gs",
        f"n1 result t2.ps.ppmraw.72.0 0 0.25 0.00 0.00 {MD5} gs pdfwrite",
        f"n2 result t3.ps.ppmraw.72.0 0 0.50 0.00 0.00 {MD5} gs"]
    again = journal.Journal(path, "r")
    assert [r.name for r in again.loaded] == [f"t{i}.ps.ppmraw.72.0" for i in (1, 2, 3)]
    again.close()


def test_a_torn_tail_longer_than_the_read_block_is_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "results"
    journal.Journal(path, "r").append([res(1)])
    with open(path, "a") as fh:
        fh.write("n1 result " + "x" * 200000)
    j = journal.Journal(path, "r")
    j.close()
    assert path.read_text().endswith(" gs pdfwrite\n")


def test_line_format_round_trips() -> None:
    """The journal owns its line format: made, split and parsed back here."""
    line = journal.format_line(res(1))
    assert line == f"n1 result t1.ps.ppmraw.72.0 0 0.25 0.00 0.00 {MD5} gs pdfwrite"
    assert journal.split_line(line) == ("n1", journal.result_text(res(1)))
    assert journal.journal_result(line) == res(1)
    assert journal.journal_line("", "x") == "- result x"  # no machine: "-"
    with pytest.raises(ValueError, match="result"):
        journal.split_line("n1 garbage t1")
