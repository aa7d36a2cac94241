"""The master's side of a developer's steps after a push: wait, report, fetch, stop, rerun.

Run on the master, by both ways in (docs/operating.md, "The user gate"): the shipped code
of a plain ssh login (:mod:`cluster.cli.pushremote`) and the restricted user gate
(:mod:`cluster.cli.usergate`) call the same functions here, so what a step does does not
depend on the way in.  Each takes ``user``, the user the step is for: a run named by id
must be that user's (its queue line ``user <user> ...``: run.info's ``queue`` once
archived, job.start's while running), else :class:`NotYours`; ``user=None`` is an
administrator's step (any run).

:func:`wait_step`
    follows the run queued as a queue line after a time (the commit's, the master's
    clock) to its end, writing ``progress: <text>`` lines meanwhile (every
    :data:`PROGRESS_EVERY` s when asked for, else every :data:`KEEPALIVE` s: a client that
    went away is noticed at the next write); returns ``{"run", "status", "ended"}`` or
    ``{"timeout": true}``.
:func:`report_bytes`
    the run's report, or its CI file (``junit``, ``json``).
:func:`fetch_tar`
    the files :func:`cluster.console.archivefiles.fetchable` lists and the CI files
    rendered from the run's facts, as an uncompressed tar stream (names ``<run>/<path>``),
    every file opened without following a symlink.
:func:`stop_step`, :func:`rerun_step`
    a running run stopped (:func:`cluster.console.admin.stop`), an archived run queued again
    with the tree as last pushed (:func:`cluster.triggers.push.requeue`).
"""

from __future__ import annotations

import io
import math
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

from cluster.cli import pushwait
from cluster.console import admin, archivefiles, runinfo
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.localrunend import run_end
from cluster.report import cifiles
from cluster.runspec import RunSpec
from cluster.triggers.push import requeue

#: How often a waiting step writes a progress line when the client shows one [s].
PROGRESS_EVERY = 2.0
#: How often it writes one otherwise [s]: a write is how a client gone away is noticed.
KEEPALIVE = 30.0
#: The kinds :func:`report_bytes` gives.
KINDS = ("report", "junit", "json")


class NotYours(ClusterError):
    """A step named a run that is not the user's (or no run the user may see)."""


def run_line(home: Home, run_id: str) -> str | None:
    """The queue line of run ``run_id``: archived (run.info's ``queue``) or running
    (job.start's); None when neither knows it."""
    archivefiles.check_run_id(run_id)
    info = runinfo.read_text(home.archive / run_id / "run.info")
    if info is not None and not (home.archive / run_id).is_symlink():
        line = runinfo.parse_info(info).get("queue")
        if line:
            return line
    for start in admin.running_starts(home):
        if start.id == run_id:
            return start.queue
    return None


def check_owner(home: Home, run_id: str, user: str | None) -> str:
    """The queue line of run ``run_id`` if ``user`` may act on it (``None``: anyone);
    :class:`NotYours` otherwise, naming the run and whose it is."""
    line = run_line(home, run_id)
    if line is None:
        raise NotYours(f"run {run_id} is neither archived nor running here")
    if user is None:
        return line
    try:
        spec = RunSpec.parse(line, source=f"run {run_id}")
    except ValueError:
        spec = None
    if spec is None or spec.kind != "user" or spec.ref != user:
        owner = f"{spec.kind} {spec.ref}" if spec is not None else "unknown"
        raise NotYours(f"run {run_id} is not a run of user {user} (it is {owner!r}'s)")
    return line


def _config(home: Home, config: Path | None) -> object:
    from cluster import configfile  # here: a step that waits only needs it

    return configfile.load(config, {"home": str(home.root)})


