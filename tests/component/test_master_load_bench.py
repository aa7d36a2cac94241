"""bench/master_load.py keeps working: a small run against a real master, checked.

CI checks that it completes with correct results (every test once in the .tab, the
expected md5), never how fast it is.
"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_master_load_small() -> None:
    """The default run is a second one: the master compares it with a seeded baseline,
    previous push and md5 cache, and ok=yes includes the report's expected counts."""
    done = subprocess.run([sys.executable, "bench/master_load.py", "--nodes", "50",
                           "--jobs", "500"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("machine=")
    figures = dict(word.split("=", 1) for word in lines[-1].split())
    assert figures["ok"] == "yes" and figures["jobs"] == "500" and figures["nodes"] == "50"
    assert figures["history"] == "yes"
    assert float(figures["jobs_per_s"]) > 0 and float(figures["rss_mb"]) > 0
    assert float(figures["p50_ms"]) <= float(figures["p99_ms"])


def test_master_load_two_client_processes_first_run() -> None:
    """The nodes may be spread over several client processes (--procs); --first-run
    leaves the history out."""
    done = subprocess.run([sys.executable, "bench/master_load.py", "--nodes", "20",
                           "--jobs", "300", "--slots", "2", "--procs", "2", "--first-run"],
                          cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].endswith("ok=yes")
    assert " history=no " in done.stdout.splitlines()[-1]


def test_master_load_nightly_auto_run() -> None:
    """--kind auto: a priority-2 nightly run is compared with the baseline (removed tests
    listed), moves the baseline and rebuilds the md5 cache from itself and three archived
    runs (--archived 3); ok=yes checks all three, the cache pair by pair count."""
    done = subprocess.run([sys.executable, "bench/master_load.py", "--nodes", "20",
                           "--jobs", "600", "--kind", "auto", "--archived", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]
    assert last.endswith("ok=yes") and " kind=auto archived=3 " in last
    assert " history=yes " in last


def test_master_handler_small() -> None:
    """bench/master_handler.py serves a whole run in-process and checks every job has one
    result; --stages adds the time of each step of the handler."""
    done = subprocess.run([sys.executable, "bench/master_handler.py", "--jobs", "3000",
                           "--nodes", "30", "--reps", "2", "--stages"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = dict(word.split("=", 1) for word in done.stdout.splitlines()[-1].split())
    assert figures["ok"] == "yes" and figures["jobs"] == "3000"
    assert len(figures["repeats"].split(",")) == 2
    assert float(figures["handler_us_per_job"]) > 0 and int(figures["calls"]) > 30
    for step in ("verify", "parse", "state", "sign"):
        assert int(figures[f"{step}_ns"]) > 0
