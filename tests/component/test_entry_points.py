"""The commands ``pip install`` puts on PATH work from any directory and call themselves
by the name that was typed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO, command

SCRIPTS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_command_answers_help_from_any_directory(name: str, tmp_path: Path) -> None:
    done = subprocess.run([*command(name), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {name} "), done.stdout[:200]


def test_a_command_s_error_names_the_command_typed(tmp_path: Path) -> None:
    typed = subprocess.run([*command("clusteradmin"), "--home", str(tmp_path / "none"),
                            "ls"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    script = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                             str(tmp_path / "none"), "ls"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert typed.returncode == script.returncode != 0
    assert typed.stderr.startswith("clusteradmin: "), typed.stderr
    assert script.stderr.startswith("clusteradmin.py: "), script.stderr
