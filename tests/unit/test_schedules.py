"""Named schedules (docs/operating.md, "Schedules"): the cron expression's check naming the
bad field, the name and line checks, the folder ``auto/cron/<name>/`` written whole or not
at all, and ``enqueue_auto.py cron NAME``'s queuing of a run and of a whole graph (all or
none).  Pure files in a temporary home; the real crontab is tests/e2e/test_schedules.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import cron
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.triggers import auto, schedules
from cluster.triggers.schedules import ScheduleError


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    return h


def queued(home: Home) -> dict[int, list[str]]:
    return {p: [s.line() for s in QueueFile.for_priority(home, p).read()] for p in (0, 1, 2)}


@pytest.mark.parametrize("good", ["0 3 * * 0", "*/15 * * * *", "0 3 * * sun", "5 4 1 jan *",
                                  "0 0 1-7,15 * 1-5", "0  3 * *  7", "@daily", "@weekly",
                                  "@hourly", "@reboot", "@midnight"])
def test_cron_takes_five_fields_and_the_nicknames(good: str) -> None:
    assert cron.schedule_problem(good) is None


@pytest.mark.parametrize(("bad", "expected"), [
    ("61 * * * *", "field 1 (minute) is '61'"),
    ("* 24 * * *", "field 2 (hour) is '24'"),
    ("* * 0 * *", "field 3 (day of month) is '0'"),
    ("* * * 13 *", "field 4 (month) is '13'"),
    ("* * * * 8", "field 5 (day of week) is '8'"),
    ("* * * * funday", "field 5 (day of week) is 'funday'"),
    ("*/0 * * * *", "field 1 (minute) is '*/0'"),
    ("5-1 * * * *", "field 1 (minute) is '5-1'"),
    ("* * *", "has 3 field(s); expected five fields"),
    ("* * * * * *", "has 6 field(s)"),
    ("@fortnightly", "is no cron nickname"),
    ("", "an empty schedule"),
])
def test_a_bad_expression_names_its_field_and_what_it_takes(bad: str, expected: str) -> None:
    problem = cron.schedule_problem(bad)
    assert problem is not None and expected in problem, problem
    if "field " in expected and "(" in expected:
        assert "; expected " in problem


@pytest.mark.parametrize("name", ["", "-x", "1abc", "a/b", "a.b", "a b", "x" * 49, "..",
                                  "é"])
def test_a_name_is_a_safe_identifier(name: str) -> None:
    with pytest.raises(ScheduleError, match="expected a letter"):
        schedules.check_name(name)


def test_add_writes_the_folder_and_read_gives_it_back(home: Home) -> None:
    added = schedules.add(home, "smoke", "0  3 * * sun", "shell num_execution=3")
    folder = home.root / "auto" / "cron" / "smoke"
    assert added.folder == folder and added.cron == "0 3 * * sun" and added.what == "run"
    assert (folder / "schedule.toml").read_text().endswith('cron = "0 3 * * sun"\n')
    assert schedules.read(home, "smoke") == added
    assert schedules.names(home) == ["smoke"]
    with pytest.raises(ScheduleError, match="schedule smoke exists"):
        schedules.add(home, "smoke", "@daily", "gs")
    entry = schedules.entry(home, added, ["--home", str(home.root)])
    assert entry.tag == f"schedule-smoke:{home.root.resolve()}"
    assert entry.command.endswith(f"--home {home.root} --quiet cron smoke")
    assert cron.render(entry).startswith("0 3 * * sun cd ")
    assert schedules.remove(home, "smoke") == folder and not folder.exists()
    with pytest.raises(ScheduleError, match="no schedule smoke"):
        schedules.read(home, "smoke")


@pytest.mark.parametrize(("cron_text", "line", "expected"), [
    ("61 3 * * *", "gs", "cron expression '61 3 * * *': field 1 (minute)"),
    ("@daily", "user bob gs", "starts with the kind 'user'"),
    ("@daily", "gs num_execution=2", "num_execution= goes with product shell only"),
    ("@daily", "shell num_execution=0", "expected a whole number from 1 to 1000"),
    ("@daily", "gs,bogus", "unknown product 'bogus'"),
    ("@daily", "dag /no/such.dag", "/no/such.dag: cannot read it"),
    ("@daily", "sweep /no/such/folder", "is neither a folder nor a file"),
])
def test_bad_values_are_refused_and_nothing_is_written(home: Home, cron_text: str, line: str,
                                                        expected: str) -> None:
    with pytest.raises(ScheduleError, match="schedule s1: ") as caught:
        schedules.add(home, "s1", cron_text, line)
    assert expected in str(caught.value)
    folder = auto.jobs_dir(home, auto.NAMED)
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_graph_is_checked_when_added(home: Home, tmp_path: Path) -> None:
    graph = tmp_path / "g.dag"
    graph.write_text("user bob shell name=A after=B\nuser bob shell name=B after=A\n")
    with pytest.raises(ScheduleError, match="cycle"):
        schedules.add(home, "g", "@daily", schedules.path_line("dag", graph))
    graph.write_text("user bob shell name=A\nuser bob shell name=B after=Z\n")
    with pytest.raises(ScheduleError, match="after=Z names no run"):
        schedules.add(home, "g", "@daily", schedules.path_line("dag", graph))
    assert schedules.names(home) == []


def test_enqueue_queues_a_run_and_a_whole_graph(home: Home, tmp_path: Path) -> None:
    graph = tmp_path / "my graph.dag"  # a blank: the jobdef quotes the path
    graph.write_text("user bob shell name=A\nauto B shell name=B after=A priority=1\n")
    schedules.add(home, "g", "*/5 * * * *", schedules.path_line("dag", graph))
    schedules.add(home, "r", "@hourly", "shell num_execution=2")
    added = auto.enqueue(home, auto.NAMED, ["g", "r"])
    assert [s.line() for s in added] == ["user bob shell name=A",
                                         "auto B shell after=A name=B",
                                         "auto cron-r shell num_execution=2"]
    assert queued(home) == {0: ["user bob shell name=A"], 1: ["auto B shell after=A name=B"],
                            2: ["auto cron-r shell num_execution=2"]}
    # Again while A is still queued: refused whole (nothing of the graph queued twice).
    assert auto.enqueue(home, auto.NAMED, ["g"]) == []
    assert queued(home)[0] == ["user bob shell name=A"]


def test_a_hand_written_schedule_is_read_and_checked(home: Home) -> None:
    folder = auto.jobs_dir(home, auto.NAMED) / "hand"
    folder.mkdir(parents=True)
    (folder / "jobdef.txt").write_text("gs lowres\n")
    (folder / "schedule.toml").write_text('cron = "30 1 * * 1-5"\n')
    assert schedules.read(home, "hand").line == "gs lowres"
    (folder / "schedule.toml").write_text('cron = "30 1 * * 1-8"\n')
    with pytest.raises(ScheduleError, match=r"field 5 \(day of week\)"):
        schedules.read(home, "hand")
    (folder / "schedule.toml").write_text('cron = "@daily"\nwhen = "later"\n')
    with pytest.raises(ScheduleError, match="expected one key"):
        schedules.read(home, "hand")
    (folder / "schedule.toml").write_text('cron = "@daily"\n')
    (folder / "jobdef.txt").write_text("gs;reboot\n")
    with pytest.raises(ScheduleError, match="schedule hand: "):
        schedules.read(home, "hand")


def test_stale_tags_are_the_entries_whose_folder_is_gone(home: Home) -> None:
    schedules.add(home, "kept", "@daily", "gs")
    root = home.root.resolve()
    listed = [cron.Listed(f"schedule-{n}:{root}", "@daily", "x", True) for n in ("kept", "gone")]
    listed.append(cron.Listed("schedule-gone:/elsewhere", "@daily", "x", True))
    assert schedules.stale_tags(home, listed) == [f"schedule-gone:{root}"]
