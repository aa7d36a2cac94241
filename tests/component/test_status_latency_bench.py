"""bench/status_latency.py keeps working: a small base/probed pair against a real master and
a real clusterstatus, checked.

CI checks that it completes with correct results (master_load's own checks, every probe a
complete 200 answer), never how fast anything is.
"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_status_latency_small() -> None:
    done = subprocess.run([sys.executable, "bench/status_latency.py", "--nodes", "20",
                           "--jobs", "20000", "--fake-nodes", "50", "--archived", "10",
                           "--rate", "50"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("machine=")
    rows = [dict(word.split("=", 1) for word in line.split()) for line in lines[1:]]
    runs = {row["run"]: row for row in rows if "run" in row}
    assert set(runs) == {"base", "probed"}
    assert all(row["ok"] == "yes" and row["jobs"] == "20000" for row in runs.values())
    (probes,) = [row for row in rows if row.get("status") == "all"]
    assert int(probes["requests"]) > 0 and probes["errors"] == "0"
    assert float(probes["p50_ms"]) <= float(probes["p95_ms"]) <= float(probes["p99_ms"])
    assert rows[-1]["summary"] == "medians" and rows[-1]["ok"] == "yes"
