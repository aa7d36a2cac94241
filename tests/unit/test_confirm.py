"""Differences confirmed and indeterminate tests (docs/results.md, "Differences confirmed,
indeterminate tests named"): the pure decisions (which tests are run again, the verdict from
md5s, the report's section and top line, the record of indeterminate tests) and the confirm
phase over a real run state, plan and journal files."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.master.files import confirmplan
from cluster.master.files.journal import Journal
from cluster.master.serve import confirm
from cluster.master.serve.handler import RequestHandler, RunSession
from cluster.master.state.runstate import RunState
from cluster.records import Job, JobResult
from cluster.report import compare, indeterminate
from cluster.report.indeterminate import Flaky, Kind, Verdict, judge
from cluster.report.tab import TabRow, write_tab
from cluster.runoptions import RunOptionError, RunOptions
from cluster.runspec import RunSpec
from cluster.wire import protocol
from cluster.wire.protocol import Request

RUN = "20260101000000-p0-abcd"
OLD, NEW, OTHER = "a" * 32, "b" * 32, "c" * 32


# ---------------------------------------------------------------- the pure decisions
def test_choose_runs_again_the_first_tests_up_to_the_cap() -> None:
    assert confirmplan.choose(["a", "b", "c"], 2) == (["a", "b"], ["c"])
    assert confirmplan.choose(["a"], 50) == (["a"], [])
    assert confirmplan.choose([], 50) == ([], [])


def test_the_same_new_md5_twice_is_a_confirmed_change() -> None:
    v = judge("t", OLD, (NEW, "node1"), (NEW, "node2"))
    assert v.kind is Kind.CONFIRMED and v.nodes == ("node1", "node2")
    assert v.digests == (OLD, NEW, NEW)


def test_a_second_md5_that_differs_makes_the_test_indeterminate() -> None:
    assert judge("t", OLD, (NEW, "n1"), (OTHER, "n2")).kind is Kind.INDETERMINATE
    # Back to the baseline's output: the change did not reproduce either.
    back = judge("t", OLD, (NEW, "n1"), (OLD, "n2"))
    assert back.kind is Kind.INDETERMINATE and back.digests == (OLD, NEW, OLD)


def test_no_second_result_or_a_failed_one_leaves_the_change_unconfirmed() -> None:
    none = judge("t", OLD, (NEW, "n1"), None, "its node left")
    assert none.kind is Kind.UNCONFIRMED and none.why == "its node left"
    failed = judge("t", OLD, (NEW, "n1"), ("error 3", "n2"))
    assert failed.kind is Kind.UNCONFIRMED and "ended with error 3" in failed.why
    # An error both times is the same digest: a confirmed change to an error.
    both = judge("t", OLD, ("error 1", "n1"), ("error 1", "n2"))
    assert both.kind is Kind.CONFIRMED


def test_a_verdict_line_reads_back() -> None:
    for v in (judge("t__x.ps", OLD, (NEW, "n1"), (OTHER, "n2")),
              judge("t", OLD, (NEW, "n1"), None, "over confirm_max (50 tests run again)")):
        assert Verdict.parse(v.line()) == v


def comparison() -> compare.Comparison:
    current = {name: TabRow(name, 0, 0, 0, 0, NEW, "r2", "gs", "n1")
               for name in ("a.ps", "b.ps", "c.ps")}
    previous = {name: TabRow(name, 0, 0, 0, 0, OLD if name != "c.ps" else NEW, "r1", "gs",
                             "n1") for name in current}
    return compare.analyse(current, previous)


def test_indeterminate_tests_are_taken_out_of_the_differences() -> None:
    c = comparison()
    assert c.differing() == ["a.ps", "b.ps"]
    assert indeterminate.without(c, {"a.ps"}).differing() == ["b.ps"]
    assert indeterminate.without(c, set()) is c


def test_the_report_line_when_a_run_differs_only_in_known_indeterminate_tests() -> None:
    c = comparison()
    assert indeterminate.known_only_line(c, {"a.ps", "b.ps", "z"}) == \
        "differs only in known-indeterminate tests: a.ps, b.ps"
    assert indeterminate.known_only_line(c, {"a.ps"}) == ""  # b.ps is a real change
    nothing = indeterminate.without(c, {"a.ps", "b.ps"})
    assert indeterminate.known_only_line(nothing, {"a.ps", "b.ps"}) == ""


def test_the_section_lists_indeterminate_tests_then_each_verdict() -> None:
    text = indeterminate.section([
        judge("x__r.ps", OLD, (NEW, "node1"), (OTHER, "node2")),
        judge("x__t.ps", OLD, (NEW, "node1"), (NEW, "node2")),
        judge("x__u.ps", OLD, (NEW, "node1"), None, "over confirm_max (1 tests run again)")])
    assert f"x/r.ps md5s: {OLD} (baseline), {NEW} (node1), {OTHER} (node2)\n" in text
    assert "x/t.ps confirmed on node2\n" in text
    assert "x/u.ps changed, unconfirmed: over confirm_max (1 tests run again)\n" in text
    assert text.index("indeterminate") < text.index("confirmed on")
    assert indeterminate.section([]) == ""


def test_the_record_is_newest_first_bounded_and_never_doubled(tmp_path: Path) -> None:
    def flaky(when: float, run: str, test: str) -> Flaky:
        return Flaky(when, run, test, ("n1", "n2"), (OLD, NEW, OTHER))

    assert indeterminate.read(tmp_path) == []
    assert indeterminate.record(tmp_path, [flaky(10, "r1", "a"), flaky(10, "r1", "b")], 3) == 2
    assert indeterminate.record(tmp_path, [flaky(10, "r1", "a")], 3) == 0  # a redone end
    assert indeterminate.record(tmp_path, [flaky(20, "r2", "a"), flaky(30, "r3", "c")], 3) == 2
    found = indeterminate.read(tmp_path)
    assert [(f.run, f.test) for f in found] == [("r3", "c"), ("r2", "a"), ("r1", "b")]
    assert indeterminate.known(tmp_path) == {"a", "b", "c"}
    assert found[0].to_json()["digests"] == [OLD, NEW, OTHER]


# ---------------------------------------------------------------- the confirm phase
def jobs() -> list[Job]:
    return [Job(f"t{i}.ps", f"__temp__/t{i}.log", f"echo {i}") for i in range(3)]


def req(node: str, **kw: object) -> Request:
    kw.setdefault("job_id", RUN)
    kw.setdefault("built", RUN)
    return Request(node=node, slots=1, **kw)  # type: ignore[arg-type]


def result(name: str, node: str, md5: str) -> JobResult:
    return JobResult(name, 0, 0.1, 0, 0, md5, "gs", node)


def served_run(tmp_path: Path, md5s: dict[str, str]) -> tuple[Home, RunState]:
    """A home whose user alice's previous push gave OLD for every test, and a run state in
    which nodes a and b returned ``md5s`` (a: t0 and t1, b: t2)."""
    home = Home(tmp_path / "home")
    home.create()
    write_tab(home.tables / "user-alice.tab",
              [TabRow(j.name, 0, 0, 0, 0, OLD, "r1", "gs", "a") for j in jobs()])
    home.run_dir(RUN).mkdir(parents=True)
    state = RunState(RUN, jobs(), 0.0)
    for node in ("a", "b"):
        assert state.handle(req(node), 0.0).reply.verb == protocol.BUILD
    state.hold_end = True
    handed = {"a": state.handle(req("a"), 0.0).reply, "b": state.handle(req("b"), 0.0).reply}
    for node, reply in handed.items():
        done = tuple(result(line.split(" ")[0], node, md5s[line.split(" ")[0]])
                     for line in reply.jobs)
        state.handle(req(node, results=done), 1.0)
    assert state.all_results_in
    return home, state


def phase(home: Home, state: RunState, cfg: Config | None = None) -> confirm.ConfirmPhase:
    handler = RequestHandler(1 << 16, 1000, lambda: 0.0)
    return confirm.ConfirmPhase(cfg or Config(home=home.root), home,
                                RunSpec.parse("user alice gs"), state, handler,
                                cast(RunSession, None))


def test_the_changed_tests_are_run_again_on_the_other_node_and_judged(
        tmp_path: Path) -> None:
    home, first = served_run(tmp_path, {"t0.ps": NEW, "t1.ps": OLD, "t2.ps": NEW})
    # While the master may still confirm, nodes are not told to upload.
    assert first.handle(req("a"), 2.0).reply.verb == protocol.CONTINUE
    assert not first.finished(2.0)
    confirming = phase(home, first)
    main = Journal(home.results(0), RUN)
    state, jrnl = confirming.serving(first, main, 2.0)
    assert state is not first and state.confirming and jrnl is not main
    assert sorted(state.jobs.names) == ["t0.ps", "t2.ps"]  # t1 did not change
    # Node a made t0's first result: it gets t2 only; b gets t0.
    assert [line.split(" ")[0] for line in state.handle(req("a"), 3.0).reply.jobs] == \
        ["t2.ps"]
    assert [line.split(" ")[0] for line in state.handle(req("b"), 3.0).reply.jobs] == \
        ["t0.ps"]
    jrnl.write(state.handle(req("a", results=(result("t2.ps", "a", OTHER),)), 4.0).journal)
    jrnl.write(state.handle(req("b", results=(result("t0.ps", "b", NEW),)), 4.0).journal)
    assert state.all_results_in
    assert state.handle(req("a"), 5.0).reply.verb == protocol.UPLOAD  # now they upload
    confirming.close()
    main.close()
    verdicts = {v.test: v for v in confirmplan.verdicts(home.run_dir(RUN), RUN)}
    assert verdicts["t0.ps"].kind is Kind.CONFIRMED and verdicts["t0.ps"].nodes == ("a", "b")
    assert verdicts["t2.ps"].kind is Kind.INDETERMINATE
    assert verdicts["t2.ps"].digests == (OLD, NEW, OTHER)


def test_a_successor_master_continues_the_confirm_phase_from_its_files(
        tmp_path: Path) -> None:
    home, first = served_run(tmp_path, {"t0.ps": NEW, "t1.ps": NEW, "t2.ps": OLD})
    confirming = phase(home, first)
    main = Journal(home.results(0), RUN)
    state, jrnl = confirming.serving(first, main, 2.0)
    state.handle(req("b"), 3.0)
    jrnl.write(state.handle(req("b", results=(result("t0.ps", "b", NEW),)), 4.0).journal)
    confirming.close()  # the master dies here: t1 has no second result yet
    main.close()
    successor = RunState(RUN, jobs(), 10.0, done=[f"- result {name} 0 0.1 0 0 {md5} gs"
                                                  for name, md5 in (("t0.ps", NEW),
                                                                    ("t1.ps", NEW),
                                                                    ("t2.ps", OLD))])
    again = phase(home, successor)
    state2, _ = again.serving(successor, Journal(home.results(0), RUN), 10.0)
    assert state2.results.count == 1 and state2.pending == ["t1.ps"]
    again.close()


def test_no_baseline_or_nothing_changed_means_no_confirm_phase(tmp_path: Path) -> None:
    home, first = served_run(tmp_path, {"t0.ps": OLD, "t1.ps": OLD, "t2.ps": OLD})
    confirming = phase(home, first)
    main = Journal(home.results(0), RUN)
    assert confirming.serving(first, main, 2.0) == (first, main)
    assert not first.hold_end and first.handle(req("a"), 3.0).reply.verb == protocol.UPLOAD
    assert confirmplan.verdicts(home.run_dir(RUN), RUN) == []
    (home.tables / "user-alice.tab").unlink()
    fresh = RunState(RUN, jobs(), 0.0)
    assert phase(home, fresh).phase is confirm.Phase.OFF and not fresh.hold_end
    off = Config(home=home.root, confirm_differences=False)
    assert phase(home, RunState(RUN, jobs(), 0.0), off).phase is confirm.Phase.OFF
    main.close()


def test_over_the_cap_and_a_phase_given_up_leave_changes_unconfirmed(
        tmp_path: Path) -> None:
    home, first = served_run(tmp_path, {"t0.ps": NEW, "t1.ps": NEW, "t2.ps": NEW})
    cfg = Config(home=home.root, confirm_max=2, confirm_timeout=5.0)
    confirming = phase(home, first, cfg)
    main = Journal(home.results(0), RUN)
    state, _ = confirming.serving(first, main, 2.0)
    assert len(state.jobs) == 2
    state, _ = confirming.serving(first, main, 8.0)  # past confirm_timeout
    assert state.all_results_in and confirming.phase is confirm.Phase.OVER
    confirming.close()
    main.close()
    verdicts = confirmplan.verdicts(home.run_dir(RUN), RUN)
    assert [v.kind for v in verdicts] == [Kind.UNCONFIRMED] * 3
    assert "ran out of time" in verdicts[0].why
    assert verdicts[2].why == "over confirm_max (2 tests run again)"


def test_a_runs_own_confirm_option_overrides_the_setting(tmp_path: Path) -> None:
    home, _ = served_run(tmp_path, {"t0.ps": NEW, "t1.ps": OLD, "t2.ps": OLD})
    off = Config(home=home.root, confirm_differences=False)
    for words, cfg, expected in ((["confirm=no"], Config(home=home.root), confirm.Phase.OFF),
                                 (["confirm=yes"], off, confirm.Phase.FIRST),
                                 ([], off, confirm.Phase.OFF)):
        state = RunState(RUN, jobs(), 0.0)
        state.options = RunOptions.of(words, cfg)
        assert phase(home, state, cfg).phase is expected, words
        assert state.hold_end is (expected is confirm.Phase.FIRST)
    with pytest.raises(RunOptionError, match="expected confirm=yes or confirm=no"):
        RunOptions.of(["confirm=maybe"], off)


def test_the_same_build_section_names_each_test_with_both_md5s() -> None:
    text = indeterminate.same_build_section([("x__r.ps", "node2", OLD, NEW)])
    assert "1 test(s) gave another output than an earlier run of the same build" in text
    assert f"x/r.ps md5s: {OLD} (earlier run), {NEW} (node2)\n" in text
    assert indeterminate.same_build_section([]) == ""
