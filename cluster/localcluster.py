"""A whole cluster on one machine: master home, supervisor, monitor, N nodes, one pushed run.

:class:`LocalCluster` is what ``localcluster.py`` drives and what the end-to-end tests use:
it writes a configuration into the home, starts the real scripts as child processes (each
in its own process group, logging into ``home/log``), pushes a product tree with
clusterpush, waits for the run's archive folder and stops everything it started.

The demo product: a tree with a Makefile whose build writes ``bin/gs`` (or ``bin/mutool``),
a wrapper around the installed program that adds the options listed in the tree's
``options`` file.  Changing an option changes the product's command line, exactly as a
developer's change to ghostpdl would change its output.

Failing fast: :meth:`LocalCluster.start` first checks that every port the cluster will
listen on (``base_port`` + 0, 1, 2 and ``monitor_port``, on ``listen_address``, and
``status_port`` on ``status_address`` unless it is 0) can be bound, and raises
:class:`LocalClusterError` naming the port, its role and, when psutil can tell, the process
holding it.  While :meth:`~LocalCluster.wait_for_nodes` and
:meth:`~LocalCluster.wait_for_run` wait, they look at the monitor, the supervisor and the
status service every poll: if one has exited, the wait stops at once with a
LocalClusterError carrying its exit status and the last lines it logged, instead of waiting
out its timeout.

The status page: :meth:`LocalCluster.start` starts ``clusterstatus.py`` with the other
master daemons (unless ``status_port`` is 0); :meth:`LocalCluster.status_url` is its address.
:meth:`~LocalCluster.wait_for_run` calls its ``on_poll`` at every look (localcluster.py
rewrites its progress line there), adding no wait of its own.

Transports: with ``transport="ssh"`` (``localcluster.py --transport ssh``) the nodes reach
the master's files the way nodes on other machines do: :meth:`LocalCluster.start` first
starts a private OpenSSH server (:class:`cluster.runtime.sshd.PrivateSshd`) on a free
loopback port, with a host key and a client key it generates in ``home/ssh/``, and each
node is configured with ``transport = ssh`` against it (``master_home`` the home's absolute
path, ``ssh_key`` the client key, ``ssh_known_hosts`` the server's known_hosts file).  It
removes nothing outside the home (``home/ssh/`` stays for the next start).  ``local``
(the home read directly) stays the default.

Wrapping: :attr:`LocalCluster.wrap` rewrites the command line of every process
it starts (the multi-machine tests run the monitor and the supervisor inside a network
namespace with it).

Stopping (docs/architecture.md, "Stopping"): :meth:`~LocalCluster.wait_for_run` returns
only once the run's clustermaster has exited (after its end steps it removes its PID file
and exits), and :meth:`~LocalCluster.stop` first gives a clustermaster that is not serving
a run (ending one, or looking for work) a bounded moment to exit, then stops the daemons
with SIGTERM (the supervisor passes it on to its clustermasters, which leave their run to
the next one, their PID files removed).  So a stop leaves no PID file behind, and the next
local cluster in the same home starts its run at once.  Every daemon is started with the
parent watch (:func:`cluster.runtime.proc.spawn`'s ``watch_parent``): if the process that
started them dies, even by SIGKILL, they get SIGTERM and leave, and so do the
clustermasters and run.py processes they started.
"""

from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cluster import configfile, lanes, nodekeys
from cluster.config import Config
from cluster.defaults import REPO_ROOT
from cluster.demotree import write_demo_tree
from cluster.errors import ClusterError, LocalClusterError
from cluster.home import Home
from cluster.localports import check_port, cluster_ports, page_url, status_port
from cluster.localprocs import END_LOOK, supervisor_masters, wait_for_masters
from cluster.master.files import pidformat
from cluster.node.transport import LocalTransport
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.triggers.push import push_tree

if TYPE_CHECKING:
    from cluster.provision.sgehost import PrivateGridEngine
    from cluster.provision.slurmhost import PrivateSlurm
    from cluster.runtime.sshd import PrivateSshd

