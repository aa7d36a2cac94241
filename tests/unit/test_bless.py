"""Blessed outputs (cluster.console.bless; docs/operating.md, "Accepting an intended change:
`clusteradmin bless`"): the record's lines, the table merges it relies on, and on a real
home: the baseline rows rewritten, the record appended, history showing it, and later
comparisons against the blessed result."""

from __future__ import annotations

import calendar
import time
from pathlib import Path

import pytest

from cluster.cli import clusteradmin
from cluster.console import admin, bless
from cluster.console.bless import Blessing
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.end import streamtables
from cluster.report import compare, tab
from cluster.report.tab import TabFile, TabRow, read_tab, write_tab
from tests.unit.test_console_status import archive

T = "ex__golfer.eps.ppmraw.72.0"
U = "ex__tiger.eps.ppmraw.72.0"
V = "ex__chess.ps.pgmraw.72.0"
A, B, C = "a" * 32, "b" * 32, "c" * 32
#: The blessing's time: after every run id below, before the later runs'.
BLESSED_AT = float(calendar.timegm(time.strptime("2027-01-01 00:00:10", "%Y-%m-%d %H:%M:%S")))


def line(name: str, md5: str = A, error: int = 0, machine: str = "n1") -> str:
    return TabRow(name, error, 0.1, 0.0, 0.0, md5, "r", "gs", machine).line()


def rows(*lines: str) -> dict[str, TabRow]:
    return {TabRow.parse(x).name: TabRow.parse(x) for x in lines}


# ------------------------------------------------------------------ pure parts
def test_a_blessing_line_round_trips_with_its_reason_on_one_line() -> None:
    b = Blessing(BLESSED_AT, "ann@host", "20270101000003-p0-0003", T, 0, B,
                 ("current.tab", "user-ann.tab"), "new\tanti-aliasing\n  in the ppm device")
    back = Blessing.parse(b.line())
    assert back.reason == "new anti-aliasing in the ppm device"
    assert back == Blessing(BLESSED_AT, "ann@host", b.run, T, 0, B, b.tables, back.reason)
    assert b.to_json()["when"] == "2027-01-01 00:00:10 UTC"
    with pytest.raises(ValueError):
        Blessing.parse("too\tfew\tfields")


def test_with_rows_replaces_and_adds_rows_in_name_order(tmp_path: Path) -> None:
    path = tmp_path / "current.tab"
    write_tab(path, rows(line(T, A), line(U, A)).values())
    new = rows(line(T, B), line(V, C))
    assert list(tab.with_rows(TabFile(path), new)) == [line(V, C), line(T, B), line(U, A)]
    assert list(tab.with_rows(None, new)) == [line(V, C), line(T, B)]


def test_the_three_way_merge_keeps_the_runs_rows_and_the_rewrite_of_the_others() -> None:
    base = rows(line(T, A), line(U, A), line(V, A))
    ours = rows(line(T, C), line(U, A))  # the run changed T, removed V
    theirs = rows(line(T, B), line(U, B), line(V, B))  # blessed all three
    assert list(tab.rebased_lines(base, ours, theirs)) == [line(T, C), line(U, B)]


# ------------------------------------------------------------------ on a home
def make_home(tmp_path: Path) -> Home:
    """A baseline at A (auto run 1), a commit run 2 that changed T to B (and so the
    baseline), then a git run 3 that changed T to C: the baseline holds C."""
    home = Home(tmp_path / "home")
    home.create()
    archive(home, "20270101000001-p2-0001", "auto nightly gs", "done",
            rows=[line(T, A), line(U, A)])
    archive(home, "20270101000002-p1-0002", "git 2222222 gs", "done",
            rows=[line(T, B), line(U, A)])
    archive(home, "20270101000003-p1-0003", "git 3333333 gs", "done",
            rows=[line(T, C), line(U, A)])
    write_tab(home.tables / "current.tab", rows(line(T, C), line(U, A)).values())
    return home


