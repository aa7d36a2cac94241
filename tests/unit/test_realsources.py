"""The real-product tests unpack Debian's tarballs safely on every Python 3.11 (Debian 12's
3.11.2 has no tarfile filters): tests.realsources.extract_all."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tests.realsources import extract_all


def _tarball(path: Path, members: list[tuple[str, str]]) -> Path:
    """A tarball of ``(name, link target or '' for a small file)`` members."""
    with tarfile.open(path, "w") as archive:
        for name, target in members:
            info = tarfile.TarInfo(name)
            if target:
                info.type, info.linkname = tarfile.SYMTYPE, target
                archive.addfile(info)
            else:
                info.size = 2
                archive.addfile(info, io.BytesIO(b"x\n"))
    return path


@pytest.fixture(params=["filters", "no filters"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both paths: this Python's filter="data", and the checks made without it."""
    if request.param == "no filters":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return str(request.param)


def test_a_source_tree_with_inner_links_is_unpacked(tmp_path: Path, python: str) -> None:
    tar = _tarball(tmp_path / "t.tar", [("top/a/file.c", ""), ("top/a/link.c", "file.c"),
                                        ("top/b/up.c", "../a/file.c")])
    extract_all(tarfile.open(tar), tmp_path / "out")
    assert (tmp_path / "out" / "top" / "b" / "up.c").read_text() == "x\n"


@pytest.mark.parametrize("members", [
    [("../evil", "")],
    [("/tmp/evil-abs", "")],
    [("top/link", "/etc/passwd")],
    [("top/link", "../../outside")],
])
def test_a_member_leaving_the_folder_is_refused(tmp_path: Path, python: str,
                                                members: list[tuple[str, str]]) -> None:
    """Refused, or (filter="data" on an absolute name) written inside the folder: never
    outside it."""
    tar = _tarball(tmp_path / "t.tar", members)
    out = tmp_path / "out"
    try:
        extract_all(tarfile.open(tar), out)
    except (ValueError, tarfile.TarError):
        refused = True
    else:
        refused = False
        assert members[0][0].startswith("/") and python == "filters", members
        assert (out / members[0][0].lstrip("/")).is_file()
    assert refused or python == "filters"
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil-abs").exists()
