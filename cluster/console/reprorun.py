"""``clusteradmin repro``'s work: a found job (:mod:`cluster.console.repro`) run again on
its node or here, against the same build, and its md5 set beside the run's (docs/operating.md,
"Reproducing one job: `clusteradmin repro`").

**Where.** :func:`on_node`: in the work folder of a node that runs on this machine (a
local cluster's nodes are processes with folders of their own), found from the node's
archived build log, against the build in its build folder as it is now (its lock held
while the job runs).  A node on another machine cannot be reached from here (the master
keeps no ssh address for its nodes; they call it), so that is a
:class:`~cluster.console.repro.NotHere`: the job then goes to the node as a repro run
(:mod:`cluster.console.reproqueue`).  :func:`here`: the run's source built in a
repro work folder on this machine with the node's build machinery
(:mod:`cluster.node.buildtree`, :mod:`cluster.node.buildcmd`): ``<work>/build/<build
key>``, kept and brought up to date from the source by its manifest, so the next repro of
the same tree rebuilds only what changed.  The source: a user run's snapshot kept in its
archive, a commit run's commit exported again, any other run's tree in the master home
as it is now.

**Which build.** Where the job runs, each program it calls is hashed as the node hashes it
for the result cache (:func:`cluster.node.builddigest.build_keys`) and the environment
too (:func:`~cluster.node.builddigest.environment_digest`); both are printed beside the
run's, so a repro against another build or environment says so.

**Run.** The job's command, placeholders filled with the place's values and its output
kept (:func:`cluster.console.repro.keeping_output`), runs in ``sh`` in a fresh temp folder
``<work>/out/<run>/<test>/<node or here>`` under the job's own timeout (the line's
``timeout=<s>``, written by the run's master) or else ``job_timeout``; its log and md5 are
read as a node reads them (:func:`cluster.node.readlog.classify`).

**bmpcmp.** When the new md5 differs from the baseline's (``tables/current.tab``) and the
kept output is a raster, the master's clean tree is built here too and the job run with
it; when that gives the baseline's md5, its raster is the baseline's and
:func:`cluster.bmpcmp.compare_files` compares the two (the images beside the output).
Otherwise the baseline's raster is not available, and the output says why.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cluster.bmpcmp import MAX_IMAGES, PnmError, compare_files
from cluster.config import Config
from cluster.console import repro
from cluster.console.repro import Found, NotHere, ReproCannot
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files import reprokeep
from cluster.node import buildcmd, builddigest, buildtree, readlog
from cluster.node.runcontext import build_key, job_environment
from cluster.records import BIN, PYTHON, TEMP, TESTS, TREE_DIR, JobResult
from cluster.report import tab
from cluster.runtime import fsutil, proc
from cluster.triggers.git.export import export_commit
from cluster.wire.jobstart import JobStart

#: A shell job's raw output, hashed as the node hashes it (cluster.node.nodejobs.JOB_OUT).
SHELL_OUT = ".out"


@dataclass
class Place:
    """Where the job runs: ``label`` for people, the build's folder and binaries' folder,
    the corpus, the build folder's lock (held while the job runs) and the build's keys."""

    label: str
    build_dir: Path
    bin_dir: Path
    tests: Path
    lock: Path
    digests: tuple[tuple[str, str], ...] = ()
    environment: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Ran:
    """The job run again: its result, its temp folder, the output it kept (None: none)."""

    result: JobResult
    folder: Path
    output: Path | None
    log: Path
    command: str


def default_work() -> Path:
    """The repro work folder: ``$XDG_CACHE_HOME/cluster-repro`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cluster-repro"


def on_node(found: Found, node: str, cfg: Config) -> Place:
    """``node``'s build of the run, in its work folder on this machine."""
    keys = found.keys if node == found.node else repro.node_keys(
        found.archive / "logs" / f"{node}.build.log", node, found.run)
    if keys.build_dir is None:
        raise NotHere(f"node {node} did not build run {found.made_in} (no build folder "
                          f"in its archived build log): its build is not known")
    build_dir = Path(keys.build_dir)
    work = build_dir.parent.parent
    if not build_dir.is_dir():
        if (work / "build").is_dir():
            raise NotHere(f"node {node}'s build folder {build_dir} is gone (a node keeps "
                          "its build_keep most recent builds)")
        raise NotHere(f"node {node}'s build folder {build_dir} is not on this machine (the "
                      "master never reaches its nodes: they call it)")
    place = Place(f"node {node}, work folder {work}", build_dir,
                  bin_dir(build_dir, found.start, cfg), work / "tests",
                  build_dir.with_name(f".{build_dir.name}.lock"))
    _hash(place, found, cfg)
    return place


def here(found: Found, home: Home, cfg: Config, work: Path) -> Place:
    """The run's source built in ``work`` (module docstring), its build log in
    ``<work>/build/<key>.log``."""
    start = found.start
    source, said = _source(found, home, cfg, work)
    key = build_key(start)
    place = _build(start, source, work / "build" / key, cfg)
    place.label = f"here, work folder {work}"
    place.tests = home.root / start.tests
    place.notes.append(f"built from {said}")
    _hash(place, found, cfg)
    return place


def _source(found: Found, home: Home, cfg: Config, work: Path) -> tuple[Path, str]:
    """The tree the run built, and how to say where it came from."""
    start = found.start
    kept = reprokeep.kept_source(found.archive, start.tree)
    if kept is not None:
        return kept, f"the run's snapshot {kept}"
    if start.source.startswith("runs/"):
        if start.kind == "git":
            dest = work / "src" / f"git__{start.tree}__{start.ref}"
            if not dest.is_dir():
                staging = dest.with_name(dest.name + ".new")
                shutil.rmtree(staging, ignore_errors=True)
                staging.parent.mkdir(parents=True, exist_ok=True)
                try:
                    export_commit(home, cfg, start.tree, start.ref, staging)
                except ClusterError as exc:
                    raise ReproCannot(f"commit {start.ref} of {start.tree} cannot be "
                                      f"exported again: {exc}") from None
                os.replace(staging, dest)
            return dest, f"commit {start.ref} of {start.tree}, exported again"
        raise ReproCannot(f"run {found.run}'s source {start.source} is gone and its archive "
                          "kept none (archived before user runs' snapshots were kept)")
    tree = home.root / start.source
    if not tree.is_dir():
        raise ReproCannot(f"run {found.run}'s source {tree} is not there")
    return tree, f"{tree} as it is now (the run built that tree as it was then)"


def bin_dir(tree: Path, start: JobStart, cfg: Config) -> Path:
    """The binaries' folder of the build in ``tree`` (``tree/bin`` when its plan does not
    read), as a node finds it."""
    try:
        return tree / buildcmd.plan(tree, start, cfg.effective_slots()).bin_dir
    except ValueError:
        return tree / "bin"


def _build(start: JobStart, source: Path, tree: Path, cfg: Config) -> Place:
    """``source`` built in ``tree`` as a node builds (bounded by ``build_timeout``)."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    lock = tree.with_name(f".{tree.name}.lock")
    build_log = tree.with_name(f"{tree.name}.log")
    with fsutil.flocked(lock), open(build_log, "w", encoding="utf-8") as out:
        buildtree.overlay(source, tree, tree.with_name(f".{tree.name}.manifest"))
        try:
            plan = buildcmd.plan(tree, start, cfg.effective_slots())
        except ValueError as exc:
            raise ReproCannot(f"cannot build {source}: {exc}") from None
        buildtree.remove_programs(tree / plan.bin_dir, source / plan.bin_dir)
        out.write(f"$ {plan.command}\n")
        out.flush()
        done = proc.run(plan.command, shell=True, cwd=tree,
                        env={**os.environ, **dict(plan.env)}, stdout=out,
                        stderr=proc.STDOUT, timeout=cfg.build_timeout)
    if done.timed_out or done.returncode != 0:
        raise ReproCannot(f"the build {plan.command!r} of {source} in {tree} failed "
                          f"(status {done.returncode}{', timed out' if done.timed_out else ''}"
                          f"); its log: {build_log}")
    return Place("", tree, tree / plan.bin_dir, Path(), lock)


def _hash(place: Place, found: Found, cfg: Config) -> None:
    """The build digests of the job's programs and the environment digest, where it runs."""
    env = job_environment()
    place.environment = builddigest.environment_digest(env, cfg.reuse_environment)
    try:
        place.digests = builddigest.build_keys(
            place.build_dir, place.bin_dir, repro.programs(found.job.command),
            environment=cfg.reuse_environment, env=env).digests
    except (OSError, ValueError) as exc:
        place.notes.append(f"the build's programs could not be hashed: {exc}")


def run(found: Found, place: Place, folder: Path, cfg: Config) -> Ran:
    """Run the job at ``place`` with its temp folder ``folder`` (emptied first)."""
    job = found.job
    for program in repro.programs(job.command):
        path = place.bin_dir / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ReproCannot(f"{path} is missing or not executable ({place.label}: the build "
                              "did not make it)")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    values = {TEMP: str(folder), BIN: str(place.bin_dir), TESTS: str(place.tests),
              PYTHON: shlex.quote(sys.executable), TREE_DIR: str(place.build_dir)}
    command = repro.fill(repro.keeping_output(job.command, job.name), values)
    timeout = min(cfg.job_timeout, job.timeout) if job.timeout else cfg.job_timeout
    with fsutil.flocked(place.lock):
        done = proc.run(["sh", "-c", command], cwd=folder, env=job_environment(),
                        stdout=proc.DEVNULL, stderr=proc.STDOUT, timeout=timeout)
    base = folder / job.name
    log_text = _read(base.with_name(job.name + ".log"))
    md5_text = _read(base.with_name(job.name + ".md5"))
    output = None
    raw = base.with_name(job.name + SHELL_OUT)
    if raw.is_file():
        md5_text += f"{_md5(raw)}  -\n"
        output = raw
    raster = base.with_name(job.name + repro.RASTER)
    if raster.is_file():
        output = raster
    result = readlog.classify(job.name, log_text, md5_text, done.timed_out, place.label,
                              done.returncode if done.returncode >= 0 else None)
    return Ran(result, folder, output, base.with_name(job.name + ".log"), command)


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def baseline_md5(home: Home, test: str) -> str | None:
    """The test's md5 in the baseline ``tables/current.tab`` (None: no row, or an error)."""
    table = home.tables / "current.tab"
    if not table.is_file():
        return None
    row = next((e.row() for e in tab.TabFile(table).entries() if e.name == test), None)
    return row.md5 if row is not None and row.error == 0 else None


def bmpcmp(found: Found, home: Home, cfg: Config, work: Path, ran: Ran,
           baseline: str) -> list[str]:
    """Compare ``ran``'s raster with the baseline's (module docstring); the lines to print."""
    if ran.output is None or ran.output.suffix != repro.RASTER:
        return ["bmpcmp: the job kept no raster to compare"]
    clean = home.root / found.start.tree
    if not clean.is_dir():
        return [f"bmpcmp: the baseline's raster is not available: the master has no clean "
                f"tree {clean} to render it with"]
    try:
        place = _build(found.start, clean, work / "build" / f"baseline__{found.start.tree}",
                       cfg)
    except ReproCannot as exc:
        return [f"bmpcmp: the baseline's raster is not available: {exc}"]
    place.tests = home.root / found.start.tests
    place.label = "baseline"
    base = run(found, place, ran.folder.with_name(ran.folder.name + ".baseline"), cfg)
    if base.result.md5 != baseline or base.output is None:
        return [f"bmpcmp: the baseline's raster is not available: the clean tree {clean} "
                f"now renders md5 {base.result.md5 or '-'}, not the baseline's {baseline}"]
    root = ran.folder / "bmpcmp"
    try:
        compared = compare_files(base.output, ran.output, root, MAX_IMAGES)
    except (PnmError, OSError) as exc:
        return [f"bmpcmp: {base.output} and {ran.output} cannot be compared: {exc}"]
    return [f"bmpcmp: baseline raster {base.output}",
            f"bmpcmp: {compared.pages} page(s) compared, {len(compared.sets)} image set(s) "
            f"written as {root}.*", *compared.summary().splitlines()]
