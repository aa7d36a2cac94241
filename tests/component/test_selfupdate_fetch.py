"""Self-update (cluster/node/selfupdate.py) against a real master home through the local
transport: a new version is fetched into work_dir/code/<md5>/ and checked; the same version
is not fetched again; only changed files travel; a corrupt file is refused and the last
good version used; nothing published means the installed copy; old versions go unless a
live process uses them."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.node import code, selfupdate
from cluster.node.selfupdate import CodeChoice, SelfUpdate
from cluster.node.transport import LocalTransport
from tests.helpers import REPO

INSTALLED = CodeChoice(Path("/installed/copy"))


class CountingTransport(LocalTransport):
    """The real local transport, counting the trees it fetches."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.fetches = 0

    def fetch_tree(self, rel: str, dest: Path, exclude: object = None,  # type: ignore[override]
                   max_size: int | None = None) -> None:
        self.fetches += 1
        super().fetch_tree(rel, dest)


@pytest.fixture
def master(tmp_path: Path) -> tuple[Path, Home]:
    """A copy of the repo's package and scripts (the master's checkout) and its home."""
    repo = tmp_path / "master-repo"
    shutil.copytree(REPO / "cluster", repo / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for script in REPO.glob("*.py"):
        shutil.copy2(script, repo / script.name)
    home = Home(tmp_path / "home")
    home.create()
    return repo, home


def _updater(home: Home, work: Path) -> tuple[SelfUpdate, CountingTransport]:
    transport = CountingTransport(home.root)
    return SelfUpdate(lambda: transport, work, INSTALLED), transport


def _edit(repo: Path, rel: str = "cluster/node/caps.py", line: str = "# edited\n") -> None:
    path = repo / rel
    path.write_text(path.read_text() + line)


def test_nothing_published_means_the_installed_copy(master: tuple[Path, Home],
                                                    tmp_path: Path) -> None:
    _, home = master
    updater, transport = _updater(home, tmp_path / "work")
    assert updater.choose() == INSTALLED
    assert transport.fetches == 0
    assert INSTALLED.env() is None


def test_a_new_version_is_fetched_checked_and_kept(master: tuple[Path, Home], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    repo, home = master
    code.publish(repo, home.node_code)
    manifest = (home.node_code / code.MANIFEST).read_text()
    version = code.manifest_version(manifest)
    work = tmp_path / "work"
    updater, transport = _updater(home, work)

    first = updater.choose()
    assert first == CodeChoice(work.absolute() / "code" / version, version)
    assert first.run_script.is_file()
    selfupdate.check_copy(first.root, manifest)
    assert (work / "code" / "CURRENT").read_text() == version + "\n"
    assert transport.fetches == 1
    env = first.env({"PYTHONPATH": "/elsewhere"})
    assert env is not None and env["PYTHONPATH"] == f"{first.root}{os.pathsep}/elsewhere"

    # The same manifest: nothing fetched again.
    assert updater.choose() == first
    assert transport.fetches == 1

    # A module changed on the master: the next choice is a new version, and only the
    # changed file, its bytecode and the manifest travelled (the fetch is seeded with the
    # last version).
    _edit(repo)
    assert code.publish(repo, home.node_code) is True
    caplog.set_level(logging.DEBUG, logger="cluster.transport")
    second = updater.choose()
    assert second.version not in (None, version)
    assert (second.root / "cluster/node/caps.py").read_text().endswith("# edited\n")
    assert transport.fetches == 2
    copied = [r.getMessage() for r in caplog.records if "file(s) copied" in r.getMessage()]
    assert copied and copied[-1].endswith(": 3 file(s) copied"), copied
    # The first version stays (a run.py may use it; two are kept), untouched.
    assert (first.root / "cluster/node/caps.py").read_text() == \
        (home.node_code / "cluster/node/caps.py").read_text().removesuffix("# edited\n")
    assert not list((work / "code").glob(".fetch-*"))


def test_a_fetched_copy_runs_the_masters_bytecode_and_compiles_nothing(
        master: tuple[Path, Home], tmp_path: Path) -> None:
    """The master ships each module's bytecode for its Python; a node running the same
    Python compiles nothing (its copy's bytecode is the master's, byte for byte), and a
    run.py started with PYTHONDONTWRITEBYTECODE=1 imports it without compiling anything,
    its tracebacks naming the copy's final place."""
    repo, home = master
    code.publish(repo, home.node_code)
    updater, _ = _updater(home, tmp_path / "work")
    copy = updater.choose()
    modules = sorted(copy.root.glob("cluster/**/*.py"))
    assert modules
    for module in modules:
        pyc = module.parent / "__pycache__" / f"{module.stem}.{sys.implementation.cache_tag}.pyc"
        rel = pyc.relative_to(copy.root)
        assert pyc.read_bytes() == (home.node_code / rel).read_bytes(), f"{rel}: not the master's"
    assert selfupdate.compile_copy(copy.root, copy.root) == []
    probe = "import cluster.node.noderun as n; print(n.NodeRun.run.__code__.co_filename)"
    done = subprocess.run([sys.executable, "-v", "-c", probe], cwd=copy.root,
                          env={**os.environ, **(copy.env() or {}),
                               "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    noderun = copy.root / "cluster/node/noderun.py"
    assert f"code object from '{noderun.parent}/__pycache__/" in done.stderr
    assert f"matches {noderun}" in done.stderr
    assert str(noderun) in done.stdout and ".fetch-" not in done.stdout
    selfupdate.check_copy(copy.root, (home.node_code / code.MANIFEST).read_text())


def test_a_node_of_another_python_compiles_its_copy_itself(
        master: tuple[Path, Home], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A master whose Python has another cache tag ships bytecode this node's Python does
    not read: the node compiles every module once when it fetches, naming the final
    place, and its own bytecode beside the master's passes the check."""
    repo, home = master
    with monkeypatch.context() as m:
        m.setattr(sys.implementation, "cache_tag", "otherpython-99")
        code.publish(repo, home.node_code)
    listed = code.parse_manifest((home.node_code / code.MANIFEST).read_text())
    assert any(rel.endswith(".otherpython-99.pyc") for rel in listed)
    assert not any(rel.endswith(f".{sys.implementation.cache_tag}.pyc") for rel in listed)
    updater, _ = _updater(home, tmp_path / "work")
    copy = updater.choose()
    assert copy.version is not None
    for module in copy.root.glob("cluster/**/*.py"):
        own = module.parent / "__pycache__" / f"{module.stem}.{sys.implementation.cache_tag}.pyc"
        assert own.is_file(), f"{module}: not compiled for this Python"
    selfupdate.check_copy(copy.root, (home.node_code / code.MANIFEST).read_text())
    probe = "import cluster.node.noderun as n; print(n.NodeRun.run.__code__.co_filename)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path,
                          env={**os.environ, **(copy.env() or {})},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(copy.root / "cluster/node/noderun.py")


def test_bytecode_that_differs_from_the_manifest_is_refused(
        master: tuple[Path, Home], tmp_path: Path) -> None:
    """The master's bytecode is checked like its sources: a fetched copy whose bytecode of
    one module differs from the manifest is refused; a file the manifest does not list is
    refused outside a bytecode directory only."""
    repo, home = master
    code.publish(repo, home.node_code)
    manifest = (home.node_code / code.MANIFEST).read_text()
    updater, _ = _updater(home, tmp_path / "work")
    copy = updater.choose()
    pyc = copy.root / str(code.bytecode_file("cluster/node/caps.py"))
    (pyc.parent / "unlisted.cpython-311.pyc").write_bytes(b"the node's own")
    selfupdate.check_copy(copy.root, manifest)
    damaged = bytearray(pyc.read_bytes())
    damaged[-1] ^= 1
    pyc.write_bytes(bytes(damaged))
    with pytest.raises(selfupdate.CodeCheckError, match="caps.*pyc: md5"):
        selfupdate.check_copy(copy.root, manifest)
    (copy.root / "cluster/unlisted.py").write_text("")
    with pytest.raises(selfupdate.CodeCheckError, match="not in the manifest"):
        selfupdate.check_copy(copy.root, manifest)


def test_a_corrupt_file_is_refused_and_the_last_good_version_used(
        master: tuple[Path, Home], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo, home = master
    code.publish(repo, home.node_code)
    work = tmp_path / "work"
    updater, transport = _updater(home, work)
    good = updater.choose()
    assert good.version is not None

    # A new version whose published copy is damaged (a file no longer matches MANIFEST).
    _edit(repo)
    code.publish(repo, home.node_code)
    new_version = code.manifest_version((home.node_code / code.MANIFEST).read_text())
    damaged = home.node_code / "cluster/node/caps.py"
    damaged.write_text(damaged.read_text() + "import os; os.system('evil')\n")
    caplog.set_level(logging.ERROR, logger="cluster.selfupdate")
    assert updater.choose() == good
    errors = [r.getMessage() for r in caplog.records]
    assert any(f"refusing the fetched version {new_version}" in m
               and "cluster/node/caps.py: md5" in m for m in errors), errors
    assert not (work / "code" / new_version).exists()
    assert not list((work / "code").glob(".fetch-*"))
    assert (work / "code" / "CURRENT").read_text() == good.version + "\n"

    # The master publishes again (repairing it): the next cycle takes the new version.
    time.sleep(0.01)
    os.utime(repo / "cluster/node/caps.py")
    code.publish(repo, home.node_code)
    fixed = updater.choose()
    assert fixed.version == new_version

    # A local copy damaged after the fact is noticed and fetched again.
    (fixed.root / "cluster/node/caps.py").write_text("broken\n")
    fetches = transport.fetches
    assert updater.choose() == fixed
    assert transport.fetches == fetches + 1
    selfupdate.check_copy(fixed.root, (home.node_code / code.MANIFEST).read_text())


def test_an_extra_file_is_refused(master: tuple[Path, Home], tmp_path: Path) -> None:
    repo, home = master
    code.publish(repo, home.node_code)
    (home.node_code / "cluster" / "sitecustomize.py").write_text("print('not listed')\n")
    updater, _ = _updater(home, tmp_path / "work")
    assert updater.choose() == INSTALLED  # no good version yet: the installed copy
    assert not list((tmp_path / "work" / "code").glob("[0-9a-f]*"))


def test_old_versions_go_unless_in_use(master: tuple[Path, Home], tmp_path: Path) -> None:
    repo, home = master
    work = tmp_path / "work"
    updater, _ = _updater(home, work)
    made: list[CodeChoice] = []
    user = None
    try:
        for n in range(4):
            _edit(repo, line=f"# version {n}\n")
            code.publish(repo, home.node_code)
            made.append(updater.choose())
            if n == 0:
                # A stand-in for a run.py started from the first version, still running.
                user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                                         str(made[0].run_script)])
            time.sleep(0.02)  # distinct directory mtimes (most recently chosen first)
        left = {p.name for p in (work / "code").iterdir() if p.name != "CURRENT"}
        assert left == {made[0].version, made[2].version, made[3].version}
    finally:
        if user is not None:
            user.kill()
            user.wait()
    assert updater.prune() == [made[0].root]
    left = {p.name for p in (work / "code").iterdir() if p.name != "CURRENT"}
    assert left == {made[2].version, made[3].version}


def test_a_dead_fetchers_staging_directory_is_removed(master: tuple[Path, Home],
                                                      tmp_path: Path) -> None:
    repo, home = master
    code.publish(repo, home.node_code)
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)
    stale = work / "code" / f".fetch-{done.stdout.strip()}"
    (stale / "cluster").mkdir(parents=True)
    updater, _ = _updater(home, work)
    assert updater.choose().version is not None
    assert not stale.exists()


def test_an_unusable_manifest_keeps_the_last_good_version(master: tuple[Path, Home],
                                                          tmp_path: Path) -> None:
    repo, home = master
    code.publish(repo, home.node_code)
    updater, transport = _updater(home, tmp_path / "work")
    good = updater.choose()
    (home.node_code / code.MANIFEST).write_text("not a manifest\n")
    assert updater.choose() == good
    assert transport.fetches == 1
