"""After ``clusterpush --master``: wait for the run, get its report, fetch, stop, rerun.

The developer's side of the steps of :mod:`cluster.cli.pushsteps`, sent over ssh with
:func:`cluster.triggers.remotepush.run_step` (through the user gate, or by the push's shipped
code on a plain login): :func:`remote_wait` shows the ``progress:`` lines the master writes
while it waits and returns the outcome; :func:`remote_bytes` gets the report or a CI file;
:func:`remote_fetch` unpacks the tar stream of a run's fetchable files into a folder (only
regular files and folders below it: ``tarfile``'s "data" filter); :func:`remote_outcome`
runs stop and rerun.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from cluster.errors import ClusterError
from cluster.runtime.ssh import SshTarget
from cluster.triggers.remotepush import MARKER, run_step

#: How long a remote wait may take at most beyond its own timeout [s].
WAIT_SLACK = 300.0
#: The time limit of a report, fetch, stop or rerun step [s].
STEP_TIMEOUT = 3600.0


class RemoteRefused(ClusterError):
    """The master (the user gate) refused the step: the message is its line."""


def _failure(where: str, status: int, out: bytes, err: bytes) -> ClusterError:
    text = err.decode("utf-8", "replace").strip()
    lines = [x for x in text.splitlines() if x.strip()]
    refused = [x for x in lines if x.startswith("usergate: ")]
    if refused:
        return RemoteRefused(refused[-1])
    tail = "\n".join(lines[-6:]) or out.decode("utf-8", "replace")[-400:]
    return ClusterError(f"{where}: the step failed (exit status {status}): {tail}")


def _outcome(out: bytes) -> dict[str, object] | None:
    found = None
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except ValueError:
                continue
            if isinstance(value, dict):
                found = value
    return found


def remote_wait(target: SshTarget, home: str, line: str, after: float, timeout: float, *,
                on_progress: Callable[[str], None] | None = None,
                **ssh: object) -> dict[str, object]:
    """Wait on the master for the run queued as ``line`` after ``after`` (the commit's
    time); its outcome ``{"run", "status", "ended"}`` or ``{"timeout": True}``.
    ``on_progress`` gets each progress text (asked for only when given)."""
    pending = bytearray()
    kept = bytearray()

    def take(chunk: bytes) -> None:
        pending.extend(chunk)
        while b"\n" in pending:
            raw, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            text = raw.decode("utf-8", "replace")
            if text.startswith("progress: "):
                if on_progress is not None:
                    on_progress(text[len("progress: "):])
            else:
                kept.extend(raw + b"\n")

    words = ["wait", f"--line={line}", f"--after={after!r}", f"--timeout={timeout!r}"]
    if on_progress is not None:
        words.append("--progress")
    status, _out, err = run_step(target, home, words, timeout=timeout + WAIT_SLACK,
                                 on_out=take, **ssh)  # type: ignore[arg-type]
    kept.extend(pending)
    outcome = _outcome(bytes(kept))
    if outcome is None or "error" in outcome:
        if outcome is not None:
            raise ClusterError(f"{target.where()}: {outcome['error']}")
        raise _failure(target.where(), status, bytes(kept), err)
    return outcome


def remote_bytes(target: SshTarget, home: str, user: str, run: str, kind: str,
                 **ssh: object) -> bytes:
    """Run ``run``'s report (``kind`` "report") or CI file ("junit", "json")."""
    status, out, err = run_step(target, home, ["report", f"--user={user}", f"--run={run}",
                                               f"--kind={kind}"],
                                timeout=STEP_TIMEOUT, **ssh)  # type: ignore[arg-type]
    if status != 0:
        raise _failure(target.where(), status, out, err)
    return out


def remote_fetch(target: SshTarget, home: str, user: str, run: str, dest: Path,
                 **ssh: object) -> list[str]:
    """Fetch run ``run``'s files into ``dest/<run>/``; the names unpacked."""
    with tempfile.TemporaryFile() as spool:  # the stream, on disk: bmpcmp pages are big
        status, out, err = run_step(target, home, ["fetch", f"--user={user}", f"--run={run}"],
                                    timeout=STEP_TIMEOUT, on_out=_writer(spool),
                                    **ssh)  # type: ignore[arg-type]
        if status != 0:
            raise _failure(target.where(), status, out, err)
        spool.seek(0)
        dest.mkdir(parents=True, exist_ok=True)
        names: list[str] = []
        with tarfile.open(fileobj=spool, mode="r|") as tar:
            for member in tar:  # bounded: the stream
                if not member.isfile() or not member.name.startswith(f"{run}/"):
                    raise ClusterError(f"{target.where()}: the fetch of {run} sent "
                                       f"{member.name!r}; expected files below {run}/")
                tar.extract(member, dest, filter="data")
                names.append(member.name)
    return names


def _writer(fh: BinaryIO) -> Callable[[bytes], None]:
    def write(chunk: bytes) -> None:
        fh.write(chunk)
    return write


def remote_outcome(target: SshTarget, home: str, words: list[str],
                   **ssh: object) -> dict[str, object]:
    """Run a step that answers with an outcome line (stop, rerun); the outcome."""
    status, out, err = run_step(target, home, words, timeout=STEP_TIMEOUT,
                                **ssh)  # type: ignore[arg-type]
    outcome = _outcome(out)
    if outcome is None:
        raise _failure(target.where(), status, out, err)
    if "error" in outcome:
        raise ClusterError(f"{target.where()}: {outcome['error']}")
    return outcome
