"""clusterpush --master, the pure parts: the shipped code, the modes list."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cluster.errors import ClusterError
from cluster.triggers.pushreceive import read_modes, source_modes, write_modes
from cluster.triggers.remotepush import build_zip, code_zip

REPO = Path(__file__).resolve().parents[2]


def test_remote_push_master_side_needs_only_the_standard_library() -> None:
    """The master's python3 runs the shipped code without the package's dependencies."""
    code = ("import sys\n"
            "for name in ('paramiko', 'psutil', 'crontab', 'importlinter'):\n"
            "    sys.modules[name] = None  # importing it now fails\n"
            "import cluster.cli.pushremote\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_remote_push_code_zip_runs_pushremote() -> None:
    data = code_zip()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        main = zf.read("__main__.py").decode()
    assert "cluster/cli/pushremote.py" in names and "cluster/triggers/push.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    assert "cluster.cli.pushremote" in main


def test_remote_push_code_zip_is_deterministic(tmp_path: Path) -> None:
    """The same sources make the same bytes (a copy: other work may edit the tree)."""
    copy = tmp_path / "cluster"
    shutil.copytree(REPO / "cluster", copy, ignore=shutil.ignore_patterns("__pycache__"))
    first = build_zip(copy)
    (copy / "runtime" / "clock.py").touch()  # a new mtime is not a new version
    assert build_zip(copy) == first
    (copy / "errors.py").write_text((copy / "errors.py").read_text() + "# changed\n")
    assert build_zip(copy) != first


def test_remote_push_zip_refuses_bad_arguments(tmp_path: Path) -> None:
    pyz = tmp_path / "c.pyz"
    pyz.write_bytes(code_zip())
    done = subprocess.run([sys.executable, str(pyz), "receive", f"--home={tmp_path}",
                           "--line=user alice gs", "--token=0123456789abcdef", "--",
                           "--server", "--sender", "."],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert '"error": "remote push: expected rsync' in done.stderr
    assert not (tmp_path / "users").exists()


def test_remote_push_modes_round_trip(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "gs").write_text("excluded\n")
    (tree / "a b\nc").write_text("x")
    (tree / "a b\nc").chmod(0o640)
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o750)
    (tree / "link").symlink_to("run.sh")
    modes = source_modes(tree)
    assert modes == {"a b\nc": 0o640, "run.sh": 0o750, "link": 0o750}
    assert read_modes(write_modes(modes)) == modes


@pytest.mark.parametrize("data", [b"644\0a", b"999\0a\0", b"644\0/etc/passwd\0",
                                  b"644\0a/../../x\0", b"644\0\0"])
def test_remote_push_modes_refuses_garbage(data: bytes) -> None:
    with pytest.raises(ClusterError):
        read_modes(data)
