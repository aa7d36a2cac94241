"""The node code (cluster/node/code.py): the computed file set is closed under imports and
runs on its own; the manifest's format; publish copies only what changed, deletes what left
the set, writes MANIFEST last, and does nothing when nothing changed."""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest

from cluster.node import code
from tests.helpers import REPO, copy_code


def _copy_repo(dest: Path) -> Path:
    """The repo's package and top-level scripts (not .git, tests, corpus) under ``dest``."""
    return copy_code(dest)


def _old(path: Path, seconds: float = 60.0) -> None:
    """Date ``path``'s mtime back, as a file edited a while ago (not racy)."""
    when = time.time() - seconds
    os.utime(path, (when, when))


def _resolve(files: set[str], module: str) -> bool:
    base = PurePosixPath(*module.split("."))
    return str(base.with_suffix(".py")) in files or str(base / "__init__.py") in files


def test_the_set_is_closed_under_imports() -> None:
    """Checked independently of node_files' own scan: every ``cluster.*`` import of every
    file in the set, found by walking its syntax tree, names a module in the set (``from
    a import b`` needs a, and a.b too when a/b.py exists in the repo)."""
    files = set(code.node_files(REPO))
    for must in ("run.py", "clusterpull.py", "heartbeat.py", "send_caps.py",
                 "cluster/bmpcmp/__main__.py", "cluster/cli/bmpcmp.py",
                 "cluster/node/pull.py", "cluster/wire/protocol.py", "cluster/runtime/proc.py",
                 "cluster/__init__.py", "cluster/config.py"):
        assert must in files, must
    for master_side in ("cluster/master/run/clustermaster.py", "cluster/report/tab.py",
                        "cluster/jobs/generate.py", "cluster/triggers/push.py",
                        "cluster/cli/clustermaster.py", "clustermaster.py"):
        assert master_side not in files, master_side
    problems = []
    for rel in sorted(files):
        tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                         if _resolve_in_repo(f"{node.module}.{a.name}")]
            for name in names:
                if name.split(".")[0] == "cluster" and not _resolve(files, name):
                    problems.append(f"{rel} imports {name}")
        for depth in range(1, len(PurePosixPath(rel).parts) - 1):
            init = str(PurePosixPath(*PurePosixPath(rel).parts[:depth], "__init__.py"))
            if init not in files:
                problems.append(f"{rel}: package file {init} missing")
    assert problems == []


def _resolve_in_repo(module: str) -> bool:
    return _resolve({str(p.relative_to(REPO).as_posix()) for p in (REPO / "cluster").rglob("*.py")},
                    module)


