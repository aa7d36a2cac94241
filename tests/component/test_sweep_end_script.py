"""The collection script at the end of a sweep run (docs/sweeps.md, "The collection
script"), on run folders built by hand as the intake leaves them (the helpers of
test_sweep_end): a real script run by the real end step, given each valid task's parameters
and result folder in task order; its files in collected/, its output in the archive; a
failing, hanging or clashing script reported without losing anything; a redo after a kill
giving the same collected/."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.master.end import sweepend
from cluster.report import sweepreport
from cluster.runspec import RunSpec
from cluster.sweep import collectscript
from cluster.sweep.expand import Task
from tests.component.test_sweep_end import (
    RUN1,
    SWEEP_TOML,
    first_run,
    start_of,
)

SUMMARY = """\
#!/usr/bin/env python3
import json, os, sys
tasks = [json.loads(line) for line in sys.stdin]
with open("summary.txt", "a") as out:   # appends: a redo must start afresh
    for t in tasks:
        with open(os.path.join(t["results"], "out")) as f:
            result = f.read().strip()
        out.write(f"{t['task']} {t['id']} a={t['params']['a']} b={t['params']['b']} {result}\\n")
os.mkdir("plots")
open("plots/n.txt", "w").write(str(len(tasks)))
print("summarised", len(tasks), sys.argv[1] == os.environ["CLUSTER_TASKS"],
      os.path.isfile(os.environ["CLUSTER_RESULTS_TSV"]),
      os.path.isfile(os.path.join(os.environ["CLUSTER_SWEEP_DIR"], "params.csv")))
print("to stderr", file=sys.stderr)
"""


@pytest.fixture
def home(tmp_path: Path) -> Home:
    made = Home(tmp_path / "home")
    made.create()
    return made


def with_script(home: Home, body: str, extra: str = "") -> list[Task]:
    """Run 1 of test_sweep_end (tasks 1, 2 and 5 valid) with a collection script."""
    made = first_run(home)
    folder = home.run_dir(RUN1) / "source" / "sweep"
    (folder / "sweep.toml").write_text(extra + 'collect_script = "tools/collect"\n'
                                       + SWEEP_TOML)
    (folder / "tools").mkdir()
    (folder / "tools" / "collect").write_text(body)
    (folder / "tools" / "collect").chmod(0o755)
    return made


def end(home: Home) -> sweepend.SweepEnd:
    made = sweepend.end_sweep(home, start_of(RUN1), RunSpec.parse("user alice sweep"))
    assert made is not None and made.error == ""
    return made


def report(home: Home, made: sweepend.SweepEnd) -> str:
    archive = home.archive / RUN1
    text, _ = sweepreport.render(
        "Sweep:", sweepreport.SweepFacts("sweep.toml", collect=made.collect,
                                         script=made.script),
        archive / "results.tsv", archive / "sweep-attempts.tsv", archive / "collected")
    return text


def test_the_script_gets_every_valid_task_in_order_and_its_files_are_collected(
        home: Home) -> None:
    t1, t2, _t3, _t4, t5, _t6 = with_script(home, SUMMARY)
    made = end(home)
    archive = home.archive / RUN1
    collected = archive / "collected"
    assert (collected / "summary.txt").read_text() == (
        f"1 {t1.task_id} a=x b=1 one\n2 {t2.task_id} a=y b=2 two\n"
        f"5 {t5.task_id} a=y b=5 five\n")
    assert (collected / "plots" / "n.txt").read_text() == "3"
    assert (collected / "all.txt").read_text() == "one\ntwo\nfive\n"  # [collect] too
    lines = [json.loads(line) for line in
             (archive / collectscript.TASKS_FILE).read_text().splitlines()]
    assert lines[0] == {"task": 1, "id": t1.task_id, "params": {"a": "x", "b": "1"},
                        "results": str((archive / "results" / t1.task_id).absolute())}
    log = (archive / collectscript.LOG_FILE).read_text()
    assert "summarised 3 True True True" in log and "to stderr" in log
    assert made.script is not None
    assert made.script["files"] == ("plots", "summary.txt") and made.script["error"] == ""
    assert sweepend.read_summary(archive) is not None
    assert not (archive / collectscript.WORK_DIR).exists()
    text = report(home, made)
    assert ("Collection script tools/collect: 3 task(s) given, made plots, summary.txt in "
            "collected/.") in text


def test_the_step_done_again_after_a_kill_gives_the_same_collected_files(
        home: Home) -> None:
    with_script(home, SUMMARY)
    end(home)
    collected = home.archive / RUN1 / "collected"
    before = {str(p.relative_to(collected)): p.read_bytes()
              for p in collected.rglob("*") if p.is_file()}
    # Killed while the script ran: its half folder is left; the step is done again.
    (home.archive / RUN1 / collectscript.WORK_DIR).mkdir()
    (home.archive / RUN1 / collectscript.WORK_DIR / "summary.txt").write_text("half\n")
    end(home)
    after = {str(p.relative_to(collected)): p.read_bytes()
             for p in collected.rglob("*") if p.is_file()}
    assert after == before


def test_a_failing_script_is_reported_and_nothing_is_lost(home: Home) -> None:
    with_script(home, "#!/bin/sh\necho partial > part.txt\necho 'no data for b' >&2\n"
                "exit 3\n")
    made = end(home)
    archive = home.archive / RUN1
    assert made.script is not None
    assert made.script["error"] == "tools/collect exited 3: no data for b"
    assert (archive / collectscript.FAILED_DIR / "part.txt").read_text() == "partial\n"
    assert not (archive / "collected" / "part.txt").exists()
    assert (archive / "collected" / "all.txt").read_text() == "one\ntwo\nfive\n"
    assert len((archive / "results.tsv").read_text().splitlines()) == 7
    assert "no data for b" in (archive / collectscript.LOG_FILE).read_text()
    assert "Collection script tools/collect failed: tools/collect exited 3: no data for b" \
        in report(home, made)


def test_a_hanging_script_is_stopped_at_the_sweeps_timeout(home: Home) -> None:
    with_script(home, "#!/bin/sh\nsleep 60\n", extra="timeout = 1\n")
    started = time.monotonic()
    made = end(home)
    assert time.monotonic() - started < 20
    assert made.script is not None
    assert made.script["error"] == "tools/collect timed out after 1 s"


def test_a_script_file_named_like_a_collect_target_is_left_out(home: Home) -> None:
    with_script(home, "#!/bin/sh\necho mine > all.txt\necho ok > own.txt\n")
    made = end(home)
    collected = home.archive / RUN1 / "collected"
    assert (collected / "all.txt").read_text() == "one\ntwo\nfive\n"
    assert (collected / "own.txt").read_text() == "ok\n"
    assert made.script is not None and made.script["left_out"] == ("all.txt",)
    assert "left out, made by a [collect] rule: all.txt" in report(home, made)


def test_a_script_that_is_not_executable_is_a_failure_not_a_crash(home: Home) -> None:
    with_script(home, "echo hi > x\n")
    (home.run_dir(RUN1) / "source" / "sweep" / "tools" / "collect").chmod(0o644)
    made = end(home)
    assert made.script is not None
    assert made.script["error"] == "tools/collect is not executable"
