"""Reuse that checks itself (docs/results.md, "Results reused"): a sample of the results a
run would take from the result cache is run again, at least one per program build and
maker node, away from the maker; the others are held until the sample agrees; a mismatch
withdraws the build's cached results from the store and from the run; a master that takes
the run over ends with the same answer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.master.cache import reuse, reuseverify
from cluster.master.cache.resultcache import FileDigests, ResultCache
from cluster.master.cache.reuse import RunReuse, store_run
from cluster.master.cache.reuseverify import RECORD_FILE, ReuseChecks, read_record
from cluster.master.model.joblist import MemoryJobList
from cluster.master.model.results import Results
from cluster.master.state.runcore import Outcome
from cluster.master.state.runstate import RunState
from cluster.records import Job
from cluster.wire import protocol
from cluster.wire.protocol import Request

RUN = "run-2"
GOOD = "0123456789abcdef0123456789abcdef"
BAD = "fedcba9876543210fedcba9876543210"
GS = ("gs", "a" * 64)
MUTOOL = ("mutool", "b" * 64)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "tests"
    root.mkdir()
    for name in ("a.ps", "c.pdf"):
        (root / name).write_bytes(f"%!PS {name}\n".encode())
    return root


def make_jobs() -> list[Job]:
    """12 gs jobs (g00..g11) and 4 mutool jobs (m0..m3)."""
    gs = [Job(f"g{k:02d}", f"__temp__/g{k}.log",
              f"__bin__/gs -r{60 + k} -sOutputFile=- __tests__/a.ps | md5sum")
          for k in range(12)]
    mu = [Job(f"m{k}", f"__temp__/m{k}.log",
              f"__bin__/mutool draw -r{60 + k} -o - __tests__/c.pdf | md5sum")
          for k in range(4)]
    return gs + mu


def maker_of(name: str) -> str:
    """The first run's node of each job: n1 the even gs jobs and the mutool jobs, n2 (the
    misbehaving node) the odd gs jobs."""
    return "n2" if name.startswith("g") and int(name[1:]) % 2 else "n1"


def first_run(tmp_path: Path, corpus: Path, jobs: list[Job], bad: bool = True) -> ResultCache:
    """run1 on n1 and n2 (same builds), stored: n2's gs outputs are wrong when ``bad``."""
    cache = ResultCache(tmp_path / "rc", 5)
    run1 = tmp_path / "run1"
    run1.mkdir()
    first = RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), run1 / "builds")
    first.learn("n1", (GS, MUTOOL))
    first.learn("n2", (GS, MUTOOL))
    results = Results(MemoryJobList(jobs))
    for i, job in enumerate(jobs):
        node = maker_of(job.name)
        md5 = BAD if bad and node == "n2" else GOOD
        results.add([i], [f"{job.name} 0 0.50 0.00 0.00 {md5} gs"], f"{node} result ")
    assert store_run(cache, "run1", MemoryJobList(jobs), results, run1,
                     FileDigests(corpus)) == 16
    return cache


def second_run(tmp_path: Path, corpus: Path, jobs: list[Job], cache: ResultCache,
               verify: float, done: list[str] | None = None) -> RunState:
    state = RunState(RUN, jobs, 0, done=done or ())
    run2 = tmp_path / "run2"
    run2.mkdir(exist_ok=True)
    state.reuse = RunReuse(cache, FileDigests(corpus), state.jobs, run2 / "builds",
                           verify=verify)
    return state


def join(state: RunState, node: str, now: float = 1.0, slots: int = 64) -> Outcome:
    """``node`` calls, builds (gs and mutool as everywhere) and asks for jobs."""
    assert state.handle(Request(node=node, job_id=RUN, slots=slots), now).reply.verb == \
        protocol.BUILD
    return state.handle(Request(node=node, job_id=RUN, built=RUN, slots=slots,
                                digests=(GS, MUTOOL)), now)


