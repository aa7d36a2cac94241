"""The master's side of the steps after a push (cluster/cli/pushsteps.py): whose run a run
is, and the remote wait's progress lines and outcome."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cluster.cli import pushsteps
from cluster.home import Home

RUN = "20270115080000-p0-bbbb"


def archive(home: Home, run: str, line: str, outcome: str = "done") -> Path:
    folder = home.archive / run
    folder.mkdir(parents=True)
    (folder / "report.txt").write_text("report\n")
    (folder / "run.info").write_text(f"queue {line}\noutcome {outcome}\n")
    return folder


def test_a_run_is_its_queue_lines_user(tmp_path: Path) -> None:
    home = Home(tmp_path)
    archive(home, RUN, "user alice gs")
    archive(home, "20270115080000-p2-cccc", "auto nightly-plain gs")
    assert pushsteps.check_owner(home, RUN, "alice") == "user alice gs"
    assert pushsteps.check_owner(home, RUN, None) == "user alice gs"
    with pytest.raises(pushsteps.NotYours, match="not a run of user bob"):
        pushsteps.check_owner(home, RUN, "bob")
    with pytest.raises(pushsteps.NotYours, match="'auto nightly-plain'"):
        pushsteps.check_owner(home, "20270115080000-p2-cccc", "alice")
    with pytest.raises(pushsteps.NotYours, match="neither archived nor running"):
        pushsteps.check_owner(home, "20270115080000-p0-none", "alice")


def test_the_wait_writes_progress_lines_then_its_outcome(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.archive.mkdir(parents=True)
    out = io.StringIO()
    now = [0.0]
    looks = [0]

    def clock() -> float:
        now[0] += 1.0
        looks[0] += 1
        if looks[0] == 6:
            archive(home, RUN, "user alice gs")
        return now[0]

    outcome = pushsteps.wait_step(home, "user alice gs", 1_800_000_000.0, 3600, out,
                                  progress=True, clock=clock, sleep=lambda s: None)
    assert outcome["run"] == RUN and outcome["status"] in (0, 3)
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("progress: ") for line in lines)
    json.dumps(outcome)  # it travels as one JSON line
