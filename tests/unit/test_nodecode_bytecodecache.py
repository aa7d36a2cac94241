"""The bytecode a publish compiled, kept across processes (cluster/node/bytecodecache.py):
a second publish of the same sources into a new home compiles nothing and writes the same
MANIFEST; a damaged entry is never published; a changed source misses; the cache stays
bounded; a cache that cannot be written changes nothing but the speed."""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

import pytest

from cluster.node import bytecodecache, code
from tests.helpers import copy_code


def _copy_repo(dest: Path) -> Path:
    return copy_code(dest)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bytecode-cache"
    monkeypatch.setenv(bytecodecache.ENV, str(folder))
    return folder


def _no_compiling(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make py_compile.compile record its calls and then compile as before."""
    calls: list[str] = []
    real = py_compile.compile

    def recording(file: str, *args: object, **kwargs: object) -> str:
        calls.append(file)
        return real(file, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(py_compile, "compile", recording)
    return calls


def test_a_second_home_gets_the_bytecode_from_the_cache(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _copy_repo(tmp_path / "repo")
    calls = _no_compiling(monkeypatch)
    assert code.publish(repo, tmp_path / "home1" / "node-code") is True
    compiled = len(calls)
    modules = [rel for rel in code.node_files(repo) if code.bytecode_file(rel)]
    assert compiled == len(modules)
    assert len(list(cache.glob("*.pyc"))) == len(modules)
    assert code.publish(repo, tmp_path / "home2" / "node-code") is True
    assert len(calls) == compiled  # nothing compiled for the second home
    first = (tmp_path / "home1" / "node-code" / code.MANIFEST).read_text()
    assert (tmp_path / "home2" / "node-code" / code.MANIFEST).read_text() == first


def test_a_damaged_entry_is_compiled_over_and_never_published(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _copy_repo(tmp_path / "repo")
    code.publish(repo, tmp_path / "home1" / "node-code")
    first = (tmp_path / "home1" / "node-code" / code.MANIFEST).read_text()
    rel = "cluster/node/caps.py"
    key = bytecodecache.entry_key(rel, code.file_md5(repo / rel))
    (entry,) = cache.glob(f"{key}.*.pyc")
    damaged = bytearray(entry.read_bytes())
    damaged[-1] ^= 1
    entry.write_bytes(bytes(damaged))
    calls = _no_compiling(monkeypatch)
    assert code.publish(repo, tmp_path / "home2" / "node-code") is True
    assert calls == [str(tmp_path / "home2" / "node-code" / rel)]  # that module only
    assert (tmp_path / "home2" / "node-code" / code.MANIFEST).read_text() == first
    (again,) = cache.glob(f"{key}.*.pyc")  # the entry made anew, sound
    assert again.read_bytes() != bytes(damaged)


def test_a_changed_source_misses_and_the_key_names_path_source_and_python(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _copy_repo(tmp_path / "repo")
    code.publish(repo, tmp_path / "home1" / "node-code")
    caps = repo / "cluster/node/caps.py"
    caps.write_text(caps.read_text() + "# changed\n")
    calls = _no_compiling(monkeypatch)
    code.publish(repo, tmp_path / "home2" / "node-code")
    assert calls == [str(tmp_path / "home2" / "node-code" / "cluster/node/caps.py")]
    md5 = "0" * 32
    keys = {bytecodecache.entry_key("cluster/a.py", md5),
            bytecodecache.entry_key("cluster/b.py", md5),
            bytecodecache.entry_key("cluster/a.py", "1" * 32)}
    with monkeypatch.context() as m:
        m.setattr(bytecodecache.sys.implementation, "cache_tag", "otherpython-99")
        keys.add(bytecodecache.entry_key("cluster/a.py", md5))
    assert len(keys) == 4


def test_the_cache_keeps_at_most_max_files_the_newest_used(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytecodecache, "MAX_FILES", 3)
    pyc = tmp_path / "x.pyc"
    pyc.write_bytes(b"bytecode")
    md5 = code.file_md5(pyc)
    store = bytecodecache.BytecodeCache()
    for n in range(5):
        store.store(f"cluster/m{n}.py", "0" * 32, pyc, md5)
        entry = next(cache.glob(f"{bytecodecache.entry_key(f'cluster/m{n}.py', '0' * 32)}.*"))
        os.utime(entry, (1000 + n, 1000 + n))
    kept = bytecodecache.BytecodeCache()
    assert len(list(cache.glob("*.pyc"))) == 3
    for n in range(5):
        found = kept.fetch(f"cluster/m{n}.py", "0" * 32, tmp_path / f"out{n}.pyc")
        assert (found == md5) is (n >= 2), n


def test_a_cache_that_cannot_be_written_only_costs_the_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv(bytecodecache.ENV, str(blocker / "cache"))
    repo = _copy_repo(tmp_path / "repo")
    assert code.publish(repo, tmp_path / "home" / "node-code") is True
    listed = code.parse_manifest((tmp_path / "home" / "node-code" / code.MANIFEST).read_text())
    assert code.bytecode_file("cluster/node/caps.py") in listed
