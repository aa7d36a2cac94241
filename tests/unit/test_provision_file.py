"""The provisioner's status file (cluster.wire.provision): round trip, every malformed field
named with what was expected, staleness at 3 x the provisioner's own interval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.wire.provision import (
    ProvisionFileError,
    ProvisionJob,
    ProvisionStatus,
    format_status,
    parse_status,
    read_status,
)

WRITTEN = 1_795_683_296.5
STATUS = ProvisionStatus(
    written=WRITTEN, pid=4242, engine="Slurm", interval=10.0, wanted=3, pending=1, running=1,
    jobs=(ProvisionJob("41", "slurm-node", "slurm-41", "running"),
          ProvisionJob("42", "slurm-node", "slurm-42", "pending", "PartitionDown"),
          ProvisionJob("43", "slurm-node", "slurm-43", "submitted")),
    action="wanted 3 pending 1 running 1: submitted 1 (1 wanted beyond pending + running); "
           "pending: 1 PartitionDown",
    trouble="")


def document(**changes: Any) -> dict[str, Any]:
    data = json.loads(format_status(STATUS))
    data.update(changes)
    return data


def test_the_file_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "provision.json"
    path.write_text(format_status(STATUS), encoding="utf-8")
    assert read_status(path, WRITTEN + 5) == STATUS
    text = format_status(STATUS)
    assert text.endswith("\n") and json.loads(text)["format"] == 1
    refused = ProvisionStatus(written=WRITTEN, pid=1, engine="Slurm", interval=2.5, wanted=2,
                              pending=None, running=None, action="wanted 2 pending ? ...",
                              trouble="squeue: exit status 1: slurm_load_jobs error: "
                                      "Unable to contact slurm controller")
    assert parse_status(format_status(refused), WRITTEN) == refused
    assert json.loads(format_status(refused))["pending"] is None


def test_keys_it_does_not_know_are_ignored() -> None:
    assert parse_status(json.dumps(document(future="x")), WRITTEN) == STATUS


def test_it_is_stale_after_three_of_its_own_intervals() -> None:
    text = format_status(STATUS)
    assert not parse_status(text, WRITTEN + 30).stale
    late = parse_status(text, WRITTEN + 30.5)
    assert late.stale and late.age(WRITTEN + 30.5) == 30.5
    slow = json.dumps(document(interval=60))
    assert not parse_status(slow, WRITTEN + 170).stale
    assert parse_status(slow, WRITTEN + 181).stale
    assert parse_status(text, WRITTEN - 100).age(WRITTEN - 100) == 0.0  # a clock ahead


@pytest.mark.parametrize(("changes", "named"), [
    ({"format": 2}, "format 2: expected 1"),
    ({"format": True}, "format True: expected 1"),
    ({"written": "yesterday"}, "written 'yesterday': expected a finite number"),
    ({"pid": 0}, "pid 0: expected an integer >= 1"),
    ({"engine": ""}, "engine '': expected a non-empty string"),
    ({"interval": 0}, "interval 0: expected a finite number > 0"),
    ({"wanted": -1}, "wanted -1: expected an integer >= 0"),
    ({"wanted": True}, "wanted True: expected an integer >= 0"),
    ({"pending": "3"}, "pending '3': expected an integer >= 0, or null"),
    ({"running": None}, "running None: expected null only when the other of pending and "
                        "running is null too"),
    ({"pending": None}, "pending None: expected null only when the other"),
    ({"jobs": {}}, "jobs {}: expected a list of jobs"),
    ({"jobs": ["41"]}, "jobs.0 '41': expected a JSON object"),
    ({"jobs": [{"job_id": "41", "name": "n", "node": "slurm-41", "state": "lost",
                "reason": ""}]},
     "jobs.0.state 'lost': expected one of pending, running, ending, submitted, cancelled"),
    ({"jobs": [{"job_id": "", "name": "n", "node": "slurm-41", "state": "running",
                "reason": ""}]}, "jobs.0.job_id '': expected a non-empty string"),
    ({"jobs": [{"job_id": "41", "name": "n", "state": "running", "reason": ""}]},
     "jobs.0.node missing: expected a non-empty string"),
    ({"action": None}, "action None: expected a string"),
    ({"trouble": 7}, "trouble 7: expected a string"),
])
def test_a_malformed_field_is_named_with_what_was_expected(changes: dict[str, Any],
                                                            named: str) -> None:
    with pytest.raises(ProvisionFileError) as caught:
        parse_status(json.dumps(document(**changes)), WRITTEN, source="/h/provision.json")
    assert str(caught.value).startswith("/h/provision.json: ")
    assert named in str(caught.value)


def test_what_is_not_a_json_object_is_refused_and_a_missing_file_is_oserror(
        tmp_path: Path) -> None:
    with pytest.raises(ProvisionFileError, match="not JSON .*expected one JSON object"):
        parse_status("{half", WRITTEN)
    with pytest.raises(ProvisionFileError, match="the file is list: expected a JSON object"):
        parse_status("[]", WRITTEN)
    missing = document()
    del missing["wanted"]
    with pytest.raises(ProvisionFileError, match="wanted missing: expected an integer"):
        parse_status(json.dumps(missing), WRITTEN)
    with pytest.raises(FileNotFoundError):
        read_status(tmp_path / "provision.json", WRITTEN)