def names(out: Outcome) -> list[str]:
    return [line.split()[0] for line in out.reply.jobs]


def answer(state: RunState, node: str, tests: list[str], now: float = 2.0,
           md5: dict[str, str] | None = None, error: int = 0) -> Outcome:
    """``node`` sends the results of ``tests`` (the good md5 unless ``md5`` says)."""
    lines = tuple(f"{t} {error} 0.10 0.00 0.00 {(md5 or {}).get(t, GOOD)} gs" for t in tests)
    return state.handle(Request(node=node, job_id=RUN, slots=64, result_lines=lines), now)


def test_at_least_one_sample_per_program_build_and_maker_node(tmp_path: Path,
                                                              corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=False)
    state = second_run(tmp_path, corpus, jobs, cache, verify=0.01)
    out = join(state, "n3")
    # Three groups: gs made by n1, gs made by n2, mutool made by n1: one sample each,
    # handed out; nothing else (the rest is held until they agree), nothing recorded yet.
    sent = names(out)
    assert len(sent) == 3 and out.journal == b""
    assert {maker_of(n) + n[0] for n in sent} == {"n1g", "n2g", "n1m"}
    assert state.reused == 0 and not state.all_results_in
    # Held is not "not run", neither on the status line nor in the report's list.
    assert "13 reused, being checked" in state.status_line()
    assert "not run" not in state.status_line() and not state.not_run_names()
    # Held jobs are not handed out, however often a node asks.
    again = state.handle(Request(node="n3", job_id=RUN, slots=64, pending=3), 1.5)
    assert again.reply.verb == protocol.CONTINUE
    # The samples agree: every held result is recorded, named by its maker and run.
    done = answer(state, "n3", sent)
    assert state.reused == 13 and state.all_results_in
    journal = done.journal.decode()
    # n1 made 6 gs and 4 mutool results, n2 6 gs results; one sample of each group ran.
    assert journal.count("cache:n1@run1 result ") == 6 + 4 - 2
    assert journal.count("cache:n2@run1 result ") == 5
    assert all(f"n3 result {n} " in journal for n in sent)  # the samples: the node's own
    assert done.reply.verb == protocol.UPLOAD
    checks = read_record(tmp_path / "run2")
    assert [c.kind for c in checks] == ["agreed"] * 3


def test_the_share_is_of_each_group(tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=False)
    state = second_run(tmp_path, corpus, jobs, cache, verify=0.5)
    sent = names(join(state, "n3"))
    # half of 6 (gs by n1), of 6 (gs by n2) and of 4 (mutool by n1), rounded up
    assert len(sent) == 3 + 3 + 2


def test_a_sample_goes_to_another_node_than_its_maker(tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=False)
    state = second_run(tmp_path, corpus, jobs, cache, verify=1.0)  # all sampled
    # n3 is ready first but asks for nothing yet; then n1, the maker of most, asks.
    assert state.handle(Request(node="n3", job_id=RUN, slots=1), 0).reply.verb == "BUILD"
    state.handle(Request(node="n3", job_id=RUN, built=RUN, slots=1, digests=(GS, MUTOOL),
                         pending=1, running=0), 0.5)
    sent_n1 = names(join(state, "n1", slots=64))
    assert sent_n1 and all(maker_of(n) != "n1" for n in sent_n1)


