"""What every tier of the suite shares: each parallel worker picks ports in its own range.

The README's test command runs the suite in four worker processes (pytest-xdist).  Tests
pick their ports with :func:`cluster.runtime.ports.free_port` before anything binds them;
two workers asking the kernel at the same moment could be offered the same port.  So each
worker (``PYTEST_XDIST_WORKER`` = ``gw0``, ``gw1``, ...) gets a range of its own below the
kernel's ephemeral range (:data:`cluster.runtime.ports.PORTS_ENV`), inherited by the
processes the tests start.  Without xdist nothing changes.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pluggy
import pytest

from cluster.provision.sgehost import PrivateGridEngine
from cluster.provision.slurmhost import PrivateSlurm
from cluster.runtime.ports import PORTS_ENV

#: The first worker's ports, and the size of each worker's range (below 32768, where the
#: kernel's ephemeral ports begin on Linux).
FIRST_PORT = 10000
PORTS_PER_WORKER = 2500


#: The xdist group of the modules whose tests write the real crontab (see crontab_turn).
CRONTAB_GROUP = "crontab"


#: The xdist groups of the real-product modules (tests/e2e/test_real_*.py): minutes of
#: compiling each, so they are handed out first and overlap the rest of the suite.
REAL_PRODUCT_GROUPS = ("real-ghostpdl", "real-mupdf")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-product tests first (stable: each module's own order is kept): with the
    suite in parallel workers, the longest tests start at once instead of last."""
    def first(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        return 0 if marker is not None and marker.args and \
            marker.args[0] in REAL_PRODUCT_GROUPS else 1
    items.sort(key=first)


def pytest_configure() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        low = FIRST_PORT + int(worker[2:]) * PORTS_PER_WORKER
        os.environ[PORTS_ENV] = f"{low}-{low + PORTS_PER_WORKER}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A report's captured output as UTF-8 a worker can send: tests of hostile file names
    log names with lone surrogates (``'\\udcff'``), which xdist's channel refuses to carry
    (the worker would crash and the rest of its tests go unrun)."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, _utf8(text)) for title, text in report.sections]


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.fixture(scope="module", autouse=True)
def crontab_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """One module at a time writes the real crontab, whichever worker runs it.

    A module marked ``xdist_group("crontab")`` holds an exclusive lock (flock on a file in
    the temporary folder, shared by every worker) from its first fixture to its last
    teardown.  ``--dist loadgroup`` normally keeps such modules on one worker anyway, but
    not under every pytest version (pytest 9.2 with xdist 3.8 spread two tests of one such
    module over two workers, and each found the other's crontab line): the lock makes the
    order hold without it.
    """
    marker = request.node.get_closest_marker("xdist_group")
    if marker is None or CRONTAB_GROUP not in (*marker.args, *marker.kwargs.values()):
        yield
        return
    path = Path(tempfile.gettempdir()) / f"regression-cluster-tests-{os.getuid()}.crontab.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # bounded by the holder: one module's tests
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def private_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSlurm]:
    """A private single-host Slurm (munged, slurmctld, slurmd), started for the module and
    stopped after it by PID, nothing left running; its ``env`` is what a Slurm command or a
    :class:`cluster.provision.slurm.SlurmEngine` needs to use it."""
    with PrivateSlurm(tmp_path_factory.mktemp("slurm")) as slurm:
        yield slurm


@pytest.fixture(scope="module")
def private_gridengine(tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[PrivateGridEngine]:
    """A private single-host Grid Engine cell (sge_qmaster, sge_execd, the queue ``main``
    with 4 slots), started for the module and stopped after it by PID; its ``env`` is what
    a Grid Engine command or a :class:`cluster.provision.gridengine.GridEngine` needs."""
    with PrivateGridEngine(tmp_path_factory.mktemp("sge"), slots=4) as cell:
        yield cell
