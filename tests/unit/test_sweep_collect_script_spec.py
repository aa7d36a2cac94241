"""The sweep file's ``collect_script`` key (docs/sweeps.md, "The collection script"): a
script of the sweep folder, refused at submission like the check script when its path is
hostile, missing or leads out of the folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.errors import SweepError
from cluster.sweep.spec import SweepSpec, load
from cluster.triggers.sweeppush import prepare_sweep

MINIMAL = 'command = "echo {alpha}"\ntable = "params.csv"\n'


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "params.csv").write_text("alpha,n\n0.1,10\n", encoding="utf-8")
    (sweep / "collect.sh").write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    return sweep


def load_text(folder: Path, text: str) -> SweepSpec:
    path = folder / "sweep.toml"
    path.write_text(text, encoding="utf-8")
    return load(path)


def refused(folder: Path, text: str) -> SweepError:
    with pytest.raises(SweepError) as info:
        load_text(folder, text)
    assert info.value.where == "sweep.toml"
    return info.value


def test_collect_script_names_a_file_of_the_sweep_folder(folder: Path) -> None:
    (folder / "tools").mkdir()
    (folder / "tools" / "sum.py").write_text("", encoding="utf-8")
    assert load_text(folder, MINIMAL + 'collect_script = "collect.sh"\n').collect_script \
        == "collect.sh"
    assert load_text(folder, MINIMAL + 'collect_script = "tools/sum.py"\n').collect_script \
        == "tools/sum.py"


def test_without_the_key_there_is_no_collection_script(folder: Path) -> None:
    assert load_text(folder, MINIMAL).collect_script == ""


@pytest.mark.parametrize(("script", "message"), [
    ("../collect.sh", "has a '..' component"),
    ("/bin/true", "is an absolute path"),
    ("a//b", "has an empty component"),
    ("", "is empty"),
    ("nope.sh", "is not there"),
])
def test_a_bad_script_path_is_refused_naming_the_key(folder: Path, script: str,
                                                     message: str) -> None:
    error = refused(folder, MINIMAL + f'collect_script = "{script}"\n')
    assert error.key == "collect_script"
    assert "the collection script" in str(error) and message in str(error)


def test_a_script_linked_from_outside_the_folder_is_refused(folder: Path) -> None:
    (folder / "link.sh").symlink_to("/bin/true")
    error = refused(folder, MINIMAL + 'collect_script = "link.sh"\n')
    assert error.key == "collect_script"
    assert "leads outside the sweep folder" in str(error)


def test_a_folder_is_not_a_script(folder: Path) -> None:
    (folder / "tools").mkdir()
    error = refused(folder, MINIMAL + 'collect_script = "tools"\n')
    assert "is not a regular file" in str(error)


def test_a_script_that_is_not_a_string_is_refused(folder: Path) -> None:
    error = refused(folder, MINIMAL + "collect_script = [\"collect.sh\"]\n")
    assert error.key == "collect_script"
    assert "expected the collection script's path in the sweep folder" in str(error)


def test_a_misspelt_key_is_unknown_and_the_known_ones_are_listed(folder: Path) -> None:
    error = refused(folder, MINIMAL + 'collect_scrpit = "collect.sh"\n')
    assert error.key == "collect_scrpit"
    assert "collect_script" in str(error)


def test_script_is_not_a_key_of_a_collect_entry(folder: Path) -> None:
    error = refused(folder, MINIMAL + '[results]\no = "stdout"\n[collect]\n'
                    '"all.txt" = { from = "o", script = "collect.sh" }\n')
    assert error.key == 'collect."all.txt".script'


def test_a_script_a_push_would_leave_behind_is_refused_at_submission(folder: Path) -> None:
    (folder / "build").mkdir()
    (folder / "build" / "collect.sh").write_text("#!/bin/sh\n", encoding="utf-8")
    (folder / "sweep.toml").write_text(MINIMAL + 'collect_script = "build/collect.sh"\n',
                                       encoding="utf-8")
    with pytest.raises(SweepError) as info:
        prepare_sweep(folder / "sweep.toml")
    assert info.value.key == "collect_script"
    assert "would not travel with the sweep folder" in str(info.value)
