#!/usr/bin/env python3
"""bench/reuse.py -- the README's main command run twice in one home: what reuse saves.

Usage: python3 bench/reuse.py [--reps 3] [--corpus DIR] [--verify SHARE] [--keep DIR]

Each repetition makes a new home and runs ``python3 localcluster.py --home <it>`` (the
README's main job, the embedded defaults: the result cache on, its checks at
``reuse_verify``'s default unless ``--verify`` says otherwise) twice, as the README's "run
it again" does.  The second run pushes the same tree: every job's key is unchanged, so the
run reuses what the checks (a sample run again, docs/results.md) let it.

Per repetition it prints the two wall times of the whole command (home, daemons, the run,
the report, the stop), the two runs' own elapsed times (``run.info``: from the run's start
to its end), the ratios second/first of both, how many tests the second run reused of how
many, and how many checks it ran (its report's "Reused results checked" section); then the
medians.  ok=yes when both commands exit 0, the first reuses nothing, the second reuses
every test but the samples, and the two tables hold the same md5s.

  rep=1 first_s=38.2 second_s=6.1 ratio=0.16 run_first_s=30.5 run_second_s=2.0 ...
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, figures, median, start  # noqa: E402
from cluster.localcluster import DEFAULT_CORPUS  # noqa: E402
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402

#: The report's line of reused tests (docs/results.md, "What the report says").
REUSED = re.compile(r"(\d+) of (\d+) tests reused")
#: The count of checks in the report's "Reused results checked" section.
CHECKS = re.compile(r"(\d+) of the results this run would take from the result cache")


def one_command(home: Path, corpus: Path, verify: str | None) -> tuple[float, int, str]:
    """``localcluster.py --home home`` once: (wall seconds, exit status, stderr's tail)."""
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
            "--corpus", str(corpus),
            "--set", f"base_port={free_port(5)}", "--set", f"monitor_port={free_port()}",
            "--set", f"status_port={free_port()}"]
    if verify is not None:
        argv += ["--set", f"reuse_verify={verify}"]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, check=False, cwd=home.parent)
    return time.monotonic() - began, done.returncode, \
        done.stderr.decode(errors="replace")[-2000:]


def run_facts(archive: Path) -> tuple[float, int, int, int, dict[str, str]]:
    """(elapsed seconds, tests reused, tests, checks run, md5 by test) of an archived run."""
    info = (archive / "run.info").read_text(encoding="utf-8")
    found = re.search(r"^elapsed (\S+)$", info, re.MULTILINE)
    elapsed = float(found.group(1)) if found else float("nan")
    report = (archive / "report.txt").read_text(encoding="utf-8")
    table = read_tab(archive / f"{archive.name}.tab")
    reused = REUSED.search(report)
    used = int(reused.group(1)) if reused else 0
    counted = CHECKS.search(report)
    checks = int(counted.group(1)) if counted else 0
    return elapsed, used, len(table), checks, {n: r.md5 for n, r in table.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/reuse.py", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--verify", help="reuse_verify for both runs (default: its default)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    work = start("reuse", ["gs", "make"], args.keep)
    if work is None:
        return 2
    ratios: list[float] = []
    run_ratios: list[float] = []
    ok_all = True
    try:
        for rep in range(1, args.reps + 1):
            home = work / f"home{rep}"
            first_s, code1, err1 = one_command(home, args.corpus, args.verify)
            second_s, code2, err2 = one_command(home, args.corpus, args.verify)
            archives = sorted((home / "archive").iterdir(), key=lambda p: p.name)
            ok = code1 == 0 and code2 == 0 and len(archives) == 2
            if not ok:
                print(err1 + err2, file=sys.stderr)
                print(figures({"rep": rep, "ok": "no", "exit": f"{code1},{code2}"}))
                ok_all = False
                continue
            run1, reused1, total1, _, md5s1 = run_facts(archives[0])
            run2, reused2, total2, checks, md5s2 = run_facts(archives[1])
            ok = reused1 == 0 and total1 == total2 and md5s1 == md5s2 \
                and reused2 + checks == total2 and checks > 0
            ok_all = ok_all and ok
            ratios.append(second_s / first_s)
            run_ratios.append(run2 / run1)
            print(figures({"rep": rep, "first_s": f"{first_s:.1f}", "second_s": f"{second_s:.1f}",
                           "ratio": f"{second_s / first_s:.2f}", "run_first_s": f"{run1:.1f}",
                           "run_second_s": f"{run2:.1f}", "run_ratio": f"{run2 / run1:.2f}",
                           "reused": f"{reused2}/{total2}", "checks": checks,
                           "ok": "yes" if ok else "no"}), flush=True)
        print(figures({"median_ratio": f"{median(ratios):.2f}",
                       "median_run_ratio": f"{median(run_ratios):.2f}",
                       "ok": "yes" if ok_all else "no"}))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
