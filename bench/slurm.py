#!/usr/bin/env python3
"""bench/slurm.py -- nodes from Slurm against static nodes: how soon and at what cost.

Usage: python3 bench/slurm.py [--nodes 2] [--slots 1] [--reps 3] [--corpus DIR]
                              [--resource-interval 10] [--keep DIR]

One gs run over the corpus (the README's main job: the ghostpdl examples) is queued on two
local clusters, repetitions interleaved (static slurm static slurm ...), each cluster
started afresh for its repetition and stopped after it:

  static   a master and ``--nodes`` static local nodes of ``--slots`` slots each, up and
           heartbeating before the clock starts (as a site's nodes are)
  slurm    a master, a private single-host Slurm (its controller up before the clock
           starts, as a site's controller is) and the provisioner; no node at all:
           every node is an ephemeral one, started by ``sbatch`` once the run waits, at most
           ``--nodes`` (``max_nodes``) of ``--slots`` slots (``node_slots``)

Each repetition times, from the enqueue (the push):
  first_job_s   to the first job handed to a node (the run's audit log, its first
                ``given JOBS`` line: the node starts it at once); for slurm, this node was
                started by Slurm after the push
  sbatch_s      (slurm) to the provisioner's first submit (its log line ``submitted``)
  run_s         to the report (the run's end, as bench/dispatch.py counts it)

and checks the run's .tab: every job once, error 0, and the same md5 per test in both
clusters (``same=yes``).  The intervals are the defaults a site has, but for
``resource_interval`` (``--resource-interval``, default 10 s as in master.conf): the
provisioner looks that often, and the master also rewrites the resource file at once when a
run starts, which the provisioner sees at its next look.

Prints the machine, one line per repetition and a summary:
  contender=slurm first_job_s=... run_s=... median_run_s=... ratio=1.07 ...
where ``ratio`` is the median slurm run_s over the median static run_s (goal:
at most 1.15) and ``first_job_s`` the median of the slurm repetitions (goal: at most 3 s).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import figures, median, start  # noqa: E402
from bench.dispatch import settle  # noqa: E402
from cluster.demotree import write_demo_tree
from cluster.localcluster import DEFAULT_CORPUS, LocalCluster
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402

#: The tools the benchmark needs (Slurm's daemons and client, munge, gs).
TOOLS = ("gs", "sbatch", "slurmctld", "slurmd", "munged")
#: An audit line handing jobs to a node: ``<time> <peer> node <name> ... given JOBS <n>``.
GIVEN = re.compile(r"^(\S+) \S+ node (\S+) .* given JOBS \d+")
#: A provisioner log line that submitted jobs, with its time stamp at the head.
SUBMITTED = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+).*: submitted \d+")


def _stamp(text: str) -> float:
    """An audit time stamp (UTC, ``2026-11-26T10:00:00.123``) as epoch seconds."""
    return datetime.fromisoformat(text.rstrip("Z")).replace(tzinfo=UTC).timestamp()


def first_given(archive: Path) -> tuple[float, str] | None:
    """When jobs were first handed to a node in the run archived at ``archive``, and to
    which node; None when no line says so."""
    audit = archive / "audit.log"
    if not audit.exists():
        return None
    for line in audit.read_text(encoding="utf-8", errors="replace").splitlines():
        match = GIVEN.match(line)
        if match:
            return _stamp(match.group(1)), match.group(2)
    return None


def first_submit(log: Path) -> float | None:
    """When the provisioner's log first says it submitted (local time stamps, as
    logging writes them), or None."""
    if not log.exists():
        return None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = SUBMITTED.match(line)
        if match:
            text = match.group(1).replace(",", ".").replace(" ", "T")
            return datetime.fromisoformat(text).timestamp()
    return None


def make_cluster(root: Path, contender: str, nodes: int, slots: int, corpus: Path,
                 interval: str) -> LocalCluster:
    settings = {"base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": "0", "slots": str(slots), "resource_interval": interval}
    if contender == "slurm":
        settings.update({"max_nodes": str(nodes), "node_slots": str(slots)})
        cluster = LocalCluster(root, 0, corpus, settings, provider="slurm")
    else:
        cluster = LocalCluster(root, nodes, corpus, settings)
    cluster.prepare()
    return cluster


def wait_provisioner(cluster: LocalCluster, timeout: float = 30.0) -> None:
    """Until the provisioner has made its first look (its start line is in its log)."""
    log = cluster.home.log_dir / "clusterscale.log"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists() and "provisioning from" in log.read_text(encoding="utf-8"):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the provisioner did not start within {timeout:.0f} s ({log})")


def one_rep(root: Path, contender: str, args: argparse.Namespace
            ) -> tuple[dict[str, object], dict[str, str]]:
    """Start a cluster, time one run from its push, stop it: (figures, md5 by test)."""
    cluster = make_cluster(root, contender, args.nodes, args.slots, args.corpus,
                           args.resource_interval)
    tree = write_demo_tree(root / "demo" / "gs", "gs", [])
    cluster.start()
    try:
        if contender == "static":
            cluster.wait_for_nodes()
        else:
            wait_provisioner(cluster)
        settle(cluster)
        before = cluster.archives()
        began = time.time()
        spec = cluster.push(tree, "bench", ["gs"], [])
        archive = cluster.wait_for_run(spec, before, 1800)
        run_s = time.time() - began
    finally:
        cluster.stop(grace=10)
    given = first_given(archive)
    table = read_tab(next(archive.glob("*.tab")))
    md5s = {name: row.md5 for name, row in table.items()}
    ok = len(table) > 0 and all(row.error == 0 for row in table.values())
    out: dict[str, object] = {
        "contender": contender, "run_s": f"{run_s:.2f}",
        "first_job_s": f"{given[0] - began:.2f}" if given else "none",
        "first_node": given[1] if given else "none"}
    if contender == "slurm":
        submitted = first_submit(cluster.home.log_dir / "clusterscale.log")
        out["sbatch_s"] = f"{submitted - began:.2f}" if submitted else "none"
    out.update({"jobs": len(table), "ok": "yes" if ok else "no"})
    return out, md5s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/slurm.py", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--resource-interval", default="10")
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    work = start("slurm", TOOLS, args.keep)
    if work is None:
        return 2
    results: dict[str, list[dict[str, object]]] = {"static": [], "slurm": []}
    tables: dict[str, dict[str, str]] = {}
    try:
        for rep in range(args.reps):
            for contender in ("static", "slurm"):
                fig, md5s = one_rep(work / f"{contender}{rep}", contender, args)
                fig["same"] = "yes" if tables.setdefault(contender, md5s) == md5s and \
                    tables.get("static", md5s) == md5s else "no"
                results[contender].append(fig)
                print(figures({"rep": rep, **fig}), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    runs = {c: median([float(str(f["run_s"])) for f in figs]) for c, figs in results.items()}
    firsts = [float(str(f["first_job_s"])) for f in results["slurm"]
              if f["first_job_s"] != "none"]
    sbatch = [float(str(f["sbatch_s"])) for f in results["slurm"] if f["sbatch_s"] != "none"]
    ok = all(f["ok"] == "yes" and f["same"] == "yes" for figs in results.values() for f in figs)
    ratio = runs["slurm"] / runs["static"]
    print(figures({"summary": "slurm-vs-static", "nodes": args.nodes, "slots": args.slots,
                   "reps": args.reps, "median_static_s": f"{runs['static']:.2f}",
                   "median_slurm_s": f"{runs['slurm']:.2f}", "ratio": f"{ratio:.3f}",
                   "first_job_s": f"{median(firsts):.2f}", "sbatch_s": f"{median(sbatch):.2f}",
                   "met": "yes" if ratio <= 1.15 and median(firsts) <= 3.0 else "no",
                   "ok": "yes" if ok else "no"}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