def wait_step(home: Home, line: str, after: float, timeout: float, out: TextIO, *,
              progress: bool = False, config: Path | None = None,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> dict[str, object]:
    """Follow the run queued as ``line`` that started at or after ``after`` (epoch seconds)
    until it is archived (see the module docstring)."""
    RunSpec.parse(line, source="wait")  # a queue line, or ValueError
    every = PROGRESS_EVERY if progress else KEEPALIVE
    last = [-math.inf]
    state: dict[str, object] = {}

    def poll() -> None:
        if clock() - last[0] < every:
            return
        last[0] = clock()
        text = "waiting"
        if progress:
            try:
                from cluster.console import progress as progress_mod
                from cluster.console import status

                if "cfg" not in state:
                    state["cfg"] = _config(home, config)
                text = progress_mod.progress_line(status.snapshot(home, state["cfg"]), line)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 -- a progress line never ends a wait
                text = f"(no progress: {type(exc).__name__}: {exc})"
        out.write(f"progress: {' '.join(text.split())}\n")
        out.flush()

    archive = pushwait.wait_for_archive(home, line, set(), timeout, on_poll=poll,
                                        since=float(math.floor(after)), clock=clock,
                                        sleep=sleep)
    if archive is None:
        return {"timeout": True}
    return {"run": archive.name, "status": pushwait.verdict(archive),
            "ended": run_end(archive).describe()}


def ci_bytes(archive: Path, kind: str) -> bytes | None:
    """The run's CI file of ``kind`` ("junit" or "json"), rendered from its facts
    (:func:`cluster.report.cifiles.render`); None when it has none."""
    try:
        return "".join(cifiles.render(archive, kind)).encode("utf-8")
    except (cifiles.NoCiFacts, OSError, ValueError):
        return None


def ci_members(archive: Path, have: set[str]) -> list[tuple[str, bytes]]:
    """The CI files a fetch adds, rendered (names not in ``have``: an older master's
    archived files are fetched as they are)."""
    found = []
    for kind, name in cifiles.KINDS.items():
        if name in have:
            continue
        data = ci_bytes(archive, kind)
        if data is not None:
            found.append((name, data))
    return found


def report_bytes(home: Home, run_id: str, kind: str, user: str | None) -> bytes:
    """The report (``kind`` "report") or a CI file of archived run ``run_id``."""
    if kind not in KINDS:
        raise ClusterError(f"report kind {kind!r}: expected one of {', '.join(KINDS)}")
    check_owner(home, run_id, user)
    archive = home.archive / run_id
    if kind == "report":
        try:
            return (archive / "report.txt").read_bytes()
        except OSError:
            raise ClusterError(f"run {run_id} has no report (is it finished?)") from None
    data = ci_bytes(archive, kind)
    if data is None:
        raise ClusterError(f"run {run_id} has no {kind} result (a sweep or bmpcmp run)")
    return data


def fetch_tar(home: Home, run_id: str, user: str | None, out: BinaryIO) -> int:
    """Write run ``run_id``'s fetchable files to ``out`` as a tar stream; how many."""
    check_owner(home, run_id, user)
    files = archivefiles.fetchable(home, run_id)
    rendered = ci_members(home.archive / run_id, {rel for rel, _ in files})
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, data in rendered:
            info = tarfile.TarInfo(f"{run_id}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        for rel, path in files:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # vanished, or became a link: left out
            with os.fdopen(fd, "rb") as fh:
                info = tar.gettarinfo(fileobj=fh, arcname=f"{run_id}/{rel}")
                if not info.isfile():
                    continue
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                tar.addfile(info, fh)
    return len(files) + len(rendered)


def stop_step(home: Home, run_id: str, user: str | None, who: str,
              reason: str = "") -> dict[str, object]:
    """Stop running run ``run_id`` (the user's): its report says ``who`` stopped it."""
    archivefiles.check_run_id(run_id)
    check_owner(home, run_id, user)
    done = admin.stop(home, run_id, who, reason)
    return {"action": done.action, "run": done.run, "message": done.message()}


def rerun_step(home: Home, run_id: str, user: str | None) -> dict[str, object]:
    """Queue archived run ``run_id``'s line again with its user's tree as last pushed."""
    line = check_owner(home, run_id, user)
    if not (home.archive / run_id / "run.info").is_file():
        raise ClusterError(f"run {run_id} has not finished; rerun runs a finished run again")
    spec = RunSpec.parse(line, source=f"run {run_id}")
    if spec.kind != "user":
        raise ClusterError(f"run {run_id} is a {spec.kind} run; rerun queues user runs")
    pushed = requeue(home, spec)
    return {"line": spec.line(), "note": pushed.note}
