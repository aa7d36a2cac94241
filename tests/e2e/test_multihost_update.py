"""Self-updating nodes over a network: a change on the master reaches both remote nodes.

The master's supervisor runs from a copy of the repository (the "master's checkout") and
publishes that copy's node code into its home (``node-code/``).  The two nodes run
clusterpull from this repository and cannot see the master home: they get the node code
only through their ssh transport.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cluster.report.tab import read_tab
from tests.helpers import copy_code, wait_for
from tests.multihost import (
    MakeMultiHost,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
    run_once,
    start_all,
    tab_names,
)

pytestmark = pytest.mark.e2e

#: What the changed module prints when run.py imports it (into the node's run.log).
MARKER = "node code changed on the master: v2"


def master_checkout(dest: Path) -> Path:
    """A copy of this repository's code (the package and the top-level scripts)."""
    return copy_code(dest)


def current_version(work: Path) -> str:
    try:
        return (work / "code" / "CURRENT").read_text().strip()
    except FileNotFoundError:
        return ""


def test_a_node_module_changed_on_the_master_reaches_both_nodes_and_the_next_run_uses_it(
        make_multihost: MakeMultiHost, tmp_path: Path) -> None:
    checkout = master_checkout(tmp_path / "master-checkout")
    mh = make_multihost(master_repo=checkout, gs_configs="ppmraw.72.0 pbmraw.72.0")
    start_all(mh)
    first = run_once(mh.cluster)
    assert len(tab_names(first)) == 30
    manifest = mh.home_dir / "node-code" / "MANIFEST"
    old_manifest = manifest.read_text()
    versions = {name: current_version(node.work) for name, node in mh.nodes.items()}
    assert all(versions.values()) and len(set(versions.values())) == 1, versions
    for node in mh.nodes.values():
        assert MARKER not in node.run_log()
        # run.py ran from the fetched copy, not from the repository clusterpull runs from.
        assert f"code/{versions[node.name]}/run.py" in node.out.read_text() + \
            (node.work / "log" / "clusterpull.log").read_text()
    # A developer changes a node-side module in the master's checkout.
    module = checkout / "cluster" / "node" / "readlog.py"
    module.write_text(module.read_text() + f"\nimport sys as _sys\nprint({MARKER!r}, "
                      "file=_sys.stderr, flush=True)\n")
    # The supervisor publishes it (every loop); nothing is copied to the nodes by hand.
    wait_for(lambda: manifest.read_text() != old_manifest, 60, "the new node code published")
    assert "cluster/node/readlog.py" in manifest.read_text()
    second = run_once(mh.cluster)
    machines = Counter(r.machine for r in read_tab(second / f"{second.name}.tab").values())
    assert machines["node1"] > 0 and machines["node2"] > 0, machines
    for node in mh.nodes.values():
        version = current_version(node.work)
        assert version and version != versions[node.name], node.name
        copy = node.work / "code" / version / "cluster" / "node" / "readlog.py"
        assert copy.read_text() == module.read_text()
        assert MARKER in node.run_log(), f"{node.name}'s run.py did not run the new code"
    # The first run's output is unchanged by a change that does not touch the results.
    old = read_tab(first / f"{first.name}.tab")
    new = read_tab(second / f"{second.name}.tab")
    assert {n: r.md5 for n, r in old.items()} == {n: r.md5 for n, r in new.items()}