log = logging.getLogger("cluster.localcluster")

DEFAULT_CORPUS = REPO_ROOT / "corpus" / "ghostpdl-examples"
#: How often the waits below look again [seconds].
_POLL = 0.05
#: wait_for_run lists the archive folder when its mtime moved, and at least this often
#: [seconds] (an mtime can stay the same over two changes within one tick of its clock).
_RELIST = 1.0
#: The daemons whose exit ends a wait at once (a node may die and be replaced; these not).
MONITOR_SCRIPT = "monitor_port.py"
SUPERVISOR_SCRIPT = "run_clustermaster.py"
STATUS_SCRIPT = "clusterstatus.py"
PROVISIONER_SCRIPT = "clusterscale.py"
#: A clustermaster's script, as the supervisor starts it (its priority in the name).
#: Where the nodes come from: started here (""), or asked of a private Slurm ("slurm") or
#: Grid Engine ("gridengine").
PROVIDERS = ("", "slurm", "gridengine")
#: How many of a dead daemon's last log lines an error shows.
LOG_TAIL_LINES = 20
#: How much of a dead daemon's log is read for them, at most [bytes].
LOG_TAIL_BYTES = 16_384
#: The transports a local cluster's nodes can use (the node key ``transport``).
TRANSPORTS = ("local", "ssh")
#: Where ``transport="ssh"`` keeps its sshd's keys and configuration, in the home.
SSH_DIR = "ssh"
#: How long the private sshd has to start accepting connections [seconds].
SSHD_START_TIMEOUT = 30.0
#: The longest :meth:`LocalCluster.wait_for_run` waits for the run's clustermaster to exit
#: after the run's end steps (it refreshes the resource file, releases its PID file and
#: exits: milliseconds) [seconds].
MASTER_EXIT_WAIT = 30.0


def log_tail(path: Path, since: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines written to ``path`` after byte offset ``since`` (what a
    process started when the file had that size wrote), at most LOG_TAIL_BYTES of them."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(since, size - LOG_TAIL_BYTES))
            data = fh.read()
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror or exc})"
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    if not text:
        return "(it wrote nothing)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Daemon:
    """A process whose exit ends the waits, and where its output goes."""

    child: subprocess.Popen[bytes]
    log_path: Path
    log_start: int  # the log's size when it was started: what it wrote comes after


#: What :attr:`LocalCluster.wrap` is given: the role of the process ("monitor",
#: "supervisor" or a node's name) and its command line; it returns the command line to run.
Wrap = Callable[[str, list[str]], list[str]]


