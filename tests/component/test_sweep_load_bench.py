"""bench/sweep_load.py keeps working: a small sweep against a real master, checked.

CI checks that it completes with correct results (every task ``ok`` in results.tsv, each
task's file in its folder, every result journaled), never how fast it is; and that with
one slow check the other tasks are journaled before it.
"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def _bench(*args: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "bench/sweep_load.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("machine=")
    return dict(word.split("=", 1) for word in lines[-1].split())


def test_sweep_load_small_without_and_with_a_check_script() -> None:
    figures = _bench("--nodes", "20", "--tasks", "400", "--slots", "2")
    assert figures["ok"] == "yes" and figures["tasks"] == "400" and figures["check"] == "none"
    assert float(figures["results_per_s"]) > 0
    figures = _bench("--nodes", "5", "--tasks", "60", "--check", "fast", "--procs", "2")
    assert figures["ok"] == "yes" and figures["check"] == "fast"


def test_sweep_load_one_slow_check_is_journaled_after_the_others() -> None:
    figures = _bench("--nodes", "5", "--tasks", "100", "--slow-task", "--check", "2")
    assert figures["ok"] == "yes"
    # Its check sleeps 2 s; the 99 others' fast checks end long before.
    assert float(figures["others_journaled_s"]) < float(figures["slow_journaled_s"])
