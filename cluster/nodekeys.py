"""Each node's own key: ``node-keys/<name>.key`` in the master home (docs/protocol.md,
"Signed messages").

A node signs its requests with a key of its own, never with one that every node holds, so
that one node (or anyone with a node's login) cannot speak for another name.  The key is
32 random bytes written as 64 hex digits (the form of :mod:`cluster.wire.signing`), in a
file of mode 0600 inside ``node-keys/`` (mode 0700), kept by the master home:

* made by ``bootstrap_node.py`` when it sets a node up, by ``localcluster.py`` for its
  nodes, or by a node with ``transport = local`` (it shares the master's file system and
  account, so it could read any key there anyway);
* read by the node through its own transport (over ssh: its own login, which
  ``bootstrap_node.py --restrict`` limits to that one key file), never sent over the
  cleartext TCP protocol;
* read by the master when a name first calls in a run (:func:`read_node_key`); a run's
  request key is derived from it (:func:`cluster.wire.signing.run_key`), so a recorded
  request of one run verifies in no other.

Reads go through :func:`cluster.runtime.secretfile.read_secret_file`: a key file that is a
link or open to group or others is refused with a message naming it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from cluster.datatypes import valid_node_name
from cluster.errors import ClusterError
from cluster.runtime import secretfile

#: The folder of the node keys in the master home, and its mode.
NODE_KEYS_DIR = "node-keys"
DIR_MODE = 0o700
#: A key's bytes (written as twice as many hex digits).
KEY_BYTES = 32


def key_rel(name: str) -> str:
    """``node-keys/<name>.key``: the key file of node ``name``, relative to the master home.
    ValueError for a name that is not a node name (it would name another file)."""
    if not valid_node_name(name):
        raise ValueError(f"{name!r} is not a node name (1-64 of [A-Za-z0-9._-])")
    return f"{NODE_KEYS_DIR}/{name}.key"


def key_path(home_root: Path, name: str) -> Path:
    """The key file of node ``name`` in the master home ``home_root``."""
    return Path(home_root) / key_rel(name)


def ensure_node_key(home_root: Path, name: str) -> Path:
    """Make node ``name``'s key in ``home_root`` unless it exists; return its path.

    Created exclusively (``O_EXCL``, mode 0600 from the start) so that two makers agree on
    one key; an existing key is never rewritten (the node holds a copy).  ClusterError if
    ``node-keys/`` cannot be made or the file cannot be written.
    """
    path = key_path(home_root, name)
    folder = path.parent
    try:
        # Apart from the open: a FileExistsError here is node-keys/ being a file, not a key.
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(folder, DIR_MODE)
    except OSError as exc:
        raise ClusterError(f"cannot make the key of node {name} at {path}: {folder} cannot "
                           f"be made a folder: {exc.strerror or exc}") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     secretfile.SECRET_MODE)
    except FileExistsError:
        return path
    except OSError as exc:
        raise ClusterError(f"cannot make the key of node {name} at {path}: "
                           f"{exc.strerror or exc}") from None
    try:
        os.write(fd, (secrets.token_hex(KEY_BYTES) + "\n").encode("ascii"))
        os.fsync(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise ClusterError(f"cannot write the key of node {name} at {path}: "
                           f"{exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return path


def read_node_key(home_root: Path, name: str) -> str | None:
    """The text of node ``name``'s key file, or None if there is none (an unknown node).
    SecretFileError naming the file if it is a link or open to others; another OSError if
    it cannot be read."""
    try:
        return secretfile.read_secret_file(key_path(home_root, name))
    except FileNotFoundError:
        return None