def test_bless_rewrites_the_baseline_rows_and_appends_the_record(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    done = bless.bless(home, "20270101000002-p1-0002", ["ex/golfer.eps.ppmraw.72.0"],
                       "B is right after all", "ann@host", now=BLESSED_AT)
    assert [(b.test, b.md5, b.tables) for b in done] == [(T, B, ("current.tab",))]
    table = read_tab(home.tables / "current.tab")
    assert table[T].line() == line(T, B) and table[U].line() == line(U, A)
    assert bless.read(home.tables) == done
    # A second blessing appends: the record is never rewritten.
    bless.bless(home, "20270101000003-p1-0003", [T], "no, C", "bob@host", now=BLESSED_AT + 1)
    assert [b.who for b in bless.read(home.tables)] == ["ann@host", "bob@host"]
    assert read_tab(home.tables / "current.tab")[T].md5 == C


def test_history_shows_the_blessing_and_counts_from_it(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    bless.bless(home, "20270101000002-p1-0002", [T], "B is right", "ann@host",
                now=BLESSED_AT)
    # Later runs: one reproduces the blessed B (no change), the next one differs again.
    archive(home, "20270101000011-p1-0004", "git 4444444 gs", "done",
            rows=[line(T, B), line(U, A)])
    archive(home, "20270101000012-p1-0005", "git 5555555 gs", "done",
            rows=[line(T, C), line(U, A)])
    data = admin.history(home, T)
    assert [(c["run"], c["change"], c["against"]) for c in data["changes"]] == [
        # 0004 equals the blessed B: no change; 0005 differs from it again.
        ("20270101000012-p1-0005", "md5", "20270101000011-p1-0004"),
        ("20270101000003-p1-0003", "md5", "20270101000002-p1-0002"),
        ("20270101000002-p1-0002", "md5", "20270101000001-p2-0001"),
        ("20270101000001-p2-0001", "new", None)]
    text = admin.format_history(data)
    assert ("  blessed by ann@host at 2027-01-01 00:00:10 UTC: B is right "
            "(run 20270101000002-p1-0002)") in text


def test_a_later_run_equal_to_the_blessed_md5_is_no_difference(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    bless.bless(home, "20270101000002-p1-0002", [T], "B is right", "ann@host")
    baseline = TabFile(home.tables / "current.tab")
    same = compare.analyse(rows(line(T, B), line(U, A)), baseline)
    assert same.changed() == [] and same.started_errors == []
    other = compare.analyse(rows(line(T, C), line(U, A)), baseline)
    assert other.changed() == [T]
    errored = compare.analyse(rows(line(T, error=1), line(U, A)), baseline)
    assert errored.started_errors == [T]


def test_without_tests_every_test_the_run_reported_is_blessed(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    # A commit run: the tests that differ from the baseline now (T, not U).
    done = bless.bless(home, "20270101000002-p1-0002", [], "B", "ann@host")
    assert [b.test for b in done] == [T]
    # A user run: its changed.lst, and both tables it was compared with.
    folder = archive(home, "20270101000013-p0-0006", "user ann gs", "done",
                     rows=[line(T, C), line(U, B), line(V, B)])
    (folder / "changed.lst").write_text(f"{U} gs\n{V} gs\n")
    write_tab(home.tables / "user-ann.tab", rows(line(U, C)).values())
    done = bless.bless(home, "20270101000013-p0-0006", [], "user's change", "ann@host")
    assert [(b.test, b.tables) for b in done] == [
        (V, ("current.tab", "user-ann.tab")), (U, ("current.tab", "user-ann.tab"))]
    assert read_tab(home.tables / "current.tab")[U].md5 == B
    assert set(read_tab(home.tables / "user-ann.tab")) == {U, V}


def test_refusals_change_nothing(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    archive(home, "20270101000014-p1-0007", "git 7777777 gs", "failed")
    archive(home, "20270101000015-p1-0008", "git 8888888 gs", "done", rows=[line(U, A)])
    before = (home.tables / "current.tab").read_bytes()
    cases = [
        ("20270101000002-p1-0002", [T], "  ", "needs a reason"),
        ("20270101000099-p1-0099", [T], "r", "unknown run"),
        ("../x", [T], "r", "unknown run"),
        ("20270101000014-p1-0007", [T], "r", "has no archived table"),
        ("20270101000002-p1-0002", ["ex__nope"], "r", "not in run"),
        ("20270101000015-p1-0008", [], "r", "reported no changed test"),
    ]
    for run, tests, reason, message in cases:
        with pytest.raises(ClusterError, match=message):
            bless.bless(home, run, tests, reason, "ann@host")
    assert (home.tables / "current.tab").read_bytes() == before
    assert bless.read(home.tables) == []


def test_the_command_blesses_and_refuses_clearly(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    home = make_home(tmp_path)
    base = ["--home", str(home.root), "bless"]
    assert clusteradmin.main([*base, "20270101000002-p1-0002", T]) == 2  # no --reason
    assert "needs --reason" in capsys.readouterr().err
    assert clusteradmin.main([*base, "20270101000099-p1-0099", T, "--reason", "r"]) == 1
    assert "unknown run" in capsys.readouterr().err
    assert clusteradmin.main([*base, "20270101000002-p1-0002", T, "--reason", "ok"]) == 0
    assert "blessed 1 test(s) of run 20270101000002-p1-0002 into current.tab" \
        in capsys.readouterr().out
    assert clusteradmin.main(["--home", str(home.root), "history", T]) == 0
    assert "blessed by " in capsys.readouterr().out


def test_a_run_ending_meanwhile_keeps_the_blessing(tmp_path: Path) -> None:
    """The end of a run stages its tables from the baseline; a blessing before they are
    installed is rebased on, not undone: the run's rows win, the blessed ones stay."""
    home = make_home(tmp_path)
    stage = tmp_path / "stage"
    stage.mkdir()
    run_tab = tmp_path / "run.tab"
    new = rows(line(U, C))  # the ending run has only U
    write_tab(run_tab, new.values())
    current = home.tables / "current.tab"
    streamtables.stage_stream(stage, current, TabFile(current), new, ("pdfwrite",), run_tab)
    bless.bless(home, "20270101000002-p1-0002", [T, U], "B and A", "ann@host")
    assert streamtables.install_tables(stage, home.tables) == ["previous.tab", "current.tab"]
    assert read_tab(current) == rows(line(T, B), line(U, C))
    assert read_tab(home.tables / "previous.tab") == rows(line(T, B), line(U, A))
