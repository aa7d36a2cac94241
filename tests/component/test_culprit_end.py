"""The end step ``culprit`` (cluster.master.end.culprit) over a real git repository, a real
master home and its real priority-1 queue; the runs' archives are written as the end of a
run writes them (run.info, the .tab, confirm.tsv), without nodes.

Eight commits; the 8th's run has two confirmed differences, t1 first changed by the 5th
commit and t2 by the 3rd; the run at the 4th commit fails (its build): it is skipped for
both, and t2 times out at the 2nd: skipped for t2.  The tests split; each is left among
two suspects, t2 the 2nd (skipped) and 3rd commits, t1 the 4th (skipped) and 5th.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cluster.config import Config
from cluster.console import culprit as console_culprit
from cluster.home import Home
from cluster.master.end import culprit
from cluster.master.files import culprits
from cluster.master.files.ending import Outcome
from cluster.queue import QueueFile
from cluster.report import culpritreport
from cluster.report.tab import TabRow
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart

OLD = {"t1": "1" * 32, "t2": "2" * 32}
NEW = {"t1": "a" * 32, "t2": "b" * 32}
#: Each test's culprit, as an index into the 8 commits.
CULPRIT = {"t1": 4, "t2": 2}
#: The commit whose bisection run fails.
BROKEN = 3
#: The commit where t2 times out (error 3): no answer for t2 there.
TIMED_OUT = 1


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=Dev Eloper", "-c",
                           "user.email=dev@example.org", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def archive_run(home: Home, run_id: str, spec: RunSpec, outcome: Outcome,
                digests: dict[str, str] | None = None,
                confirmed: dict[str, tuple[str, str]] | None = None,
                timed_out: tuple[str, ...] = ()) -> JobStart:
    start = JobStart(id=run_id, priority=1, queue=spec.line(), kind="git", ref=spec.ref,
                     products=spec.products, tree="ghostpdl",
                     source=f"runs/{run_id}/source/ghostpdl", build="make", tests="tests",
                     options=spec.options)
    folder = home.archive / run_id
    folder.mkdir(parents=True)
    (folder / "run.info").write_text(start.format() + f"outcome {outcome.value}\n")
    if digests is not None:
        (folder / f"{run_id}.tab").write_text("".join(
            TabRow(name, 3 if name in timed_out else 0, 1.0, 0.0, 0.0, md5, spec.ref, "gs",
                   "node1").line() + "\n"
            for name, md5 in sorted(digests.items())))
    if confirmed:
        (folder / "confirm.tsv").write_text("".join(
            f"{t}\tconfirmed\tnode1,node2\t{old},{new},{new}\t\n"
            for t, (old, new) in confirmed.items()))
    return start


def repository(tmp_path: Path, commits: int) -> tuple[Path, list[str], Home, Config]:
    """A git repository of ``commits`` commits (their shas, oldest first), and a master
    home whose configuration names it as the ghostpdl tree."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    shas = []
    for n in range(1, commits + 1):
        (repo / "NOTES").write_text(f"{n}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"Change number {n}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    home = Home(tmp_path / "home")
    home.create()
    return repo, shas, home, Config(home=home.root, repositories=(f"ghostpdl={repo}",))


def test_a_search_skips_a_failed_commit_splits_its_tests_and_reports(tmp_path: Path) -> None:
    repo, shas, home, cfg = repository(tmp_path, 8)
    queue = QueueFile.for_priority(home, 1)

    def spec(sha: str, *options: str) -> RunSpec:
        return RunSpec("git", sha, ("gs",), ("tree=ghostpdl", *options))

    archive_run(home, "20261128100000-p1-aaaa", spec(shas[0]), Outcome.DONE, OLD)
    # A failed run between is no "last tested" commit; a later bisection run neither.
    archive_run(home, "20261128103000-p1-ffff", spec(shas[1]), Outcome.FAILED)
    eighth = spec(shas[7])
    start = archive_run(home, "20261128110000-p1-bbbb", eighth, Outcome.DONE, NEW,
                        {t: (OLD[t], NEW[t]) for t in OLD})
    culprit.after_run(cfg, home, start, eighth, Outcome.DONE)
    culprit.after_run(cfg, home, start, eighth, Outcome.DONE)  # a redo: nothing twice
    search = culprits.load(home, start.id)
    assert search is not None and search.commits == shas
    assert search.good_run == "20261128100000-p1-aaaa"
    assert [line.line() for line in queue.read()] == [
        f"git {shas[3]} gs confirm=no culprit={start.id}.0 tree=ghostpdl"]

    runs = 0
    while (waiting := queue.read()):
        line = waiting[0]
        assert line.culprit is not None
        number = line.culprit[1]
        index = shas.index(line.ref)
        tests = culprit.step_tests(home, line)
        runs += 1
        run_id = f"2026112812{runs:04d}-p1-cc{runs:02d}"
        if index == BROKEN:
            bisection = archive_run(home, run_id, line, Outcome.FAILED)
            culprit.after_run(cfg, home, bisection, line, Outcome.RETRY)  # another try
            assert culprits.load(home, start.id).steps[number].state == culprits.QUEUED
            culprit.after_run(cfg, home, bisection, line, Outcome.FAILED,
                              "node1's build failed:\n make: *** [all] Error 2")
        else:
            digests = {t: NEW[t] if index >= CULPRIT[t] else OLD[t] for t in tests}
            bisection = archive_run(home, run_id, line, Outcome.DONE, digests,
                                    timed_out=("t2",) if index == TIMED_OUT else ())
            culprit.after_run(cfg, home, bisection, line, Outcome.DONE)
        queue.remove(line)  # the run's dequeue step
        assert runs < 10

    search = culprits.load(home, start.id)
    assert search is not None and search.state == culprits.DONE and search.mailed
    assert search.steps[0].state == culprits.SKIPPED and search.steps[0].why == \
        "failed: node1's build failed: make: *** [all] Error 2"
    t1, t2 = search.tests
    # t2 timed out at the 2nd commit: skipped there, so its culprit is the 2nd or 3rd.
    assert (t2.good, t2.bad, t2.skipped) == (0, 2, [1, 3]) and t2.pinned
    assert t1.bad == 4 and t1.pinned and 3 in t1.skipped
    report = (home.archive / start.id / culpritreport.REPORT_NAME).read_text()
    assert search.report == f"archive/{start.id}/{culpritreport.REPORT_NAME}"
    second, first = report.split("first changed in one of these commits")[1:]
    assert f"  {shas[1]} Dev Eloper <dev@example.org> Change number 2" in second
    assert f"  {shas[2]} Dev Eloper <dev@example.org> Change number 3" in second
    assert "tests:\n  t2\n" in second
    assert f"  {shas[3]} Dev Eloper <dev@example.org> Change number 4" in first
    assert f"  {shas[4]} Dev Eloper <dev@example.org> Change number 5" in first
    assert "tests:\n  t1\n" in first
    assert f"Bisection runs:     {runs}" in report and "skipped (failed: node1's build" in report

    # What clusteradmin culprit shows, by the commit run or by one of its bisection runs.
    shown = console_culprit.search(home, "2026112812" + "0002-p1-cc02")
    assert shown["run"] == start.id and shown["untested"] == 6
    assert [(t["test"], t["culprit"]) for t in shown["tests"]] == [("t1", None),
                                                                    ("t2", None)]
    assert shown["tests"][0]["suspects"] == [shas[3], shas[4]]
    text = "\n".join(console_culprit.format_search(shown))
    assert f"t2: culprit one of {shas[1][:12]} (#2), {shas[2][:12]} (#3)" in text
    assert f"t1: culprit one of {shas[3][:12]} (#4), {shas[4][:12]} (#5)" in text
    assert f"0: {shas[3][:12]} (#4) run 20261128120001-p1-cc01 skipped (failed: " in text


def test_no_search_without_untested_commits_or_confirmed_differences(tmp_path: Path) -> None:
    repo, shas, home, cfg = repository(tmp_path, 4)

    def spec(sha: str) -> RunSpec:
        return RunSpec("git", sha, ("gs",), ("tree=ghostpdl",))

    archive_run(home, "20261128100000-p1-aaaa", spec(shas[0]), Outcome.DONE, OLD)
    # The next commit, run: a confirmed difference, but no commit between.
    second = archive_run(home, "20261128110000-p1-bbbb", spec(shas[1]), Outcome.DONE, NEW,
                         {"t1": (OLD["t1"], NEW["t1"])})
    culprit.after_run(cfg, home, second, spec(shas[1]), Outcome.DONE)
    # The 4th, the 3rd never run between, but its differences unconfirmed (no confirm.tsv:
    # the confirm phase was off).
    fourth = archive_run(home, "20261128120000-p1-cccc", spec(shas[3]), Outcome.DONE, OLD)
    culprit.after_run(cfg, home, fourth, spec(shas[3]), Outcome.DONE)
    assert culprits.searches(home) == []
    assert QueueFile.for_priority(home, 1).read() == []
    # The same with its difference confirmed: searched.
    (home.archive / fourth.id / "confirm.tsv").write_text(
        f"t1\tconfirmed\tnode1,node2\t{NEW['t1']},{OLD['t1']},{OLD['t1']}\t\n")
    culprit.after_run(cfg, home, fourth, spec(shas[3]), Outcome.DONE)
    assert culprits.searches(home) == [fourth.id]
    assert [s.ref for s in QueueFile.for_priority(home, 1).read()] == [shas[2]]