def test_a_mismatch_withdraws_the_build_from_the_store_and_the_run(tmp_path: Path,
                                                                  corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=True)
    state = second_run(tmp_path, corpus, jobs, cache, verify=0.01)
    out = join(state, "n3")
    sent = names(out)
    # n3 is good: its outputs are right, so n2's sample disagrees with n2's cached md5.
    done = answer(state, "n3", sent)
    # gs is withdrawn: all 12 gs jobs run (the 2 samples have results; 10 more to run);
    # the mutool ones agreed and are recorded.
    assert state.reused == 3
    assert cache.withdrawn() == {GS}
    rest = names(state.handle(Request(node="n3", job_id=RUN, slots=64), 3.0)) \
        if done.reply.verb != protocol.JOBS else names(done)
    assert sorted(rest) == sorted(j.name for j in jobs if j.name.startswith("g")
                                  and j.name not in sent)
    assert not any(f"cache:n2@run1 result {n} " in done.journal.decode() for n in rest)
    checks = read_record(tmp_path / "run2")
    mismatch = [c for c in checks if c.kind == "mismatch"]
    assert len(mismatch) == 1 and mismatch[0].maker == "n2@run1"
    assert mismatch[0].cached == BAD and mismatch[0].new == GOOD and mismatch[0].node == "n3"
    # The run ends with every gs job run by n3.
    answer(state, "n3", rest, 4.0)
    assert state.all_results_in
    report = reuseverify.report(state, tmp_path / "run2", {"n3": (GS, MUTOOL)}, [])
    assert "MISMATCH " + mismatch[0].test in report.section
    assert "made by n2 in run run1" in report.section
    assert "12 jobs calling it run again" in report.section
    assert report.lines[0].startswith("3 of 16 tests reused")
    # A later run looks nothing of that gs build up: its jobs run.
    later = RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), tmp_path / "b3")
    found, _ = later.resolve("n1", (GS, MUTOOL), Results(MemoryJobList(jobs)).offsets,
                             bytearray(len(jobs)))
    assert sorted(jobs[i].name for i in found) == ["m0", "m1", "m2", "m3"]


def test_nothing_is_stored_under_a_withdrawn_build_and_the_record_is_pruned(
        tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=False)
    cache.withdraw([GS], "runX", "g01")
    run = tmp_path / "r3"
    run.mkdir()
    RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), run / "builds").learn(
        "n1", (GS, MUTOOL))
    results = Results(MemoryJobList(jobs))
    results.add(list(range(16)), [f"{j.name} 0 0.1 0 0 {GOOD} gs" for j in jobs], "n1 result ")
    assert store_run(cache, "r3", MemoryJobList(jobs), results, run, FileDigests(corpus)) == 4
    # Once no kept run holds the build, its withdrawal is forgotten.
    small = ResultCache(cache.root, 1)
    small.save_run("r4", [MUTOOL], [])
    assert small.withdrawn() == frozenset()


def test_a_sample_with_no_result_to_compare_vouches_for_nothing(tmp_path: Path,
                                                                corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=False)
    state = second_run(tmp_path, corpus, jobs, cache, verify=0.01)
    sent = names(join(state, "n3"))
    gs_n2 = next(n for n in sent if maker_of(n) == "n2" and n.startswith("g"))
    others = [n for n in sent if n != gs_n2]
    answer(state, "n3", others)
    # A timeout (error 3): not compared; another job of its group is the sample now.
    for attempt in range(reuseverify.MAX_REPLACEMENTS):
        out = answer(state, "n3", [gs_n2], 3.0 + attempt, error=3)
        assert state.reused == 0
        (gs_n2,) = names(state.handle(Request(node="n3", job_id=RUN, slots=64), 3.5 + attempt))
        assert maker_of(gs_n2) == "n2"
    # Still no result to compare: n2's group is run whole, nothing withdrawn; the rest
    # (n1's gs and mutool results, whose samples agreed) recorded.
    out = answer(state, "n3", [gs_n2], 5.0, error=4)
    assert cache.withdrawn() == frozenset()
    assert state.reused == 5 + 3
    left = names(out) or names(state.handle(Request(node="n3", job_id=RUN, slots=64), 6))
    # n2's 6: the first sample and its replacements ran; the others are run now.
    assert len(left) == 6 - 1 - reuseverify.MAX_REPLACEMENTS
    assert all(maker_of(n) == "n2" for n in left)
    kinds = [c.kind for c in read_record(tmp_path / "run2")]
    assert kinds.count("unsure") == 3 and kinds.count("unverified") == 1


