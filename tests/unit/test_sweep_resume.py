"""The pieces of a sweep's ``resume`` that are pure logic: the queue option ``resume=``,
the key of a task's row, and clusterpush's checks of ``--resume`` before anything is
looked up.  The selection itself, on real files, is tests/component/test_sweep_resume.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cluster.cli import clusterpush
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.sweep.resume import row_key

RUN = "20261126081143-p0-ab12"


def test_a_sweep_run_takes_resume_with_a_run_id() -> None:
    spec = RunSpec.parse(f"user bob sweep sweep=m.toml resume={RUN}")
    assert spec.resume == RUN and spec.sweep_file == "m.toml"
    # Canonical order is sorted by key: resume= before sweep=, whatever the order given.
    assert spec.line() == f"user bob sweep resume={RUN} sweep=m.toml"
    assert RunSpec.parse(spec.line()) == spec
    assert RunSpec.parse(f"user bob sweep resume={RUN} relaxtimeout").resume == RUN
    assert RunSpec.parse("user bob sweep").resume is None


@pytest.mark.parametrize("line", [f"user bob gs resume={RUN}",
                                  f"user bob shell resume={RUN}",
                                  f"auto nightly-x mupdf resume={RUN}"])
def test_resume_goes_with_product_sweep_only(line: str) -> None:
    with pytest.raises(QueueLineError, match="option resume= goes with product sweep only"):
        RunSpec.parse(line)


@pytest.mark.parametrize("bad", ["..", ".hidden", "a/b", "../../etc", "-rf", "x" * 65,
                                 "a:b", "a$b"])
def test_the_resumed_run_must_be_a_plain_run_id(bad: str) -> None:
    with pytest.raises(QueueLineError, match=re.escape(f"bad resume run {bad!r}")):
        RunSpec.parse(f"user bob sweep resume={bad}")


def test_resume_twice_or_empty_is_refused() -> None:
    with pytest.raises(QueueLineError, match="given twice"):
        RunSpec.parse(f"user bob sweep resume={RUN} resume={RUN}")
    with pytest.raises(QueueLineError, match="resume= has no value"):
        RunSpec.parse("user bob sweep resume=")


def test_a_row_key_depends_on_the_number_the_names_and_the_values() -> None:
    key = row_key(3, (("a", "1"), ("b", "x y")))
    assert key == row_key(3, (("a", "1"), ("b", "x y")))
    assert 0 <= key < 2 ** 64
    others = {row_key(4, (("a", "1"), ("b", "x y"))), row_key(3, (("a", "1"), ("b", "x"))),
              row_key(3, (("a", "1"), ("c", "x y"))), row_key(3, (("a", "1b"), ("b", " y"))),
              row_key(3, (("b", "x y"), ("a", "1")))}
    assert key not in others and len(others) == 5


def test_clusterpush_resume_needs_sweep_and_takes_no_resume_word(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(tmp_path / "home")
    home.create()
    assert clusterpush.main(["--home", str(home.root), "--user", "al", "--resume"]) == 2
    assert "--resume resumes a sweep: it goes with --sweep FILE" in capsys.readouterr().err
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "sweep.toml").write_text("command = 'echo {a}'\n[axes]\na = [1, 2]\n")
    assert clusterpush.main(["--home", str(home.root), "--user", "al", "--sweep",
                             str(folder / "sweep.toml"), f"resume={RUN}"]) == 2
    assert "give no resume= word" in capsys.readouterr().err
    assert not (home.users / "al").exists()
