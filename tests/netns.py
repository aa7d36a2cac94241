"""Hosts made of network namespaces, for the multi-machine end-to-end tests.

A :class:`Topology` is a master namespace and N host namespaces ("node1", "node2", "dev",
...), each host joined to the master by its own veth pair on its own /24:

    master ns                                   host ns "node1"
      lo: 127.0.0.1, 10.231.0.1/32 (service)      lo: 127.0.0.1
      to-node1: 10.231.1.1/24  <--- veth --->      eth0: 10.231.1.2/24
                                                    route 10.231.0.1 via 10.231.1.1

Every service of the master (sshd, monitor, clustermasters) listens on the service address
:data:`SERVICE_ADDRESS`, which each host reaches through its own link only, so
:meth:`Topology.cut` (``ip link set to-<host> down`` in the master namespace) takes exactly
one host off the network, and :meth:`Topology.restore` puts it back (the link's prefix
route comes back with it; the host's route to the service address is kept while its peer
has no carrier).  The veth pairs are created inside the namespaces (``ip -n MASTER link add
... peer ... netns HOST``): no interface, address or route of the machine's own network
namespace is ever touched, and all traffic stays between these namespaces.

Namespaces are named ``rct-<pid>-<seq>-<role>``: unique to this process, and a later run
recognises the ones a dead process left behind and removes them
(:func:`remove_stale`, called by :meth:`Topology.create`).  :meth:`Topology.destroy`
kills every process still inside the namespaces (by pid, from ``ip netns pids``) and
deletes them, after a failure too (use the topology as a context manager).

Hiding the master home: :meth:`Host.argv` wraps a command so that it runs in the host's
network namespace *and* in a private mount namespace in which each ``hide`` directory is
covered by an empty tmpfs (mode 0700; 1 MiB, so a private directory made there, like a
node's own cron spool, stays small).  A node process started that way sees its own work
directory and the rest of the machine (python, gs, the repository) but not the master home:
whatever it gets from the master, it got over the network.

Every command here is bounded (:data:`IP_TIMEOUT`), and needs root (CAP_NET_ADMIN and
CAP_SYS_ADMIN); :func:`check_can_run` says precisely what is missing.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cluster.runtime import proc

#: Prefix of every namespace these tests create.
PREFIX = "rct-"
#: Where the master's services listen (on the master namespace's loopback device).
SERVICE_ADDRESS = "10.231.0.1"
#: Longest time one ``ip``/``mount`` command may take [seconds].
IP_TIMEOUT = 30.0
#: How long processes left in a namespace get between TERM and KILL at teardown [seconds].
KILL_GRACE = 5.0
#: The name of a host's end of its link, inside the host's namespace.
HOST_LINK = "eth0"
#: Role names: short, so ``to-<role>`` fits Linux's 15-character interface names.
ROLE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_STALE = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
_seq = itertools.count(1)


class NetnsError(RuntimeError):
    """A namespace command failed; the message quotes the command and what it printed."""


def ip(*args: str, timeout: float = IP_TIMEOUT, check: bool = True
       ) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (bounded); NetnsError naming the command unless it succeeded."""
    argv = ["ip", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{shlex.join(argv)} took over {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise NetnsError(f"{shlex.join(argv)} failed ({done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()}")
    return done


def check_can_run() -> str | None:
    """Why namespaces cannot be made here (not root, a tool missing), or None if they can."""
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: iproute2, util-linux, mount)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return None


def namespaces() -> list[str]:
    """The names of the network namespaces ``ip netns`` knows."""
    out = ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(netns: str) -> list[int]:
    """The processes running in ``netns`` (``ip netns pids``); [] if it is gone."""
    done = ip("netns", "pids", netns, check=False)
    return [int(w) for w in done.stdout.split() if w.isdigit()] if done.returncode == 0 else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_all_in(netns: str, grace: float = KILL_GRACE) -> list[int]:
    """TERM every process in ``netns``, KILL what is left after ``grace`` seconds; the pids
    found.  (The namespace is ours: everything in it was started by the test that made it.)"""
    found = pids_in(netns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_in(netns):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and any(_alive(p) for p in pids_in(netns)):
            time.sleep(0.05)
    return found


def delete(netns: str) -> None:
    """Kill what runs in ``netns`` and delete it (its veth ends, and their peers, go too)."""
    kill_all_in(netns)
    ip("netns", "delete", netns, check=False)


def remove_stale() -> list[str]:
    """Delete the ``rct-<pid>-*`` namespaces whose creating process is dead; their names."""
    removed = []
    for name in namespaces():
        match = _STALE.match(name)
        if match and not _alive(int(match.group(1))):
            delete(name)
            removed.append(name)
    return removed


@dataclass
class Host:
    """One namespace of a topology: the master, or a host joined to it."""

    role: str
    netns: str
    #: Its address: the service address for the master, its link address for a host.
    address: str
    #: For a host, the master-side end of its link (what :meth:`Topology.cut` takes down).
    link: str = ""

    def argv(self, command: Sequence[str], hide: Iterable[Path] = (), setup: str = ""
             ) -> list[str]:
        """``command`` run in this namespace; with ``hide``, also in a private mount
        namespace where each of those directories is an empty tmpfs only root can enter,
        and where the shell commands ``setup`` then run (e.g. to make a private cron
        spool in a hidden ``/var/spool/cron``)."""
        wrapped = ["ip", "netns", "exec", self.netns]
        hidden = [str(Path(p)) for p in hide]
        if not hidden:
            if setup:
                raise ValueError("setup runs in the private mount namespace: give hide too")
            return [*wrapped, *command]
        steps = [f"mount -t tmpfs -o size=1m,mode=0700 rct-hidden {shlex.quote(p)}"
                 for p in hidden]
        if setup:
            steps.append(f"{{ {setup}; }}")
        # exec: the process the caller holds is the command itself (same pid, same
        # session), so killing its tree kills the command.
        return [*wrapped, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                " && ".join(steps) + ' && exec "$@"', "sh", *command]

    def run(self, command: Sequence[str], *, timeout: float, hide: Iterable[Path] = (),
            setup: str = "", env: Mapping[str, str] | None = None, cwd: Path | None = None
            ) -> proc.Result:
        """Run ``command`` here to its end or ``timeout`` (see :func:`cluster.runtime.proc.run`)."""
        return proc.run(self.argv(command, hide, setup), timeout=timeout, env=env, cwd=cwd)

    def spawn(self, command: Sequence[str], log: Path, *, hide: Iterable[Path] = (),
              setup: str = "", env: Mapping[str, str] | None = None, cwd: Path | None = None
              ) -> subprocess.Popen[bytes]:
        """Start ``command`` here, in its own session, output appended to ``log``."""
        with open(log, "ab") as out:
            return proc.spawn(self.argv(command, hide, setup), stdout=out, stderr=proc.STDOUT,
                              env=env, cwd=cwd)


@dataclass
class Topology:
    """A master namespace and one host namespace per role in ``roles``.

    Use as a context manager (``with Topology(["node1", "node2"]) as topo:``): entering
    creates everything (:meth:`create`), leaving removes it (:meth:`destroy`) whatever
    happened in between.
    """

    roles: Sequence[str]
    master: Host = field(init=False)
    hosts: dict[str, Host] = field(init=False, default_factory=dict)
    tag: str = field(init=False, default="")

    def __post_init__(self) -> None:
        for role in self.roles:
            if not ROLE.match(role) or role == "master":
                raise ValueError(f"host role {role!r}: expected a short lowercase name "
                                 f"(letters and digits, at most 12), not 'master'")
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"host roles {list(self.roles)} repeat a name")
        if len(self.roles) > 250:
            raise ValueError("at most 250 hosts (one /24 each under 10.231.0.0/16)")
        self.tag = f"{PREFIX}{os.getpid()}-{next(_seq)}"
        self.master = Host("master", f"{self.tag}-master", SERVICE_ADDRESS)

    @property
    def all(self) -> list[Host]:
        return [self.master, *self.hosts.values()]

    def create(self) -> Topology:
        """Make the namespaces, links, addresses and routes; on any failure, remove what
        was made and raise NetnsError."""
        why = check_can_run()
        if why:
            raise NetnsError(f"cannot make network namespaces: {why}")
        remove_stale()
        try:
            m = self.master.netns
            ip("netns", "add", m)
            ip("-n", m, "link", "set", "lo", "up")
            ip("-n", m, "addr", "add", f"{SERVICE_ADDRESS}/32", "dev", "lo")
            for i, role in enumerate(self.roles, start=1):
                host = Host(role, f"{self.tag}-{role}", f"10.231.{i}.2", f"to-{role}")
                self.hosts[role] = host
                ip("netns", "add", host.netns)
                ip("-n", host.netns, "link", "set", "lo", "up")
                # Both ends are born inside the namespaces: nothing appears on the
                # machine's own network, even for an instant.
                ip("-n", m, "link", "add", host.link, "type", "veth", "peer", "name",
                   HOST_LINK, "netns", host.netns)
                ip("-n", m, "addr", "add", f"10.231.{i}.1/24", "dev", host.link)
                ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", HOST_LINK)
                ip("-n", m, "link", "set", host.link, "up")
                ip("-n", host.netns, "link", "set", HOST_LINK, "up")
                ip("-n", host.netns, "route", "add", f"{SERVICE_ADDRESS}/32", "via",
                   f"10.231.{i}.1")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Kill every process inside the namespaces and delete them (idempotent)."""
        for host in [*self.hosts.values(), self.master]:
            if host.netns in namespaces():
                delete(host.netns)

    def cut(self, role: str) -> None:
        """Take ``role``'s link down (master side): it can reach nothing, nothing reaches it."""
        ip("-n", self.master.netns, "link", "set", self.hosts[role].link, "down")

    def restore(self, role: str) -> None:
        """Bring ``role``'s link back up (the master's route to it returns with it)."""
        ip("-n", self.master.netns, "link", "set", self.hosts[role].link, "up")

    def __enter__(self) -> Topology:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


@contextmanager
def topology(roles: Sequence[str]) -> Iterator[Topology]:
    """``with topology(["node1", "node2"]) as topo:`` -- a created :class:`Topology`."""
    with Topology(roles) as topo:
        yield topo
