"""``clusteradmin cron`` against the REAL crontab of the user running the tests: the entries
``enqueue_auto.py --install-cron`` puts there for a temporary master home are listed with
their next time and the named runs they queue; a schedule with jobs and no entry, and an
entry commented out by hand, are said to never run.

The crontab is saved and restored by tests/e2e/test_cron.py's ``user_crontab`` fixture
(which also adds lines of someone else's); the module holds the crontab lock of the other
crontab modules (``xdist_group("crontab")``, tests/conftest.py's ``crontab_turn``)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cron import crontab_l, ours, set_crontab, user_crontab  # noqa: F401
from tests.helpers import REPO

pytestmark = [pytest.mark.xdist_group("crontab")]


def admin(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home", str(home),
                           "cron", *args], capture_output=True, text=True, timeout=60)


def master_home(tmp_path: Path) -> Path:
    home = tmp_path / "master home"
    jobs = (("nightly", "gs", "gs,pdfwrite highres job_timeout=2h\n"),
            ("nightly", "mu", "mupdf\n"), ("weekly", "full", "gs\n"))
    for schedule, name, text in jobs:
        jobdef = home / "auto" / schedule / name / "jobdef.txt"
        jobdef.parent.mkdir(parents=True)
        jobdef.write_text(text)
    return home


def test_the_installed_entries_are_listed_with_their_next_time_and_jobs(
        user_crontab: str, tmp_path: Path) -> None:  # noqa: F811
    home = master_home(tmp_path)
    before = admin(home)
    assert before.returncode == 0, before.stderr
    assert "enqueue_auto-nightly (this home): not in the crontab, so never run" \
        in before.stdout
    assert "  auto/nightly/gs: gs,pdfwrite highres job_timeout=2h\n" in before.stdout

    done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--home", str(home),
                           "--set", "nightly_schedule=30 2 * * *", "--install-cron"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = admin(home, "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    mine = {e["auto"]: e for e in data["entries"] if e.get("auto")}
    nightly, weekly = mine["nightly"], mine["weekly"]
    assert nightly["tag"] == f"enqueue_auto-nightly:{home}" and nightly["installed"]
    assert nightly["schedule"] == "30 2 * * *" and weekly["schedule"] == "0 3 * * 6"
    assert [j["name"] for j in nightly["jobs"]] == ["gs", "mu"]
    now = dt.datetime.fromtimestamp(data["now"])
    next_nightly = dt.datetime.fromtimestamp(nightly["next"])
    assert (next_nightly.hour, next_nightly.minute) == (2, 30)
    assert dt.timedelta(0) < next_nightly - now <= dt.timedelta(days=1)
    next_weekly = dt.datetime.fromtimestamp(weekly["next"])
    assert next_weekly.isoweekday() == 6 and next_weekly.hour == 3
    assert dt.timedelta(0) < next_weekly - now <= dt.timedelta(days=7)
    # Someone else's lines are not the cluster's entries.
    assert not [e for e in data["entries"] if "unrelated" in e["command"]]

    text = admin(home).stdout
    assert f"enqueue_auto-nightly (this home): 30 2 * * *, next {next_nightly:%Y-%m-%d} " \
        "02:30" in text
    assert "  auto/weekly/full: gs\n" in text

    # Commented out by hand: listed, and said never to run.
    [line] = ours(f"enqueue_auto-weekly:{home}")
    set_crontab(crontab_l().replace(line, "# " + line))
    assert "enqueue_auto-weekly (this home): 0 3 * * 6, commented out: never run" \
        in admin(home).stdout
