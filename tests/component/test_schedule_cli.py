"""``clusteradmin schedule`` when things go wrong, without touching the real crontab: a
crontab program that cannot be run leaves no schedule folder behind (all or none), usage
errors are exit 2, an unknown schedule is exit 1, and ``ls`` of a home without schedules
says so.  The real crontab's side is tests/e2e/test_schedules.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def admin(home: Path, *words: str, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home", str(home),
                           "schedule", *words], capture_output=True, text=True, timeout=60,
                          env=env)


def test_no_crontab_program_leaves_no_schedule(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bare = {**os.environ, "PATH": str(tmp_path / "empty")}  # no crontab program on it
    done = admin(home, "add", "smoke", "@daily", "--run", "shell", env=bare)
    assert done.returncode == 1, done.stderr
    assert "crontab" in done.stderr and "schedule smoke not added" in done.stderr
    assert list((home / "auto" / "cron").iterdir()) == []


def test_usage_errors_and_unknown_schedules(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for words, status, expected in (
            (("add", "smoke"), 2, "schedule add needs NAME and CRON"),
            (("add", "smoke", "@daily"), 2, "nothing to schedule; expected --run LINE"),
            (("add", "smoke", "@daily", "--run", "gs", "--dag", "x.dag"), 2,
             "not allowed with argument"),
            (("rm",), 2, "schedule rm takes one NAME"),
            (("rm", "ghost"), 1, "no schedule ghost"),
            (("ls", "x"), 2, "schedule ls takes no NAME")):
        done = admin(home, *words)
        assert done.returncode == status and expected in done.stderr, (words, done.stderr)
    listed = admin(home, "ls")
    assert listed.returncode == 0 and listed.stdout.startswith("no schedule in "), \
        listed.stdout
