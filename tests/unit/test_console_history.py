"""A test's history (cluster.console.history): which runs changed it, against what, and the
bisection that finds its row in a name-ordered .tab without reading the file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.console import admin, history
from cluster.console.history import Result, lookup
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.report.tab import TabRow, write_tab
from tests.unit.test_console_status import archive

T = "ex__golfer.eps.ppmraw.72.0"
U = "ex__tiger.eps.ppmraw.72.0"


def line(name: str, md5: str = "a" * 32, error: int = 0, machine: str = "n1") -> str:
    return TabRow(name, error, 0.1, 0.0, 0.0, md5, "r", "gs", machine).line()


def test_the_bisection_finds_every_row_and_no_missing_one(tmp_path: Path) -> None:
    rng = random.Random(12)
    names = sorted({f"ex__{rng.randrange(10**9):09d}{rng.choice(['', '.ps', '__x'])}"
                    f".ppmraw.72.{rng.randrange(2)}" for _ in range(30000)})
    names += ["ex__a", "ex__a.b", "ex__a__b", "ex__a.b.c"]  # prefixes of each other
    rows = [TabRow(n, int(i % 7 == 0), 0.1, 0.0, 0.0, f"{i:032x}", "r", "gs", f"m{i % 3}")
            for i, n in enumerate(names)]
    path = tmp_path / "big.tab"
    write_tab(path, rows)
    assert path.stat().st_size > 1_000_000
    by_name = {r.name: r for r in rows}
    for name in list(by_name)[::97] + ["ex__a", "ex__a.b", "ex__a__b", "ex__a.b.c",
                                        sorted(by_name)[0], sorted(by_name)[-1]]:
        r = by_name[name]
        assert lookup(path, name.encode()) == Result(r.error, r.md5 if not r.error else "0",
                                                     "gs", r.machine), name
    for missing in ("", "a", "ex__", "ex__a.", "ex__a.b.", "ex__0", "zzz", "ex__9999999999"):
        assert lookup(path, missing.encode()) is None
    assert lookup(tmp_path / "none.tab", b"x") is None
    (tmp_path / "empty.tab").write_text("")
    assert lookup(tmp_path / "empty.tab", b"x") is None


def test_changes_follow_the_streams_the_reports_compare(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    A, B, C = "a" * 32, "b" * 32, "c" * 32

    def run(run_id: str, queue: str, rows: list[str] | None, outcome: str = "done",
            report: str = "report\n") -> None:
        archive(home, run_id, queue, outcome, rows=rows, report=report)

    run("20270101000001-p2-0001", "auto nightly gs", [line(T, A), line(U, A)])
    run("20270101000002-p1-0002", "git 1111111 gs", [line(T, A), line(U, A)])
    run("20270101000003-p0-0003", "user alice gs", [line(T, B), line(U, A)])
    run("20270101000004-p1-0004", "git 2222222 gs", [line(T, C), line(U, A)],
        report="Regression git 2222222\n\ncommit 2222222\nAuthor: Ann Dev <ann@x.org>\n")
    run("20270101000005-p0-0005", "user alice gs", [line(T, C), line(U, A)])
    run("20270101000006-p1-0006", "git 3333333 gs", None, outcome="failed")
    run("20270101000007-p1-0007", "git 4444444 gs", [line(T, C), line(U, A)],
        outcome="aborted")  # incomplete: changed no table
    run("20270101000008-p1-0008", "git 5555555 gs", [line(T, error=1)])
    run("20270101000009-p1-0009", "git 6666666 gs", [line(T, error=2)])
    run("20270101000010-p1-000a", "git 7777777 pdfwrite", [line("ex__other", A)])

    changes = history.history(home, T)
    got = [(c.run, c.change, c.against, c.stream) for c in changes]
    assert got == [
        ("20270101000009-p1-0009", "error", "20270101000008-p1-0008", "baseline"),
        ("20270101000008-p1-0008", "error and md5", "20270101000004-p1-0004", "baseline"),
        # Alice's second run equals the baseline of its time (commit 2222222): no change.
        ("20270101000004-p1-0004", "md5", "20270101000002-p1-0002", "baseline"),
        ("20270101000003-p0-0003", "md5", "20270101000002-p1-0002", "user alice"),
        ("20270101000001-p2-0001", "new", None, "baseline"),
    ]
    by_run = {c.run: c for c in changes}
    assert by_run["20270101000004-p1-0004"].who == "2222222"
    assert by_run["20270101000004-p1-0004"].author == "Ann Dev <ann@x.org>"
    assert by_run["20270101000003-p0-0003"].kind == "user"
    assert by_run["20270101000003-p0-0003"].who == "alice"
    assert by_run["20270101000001-p2-0001"].who == "nightly"
    assert by_run["20270101000001-p2-0001"].before is None
    assert by_run["20270101000004-p1-0004"].before == Result(0, A, "gs", "n1")
    assert by_run["20270101000004-p1-0004"].after == Result(0, C, "gs", "n1")
    assert by_run["20270101000008-p1-0008"].after == Result(1, "0", "gs", "n1")
    assert by_run["20270101000001-p2-0001"].to_json()["after"]["md5"] == A
    # The report's form of the name works too; a test that never changed is only "new".
    assert [c.run for c in history.history(home, "ex/tiger.eps.ppmraw.72.0")] == [
        "20270101000001-p2-0001"]


def test_a_user_run_without_a_baseline_compares_with_the_users_previous_run(
        tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    archive(home, "20270101000001-p0-0001", "user bob gs", "done", rows=[line(U, "1" * 32)])
    archive(home, "20270101000002-p0-0002", "user carol gs", "done", rows=[line(U, "9" * 32)])
    archive(home, "20270101000003-p0-0003", "user bob gs", "done", rows=[line(U, "1" * 32)])
    archive(home, "20270101000004-p0-0004", "user bob gs", "done", rows=[line(U, "2" * 32)])
    got = [(c.run, c.change, c.against) for c in history.history(home, U)]
    assert got == [("20270101000004-p0-0004", "md5", "20270101000003-p0-0003"),
                   ("20270101000002-p0-0002", "new", None),
                   ("20270101000001-p0-0001", "new", None)]


def test_an_unknown_test_is_an_error_naming_it(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    archive(home, "20270101000001-p2-0001", "auto nightly gs", "done", rows=[line(T)])
    with pytest.raises(ClusterError, match="test 'ex__nope.ps' is in none of the 1 archived"):
        history.history(home, "ex/nope.ps")
    with pytest.raises(ClusterError, match="without spaces"):
        history.history(home, "two words")
    with pytest.raises(ClusterError, match="none of the 0 archived"):
        history.history(Home(tmp_path / "empty"), T)


def test_the_history_text_names_only_what_changed() -> None:
    """A change of md5 alone once printed "error 0 -> 0"."""
    from cluster.console.admin import format_history

    change = {"run": "20270101000000-p2-0001", "kind": "auto", "who": "nightly",
              "change": "changed", "against": "20261231000000-p2-0001"}
    lines = format_history({"test": "t.ps", "changes": [
        {**change, "before": {"error": 0, "md5": "a" * 32}, "after": {"error": 0, "md5": "b" * 32}},
        {**change, "before": {"error": 0, "md5": "b" * 32}, "after": {"error": 5, "md5": "0"}},
    ]})
    assert lines[1].endswith(f"changed: md5 {'a' * 32} -> {'b' * 32} (against "
                             "20261231000000-p2-0001)")
    assert "error 0 -> 0" not in "\n".join(lines)
    assert f"error 0 -> 5, md5 {'b' * 32} -> 0" in lines[2]


def test_times_lists_a_tests_times_in_every_archived_run_newest_first(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()

    def timed(name: str, t1: float, t2: float = 0.0, error: int = 0,
              machine: str = "n1") -> str:
        return TabRow(name, error, t1, t2, 0.0, "a" * 32, "r", "gs", machine).line()

    archive(home, "20270101000001-p2-0001", "auto nightly gs", "done",
            rows=[timed(T, 1.0), timed(U, 5.0)])
    archive(home, "20270101000002-p0-0002", "user alice gs", "done",
            rows=[timed(T, 1.5, 0.25, machine="n2")])
    archive(home, "20270101000003-p1-0003", "git 1111111 gs", "aborted",
            rows=[timed(T, 99.0)])  # an incomplete run changed no table: left out
    archive(home, "20270101000004-p1-0004", "git 2222222 gs", "done", rows=[timed(U, 1.0)])
    archive(home, "20270101000005-p1-0005", "git 3333333 gs", "done",
            rows=[timed(T, 4.0, error=3)])
    found = history.times(home, "ex/golfer.eps.ppmraw.72.0")
    assert [(t.run[-4:], t.kind, t.who, t.seconds, t.error, t.machine) for t in found] == [
        ("0005", "git", "3333333", 4.0, 3, "n1"),
        ("0002", "user", "alice", 1.75, 0, "n2"),
        ("0001", "auto", "nightly", 1.0, 0, "n1")]
    lines = admin.format_history_times(admin.history_times(home, T))
    assert lines[0].startswith(f"test {T}: its times in 3 archived run(s), newest first")
    assert "20270101000002-p0-0002  user alice  1.75 s (1.50 0.25 0.00)  on n2" in lines[2]
    assert "error 3" in lines[1]
    with pytest.raises(ClusterError, match="none of the 4 archived run tables"):
        history.times(home, "ex__nothing")
