"""Priority 0's requests: the droppings clusterpush leaves beside the trees it pushes.

A dropping is ``users/<user>/<tree>/cluster_command.run`` in the master home, holding one
queue line ``user <user> <products> [options]`` (written atomically, after the tree).
:func:`scan_user_droppings` (priority 0's discoverer, see :mod:`cluster.triggers.discovery`)
turns each into a queued run and removes it, or sets a bad one aside.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from cluster.config import Config
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile, RunSpec

log = logging.getLogger("cluster.discovery")

DROPPING = "cluster_command.run"
MAX_DROPPING_BYTES = 4096


def waiting(home: Home) -> list[Path]:
    """The droppings waiting in ``home``, in name order."""
    return sorted(home.users.glob(f"*/*/{DROPPING}"))


def scan_user_droppings(home: Home, cfg: Config, queue: QueueFile) -> list[RunSpec]:
    """Runs requested by clusterpush: ``users/<user>/<tree>/cluster_command.run``.

    The dropping holds one queue line, ``user <user> <products> [options]``.  It is
    removed once its run is in the queue (a duplicate of a queued run is not queued twice);
    one that is malformed, too big, or claims another user or tree is
    renamed to ``cluster_command.run.rejected`` (nothing is lost) and logged with the reason.
    """
    found: list[RunSpec] = []
    for path in waiting(home):
        user, tree = path.parent.parent.name, path.parent.name
        try:
            if path.is_symlink() or not path.is_file():
                raise QueueLineError(str(path), "not a regular file", str(path))
            if path.stat().st_size > MAX_DROPPING_BYTES:
                raise QueueLineError("", f"larger than {MAX_DROPPING_BYTES} bytes", str(path))
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            spec = RunSpec.parse(text.splitlines()[0] if text else "", source=str(path),
                                 lineno=1)
            if spec.kind != "user" or spec.ref != user:
                raise QueueLineError(text, f"must be a 'user {user} ...' line", str(path), 1)
            if spec.tree != tree:
                raise QueueLineError(text, f"products {','.join(spec.products)} belong in "
                                     f"tree {spec.tree!r}, not {tree!r}", str(path), 1)
        except (QueueLineError, OSError) as exc:
            log.error("rejected dropping %s: %s", path, exc)
            _set_aside(path)
            continue
        if queue.append(spec):
            found.append(spec)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return found


def _set_aside(path: Path) -> None:
    try:
        os.replace(path, path.with_name(DROPPING + ".rejected"))
    except OSError as exc:
        log.error("could not set %s aside: %s", path, exc)