def test_a_master_taking_over_checks_again_and_reports_the_same(tmp_path: Path,
                                                                corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=True)
    state = second_run(tmp_path, corpus, jobs, cache, verify=0.01)
    sent = names(join(state, "n3"))
    first_n1 = [n for n in sent if maker_of(n) == "n1"]
    # The n1 samples agree; then the master dies before n2's comes back.
    out = answer(state, "n3", first_n1)
    journal = [line for line in out.journal.decode().splitlines()]
    assert not any(line.startswith("cache:") for line in journal)  # nothing recorded yet
    successor = second_run(tmp_path, corpus, jobs, cache, verify=0.01, done=journal)
    assert successor.results.count == len(first_n1) and successor.reused == 0
    resent = names(join(successor, "n3", now=10))
    assert len(resent) == 3  # new samples of the three groups
    done = answer(successor, "n3", resent, 11)
    # n2's sample disagrees with n2's cached md5 at the successor too: the same answer.
    assert cache.withdrawn() == {GS}
    rest = names(done) or names(successor.handle(Request(node="n3", job_id=RUN, slots=64), 12))
    answer(successor, "n3", rest, 13)
    assert successor.all_results_in
    report = reuseverify.report(successor, tmp_path / "run2", {"n3": (GS, MUTOOL)}, [])
    assert report.section.count("MISMATCH ") == 1
    # Only mutool results are reused: 4, less its sample at each master.
    assert successor.reused == 4 - 1 - 1


def test_no_checks_when_the_share_is_zero(tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    cache = first_run(tmp_path, corpus, jobs, bad=False)
    state = second_run(tmp_path, corpus, jobs, cache, verify=0.0)
    out = join(state, "n3")
    assert state.reused == 16 and state.checks is None and out.reply.verb == protocol.UPLOAD


def test_a_check_record_line_reads_back() -> None:
    check = reuseverify.Check("mismatch", "g01", "n2@run1", BAD, "n3", GOOD, (GS,), 0)
    assert reuseverify.Check.parse(check.line()) == check
    with pytest.raises(ValueError, match="not a check line"):
        reuseverify.Check.parse("agreed\tx")


def test_keychanges_are_kept_and_named_with_the_jobs_run(tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    state = RunState(RUN, jobs, 0)
    run2 = tmp_path / "run2"
    run2.mkdir()
    state.reuse = RunReuse(ResultCache(tmp_path / "rc", 5), FileDigests(corpus), state.jobs,
                           run2 / "builds", verify=0.02)
    changes = (("gs", 3, ("/usr/lib/x86_64-linux-gnu/libtiff.so.6", "/etc/os-release")),)
    state.handle(Request(node="n1", job_id=RUN, slots=64), 0)
    out = state.handle(Request(node="n1", job_id=RUN, built=RUN, slots=64,
                               digests=(GS, MUTOOL), keychanges=changes), 1)
    # The request's header as a node sends it, parsed as the master does.
    parsed = protocol.parse_request(protocol.format_request(
        Request(node="n2", job_id=RUN, built=RUN, digests=(GS,), keychanges=changes)))
    assert parsed.keychanges == changes
    answer(state, "n1", names(out))
    kept = reuse.load_keychanges(run2 / reuse.KEYCHANGES_FILE)
    assert kept == [("n1", changes)]
    report = reuseverify.report(state, run2, {"n1": (GS, MUTOOL)}, kept)
    assert report.lines == ["gs on n1: /usr/lib/x86_64-linux-gnu/libtiff.so.6, "
                            "/etc/os-release and 1 more changed; 12 jobs run again"]


def test_the_checks_draw_from_the_given_random(tmp_path: Path) -> None:
    checks = ReuseChecks(ResultCache(tmp_path, 1), set(), RUN, tmp_path / RECORD_FILE, 0.1,
                         random.Random(7))
    assert checks.fraction == 0.1 and not checks.samples
