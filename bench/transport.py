#!/usr/bin/env python3
"""bench/transport.py -- the gs corpus run with the ssh transport against the local one.

Usage: python3 bench/transport.py [--reps 3] [--nodes 2] [--configs "ppmraw.72.0 ..."]
                                  [--keep DIR]

Two contenders on this machine, repetitions interleaved (local ssh local ssh ...):

  local   a local cluster (``LocalCluster``) whose nodes read the master home directly
  ssh     the same cluster with ``transport="ssh"``: the nodes reach the home through a
          private OpenSSH server on a loopback port (paramiko for job.start and the
          uploads, rsync over ssh for the corpus and the product's tree)

Each contender keeps its home (and so its nodes' work directories) across repetitions, as
a real cluster does: the first repetition mirrors the corpus and builds the product, the
later ones find both up to date.  The time runs from the push (clusterpush) to the report
being written; the daemons (and the sshd) are started before the clock starts and
stopped after it stops.  The check: every test once in the .tab, error 0, and the md5 of
every test the same in both contenders' runs.

Prints the machine, then one line per contender, e.g.:
  contender=ssh median_s=9.71 ratio=1.04 runs=3 ok=yes
(ratio = median / local's median; the goal is <= 1.1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import start  # noqa: E402
from bench.dispatch import QUICK, report  # noqa: E402
from cluster.demotree import write_demo_tree
from cluster.jobs import generate as jobgen  # noqa: E402
from cluster.localcluster import DEFAULT_CORPUS, LocalCluster
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402

#: Longest wait for one run [seconds].
RUN_TIMEOUT = 3600.0


class TransportContender:
    """A local cluster with one transport, started for each repetition, timed from the push.

    ``md5s`` is shared by both contenders: the first run to finish fills it, every later
    run (of either transport) must match it test by test.
    """

    def __init__(self, root: Path, transport: str, nodes: int, settings: dict[str, str],
                 md5s: dict[str, str]) -> None:
        self.md5s = md5s
        self.cluster = LocalCluster(root, nodes, DEFAULT_CORPUS, {
            **QUICK, **settings, "base_port": str(free_port(5)),
            "monitor_port": str(free_port()), "status_port": str(free_port())},
        transport=transport)
        self.cluster.prepare()
        self.tree = write_demo_tree(root / "demo" / "gs", "gs", [])

    def run(self) -> tuple[float, bool]:
        cluster = self.cluster
        cluster.start()
        try:
            cluster.wait_for_nodes()  # so only the run is timed
            before = cluster.archives()
            began = time.time()
            spec = cluster.push(self.tree, "bench", ["gs"], [])
            archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
            elapsed = (archive / "report.txt").stat().st_mtime - began
        finally:
            cluster.stop(grace=10)
            for up in cluster.home.nodes.glob("*.up"):
                up.unlink()
        tab = archive / f"{archive.name}.tab"
        names = [line.split("\t", 1)[0] for line in tab.read_text().splitlines()]
        table = read_tab(tab)
        md5s = {name: result.md5 for name, result in table.items()}
        ok = len(names) == len(set(names)) and all(r.error == 0 for r in table.values())
        if not self.md5s:
            self.md5s.update(md5s)
        ok = ok and md5s == self.md5s
        return elapsed, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--configs", default="",
                        help="gs_configs of the run (default: the cluster's default)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.nodes < 1:
        parser.error("--reps and --nodes must be positive")
    work = start("transport", ("gs", "rsync", "ssh", "/usr/sbin/sshd"), args.keep)
    if work is None:
        return 2
    settings = {"gs_configs": args.configs} if args.configs else {}
    md5s: dict[str, str] = {}
    local = TransportContender(work / "local", "local", args.nodes, settings, md5s)
    ssh = TransportContender(work / "ssh", "ssh", args.nodes, settings, md5s)
    jobs = len(read_jobs(local.cluster))
    return report({"local": local.run, "ssh": ssh.run}, args.reps, "local",
                  {"jobs": jobs, "nodes": args.nodes}, work, args.keep is None)


def read_jobs(cluster: LocalCluster) -> list[str]:
    """The names of the jobs of the run (as build.py makes them for the demo gs run)."""
    cfg = cluster.config()
    return [job.name for job in jobgen.generate(cfg, ["gs"], cluster.home_dir / "tests")]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
