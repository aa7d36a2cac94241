"""The node-code import scan kept on disk (cluster/node/scancache.py): a new process's first
scan parses only the files changed since, a changed file is parsed again, and a cache file
that is missing, corrupt or of another shape is only an empty cache."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from cluster.node import code, scancache
from tests.helpers import REPO


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the repo's node side, a fresh scan cache file, and this process's memory
    of earlier scans forgotten (as in a new process); parses count as ``tmp_path/parsed``."""
    dest = tmp_path / "repo"
    shutil.copytree(REPO / "cluster", dest / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for script in REPO.glob("*.py"):
        shutil.copy2(script, dest / script.name)
    monkeypatch.setenv(scancache.ENV, str(tmp_path / "scan.json"))
    monkeypatch.setattr(code, "RACY_WINDOW", 0.0)
    monkeypatch.setattr(code, "_IMPORTS", {})
    monkeypatch.setattr(code, "_DISK", {"loaded": False, "dirty": False})
    return dest


def _new_process(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Forget the scans in memory, as a new process would; return the list of the files
    the next scans parse."""
    monkeypatch.setattr(code, "_IMPORTS", {})
    monkeypatch.setattr(code, "_DISK", {"loaded": False, "dirty": False})
    parsed: list[str] = []
    real = ast.parse

    def counting(source: bytes, filename: str = "<unknown>", **kw: object) -> ast.AST:
        parsed.append(filename)
        return real(source, filename, **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(code.ast, "parse", counting)
    return parsed


def test_a_new_process_parses_nothing_that_an_earlier_scan_read(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _new_process(monkeypatch)
    files = code.node_files(repo)
    assert len(parsed) == len(files) > 50
    assert len(json.loads((tmp_path / "scan.json").read_text())["files"]) == len(files)
    parsed = _new_process(monkeypatch)
    assert code.node_files(repo) == files
    assert parsed == []


def test_a_changed_file_is_parsed_again_and_its_new_import_found(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = code.node_files(repo)
    assert "cluster/report/tab.py" not in files
    changed = repo / "cluster" / "node" / "slots.py"
    changed.write_text(changed.read_text() + "\nfrom cluster.report import tab  # noqa\n")
    parsed = _new_process(monkeypatch)
    after = code.node_files(repo)
    assert str(changed) in parsed and "cluster/report/tab.py" in after
    assert len(parsed) < 10  # the new file and what it brought in


@pytest.mark.parametrize("content", [
    b"", b"not json", b"[]", b'{"version": 2, "files": {}}', b'{"version": 1, "files": []}',
    b'{"version": 1, "files": {"/x.py": [1, 2, 3]}}',
    b'{"version": 1, "files": {"/x.py": [1, 2, 3, "4", [], []]}}',
    b'{"version": 1, "files": {"/x.py": [1, 2, 3, 4, [5], []]}}',
])
def test_a_cache_file_of_any_other_shape_is_an_empty_cache(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "scan.json"
    path.write_bytes(content)
    assert scancache.load(path) == {}


def test_a_broken_cache_file_costs_a_parse_not_the_publish(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scan.json").write_text('{"version": 1, "files": {"' + str(repo) +
                                        '/run.py": [0, 0, 0, 0, ["cluster.nowhere"], []]}}')
    parsed = _new_process(monkeypatch)
    files = code.node_files(repo)  # the entry's key matches no file: parsed afresh
    assert "run.py" in files and str(repo / "run.py") in parsed


def test_an_unwritable_cache_place_is_skipped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    scancache.save(blocker / "scan.json", {str(blocker): ((1, 2, 3, 4), frozenset(),
                                                          frozenset())})
    assert blocker.read_text() == ""


def test_entries_of_files_gone_are_dropped_and_the_newest_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scancache, "MAX_ENTRIES", 2)
    names = [tmp_path / f"m{i}.py" for i in range(4)]
    for name in names[1:]:
        name.write_text("")
    entry: scancache.Entry = ((1, 2, 3, 4), frozenset({"cluster.a"}), frozenset())
    scancache.save(tmp_path / "scan.json", {str(n): entry for n in names})
    assert scancache.load(tmp_path / "scan.json") == {str(n): entry for n in names[2:]}
