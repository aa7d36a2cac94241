"""Which transport a node uses: the one that ``transport`` in node.conf names.

The only module that knows both implementations.  :mod:`cluster.node.transport` (the
interface and :class:`~cluster.node.transport.LocalTransport`) does not import the ssh one,
and :mod:`cluster.node.sshtransport` imports the interface: no circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.errors import ConfigError
from cluster.node.transport import LocalTransport, Transport

if TYPE_CHECKING:
    from cluster.config import Config


def make_transport(cfg: Config) -> Transport:
    """The transport ``cfg.transport`` names: "local" gives LocalTransport(cfg.master_home),
    "ssh" :meth:`SshTransport.from_config` (nothing is connected before the first call).
    ConfigError for any other name."""
    if cfg.transport == "local":
        return LocalTransport(cfg.master_home)
    if cfg.transport == "ssh":
        # Imported here, not at the top: paramiko costs every local node's run.py a quarter
        # of a second, and a local node never needs it.
        from cluster.node.sshtransport import SshTransport
        return SshTransport.from_config(cfg)
    raise ConfigError("transport", cfg.transport, "'local' or 'ssh'")
