"""A private single-host Slurm: munged, slurmctld and slurmd in one folder, for localcluster
``--provider slurm`` and the tests.

:class:`PrivateSlurm` keeps everything inside the folder it is given (mode 0755 where munged
needs it):

* ``slurm.conf``: a one-node cluster on this host (its short host name, its CPUs or the
  number asked for, two free ports for slurmctld and slurmd), munge authentication through
  the private socket, no cgroups (``proctrack/linuxproc``), ``select/cons_tres`` so jobs
  share the node by cores, the scheduler tuned for latency
  (``batch_sched_delay=0,sched_interval=1``: a job starts within about a second),
  ``RequeueExit=3`` (an ephemeral node that lost its master exits 3 and is started again)
  and ``KillWait=5`` (a job cancelled or past its time limit is SIGKILLed 5 s after its
  SIGTERM, not Slurm's 30: a pilot that does not leave frees its CPUs soon);
* ``munge/munge.key`` (0400, made once) and munged's pid, seed and log files; munged's
  socket alone lives in a fresh folder under ``/tmp`` (``munge-*``, 0755, removed by
  :meth:`PrivateSlurm.stop`), because munged requires every folder above its socket to be
  executable by all, which a private folder (pytest's, a home's) need not be, and because a
  Unix socket's path is limited to 107 bytes;
* ``state/``, ``spool/``, ``run/``, ``log/`` (each daemon's log and its stdout/stderr).

:meth:`PrivateSlurm.start` runs the three daemons in the foreground under ``Popen`` (so
their PIDs are known at once, not read from pid files written after a fork) and returns
once ``sinfo`` says the node is idle (bounded); :attr:`PrivateSlurm.env` is what a Slurm
command needs to talk to it (``SLURM_CONF``).  :meth:`PrivateSlurm.stop` cancels the jobs
still there, then terminates the daemons by PID in reverse order (SIGKILL after a grace),
and kills any job step (``slurmstepd``) of this folder that survived: nothing is left
running.  A context manager: ``with PrivateSlurm(folder) as slurm: ...``.

The daemons run as the calling user (``SlurmUser``, ``SlurmdUser``); the tests and CI run
them as root, which slurmd needs to start a job as any user.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import psutil

from cluster.errors import ClusterError
from cluster.runtime import proc
from cluster.runtime.ports import free_ports

MUNGED = "munged"
SLURMCTLD = "slurmctld"
SLURMD = "slurmd"
SINFO = "sinfo"
SCANCEL = "scancel"
SQUEUE = "squeue"
#: The one partition of the private cluster (the default one).
PARTITION = "main"
#: Memory the node claims [MB]: must not exceed the host's (slurmd would drain the node).
REAL_MEMORY_MB = 1000
#: How long a job's processes have after Slurm's SIGTERM (scancel, the time limit) before
#: its SIGKILL: slurm.conf's ``KillWait`` (Slurm's default is 30) [seconds].
KILL_WAIT = 5
#: How long a daemon has after SIGTERM before SIGKILL [seconds].
STOP_GRACE = 5.0
#: How long a Slurm command run by this helper may take [seconds].
COMMAND_TIMEOUT = 15.0
#: How long :meth:`PrivateSlurm.stop` waits for cancelled jobs to leave [seconds].
CANCEL_WAIT = 5.0
#: How often the start-up and the stop look again [seconds].
POLL = 0.1
#: Where munged's socket folder is made: every folder above a socket must be executable
#: by all (munged checks), and /tmp is (mode 1777).
SOCKET_PARENT = "/tmp"
#: Tries to start when a port picked free was taken meanwhile by another process.
PORT_TRIES = 3


class SlurmHostError(ClusterError):
    """The private Slurm could not be set up or started, or did not come up in time."""


def short_hostname() -> str:
    """This host's short name, as ``hostname -s`` prints it (slurmctld runs as primary only
    on the host ``SlurmctldHost`` names, and slurmd finds its node by it)."""
    return socket.gethostname().split(".", 1)[0]


class PrivateSlurm:
    """One private single-host Slurm in ``folder`` (see the module docstring).

    ``cpus`` is the number of CPUs the node offers (default: this host's); more than the
    host has is allowed (``SlurmdParameters=config_overrides``), so that a small machine
    can run more pilot jobs than it has cores.
    """

    def __init__(self, folder: Path, *, cpus: int | None = None,
                 cluster_name: str = "regtest") -> None:
        self.folder = Path(folder).resolve()
        self.cpus = cpus if cpus is not None else (os.cpu_count() or 1)
        if self.cpus < 1:
            raise SlurmHostError(f"private Slurm: cpus {self.cpus} is not a positive count")
        self.cluster_name = cluster_name
        self.host = short_hostname()
        self.user = getpass.getuser()
        self.conf = self.folder / "slurm.conf"
        self.munge_dir = self.folder / "munge"
        self.munge_key = self.munge_dir / "munge.key"
        # Set by start(): a folder of its own under /tmp (see the module docstring).
        self.munge_socket = Path()
        self.log_dir = self.folder / "log"
        self.ctld_port = 0
        self.slurmd_port = 0
        # (name, process) in start order; stop() ends them in reverse.
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    def __repr__(self) -> str:
        return f"PrivateSlurm({str(self.folder)!r}, ports {self.ctld_port}/{self.slurmd_port})"

    @property
    def env(self) -> dict[str, str]:
        """The variables a Slurm command needs to use this cluster (add them to
        ``os.environ``): ``SLURM_CONF``."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def pids(self) -> dict[str, int]:
        """The running daemons' PIDs by name (``munged``, ``slurmctld``, ``slurmd``)."""
        return {name: p.pid for name, p in self._daemons if p.poll() is None}

    # -- set-up --------------------------------------------------------------------------------
    def _prepare(self) -> None:
        socket_dir = Path(tempfile.mkdtemp(prefix="munge-", dir=SOCKET_PARENT))
        socket_dir.chmod(0o755)
        self.munge_socket = socket_dir / "munge.socket"
        for sub in ("state", "spool", "run", "log"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.munge_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.munge_key.exists():
            fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(1024))

    def config_text(self) -> str:
        """The slurm.conf for the current ports (see the module docstring for each choice)."""
        f = self.folder
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmUser={self.user}",
            f"SlurmdUser={self.user}",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.log'}",
            # No cgroup plugin: no cgroup.conf needed, and none of the host's cgroups used.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            # Jobs share the node by cores (select/linear would give each the whole node).
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            # A job starts on the next whole second instead of 2-2.7 s later.
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1",
            # The node's CPUs are what this file says, even more than the host has.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            # SIGKILL 5 s after a job's SIGTERM (scancel, its time limit), not 30.
            f"KillWait={KILL_WAIT}",
            # An ephemeral node exits 3 when its master is gone: Slurm starts it again.
            "RequeueExit=3",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} "
            f"RealMemory={REAL_MEMORY_MB} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    # -- run -----------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> PrivateSlurm:
        """Set up the folder, start munged, slurmctld and slurmd, and return once ``sinfo``
        says the node is idle; SlurmHostError (with the daemons' log tails) otherwise,
        nothing left running.  Returns self."""
        if self._daemons:
            raise SlurmHostError(f"{self!r} is already running")
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self._prepare()
        self._spawn(MUNGED, [MUNGED, "-F", f"--key-file={self.munge_key}",
                             f"--socket={self.munge_socket}",
                             f"--pid-file={self.munge_dir / 'munged.pid'}",
                             f"--log-file={self.munge_dir / 'munged.log'}",
                             f"--seed-file={self.munge_dir / 'munged.seed'}"])
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.munge_socket.exists(), deadline, "munged's socket")
        for attempt in range(1, PORT_TRIES + 1):
            self.ctld_port, self.slurmd_port = free_ports(2)
            self.conf.write_text(self.config_text(), encoding="utf-8")
            self._spawn(SLURMCTLD, [SLURMCTLD, "-D", "-f", str(self.conf)])
            self._spawn(SLURMD, [SLURMD, "-D", "-f", str(self.conf)])
            try:
                self._wait(self._idle, deadline, "the node idle in sinfo")
                return
            except SlurmHostError:
                if attempt == PORT_TRIES or not self._port_taken():
                    raise
                self._stop_daemons(keep=1)  # keep munged; try new ports

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.log_dir / f"{name}.out", "ab") as out:
            try:
                self._daemons.append((name, proc.spawn(argv, stdout=out, stderr=out)))
            except proc.ProcessError as exc:
                raise SlurmHostError(f"private Slurm: {exc} (is Debian's slurmctld, slurmd "
                                     "and munge installed?)") from None

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        """Poll ``ready()`` until true; SlurmHostError when a daemon exits or time runs out."""
        while True:
            for name, p in self._daemons:
                if p.poll() is not None:
                    raise SlurmHostError(
                        f"private Slurm in {self.folder}: {name} exited "
                        f"({proc.describe_status(p.returncode)}) while waiting for {what}; "
                        f"logs:\n{self.log_tails()}")
            if ready():
                return
            if time.monotonic() >= deadline:
                raise SlurmHostError(f"private Slurm in {self.folder}: no {what} in time; "
                                     f"logs:\n{self.log_tails()}")
            time.sleep(POLL)

    def _idle(self) -> bool:
        done = self._command([SINFO, "--noheader", "--format=%T"])
        return done.ok and "idle" in done.text().split()

    def _command(self, argv: list[str]) -> proc.Result:
        return proc.run(argv, timeout=COMMAND_TIMEOUT, env={**os.environ, **self.env})

    def _port_taken(self) -> bool:
        return "Address already in use" in self.log_tails()

    def log_tails(self, lines: int = 8) -> str:
        """The last ``lines`` lines of each daemon's log, for messages."""
        parts = []
        for path in (self.munge_dir / "munged.log", *sorted(self.log_dir.glob("*"))):
            try:
                text = path.read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if text:
                tail = "\n".join(text.splitlines()[-lines:])
                parts.append(f"--- {path.name}\n{tail}")
        return "\n".join(parts) or "(no logs)"

    # -- stop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel the jobs left, end the daemons by PID in reverse order (SIGTERM, then
        SIGKILL after :data:`STOP_GRACE`), reap them, and kill any job step of this folder
        still alive.  Idempotent."""
        if self._daemons:
            if len(self._daemons) == 3 and all(p.poll() is None for _n, p in self._daemons):
                self._cancel_jobs()
            steps = self._job_steps()
            self._stop_daemons(keep=0)
            for step in steps:
                with contextlib.suppress(psutil.Error):
                    for child in step.children(recursive=True):
                        child.kill()
                    step.kill()
        if self.munge_socket.name:
            shutil.rmtree(self.munge_socket.parent, ignore_errors=True)
            self.munge_socket = Path()

    def _cancel_jobs(self) -> None:
        """scancel every job of this private cluster and wait (bounded) for them to leave:
        a job's processes live outside slurmd's process group."""
        with contextlib.suppress(proc.ProcessError):
            self._command([SCANCEL, f"--user={self.user}"])
            deadline = time.monotonic() + CANCEL_WAIT
            while time.monotonic() < deadline:
                left = self._command([SQUEUE, "--noheader", "--format=%i"])
                if not left.ok or not left.text().strip():
                    return
                time.sleep(POLL)

    def _job_steps(self) -> list[psutil.Process]:
        """The slurmstepd processes serving this cluster's jobs: those with a file open in
        this folder's spool (their step sockets), found before slurmd goes."""
        spool = str(self.folder / "spool")
        found = []
        for p in psutil.process_iter(["name"]):
            if not (p.info["name"] or "").startswith("slurmstepd"):
                continue
            with contextlib.suppress(psutil.Error):
                paths: list[str] = [f.path for f in p.open_files()]
                paths += [str(c.laddr) for c in p.net_connections(kind="unix")
                          if isinstance(c.laddr, str)]
                if any(path.startswith(spool) for path in paths):
                    found.append(p)
        return found

    def _stop_daemons(self, keep: int) -> None:
        """Terminate the daemons after the first ``keep``, last started first."""
        while len(self._daemons) > keep:
            _name, p = self._daemons.pop()
            if p.poll() is None:
                proc.kill_tree(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill_tree(p.pid, signal.SIGKILL)
                    p.wait(timeout=STOP_GRACE)

    def __enter__(self) -> PrivateSlurm:
        return self.start() if not self._daemons else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
