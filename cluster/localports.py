"""The ports of a local cluster: which it listens on, and whether each is free now.

:func:`cluster_ports` (the master's, the monitor's and each lane's clustermaster port,
each with its role; two roles on one port refused) and :func:`status_port` (the status
page's), checked before anything starts by :func:`check_port`, whose error names the port,
its role and, when psutil can tell, the process holding it (:func:`port_holder`).
:func:`page_url` is the status page's address as a browser reaches it.
"""

from __future__ import annotations

import socket

from cluster import lanes
from cluster.config import Config
from cluster.errors import LocalClusterError


def port_holder(port: int) -> str | None:
    """Who listens on TCP ``port`` on this machine, as "pid N (command line)", or None when
    psutil cannot tell (no listener found, or another user's process it may not see)."""
    import psutil  # here: only the error path needs it

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return None
            try:
                argv = psutil.Process(conn.pid).cmdline()
            except psutil.Error:
                return f"pid {conn.pid}"
            command = " ".join(argv)
            if len(command) > 160:
                command = command[:157] + "..."
            return f"pid {conn.pid} ({command})" if command else f"pid {conn.pid}"
    return None


def check_port(address: str, port: int, role: str) -> None:
    """Raise LocalClusterError unless TCP ``port`` can be bound on ``address`` now.

    Bound as the servers bind (``SO_REUSEADDR``, so a port in TIME_WAIT after an earlier
    run counts as free, as it is for them) and released at once.  The message names the
    port, ``role`` (what would listen there) and, when psutil can tell, the process holding
    it.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            holder = port_holder(port)
            by = f"; held by {holder}" if holder else ""
            raise LocalClusterError(
                f"port {port} on {address} ({role}) cannot be bound: "
                f"{exc.strerror or exc}{by}. Stop what holds it, or choose other ports "
                f"with --set base_port=N (uses N to N+2, and N+3 on for user_lanes above 1), "
                f"--set monitor_port=M and "
                f"--set status_port=S (0: no status page)"
            ) from None


def cluster_ports(cfg: Config) -> dict[int, str]:
    """The ports a cluster with ``cfg`` listens on, each with its role; LocalClusterError
    when two roles share one port (one of them could never bind it)."""
    roles = [(cfg.port_for(lane), f"clustermaster of {lanes.describe(lane)}: "
                                  f"base_port + {lane}")
             for lane in lanes.served_lanes(cfg.user_lanes)]
    roles.append((cfg.monitor_port, "monitor: monitor_port"))
    ports: dict[int, str] = {}
    for port, role in roles:
        if port in ports:
            raise LocalClusterError(f"port {port} is both the {ports[port]} and the {role}; "
                                    f"each needs its own port")
        if not 0 < port < 65536:
            raise LocalClusterError(f"port {port} ({role}) is not a TCP port (1-65535)")
        ports[port] = role
    return ports


def status_port(cfg: Config) -> tuple[int, str] | None:
    """The status page's port and role, or None when ``status_port`` is 0 (not served);
    LocalClusterError when it is also one of :func:`cluster_ports` on the same address."""
    if cfg.status_port == 0:
        return None
    role = "status page: status_port"
    if not 0 < cfg.status_port < 65536:
        raise LocalClusterError(f"port {cfg.status_port} ({role}) is not a TCP port "
                                f"(1-65535, or 0 for no status page)")
    other = cluster_ports(cfg).get(cfg.status_port)
    if other is not None and cfg.status_address in (cfg.listen_address, "0.0.0.0", "::"):
        raise LocalClusterError(f"port {cfg.status_port} is both the {other} and the {role}; "
                                f"each needs its own port")
    return cfg.status_port, role


def page_url(address: str, port: int) -> str:
    """The URL of a server listening on ``address``:``port`` (a wildcard address: this
    machine's name)."""
    host = socket.gethostname() if address in ("0.0.0.0", "::", "") else address
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