@dataclass
class LocalCluster:
    """Starts and stops a master and ``nodes`` local nodes around one master home.

    Every process is started with :func:`cluster.runtime.proc.spawn` (its own session) and
    stopped with :func:`cluster.runtime.proc.kill_tree`; the waits run on ``clock``.

    ``transport`` is how the nodes reach the home: "local" (directly) or "ssh" (through a
    private sshd :meth:`start` starts, see the module's docstring).  ``wrap``, if given,
    rewrites every command line before it is started (it must ``exec`` the command, so
    that the process started is the command's process).
    """

    home_dir: Path
    nodes: int = 2
    corpus: Path = DEFAULT_CORPUS
    overrides: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    node_procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    clock: Clock = field(default_factory=SystemClock)
    #: The master daemons (monitor, supervisor, status service) by script name (see
    #: :meth:`check_daemons`).
    daemons: dict[str, _Daemon] = field(default_factory=dict)
    transport: str = "local"
    wrap: Wrap | None = None
    #: "slurm", "gridengine": no node is started here; a private single-host batch system
    #: and the provisioner (clusterscale.py, with ``provider_env`` added to its
    #: environment) start ephemeral nodes as runs wait (docs/provisioning.md), at most
    #: ``max_nodes`` of them.
    provider: str = ""
    provider_env: dict[str, str] = field(default_factory=dict)
    #: The private Slurm or Grid Engine of ``provider``, while it runs.
    slurm: PrivateSlurm | None = None
    gridengine: PrivateGridEngine | None = None
    #: The private sshd of ``transport="ssh"``, while it runs.  Set it before
    #: :meth:`start` to use one started elsewhere (:meth:`stop` stops it all the same).
    sshd: PrivateSshd | None = None

    def __post_init__(self) -> None:
        self.home_dir = self.home_dir.resolve()
        self.home = Home(self.home_dir)
        self.conf_path = self.home_dir / "cluster.conf"
        if self.transport not in TRANSPORTS:
            raise LocalClusterError(f"transport {self.transport!r}: expected one of "
                                    f"{', '.join(TRANSPORTS)}")
        if self.provider not in PROVIDERS:
            raise LocalClusterError(f"provider {self.provider!r}: expected slurm, gridengine "
                                    "or none")
        if self.provider:  # the engine of the provisioner: one line of master.conf
            prefix = {"node_prefix": "sge"} if self.provider == "gridengine" else {}
            self.overrides = {"provision_engine": self.provider, **prefix, **self.overrides}

    # ------------------------------------------------------------------ setup
    def prepare(self) -> Config:
        """Create the home, mirror the corpus into it, write cluster.conf; return the config.

        The master's clean trees (``ghostpdl``, ``mupdf``: what auto runs build, what a push
        is diffed against and what bmpcmp renders as the baseline) are the plain demo
        products, unless the home has them already.
        """
        self.home.create()
        for tree, product in (("ghostpdl", "gs"), ("mupdf", "mupdf")):
            if not (self.home_dir / tree).exists():
                write_demo_tree(self.home_dir / tree, product, [])
        if not self.corpus.is_dir():
            raise FileNotFoundError(f"corpus {self.corpus} is not a directory")
        tests = self.home_dir / "tests"
        LocalTransport(self.corpus.resolve().parent).fetch_tree(
            self.corpus.resolve().name, tests / self.corpus.resolve().name)
        slots = max(1, (os.cpu_count() or 1) // max(self.nodes, 1))
        text = ("# Written by localcluster.py: a master and its nodes on this machine.\n"
                "[master]\nhome = .\n\n"
                f"[node]\nmaster_home = .\nslots = {slots}\n")
        self.conf_path.write_text(text, encoding="utf-8")
        # The nodes' configuration too: their own account's alone (a job run as job_user
        # must not read it: cluster.node.jobuser).
        os.chmod(self.conf_path, 0o600)
        return self.config()

    def config(self) -> Config:
        return configfile.load(self.conf_path, self.overrides)

    def config_args(self) -> list[str]:
        """The --config and --set arguments that give a script this cluster's settings."""
        argv = ["--config", str(self.conf_path)]
        for key, value in self.overrides.items():
            argv += ["--set", f"{key}={value}"]
        return argv

    def _spawn(self, script: str, extra: list[str], log_name: str,
               env: dict[str, str] | None = None, daemon: bool = False,
               role: str = "") -> subprocess.Popen[bytes]:
        log_path = self.home.log_dir / log_name
        child_env = None if env is None else {**os.environ, **env}
        argv = [sys.executable, str(REPO_ROOT / script), *self.config_args(), *extra]
        if self.wrap is not None:
            argv = self.wrap(role or script, argv)
        with open(log_path, "ab") as out:
            log_start = out.tell()
            # Watched: they die with this process, however it ends (module docstring).
            child = proc.spawn(argv, stdout=out, stderr=proc.STDOUT, cwd=self.home_dir,
                               env=child_env, watch_parent=True)
        self.procs.append(child)
        if daemon:
            self.daemons[script] = _Daemon(child, log_path, log_start)
        return child

    def check_ports(self, cfg: Config | None = None) -> None:
        """LocalClusterError unless every port of the cluster can be bound now (see
        :func:`check_port`): a port already taken is reported before anything starts."""
        cfg = cfg or self.config()
        for port, role in cluster_ports(cfg).items():
            check_port(cfg.listen_address, port, role)
        served = status_port(cfg)
        if served is not None:
            check_port(cfg.status_address, *served)

    def status_url(self, cfg: Config | None = None) -> str | None:
        """The status page's URL, or None when ``status_port`` is 0 (not served)."""
        cfg = cfg or self.config()
        return None if cfg.status_port == 0 else page_url(cfg.status_address, cfg.status_port)

    def start(self, node_env: dict[str, dict[str, str]] | None = None) -> None:
        """Check the ports (:meth:`check_ports`), start the private sshd (transport ssh,
        unless :attr:`sshd` is set already), then the monitor, the supervisor, the status
        service (unless ``status_port`` is 0) and the nodes.

        ``node_env`` maps a node name (``node1``, ...) to extra environment variables for
        that node's processes (clusterpull, its run.py and the jobs they run).
        """
        self.check_ports()
        if self.transport == "ssh" and self.sshd is None:
            self.start_sshd()
        self._spawn(MONITOR_SCRIPT, [], "monitor_port.out", daemon=True, role="monitor")
        # --kill-children: when we stop, no clustermaster may outlive the local cluster.
        self._spawn(SUPERVISOR_SCRIPT, ["--kill-children"], "run_clustermaster.out",
                    daemon=True, role="supervisor")
        if self.config().status_port != 0:
            self._spawn(STATUS_SCRIPT, [], "clusterstatus.out", daemon=True, role="status")
        for i in range(1, self.nodes + 1):
            name = f"node{i}"
            self.start_node(name, (node_env or {}).get(name))
        if self.provider:
            self.start_provider()

    def start_provider(self) -> dict[str, str]:
        """Start a private single-host Slurm or Grid Engine in ``<home>/<provider>`` (with
        CPUs for ``max_nodes`` nodes of ``node_slots``) and the provisioner, which asks it
        for ephemeral nodes as runs wait; the environment its commands need."""
        # Here, not at the top: only a provider needs its batch system.
        from cluster.provision.sgehost import PrivateGridEngine
        from cluster.provision.slurmhost import PrivateSlurm

        cfg = self.config()
        cpus, folder = max(1, cfg.max_nodes) * cfg.node_slots, self.home_dir / self.provider
        if self.provider == "slurm":
            self.slurm = PrivateSlurm(folder, cpus=cpus).start()
            env = self.slurm.env
        else:
            self.gridengine = PrivateGridEngine(folder, slots=cpus).start()
            env = self.gridengine.env
        # The jobs get the provisioner's environment: an ephemeral node works in
        # $TMPDIR/<name>, here in this home (a private batch system counts job ids from 1
        # again, so /tmp/slurm-1 would be another cluster's too).
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        self._spawn(PROVISIONER_SCRIPT, [], "clusterscale.out", env={
            **env, "TMPDIR": str(folder / "tmp"), **self.provider_env}, daemon=True,
            role="provisioner")
        return env

    def start_sshd(self) -> PrivateSshd:
        """Start the private sshd of ``transport="ssh"`` on a free port of ``master_host``
        (loopback by default), its keys in ``home/ssh/``, logging in only this user; kept in
        :attr:`sshd`.  LocalClusterError if it does not start within SSHD_START_TIMEOUT."""
        # Here, not at the top: only the ssh transport needs OpenSSH's server.
        from cluster.runtime.sshd import PrivateSshd

        cfg = self.config()
        sshd = PrivateSshd(self.home_dir / SSH_DIR, address=cfg.master_host,
                           user=getpass.getuser())
        try:
            sshd.start(timeout=SSHD_START_TIMEOUT)
        except (ClusterError, OSError, TimeoutError) as exc:
            raise LocalClusterError(f"the private sshd for the ssh transport did not start "
                                    f"on {cfg.master_host} (files in "
                                    f"{self.home_dir / SSH_DIR}): {exc}") from None
        self.sshd = sshd
        log.info("private sshd on %s:%d for the nodes (host key %s)", sshd.address, sshd.port,
                 sshd.host_fingerprint)
        return sshd

    def node_settings(self, name: str, work_dir: Path | None = None) -> dict[str, str]:
        """The settings node ``name`` runs with beyond the home's cluster.conf: its name and
        work directory (default ``home/node-work/<name>``) and, for transport ssh, the
        transport's keys against :attr:`sshd` (which must have been started)."""
        work = work_dir or self.home_dir / "node-work" / name
        settings = {"node_name": name, "work_dir": str(work)}
        if self.transport == "ssh":
            if self.sshd is None:
                raise LocalClusterError("transport ssh: the private sshd is not started "
                                        "(call start() or start_sshd() first)")
            settings.update({
                "transport": "ssh", "master_host": self.sshd.address,
                "master_home": str(self.home_dir), "ssh_port": str(self.sshd.port),
                "ssh_user": getpass.getuser(), "ssh_key": str(self.sshd.client_key),
                "ssh_known_hosts": str(self.sshd.known_hosts)})
        return settings

    def start_node(self, name: str, env: dict[str, str] | None = None, *,
                   machine: str = "", settings: dict[str, str] | None = None
                   ) -> subprocess.Popen[bytes]:
        """Start node ``name``'s clusterpull; ``env`` adds to (or overrides) the environment
        it and everything it starts (run.py, the jobs) inherit.

        ``machine`` (default: ``name``) labels the process in :attr:`node_procs` and its
        output file, and names its work dir (``home/node-work/<machine>``): another machine
        set up with the same node name.  ``settings`` override :meth:`node_settings` (a
        node reaching the sshd through another port, say).
        """
        machine = machine or name
        chosen = {**self.node_settings(name, self.home_dir / "node-work" / machine),
                  **(settings or {})}
        extra: list[str] = []
        for key, value in chosen.items():
            extra += ["--set", f"{key}={value}"]
        # Its own key, as bootstrap_node.py makes it (a node over ssh cannot make it).
        nodekeys.ensure_node_key(self.home_dir, name)
        child = self._spawn("clusterpull.py", extra, f"{machine}.out", env, role=machine)
        self.node_procs[machine] = child
        return child

    def check_daemons(self) -> None:
        """LocalClusterError if the monitor, the supervisor or the status service has exited.

        None ever exits on its own while the cluster runs, so an exit means the cluster
        cannot work as asked (its port was taken after :meth:`check_ports`, another monitor
        holds the home, a bad setting): the message gives the exit status and the last lines
        the process logged since it was started here.
        """
        for script, daemon in self.daemons.items():
            status = daemon.child.poll()
            if status is None:
                continue
            tail = log_tail(daemon.log_path, daemon.log_start)
            raise LocalClusterError(
                f"{script} exited ({proc.describe_status(status)}); the local cluster cannot "
                f"work without it. Its last lines ({daemon.log_path}):\n{tail}")

    def wait_for_nodes(self, timeout: float = 60.0) -> None:
        """Until every node has sent its first heartbeat (so a timed run starts warm).

        TimeoutError past ``timeout``; LocalClusterError at once if the monitor or the
        supervisor exits meanwhile (:meth:`check_daemons`)."""
        deadline = self.clock.monotonic() + timeout
        while len(list(self.home.nodes.glob("*.up"))) < self.nodes:
            self.check_daemons()
            if self.clock.monotonic() > deadline:
                raise TimeoutError(f"nodes did not start within {timeout:.0f} s; "
                                   f"see {self.home.log_dir}")
            self.clock.sleep(_POLL)

    def wait_for_status_page(self, timeout: float = 30.0) -> str:
        """The status page's URL once it accepts connections (start() does not wait for it:
        a run need not).  TimeoutError past ``timeout``; LocalClusterError if it is not
        served (``status_port`` 0) or a master daemon exits meanwhile."""
        cfg = self.config()
        url = self.status_url(cfg)
        if url is None:
            raise LocalClusterError("status_port is 0: the status page is not served")
        deadline = self.clock.monotonic() + timeout
        while True:
            self.check_daemons()
            try:
                with socket.create_connection((cfg.status_address, cfg.status_port),
                                              timeout=1.0):
                    return url
            except OSError:
                pass
            if self.clock.monotonic() > deadline:
                raise TimeoutError(f"the status page {url} did not answer within "
                                   f"{timeout:.0f} s; see {self.home.log_dir}")
            self.clock.sleep(_POLL)

    # ------------------------------------------------------------------ a run
    def push(self, tree: Path, user: str, products: list[str], options: list[str]) -> RunSpec:
        spec = RunSpec.parse(" ".join(["user", user, ",".join(products), *options]),
                             source="localcluster")
        push_tree(self.home, tree, spec)
        return spec

    def archives(self) -> set[str]:
        if not self.home.archive.is_dir():
            return set()
        return {p.name for p in self.home.archive.iterdir()}

    def wait_for_run(self, spec: RunSpec, before: set[str], timeout: float,
                     priority: int = 0, on_poll: Callable[[], None] | None = None) -> Path:
        """The archive folder of the run of ``spec`` (queued at ``priority``) that was not
        in ``before``, once the run has also left its queue, its master has done its end
        steps (the run's working folder is gone) and has exited, so a stop that follows
        cuts none short and leaves no PID file behind.

        ``on_poll`` is called at every look (each :data:`_POLL` seconds while the run's
        job.start is there, each :data:`END_LOOK` seconds once it is gone: localcluster.py's
        exit waits on the look that sees the run's end; it must be quick).  TimeoutError
        past ``timeout``; LocalClusterError at once if a master daemon exits meanwhile
        (:meth:`check_daemons`)."""
        end = self.clock.monotonic() + timeout
        wanted = f"queue {spec.line()}\n"
        listed: int | None = None  # the archive folder's mtime when last listed
        listed_at = -_RELIST
        new: set[str] = set()
        while (now := self.clock.monotonic()) < end:
            self.check_daemons()
            if on_poll is not None:
                on_poll()
            stamp = self._archive_mtime()
            # Listed again when its mtime moved, and every _RELIST anyway: two changes in
            # one tick of the file system's clock leave the mtime as it was.
            if stamp != listed or now - listed_at >= _RELIST:
                listed, listed_at = stamp, now
                new |= self.archives() - before
            for name in sorted(new):
                folder = self.home.archive / name
                info = folder / "run.info"
                if (folder / "report.txt").exists() and info.exists() and \
                        wanted in info.read_text(encoding="utf-8"):
                    # The report is written before run.info; both exist: the run is done.
                    self._wait_ended(spec, name, end, priority)
                    self.wait_masters_exit(priority, min(
                        end, self.clock.monotonic() + MASTER_EXIT_WAIT))
                    return folder
            served = any(os.path.lexists(self.home.job_start(lane))
                         for lane in lanes.lanes_of(priority))
            self.clock.sleep(_POLL if served else END_LOOK)
        raise TimeoutError(f"no archive for run {spec.line()!r} within {timeout:.0f} s "
                           f"(see {self.home.log_dir})")

    def _archive_mtime(self) -> int | None:
        try:
            return os.stat(self.home.archive).st_mtime_ns
        except FileNotFoundError:
            return None

    def _wait_ended(self, spec: RunSpec, run_id: str, end: float, priority: int) -> None:
        """Wait (up to monotonic ``end``) for the last of the master's end steps of the run
        archived as ``run_id``: the run leaves its queue, then its working folder goes,
        whatever the outcome (:class:`cluster.master.end.endrun.RunEnder`)."""
        queue = QueueFile(self.home.queue(priority), self.home.queue_lock(priority))
        self._wait_until(lambda: spec not in queue.read(), end)
        folder = self.home.run_dir(run_id)
        self._wait_until(lambda: not folder.exists(), end)

    def _wait_until(self, done: Callable[[], bool], end: float) -> None:
        """Look every :data:`END_LOOK` seconds until ``done()`` or monotonic ``end``."""
        while self.clock.monotonic() < end and not done():
            self.check_daemons()
            self.clock.sleep(END_LOOK)

    def clustermasters(self) -> list[tuple[int, int]]:
        """The clustermasters the supervisor has running now, as (pid, priority)
        (:func:`supervisor_masters`); [] when it is not running."""
        daemon = self.daemons.get(SUPERVISOR_SCRIPT)
        return [] if daemon is None else supervisor_masters(daemon.child.pid)

    def wait_masters_exit(self, priority: int, end: float) -> bool:
        """Wait (up to monotonic ``end``) until the clustermasters of ``priority`` running
        now have exited, or serve a run again (:func:`wait_for_masters`); whether they
        did.  A master removes its PID file before it exits (docs/architecture.md,
        "Stopping"), so a stop that follows leaves none."""
        return wait_for_masters(self.home, [m for m in self.clustermasters()
                                            if lanes.priority_of(m[1]) == priority],
                                end, self.clock)

    def wait_masters_idle(self, timeout: float) -> bool:
        """Give the clustermasters that serve no run (a master doing a run's end steps, or
        looking for work) up to ``timeout`` seconds in all to exit, so that a stop does not
        cut them short (:func:`wait_for_masters`); whether they did.  One that serves a run
        is not waited for: told to stop, it leaves the run to the next clustermaster."""
        return wait_for_masters(self.home, self.clustermasters(),
                                self.clock.monotonic() + timeout, self.clock)

    # ------------------------------------------------------------------ teardown
    def stop(self, grace: float = 20.0) -> None:
        """Give a clustermaster that is not serving a run up to ``grace`` seconds to exit
        (:meth:`wait_masters_idle`); then TERM every process group started (the supervisor
        passes it on to its clustermasters), wait ``grace`` seconds, then KILL.  A
        clustermaster still alive then is KILLed too (logged: its PID file stays, and the
        next start in this home waits for it as for one that died)."""
        if self.daemons:  # started and not stopped yet: a supervisor may have masters
            self.wait_masters_idle(grace)
        for child in self.procs:
            proc.kill_tree(child.pid, signal.SIGTERM)
        end = self.clock.monotonic() + grace
        for child in self.procs:
            # Each waited for in turn, woken by its end (proc.wait_exit): every exit waits
            # for the last daemon's, and a poll slice on top was up to 0.05 s.
            proc.wait_exit(child, end - self.clock.monotonic())
        for child in self.procs:
            proc.kill_tree(child.pid, signal.SIGKILL)
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("process %d did not die", child.pid)
        self.daemons.clear()
        # clustermasters started by the supervisor live in their own sessions.
        for p in lanes.ALL_LANES:
            pid_file = self.home.pid_file(p)
            try:
                # The PID file's first line (a refresh stamp follows); 0 is the stop
                # marker, and os.kill(0) would kill our own process group.
                pid = int(pidformat.parse(pid_file.read_text())[0])
                if pid > 0 and self._is_ours(pid):
                    log.warning("clustermaster %d did not leave after SIGTERM; killing it "
                                "(its PID file stays)", pid)
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        self.procs.clear()
        for batch in (self.slurm, self.gridengine):
            # After the provisioner: it submits nothing more.  Its stop cancels every job
            # (the ephemeral nodes) and ends the daemons by PID.
            if batch is not None:
                batch.stop()
        self.slurm = self.gridengine = None
        if self.sshd is not None:
            # After the nodes: none of them is left talking to it.
            self.sshd.stop()
            self.sshd = None

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a process of this cluster (its command line names our config
        file): a PID file left behind may name a pid the system has since given to
        another process, which must not be killed."""
        import psutil  # here: only stop() needs it

        try:
            return str(self.conf_path) in psutil.Process(pid).cmdline()
        except psutil.Error:
            return False

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
