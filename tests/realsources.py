"""The real products' sources for the real-product tests, and the local cluster they push
them to: Debian's source packages of
Ghostscript (the whole ghostpdl tree) and MuPDF, which ``etc/fetch-sources`` (the README's
set-up, and ``.ci/run``) downloads into a cache outside the checkout.

The cache is ``$CLUSTER_SOURCES``, else ``$XDG_CACHE_HOME/regression-cluster/sources``, else
``~/.cache/regression-cluster/sources`` -- the same rule as the script's.  A test that
needs a package that is not there fails under CI (``CI=true``) and is skipped elsewhere,
saying how to fetch it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster.config import DEFAULTS
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.helpers import FAST, free_port

#: Debian's way of building its MuPDF source (as debian/rules and replace-fonts.sh do): the
#: source keeps no third-party libraries and no font files, so MuPDF's Makefile is told to
#: use the system's libraries, and the 14 base fonts it embeds are Debian's URW fonts
#: (fonts-urw-base35, Type 1, which MuPDF reads as well as CFF) copied where the Makefile
#: looks for them; the CJK, Noto and SIL fonts are left out.
MUPDF_URW_FONTS = " ".join(f"Nimbus{family}-{style}" for family in ("MonoPS", "Roman", "Sans")
                           for style in ("Regular", "Italic", "Bold", "BoldItalic"))
MUPDF_DEBIAN_BUILD = (
    "mkdir -p resources/fonts/urw && "
    f"for f in {MUPDF_URW_FONTS} StandardSymbolsPS; do "
    "cp -p /usr/share/fonts/type1/urw-base35/$f.t1 resources/fonts/urw/$f.cff || exit 1; "
    "done && cp -p /usr/share/fonts/type1/urw-base35/D050000L.t1 "
    "resources/fonts/urw/Dingbats.cff && "
    "make -j__slots__ build=release USE_SYSTEM_LIBS=yes USE_SYSTEM_LCMS2=yes "
    "USE_SYSTEM_MUJS=yes HAVE_X11=no HAVE_GLUT=no HAVE_CURL=no "
    "XCFLAGS='-DFZ_ENABLE_ICC=0 -DTOFU -DTOFU_CJK -DTOFU_SIL' tools")


def cache_dir() -> Path:
    """Where ``etc/fetch-sources`` puts the source packages."""
    explicit = os.environ.get("CLUSTER_SOURCES")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "regression-cluster" / "sources"


def orig_tarball(package: str) -> Path:
    """The upstream tarball (``<package>_<version>.orig.tar.*``) of Debian source package
    ``package`` in :func:`cache_dir`; the newest by name when there are several.  Fails the
    test under CI, skips it elsewhere, when there is none."""
    found = sorted(cache_dir().glob(f"{package}_*.orig.tar.*"))
    if not found:
        message = (f"Debian's source package {package} is not in {cache_dir()} "
                   "(run etc/fetch-sources)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found[-1]


def extract_files(package: str, folder: str, suffixes: tuple[str, ...], dest: Path) -> list[Path]:
    """Copy the files of ``folder`` (relative to the tree's top, e.g. ``pcl/examples``) with
    one of ``suffixes`` from ``package``'s upstream tarball into ``dest``; return them."""
    found = []
    with tarfile.open(orig_tarball(package)) as archive:
        for member in archive:
            parent, _, name = member.name.partition("/")[2].rpartition("/")
            if member.isfile() and parent == folder and name.endswith(suffixes):
                source = archive.extractfile(member)
                assert source is not None
                found.append(dest / name)
                found[-1].write_bytes(source.read())
    return found


def extract_all(archive: tarfile.TarFile, dest: Path) -> None:
    """Unpack ``archive`` into ``dest``, refusing members that would land outside it.

    Python's ``filter="data"`` does this from 3.11.4 on; Debian 12's Python is 3.11.2,
    whose tarfile has no filters, so there the members are checked here first: no absolute
    name, no ``..``, no link leaving the archive's tree, no device file."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
        return
    for member in archive.getmembers():
        parts = Path(member.name).parts
        link = Path(member.linkname).parts if member.issym() or member.islnk() else ()
        depth = len(parts) - 1  # the folder the member is in, counted from dest
        if Path(member.name).is_absolute() or ".." in parts or member.isdev() or (
                link and (Path(member.linkname).is_absolute()
                          or link.count("..") > (depth if member.issym() else 0))):
            raise ValueError(f"{archive.name}: member {member.name!r} would be written "
                             f"outside {dest}")
    archive.extractall(dest)  # noqa: S202 - members checked above


def unpack(package: str, dest: Path) -> Path:
    """Unpack ``package``'s upstream tarball into ``dest`` (created); return the tree's top
    folder (the tarball's single top-level folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(orig_tarball(package)) as archive:
        extract_all(archive, dest)
    tops = [p for p in dest.iterdir() if p.is_dir()]
    assert len(tops) == 1, f"{package}'s tarball has {len(tops)} top folders: {tops}"
    return tops[0]


# ----------------------------------------------------------------------------------------------
# A local cluster whose developer pushes a real tree


@dataclass
class RealCluster:
    """A running local cluster of two nodes (one machine, one shared compiler cache), the
    master's clean copy of a real tree, a developer's copy (:attr:`tree`) to push, and what
    the tests of one module learn in order (:attr:`runs`, :attr:`first_builds`)."""

    cluster: LocalCluster
    tree: Path
    runs: dict[str, Path] = field(default_factory=dict)
    #: Each node's first build of the tree [s].
    first_builds: dict[str, float] = field(default_factory=dict)

    def push(self, products: str, timeout: float) -> Path:
        """Push :attr:`tree` as user USER's run of ``products``; its archive once it ended."""
        before = self.cluster.archives()
        began = time.monotonic()
        log = self.cluster.home.log_dir / "clustermaster.log"  # priority 0's master
        read_to = [log.stat().st_size if log.exists() else 0]
        spec = self.cluster.push(self.tree, USER, [products], [])
        run = self.cluster.wait_for_run(spec, before, timeout,
                                        on_poll=lambda: self._no_lost_build(log, read_to))
        # A figure for docs/performance.md (shown with -s): push to report, the build included.
        print(f"\npush of {self.tree.name} ({products}) to its report: "
              f"{time.monotonic() - began:.1f} s")
        return run

    def _no_lost_build(self, log: Path, read_to: list[int]) -> None:
        """AssertionError at once when the master's log says a node could not build the
        tree for its own reasons (a build dependency missing from this machine): the run
        would otherwise wait for nodes until the test's timeout.  Reads the whole lines
        past byte ``read_to[0]`` and advances it past them."""
        try:
            with open(log, "rb") as fh:
                fh.seek(read_to[0])
                data = fh.read()
        except FileNotFoundError:
            return
        cut = data.rfind(b"\n") + 1  # whole lines only: the rest is read next time
        read_to[0] += cut
        for line in data[:cut].decode("utf-8", "replace").splitlines():
            if "cannot build on this node" in line:
                raise AssertionError(f"a node cannot build the tree here: {line}")

    def push_change(self, products: str, path: str, old: str, new: str,
                    timeout: float) -> Path:
        """Replace ``old`` (once in the tree's file ``path``) by ``new`` and push; check
        that every test passed and that the tests whose md5 changed against the run
        ``runs["first"]`` are exactly the pgmraw ones (both changes of these tests alter
        grey output only), as the report's section against the previous push lists them.
        Returns the run's archive (also ``runs["second"]``)."""
        first = self.runs.get("first")
        assert first is not None and self.first_builds, "the first push did not run"
        source = self.tree / path
        text = source.read_text(encoding="latin-1")
        assert text.count(old) == 1, f"{path} holds {text.count(old)} copies of {old!r}"
        source.write_text(text.replace(old, new), encoding="latin-1")
        run = self.runs["second"] = self.push(products, timeout)
        before = read_tab(first / f"{first.name}.tab")
        after = read_tab(run / f"{run.name}.tab")
        assert all(row.error == 0 for row in after.values()), after
        changed = sorted(n for n in after if after[n].md5 != before[n].md5)
        assert changed == sorted(n for n in after if ".pgmraw." in n) and changed, changed
        report = (run / "report.txt").read_text(encoding="utf-8")
        against_push = report.split("Differences from previous clusterpush:", 1)[1]
        assert listed(against_push, "Differences in ") == [n.replace("__", "/")
                                                           for n in changed], report
        return run

    def test_file(self, name: str) -> Path:
        """The master's copy of the file of test ``name`` (``<corpus>__<file>.<config>``)."""
        return self.cluster.home_dir / "tests" / name.rsplit(".", 3)[0].replace("__", "/")

    def built(self, node: str, program: str) -> Path:
        """``program`` as ``node``'s kept build folder of the tree holds it (the one file
        of that name under ``build/<key>/``, in the tree kind's binaries folder)."""
        found = [p for p in (self.cluster.home_dir / "node-work" / node / "build").glob(
            f"*/**/{program}") if p.parent.name in ("bin", "release") and p.is_file()]
        assert len(found) == 1, found
        return found[0]


#: The developer who pushes the real trees.
USER = "tester"
NODES = ("node1", "node2")
#: A node's build log line giving the build command's wall time (cluster/node/nodebuild.py).
BUILD_ENDED = re.compile(r"build command ended after ([0-9.]+) s")


@contextlib.contextmanager
def real_cluster(root: Path, package: str, tree_name: str, corpus: Path,
                 settings: dict[str, str]) -> Iterator[RealCluster]:
    """Unpack ``package``'s tree; make it the master's clean ``tree_name`` and USER's tree;
    start a local cluster over ``corpus`` with ``settings`` (beyond FAST and free ports) and
    NODES sharing the compiler cache ``root/ccache``; stop it all at the end."""
    clean = unpack(package, root / "unpacked")
    home = root / "home"
    home.mkdir()
    # The master's clean tree is the same release: a push is diffed against it.
    shutil.copytree(clean, home / tree_name, symlinks=True)
    tree = root / USER / tree_name
    tree.parent.mkdir()
    clean.rename(tree)
    key = BUILD_SETTING[package]
    settings = {**settings, key: both_nodes_build(
        settings.get(key) or str(getattr(DEFAULTS, key)), root)}
    cluster = LocalCluster(home, 0, corpus, {
        **FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
        "status_port": "0", **settings})
    cluster.prepare()
    try:
        cluster.start()
        for node in NODES:
            cluster.start_node(node, settings={"build_cache": str(root / "ccache")})
        yield RealCluster(cluster, tree)
    finally:
        cluster.stop(grace=10)


#: The master.conf setting of each package's build command.
BUILD_SETTING = {"ghostscript": "build_ghostpdl", "mupdf": "build_mupdf"}
#: Longest a node's build waits at the barrier of :func:`both_nodes_build` [s].
BARRIER_WAIT = 300


def both_nodes_build(command: str, root: Path) -> str:
    """``command`` run as a test's two nodes take turns and wait for each other: under the
    lock file ``root/build.lock`` (``flock``), so one node builds at a time and the second
    builds from the compiler cache the first filled; then a barrier: a node whose build
    succeeded adds a line to ``root/built-nodes`` and waits (at most BARRIER_WAIT s) until
    the count of lines is even, that is until the other node's build of the same push ended.

    Why: two first builds that start together find nothing in the shared cache and compile
    everything twice on the same cores (docs/deviations.md), which doubled the suite's
    longest test; and the corpus is a few files, so the first node built would run every job,
    the run would end and the other node would be told to stop mid-build: its build log and
    binaries, which these tests check for both nodes, would be missing.  A failed build adds
    no line, so a push that fails on both nodes (the syntax-error push) leaves the count even.
    A node's "build command ended after" time then includes its turns at both."""
    lock, tally = shlex.quote(str(root / "build.lock")), shlex.quote(str(root / "built-nodes"))
    return (f"flock -o {lock} sh -c {shlex.quote(command)} && echo built >> {tally} && i=0 && "
            f"while [ $(( $(wc -l < {tally}) % 2 )) -ne 0 ] && [ $i -lt {BARRIER_WAIT * 2} ]; "
            "do sleep 0.5; i=$((i + 1)); done")


def build_log(run: Path, node: str) -> str:
    """``node``'s build log in ``run``'s archive; AssertionError unless its build ended
    (a node told to stop mid-build, because the run ended or failed, leaves no end line)."""
    path = run / "logs" / f"{node}.build.log"
    assert path.is_file(), f"no build log of {node} in {run}"
    text = path.read_text(encoding="utf-8", errors="replace")
    assert BUILD_ENDED.search(text), f"{node}'s build did not end in {run.name}:\n{text[-1500:]}"
    return text


def build_seconds(log: str) -> float:
    """The build command's wall time a build log gives [s]."""
    found = BUILD_ENDED.findall(log)
    assert found, f"the build log gives no build time:\n{log[-2000:]}"
    return float(found[-1])


def config_of(name: str) -> tuple[str, str]:
    """(device, resolution) of a test name ``<file>.<device>.<res>.<band>``."""
    _stem, device, res, _band = name.rsplit(".", 3)
    return device, res


def md5_of_output(argv: list[str]) -> str:
    """The md5 of what ``argv`` writes to stdout (it must exit 0)."""
    done = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    return hashlib.md5(done.stdout).hexdigest()


def listed(report: str, title_start: str) -> list[str]:
    """The test names a report lists under its first line starting with ``title_start``."""
    after = report.split("\n" + title_start, 1)
    assert len(after) == 2, f"no {title_start!r} in the report:\n{report}"
    body = after[1].split("\n", 1)[1].split("\n\n", 1)[0]
    return sorted(line.split()[0] for line in body.splitlines())
