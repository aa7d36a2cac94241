"""The resource file's format (cluster.wire.resources): the nodes-wanted rule, a round trip,
every bad field refused naming it, and staleness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.wire import resources
from cluster.wire.resources import (
    JOBS_PER_SLOT,
    MasterInfo,
    NodeLaunch,
    PriorityInfo,
    ResourceFileError,
    Resources,
    format_resources,
    nodes_wanted,
    parse_resources,
    read_resources,
)

WRITTEN = 1_795_683_296.5


def sample() -> Resources:
    return Resources(
        written=WRITTEN,
        master=MasterInfo(host="build1", address="10.0.0.5", pid=4242, base_port=9000,
                          monitor_port=9010),
        priorities={
            0: PriorityInfo(status="idle"),
            1: PriorityInfo(status="running", run="20261126083743-p1-2bf4", jobs_left=4711,
                            jobs_running=12, nodes=2, nodes_wanted=4),
            2: PriorityInfo(status="finished", run="20261126010000-p2-aa00"),
        },
        nodes_wanted=4,
        node=NodeLaunch(command=("clusterpull.py", "--ephemeral", "--config", "/srv/n.conf"),
                        slots=2, prefix="slurm", idle_exit=60.0))


def document() -> dict[str, Any]:
    return json.loads(format_resources(sample()))  # type: ignore[no-any-return]


def parse(doc: object, now: float = WRITTEN, interval: float = 10.0) -> Resources:
    return parse_resources(json.dumps(doc), now, interval, source="res.json")


# --- nodes_wanted --------------------------------------------------------------------------
def test_nodes_wanted_one_per_twenty_jobs_a_slot() -> None:
    assert nodes_wanted(0, 2, 4) == 0
    assert nodes_wanted(1, 2, 4) == 1
    assert nodes_wanted(2 * JOBS_PER_SLOT, 2, 4) == 1
    assert nodes_wanted(2 * JOBS_PER_SLOT + 1, 2, 4) == 2
    assert nodes_wanted(4711, 2, 400) == 118  # ceil(4711 / 40)


def test_nodes_wanted_bounded_by_max_nodes_and_zero_means_none() -> None:
    assert nodes_wanted(10_000, 1, 4) == 4
    assert nodes_wanted(10_000, 1, 0) == 0
    assert nodes_wanted(0, 1, 0, starting=True) == 0


def test_nodes_wanted_huge_counts_are_exact() -> None:
    """Integer arithmetic: no float rounding at counts beyond 2**53."""
    huge = 10**30 + 1
    assert nodes_wanted(huge, 1, 10**40) == -(-huge // JOBS_PER_SLOT)
    assert nodes_wanted(huge, 4096, 100_000) == 100_000


def test_a_starting_run_wants_one_node() -> None:
    assert nodes_wanted(0, 2, 4, starting=True) == 1
    assert nodes_wanted(400, 2, 4, starting=True) == 4


@pytest.mark.parametrize("args,name", [((-1, 2, 4), "jobs_left"), ((1, 0, 4), "node_slots"),
                                       ((1, 2, -1), "max_nodes"), ((True, 2, 4), "jobs_left"),
                                       ((1.5, 2, 4), "jobs_left")])
def test_nodes_wanted_refuses_bad_arguments(args: tuple[Any, Any, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        nodes_wanted(*args)


# --- round trip --------------------------------------------------------------------------
def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "resources.json"
    path.write_text(format_resources(sample()))
    back = read_resources(path, WRITTEN + 5, 10.0)
    assert back == sample()
    assert not back.stale
    assert not back.finished
    assert back.priorities[1].jobs_left == 4711


def test_the_file_is_one_json_object_with_the_documented_keys() -> None:
    doc = document()
    assert sorted(doc) == ["format", "master", "node", "nodes_wanted", "priorities",
                           "written"]
    assert sorted(doc["priorities"]) == ["0", "1", "2"]
    assert sorted(doc["priorities"]["1"]) == ["jobs_left", "jobs_running", "nodes",
                                              "nodes_wanted", "run", "status"]


def test_finished_when_nothing_runs() -> None:
    doc = document()
    doc["priorities"]["1"] = {"status": "finished", "run": "r1", "jobs_left": 0,
                              "jobs_running": 0, "nodes": 0, "nodes_wanted": 0}
    doc["nodes_wanted"] = 0
    assert parse(doc).finished


def test_unknown_keys_are_ignored() -> None:
    """Keys may be added in later versions of format 1; readers keep working."""
    doc = document()
    doc["extra"] = 1
    doc["master"]["uptime"] = 5
    assert parse(doc) == sample()


# --- staleness ----------------------------------------------------------------------------
def test_stale_after_three_intervals() -> None:
    doc = document()
    assert not parse(doc, now=WRITTEN + 30.0, interval=10.0).stale
    assert parse(doc, now=WRITTEN + 30.1, interval=10.0).stale
    assert parse(doc, now=WRITTEN + 3.1, interval=1.0).stale
    assert not parse(doc, now=WRITTEN - 100.0, interval=1.0).stale  # a clock behind


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        parse(document(), interval=0.0)


# --- bad fields -----------------------------------------------------------------------------
def _set(doc: dict[str, Any], dotted: str, value: object) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc[key]
    if value is DELETE:
        del doc[last]
    else:
        doc[last] = value


DELETE = object()

BAD_FIELDS = [
    ("format", 2, "format"), ("format", "1", "format"), ("format", DELETE, "format"),
    ("written", "now", "written"), ("written", -1, "written"), ("written", True, "written"),
    ("written", DELETE, "written"),
    ("master", [], "master"), ("master.host", 5, "master.host"),
    ("master.address", None, "master.address"), ("master.pid", 0, "master.pid"),
    ("master.pid", 1.5, "master.pid"), ("master.base_port", 70000, "master.base_port"),
    ("master.monitor_port", -1, "master.monitor_port"),
    ("master.monitor_port", DELETE, "master.monitor_port"),
    ("priorities", [], "priorities"), ("priorities.0", DELETE, "priorities.0"),
    ("priorities.7", {}, "priorities '7'"),
    ("priorities.0.status", "busy", "priorities.0.status"),
    ("priorities.0.status", DELETE, "priorities.0.status"),
    ("priorities.0.run", "r9", "priorities.0.run"),
    ("priorities.2.run", "", "priorities.2.run"),
    ("priorities.1.run", 7, "priorities.1.run"),
    ("priorities.1.jobs_left", -3, "priorities.1.jobs_left"),
    ("priorities.1.jobs_left", "many", "priorities.1.jobs_left"),
    ("priorities.1.jobs_running", None, "priorities.1.jobs_running"),
    ("priorities.1.nodes", False, "priorities.1.nodes"),
    ("priorities.1.nodes_wanted", 1.0, "priorities.1.nodes_wanted"),
    ("nodes_wanted", -1, "nodes_wanted"), ("nodes_wanted", 5, "nodes_wanted 5"),
    ("node", "x", "node"), ("node.command", [], "node.command"),
    ("node.command", "clusterpull.py", "node.command"),
    ("node.command", ["a", 3], "node.command"), ("node.command", ["a", ""], "node.command"),
    ("node.slots", 0, "node.slots"), ("node.prefix", "", "node.prefix"),
    ("node.idle_exit", 0, "node.idle_exit"), ("node.idle_exit", "60", "node.idle_exit"),
]


@pytest.mark.parametrize("dotted,value,named", BAD_FIELDS)
def test_every_bad_field_is_refused_naming_it(dotted: str, value: object,
                                              named: str) -> None:
    doc = document()
    _set(doc, dotted, value)
    with pytest.raises(ResourceFileError) as caught:
        parse(doc)
    text = str(caught.value)
    assert text.startswith("res.json: ")
    assert named in text
    assert "expected" in text


def test_not_json_and_not_an_object_are_refused() -> None:
    with pytest.raises(ResourceFileError, match="not JSON"):
        parse_resources(b"{half", WRITTEN, 10.0, source="res.json")
    with pytest.raises(ResourceFileError, match="expected a JSON object"):
        parse_resources(b"[]", WRITTEN, 10.0, source="res.json")
    with pytest.raises(ResourceFileError, match="not JSON"):
        parse_resources(b"\xff\xfe", WRITTEN, 10.0, source="res.json")


def test_a_resource_file_error_is_a_value_error() -> None:
    assert issubclass(ResourceFileError, ValueError)


def test_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_resources(tmp_path / "none.json", WRITTEN, 10.0)


def test_a_non_finite_written_is_refused() -> None:
    text = format_resources(sample()).replace(str(WRITTEN), "NaN")
    with pytest.raises(ResourceFileError, match="written"):
        parse_resources(text, WRITTEN, 10.0)
    assert resources.FORMAT == 1