def test_the_published_copy_runs_alone(tmp_path: Path) -> None:
    """The node's scripts and modules import from a published copy with nothing of the repo
    on the path: the set is complete in practice, not only on paper."""
    dest = tmp_path / "node-code"
    assert code.publish(REPO, dest) is True
    modules = sorted(rel[:-3].replace("/", ".").removesuffix(".__init__")
                     for rel in code.node_files(REPO)
                     if rel.startswith("cluster/") and not rel.endswith("__main__.py"))
    program = ("import importlib, sys\n"
               f"for m in {modules!r}:\n"
               "    mod = importlib.import_module(m)\n"
               f"    assert mod.__file__.startswith({str(dest)!r}), (m, mod.__file__)\n"
               "print('ok', len(sys.modules))\n")
    env = {**os.environ, "PYTHONPATH": str(dest)}
    done = subprocess.run([sys.executable, "-c", program], cwd=dest, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for script in ("run.py", "clusterpull.py", "heartbeat.py", "send_caps.py"):
        done = subprocess.run([sys.executable, str(dest / script), "--help"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (script, done.stderr)
    done = subprocess.run([sys.executable, "-m", "cluster.bmpcmp", "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_manifest_format_and_version(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.py").write_bytes(b"x = 1\n")
    (tmp_path / "a.py").write_bytes(b"")
    text = code.manifest(tmp_path, ["b/x.py", "a.py"])
    empty, one = hashlib.md5(b"").hexdigest(), hashlib.md5(b"x = 1\n").hexdigest()
    assert text == f"{empty}  a.py\n{one}  b/x.py\n"
    assert code.parse_manifest(text) == {"a.py": empty, "b/x.py": one}
    assert code.manifest_version(text) == hashlib.md5(text.encode()).hexdigest()
    md5 = "0" * 32
    for bad in (f"{md5} a.py", f"{md5}  /etc/passwd", f"{md5}  ../x", "xyz  a.py",
                f"{md5}  a.py\n{md5}  a.py", f"{md5}  a//b.py"):
        with pytest.raises(code.NodeCodeError):
            code.parse_manifest(bad)


def test_publish_changes_only_what_changed(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path / "repo")
    for path in repo.rglob("*.py"):
        _old(path)
    dest = tmp_path / "home" / "node-code"
    assert code.publish(repo, dest) is True
    manifest = dest / code.MANIFEST
    files = code.node_files(repo)
    published = code.published_files(files)
    assert len(published) > len(files)  # the package's modules have their bytecode
    assert manifest.read_text() == code.manifest(dest, published)
    assert all((dest / rel).read_bytes() == (repo / rel).read_bytes() for rel in files)
    assert sorted(str(p.relative_to(dest).as_posix()) for p in dest.rglob("*")
                  if p.is_file()) == sorted([*published, code.MANIFEST])
    inodes = {rel: (dest / rel).stat().st_ino for rel in [*published, code.MANIFEST]}

    # Nothing changed: nothing is written (same inodes, same times), and it is quick.
    started = time.monotonic()
    assert code.publish(repo, dest) is False
    assert time.monotonic() - started < 2.0
    assert {rel: (dest / rel).stat().st_ino for rel in inodes} == inodes

    # One module changed -> exactly it and the manifest are rewritten.
    target = repo / "cluster" / "node" / "caps.py"
    text = target.read_text()
    target.write_text(text + "# new\n")
    assert code.publish(repo, dest) is True
    changed = {rel for rel in inodes if (dest / rel).stat().st_ino != inodes[rel]}
    assert changed == {"cluster/node/caps.py", code.bytecode_file("cluster/node/caps.py"),
                       code.MANIFEST}
    assert (dest / "cluster/node/caps.py").read_text() == text + "# new\n"
    assert manifest.read_text() == code.manifest(dest, published)

    # The same size and the same mtime, different content, written within the racy window
    # of the publish: still found (hashed, not trusted).
    stamp = target.stat()
    target.write_text(text + "# old\n")
    os.utime(target, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert code.publish(repo, dest) is True
    assert (dest / "cluster/node/caps.py").read_text() == text + "# old\n"


def test_publish_follows_new_imports_and_deletes_what_left(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path / "repo")
    dest = tmp_path / "node-code"
    code.publish(repo, dest)
    assert not (dest / "cluster/node/extra_helper.py").exists()
    # A new module imported by a node module joins the set (it is in cluster/node, so it
    # would anyway); a new import of a core module outside the rooms joins it too.
    (repo / "cluster/node/extra_helper.py").write_text("from cluster import queue\n")
    assert code.publish(repo, dest) is True
    assert (dest / "cluster/node/extra_helper.py").is_file()
    assert (dest / "cluster/queue.py").is_file()
    assert "cluster/queue.py" in code.parse_manifest((dest / code.MANIFEST).read_text())
    # It goes again: both leave node-code/, and a stray file there is removed too.
    helper_pyc = dest / str(code.bytecode_file("cluster/node/extra_helper.py"))
    assert helper_pyc.is_file()
    (repo / "cluster/node/extra_helper.py").unlink()
    (dest / "cluster/stray.txt").write_text("not ours")
    (dest / "cluster/__pycache__/stray.cpython-311.pyc").write_text("not ours either")
    assert code.publish(repo, dest) is True
    assert not (dest / "cluster/node/extra_helper.py").exists()
    assert not helper_pyc.exists()
    assert not (dest / "cluster/stray.txt").exists()
    assert not (dest / "cluster/__pycache__/stray.cpython-311.pyc").exists()
    assert ("cluster/queue.py" in code.node_files(repo)) == (dest / "cluster/queue.py").exists()
    assert code.parse_manifest((dest / code.MANIFEST).read_text()).keys() == \
        set(code.published_files(code.node_files(repo)))


def test_the_bytecode_published_is_hash_checked_and_the_same_as_a_fresh_compile(
        tmp_path: Path) -> None:
    """Each module's bytecode names its source by content (PEP 552 flags: checked hash), is
    byte for byte what compiling the source again gives (so a new master process publishes
    the same version), and is what Python loads from the copy."""
    repo = _copy_repo(tmp_path / "repo")
    dest = tmp_path / "node-code"
    assert code.publish(repo, dest) is True
    first = (dest / code.MANIFEST).read_text()
    rel = "cluster/node/caps.py"
    pyc = dest / str(code.bytecode_file(rel))
    flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    assert flags == 0b11, flags  # hash-based, checked
    again = tmp_path / "again" / "caps.pyc"
    again.parent.mkdir()
    py_compile.compile(str(repo / rel), cfile=str(again), dfile=rel, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert again.read_bytes() == pyc.read_bytes()
    # A second home, published by this process from nothing: the same version.
    assert code.publish(repo, tmp_path / "other") is True
    assert (tmp_path / "other" / code.MANIFEST).read_text() == first
    probe = "import cluster.node.caps as c; print(c.__cached__)"
    done = subprocess.run([sys.executable, "-v", "-c", probe], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(dest),
                               "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"code object from '{pyc}'" in done.stderr
    assert code.bytecode_file("caps_script.py") is None  # scripts: Python never reads it


def test_a_module_that_does_not_compile_is_published_without_bytecode(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A module ast parses but the compiler refuses ('return' outside a function) is still
    published, with no bytecode and a warning naming it: the node fails where it imports
    it, with Python's own message, as before bytecode was shipped."""
    repo = _copy_repo(tmp_path / "repo")
    (repo / "cluster/node/extra_helper.py").write_text("return 1\n")
    dest = tmp_path / "node-code"
    with caplog.at_level(logging.WARNING, logger="cluster.nodecode"):
        assert code.publish(repo, dest) is True
    listed = code.parse_manifest((dest / code.MANIFEST).read_text())
    assert "cluster/node/extra_helper.py" in listed
    assert code.bytecode_file("cluster/node/extra_helper.py") not in listed
    assert not (dest / str(code.bytecode_file("cluster/node/extra_helper.py"))).exists()
    assert any("cluster/node/extra_helper.py does not compile" in r.getMessage()
               for r in caplog.records), caplog.text


def test_an_import_of_a_missing_module_is_refused(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path / "repo")
    dest = tmp_path / "node-code"
    code.publish(repo, dest)
    good = (dest / code.MANIFEST).read_text()
    (repo / "cluster/node/caps.py").write_text("import cluster.no_such_module\n")
    with pytest.raises(code.NodeCodeError, match="cluster.no_such_module"):
        code.publish(repo, dest)
    assert (dest / code.MANIFEST).read_text() == good


NESTED = '''\
import cluster.a
def f():
    import cluster.b
    class C:
        def g(self):
            try:
                pass
            except ImportError:
                from cluster import c
            else:
                import cluster.d
            finally:
                import cluster.e
while True:
    break
else:
    with open("x") as fh:
        if fh:
            pass
        else:
            from cluster.f import thing
for _ in ():
    pass
else:
    import cluster.g
match 1:
    case 1:
        import cluster.h
try:
    pass
except* ValueError:
    import cluster.i
x = lambda: __import__("cluster.not_a_statement")
'''


def test_imports_are_found_in_every_kind_of_body(tmp_path: Path) -> None:
    """The scan walks statements only (imports are statements), into every body: functions,
    classes, try and its handlers, else and finally, while, for, with, match cases."""
    root = tmp_path / "repo"
    for name in "abcdefghi":
        (root / "cluster" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / "cluster" / f"{name}.py").write_text("")
    (root / "cluster" / "__init__.py").write_text("")
    (root / "nested.py").write_text(NESTED)
    assert code.imported_modules(root, "nested.py") == {
        "cluster", *(f"cluster.{name}" for name in "abcdefghi")}


def test_the_statement_scan_finds_what_a_full_walk_finds_in_every_file() -> None:
    """Over the whole package and the scripts: the same ``cluster.*`` imports as
    :func:`ast.walk` over every node of each file."""
    rels = sorted({str(p.relative_to(REPO).as_posix()) for p in (REPO / "cluster").rglob("*.py")
                   if "__pycache__" not in p.parts} | {p.name for p in REPO.glob("*.py")})
    assert len(rels) > 100
    for rel in rels:
        tree = ast.parse((REPO / rel).read_bytes())
        full = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        found = [n for n in code._statements(tree)
                 if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert sorted(map(ast.dump, found)) == sorted(map(ast.dump, full)), rel
