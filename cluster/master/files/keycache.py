"""The keys of the nodes as the master's servers need them (docs/protocol.md, "Signed messages").

Each node signs with a key derived from its own key ``node-keys/<name>.key``
(:mod:`cluster.nodekeys`): its run requests with :func:`~cluster.wire.signing.run_key`,
its heartbeats with :func:`~cluster.wire.signing.heartbeat_key`.  :class:`NodeKeyCache`
holds the derived keys of the names that called: a dict lookup per connection, a file read
only for a name not seen yet (a missing key is looked for again at most every
:data:`NodeKeyCache.RETRY` seconds), or after a signature failed and :data:`RETRY` passed
since it was read (a node set up again gets a new key).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from cluster import nodekeys
from cluster.datatypes import valid_node_name
from cluster.errors import ClusterError
from cluster.wire import signing


class NodeKeyCache:
    """Node name -> the key ``derive`` makes of its own key; None for a name the master
    holds no key for."""

    #: How often a name without a key file, or whose key did not verify, is read again [s].
    RETRY = 1.0

    def __init__(self, home_root: Path, derive: Callable[[bytes], bytes],
                 monotonic: Callable[[], float]) -> None:
        self.home_root = home_root
        self.derive = derive
        self.monotonic = monotonic
        self._keys: dict[str, bytes] = {}
        self._read_at: dict[str, float] = {}

    def key(self, name: str) -> bytes | None:
        """The derived key of node ``name``, or None if the master holds no key for it.
        SecretFileError (a ClusterError) if its key file is a link or open to others."""
        key = self._keys.get(name)
        if key is not None or not name:
            return key
        return self._read(name)

    def reread(self, name: str) -> bytes | None:
        """The key of ``name`` read again, if it was read more than :data:`RETRY` seconds
        ago (after a signature that did not verify); else None."""
        if self.monotonic() - self._read_at.get(name, -self.RETRY) < self.RETRY:
            return None
        self._keys.pop(name, None)
        return self._read(name)

    def _read(self, name: str) -> bytes | None:
        now = self.monotonic()
        if name in self._read_at and now - self._read_at[name] < self.RETRY:
            return None
        self._read_at[name] = now
        if len(self._read_at) > signing.MAX_SESSIONS:  # bounded: strangers' names
            del self._read_at[next(iter(self._read_at))]
        try:
            text = nodekeys.read_node_key(self.home_root, name)
            if text is None:
                return None
            key = self.derive(signing.parse_secret(text))
        except ValueError as exc:
            if not valid_node_name(name):
                return None  # not a node name: no file could be its key
            # A bad key file is said as such at every call, not "unknown" after the first.
            del self._read_at[name]
            raise ClusterError(f"{nodekeys.key_path(self.home_root, name)}: {exc}") from None
        except ClusterError:
            del self._read_at[name]
            raise
        except OSError as exc:
            del self._read_at[name]
            raise ClusterError(f"{nodekeys.key_path(self.home_root, name)}: cannot be read: "
                               f"{exc.strerror or exc}") from None
        self._keys[name] = key
        if len(self._keys) > signing.MAX_SESSIONS:
            del self._keys[next(iter(self._keys))]
        return key


def run_keys(home_root: Path, run_id: str, monotonic: Callable[[], float]) -> NodeKeyCache:
    """The nodes' request keys in run ``run_id`` (the clustermaster's)."""
    return NodeKeyCache(home_root, lambda key: signing.run_key(key, run_id), monotonic)


def heartbeat_keys(home_root: Path, monotonic: Callable[[], float]) -> NodeKeyCache:
    """The nodes' heartbeat keys (the monitor's)."""
    return NodeKeyCache(home_root, signing.heartbeat_key, monotonic)


class KeyRefused(Exception):
    """A message whose node key could not verify it: ``reason`` is what the peer is told,
    ``logged`` what the master's log (and audit trail) say."""

    def __init__(self, reason: str, logged: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.logged = logged or reason


def verify(keys: NodeKeyCache, claimed: str, data: bytes) -> tuple[bytes, str]:
    """``(key, nonce)`` of the signed message ``data`` from node ``claimed``, verified under
    that node's key: read again once if it did not verify and :data:`NodeKeyCache.RETRY`
    passed (the node may have been set up anew).  KeyRefused otherwise: a name without a
    key ("unknown node"), a key file the master cannot use (the peer is told only that; the
    log names the file and why), or the signature's own refusal (unsigned, bad)."""
    try:
        key = keys.key(claimed)
    except ClusterError as exc:
        # The admin's to mend: said in full in the log, not to whoever connected (the
        # home's paths are none of a stranger's business).
        raise KeyRefused("node key refused: the master cannot use this node's key file "
                         "(its log says why)", f"node key refused: {exc}") from None
    if key is None:
        raise KeyRefused(f"unknown node: the master holds no key for {claimed!r} "
                         f"({nodekeys.NODE_KEYS_DIR}/<name>.key)")
    try:
        return key, signing.verify_request(data, key)[1]
    except signing.SignatureError as exc:
        first = exc
    fresh = None
    if first.reason == signing.BAD_SIGNATURE:
        with contextlib.suppress(ClusterError):
            fresh = keys.reread(claimed)
    if fresh is None or fresh == key:
        raise KeyRefused(str(first)) from None
    try:
        return fresh, signing.verify_request(data, fresh)[1]
    except signing.SignatureError as again:
        raise KeyRefused(str(again)) from None
