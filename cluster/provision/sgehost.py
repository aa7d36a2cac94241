"""A private single-host Grid Engine: sge_qmaster and sge_execd of one cell in one folder,
for ``localcluster --provider gridengine`` and the tests (Debian's ``gridengine-master``,
``gridengine-exec`` and ``gridengine-client``, Son of Grid Engine 8.1.9).

:class:`PrivateGridEngine` keeps everything inside the folder it is given:

* an ``SGE_ROOT`` of its own (``root/``: links to the installed ``bin``, ``lib``, ``util``
  and ``utilbin`` of ``/var/lib/gridengine``) with one cell (``root/regtest/common``):
  ``bootstrap`` (classic spooling in the folder, ``admin_user none``: the daemons run as
  the caller, root in the tests and CI), ``act_qmaster`` (this host) and ``host_aliases``
  (this host's name and ``localhost``: on a machine where the host name resolves to
  127.0.0.1, whose name is ``localhost``, qmaster would otherwise refuse its own host's
  clients: "access denied (client IP resolved to host name localhost...)");
* the spool made by Grid Engine's own ``spoolinit`` and ``spooldefaults`` (as Debian's
  ``init_cluster`` does), with a global configuration that lets root run jobs
  (``min_uid 0``, ``min_gid 0``) and keeps the execd's spool in the folder;
* two free ports (``SGE_QMASTER_PORT``, ``SGE_EXECD_PORT`` in :attr:`env`).

:meth:`PrivateGridEngine.start` runs ``sge_qmaster`` and ``sge_execd`` in the foreground
(``SGE_ND=1``, under ``Popen``: their PIDs known at once), makes this host an admin and
submit host, sets the scheduler to run every second (``schedule_interval 0:0:1``, flushes
on submit and finish: a job starts within about a second), adds the queue ``main`` (this
host, ``slots`` slots) and the parallel environment ``smp`` (``$pe_slots``), and returns
once ``qstat -f`` shows the queue without a state flag (bounded).  :meth:`stop` deletes the
jobs left, ends the daemons by PID (SIGTERM, SIGKILL after a grace) and kills any job
process (``sge_shepherd`` and its children) of the folder still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import psutil

from cluster.errors import ClusterError
from cluster.runtime import proc
from cluster.runtime.ports import free_ports

#: Where Debian installs Grid Engine's SGE_ROOT.
INSTALLED_ROOT = Path("/var/lib/gridengine")
#: The daemons and helpers (Debian's paths).
QMASTER = "/usr/sbin/sge_qmaster"
EXECD = "/usr/sbin/sge_execd"
SPOOLINIT = "/usr/lib/gridengine/spoolinit"
SPOOLDEFAULTS = "/usr/lib/gridengine/spooldefaults"
DEFAULT_CONFIGURATION = Path("/usr/share/gridengine/default-configuration")
RESOURCES = Path("/usr/share/gridengine/util/resources")
CELL = "regtest"
QUEUE = "main"
PE = "smp"
COMMAND_TIMEOUT = 15.0
STOP_GRACE = 5.0
POLL = 0.1
PORT_TRIES = 3


class GridEngineHostError(ClusterError):
    """The private Grid Engine could not be set up or started in time."""


QUEUE_CONF = """qname {name}
hostlist {host}
seq_no 0
load_thresholds NONE
suspend_thresholds NONE
nsuspend 1
suspend_interval 00:05:00
priority 0
min_cpu_interval 00:05:00
processors UNDEFINED
qtype BATCH INTERACTIVE
ckpt_list NONE
pe_list {pe}
rerun FALSE
slots {slots}
tmpdir /tmp
shell /bin/sh
prolog NONE
epilog NONE
shell_start_mode unix_behavior
starter_method NONE
suspend_method NONE
resume_method NONE
terminate_method NONE
notify 00:00:60
owner_list NONE
user_lists NONE
xuser_lists NONE
subordinate_list NONE
complex_values NONE
projects NONE
xprojects NONE
calendar NONE
initial_state default
""" + "".join(f"{limit} INFINITY\n" for limit in (
    "s_rt", "h_rt", "s_cpu", "h_cpu", "s_fsize", "h_fsize", "s_data", "h_data", "s_stack",
    "h_stack", "s_core", "h_core", "s_rss", "h_rss", "s_vmem", "h_vmem"))

PE_CONF = """pe_name {name}
slots 9999
user_lists NONE
xuser_lists NONE
start_proc_args NONE
stop_proc_args NONE
allocation_rule $pe_slots
control_slaves FALSE
job_is_first_task TRUE
urgency_slots min
accounting_summary FALSE
qsort_args NONE
"""


class PrivateGridEngine:
    """One private single-host Grid Engine cell in ``folder`` (module docstring);
    ``slots``: the queue's slots (default: this host's CPUs; more is allowed)."""

    def __init__(self, folder: Path, *, slots: int | None = None) -> None:
        self.folder = Path(folder).resolve()
        self.slots = slots if slots is not None else (os.cpu_count() or 1)
        self.host = socket.gethostname()
        self.root = self.folder / "root"
        self.common = self.root / CELL / "common"
        self.spool = self.folder / "spool"
        self.qmaster_port = 0
        self.execd_port = 0
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    def __repr__(self) -> str:
        return f"PrivateGridEngine({str(self.folder)!r}, port {self.qmaster_port})"

    @property
    def env(self) -> dict[str, str]:
        """What a Grid Engine command needs to use this cell."""
        return {"SGE_ROOT": str(self.root), "SGE_CELL": CELL,
                "SGE_QMASTER_PORT": str(self.qmaster_port),
                "SGE_EXECD_PORT": str(self.execd_port)}

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._daemons if p.poll() is None}

    def _prepare(self) -> None:
        for sub in ("qmaster/job_scripts", "execd", "log"):
            (self.spool / sub).mkdir(parents=True, exist_ok=True)
        self.common.mkdir(parents=True, exist_ok=True)
        for sub in ("bin", "lib", "util", "utilbin"):
            link = self.root / sub
            if not link.is_symlink():
                link.symlink_to(INSTALLED_ROOT / sub)
        spooling = f"{self.common};{self.spool / 'qmaster'}"
        (self.common / "bootstrap").write_text(
            "admin_user none\ndefault_domain none\nignore_fqdn true\n"
            "spooling_method classic\nspooling_lib libspoolc\n"
            f"spooling_params {spooling}\nbinary_path /usr/sbin\n"
            f"qmaster_spool_dir {self.spool / 'qmaster'}\nsecurity_mode none\n"
            "listener_threads 2\nworker_threads 2\nscheduler_threads 1\n", encoding="utf-8")
        (self.common / "act_qmaster").write_text(self.host + "\n", encoding="utf-8")
        aliases = [self.host, "localhost", *({socket.getfqdn()} - {self.host, "localhost"})]
        (self.common / "host_aliases").write_text(" ".join(aliases) + "\n", encoding="utf-8")
        if (self.common / "configuration").exists():
            return  # spooled already: a second start of the same folder
        conf = []
        for line in DEFAULT_CONFIGURATION.read_text(encoding="utf-8").splitlines():
            key = line.split(None, 1)[0] if line.strip() else ""
            if key == "execd_spool_dir":
                line = f"execd_spool_dir {self.spool / 'execd'}"
            elif key in ("min_uid", "min_gid"):
                line = f"{key} 0"
            conf.append(line)
        (self.folder / "configuration").write_text("\n".join(conf) + "\n", encoding="utf-8")
        self._tool([SPOOLINIT, "classic", "libspoolc", spooling, "init"])
        self._tool([SPOOLDEFAULTS, "configuration", str(self.folder / "configuration")])
        self._tool([SPOOLDEFAULTS, "complexes", str(RESOURCES / "centry")])
        self._tool([SPOOLDEFAULTS, "usersets", str(RESOURCES / "usersets")])
        self._tool([SPOOLDEFAULTS, "managers", "root"])
        self._tool([SPOOLDEFAULTS, "adminhosts", self.host])

    def _tool(self, argv: list[str], input: bytes | None = None,
              cwd: Path | None = None) -> str:
        try:
            done = proc.run(argv, timeout=COMMAND_TIMEOUT, env={**os.environ, **self.env},
                            input=input, cwd=cwd)
        except proc.ProcessError as exc:
            raise GridEngineHostError(f"private Grid Engine: {exc} (is Debian's "
                                      "gridengine-master, -exec and -client installed?)"
                                      ) from None
        if not done.ok:
            raise GridEngineHostError(
                f"private Grid Engine: {proc.command_text(argv)}: "
                f"{done.describe(COMMAND_TIMEOUT)}: {done.text('stderr') or done.text()}")
        return done.text()

    def start(self, timeout: float = 60.0) -> PrivateGridEngine:
        """Set up the folder, start the daemons and configure the cell; returns once the
        queue is usable (GridEngineHostError with the logs otherwise, nothing left)."""
        if self._daemons:
            raise GridEngineHostError(f"{self!r} is already running")
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for attempt in range(1, PORT_TRIES + 1):
            self.qmaster_port, self.execd_port = free_ports(2)
            self._prepare()
            self._spawn("sge_qmaster", QMASTER)
            try:
                self._wait(self._qmaster_up, deadline, "qmaster answering")
                break
            except GridEngineHostError:
                if attempt == PORT_TRIES or "bind" not in self.log_tails():
                    raise
                self._stop_daemons()
        self._tool(["qconf", "-as", self.host])
        sconf = self._tool(["qconf", "-ssconf"])
        fast = {"schedule_interval": "0:0:1", "flush_submit_sec": "1", "flush_finish_sec": "1"}
        lines = [f"{line.split()[0]} {fast[line.split()[0]]}"
                 if line.split() and line.split()[0] in fast else line
                 for line in sconf.splitlines()]
        (self.folder / "sched_configuration").write_text("\n".join(lines) + "\n")
        self._tool(["qconf", "-Msconf", str(self.folder / "sched_configuration")])
        (self.folder / "pe.conf").write_text(PE_CONF.format(name=PE))
        self._tool(["qconf", "-Ap", str(self.folder / "pe.conf")])
        (self.folder / "queue.conf").write_text(
            QUEUE_CONF.format(name=QUEUE, host=self.host, pe=PE, slots=self.slots))
        self._tool(["qconf", "-Aq", str(self.folder / "queue.conf")])
        self._spawn("sge_execd", EXECD)
        self._wait(self._queue_ready, deadline, "the queue usable in qstat -f")

    def _spawn(self, name: str, path: str) -> None:
        with open(self.spool / "log" / f"{name}.out", "ab") as out:
            try:
                p = proc.spawn([path], stdout=out, stderr=out,
                               env={**os.environ, **self.env, "SGE_ND": "1"})
            except proc.ProcessError as exc:
                raise GridEngineHostError(f"private Grid Engine: {exc}") from None
        self._daemons.append((name, p))

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while True:
            for name, p in self._daemons:
                if p.poll() is not None:
                    raise GridEngineHostError(
                        f"private Grid Engine in {self.folder}: {name} exited "
                        f"({proc.describe_status(p.returncode)}) while waiting for {what}; "
                        f"logs:\n{self.log_tails()}")
            if ready():
                return
            if time.monotonic() >= deadline:
                raise GridEngineHostError(f"private Grid Engine in {self.folder}: no {what} "
                                          f"in time; logs:\n{self.log_tails()}")
            time.sleep(POLL)

    def _command(self, argv: list[str]) -> proc.Result:
        return proc.run(argv, timeout=COMMAND_TIMEOUT, env={**os.environ, **self.env})

    def _qmaster_up(self) -> bool:
        return self._command(["qconf", "-sh"]).ok

    def _queue_ready(self) -> bool:
        done = self._command(["qstat", "-f", "-q", QUEUE])
        if not done.ok:
            return False
        for line in done.text().splitlines():
            words = line.split()
            if words and words[0] == f"{QUEUE}@{self.host}":
                # queue, type, slots, load, arch[, states]: ready with a load and no state
                return len(words) == 5 and words[3] != "-NA-"
        return False

    def log_tails(self, lines: int = 8) -> str:
        parts = []
        paths = [*sorted((self.spool / "log").glob("*")), self.spool / "qmaster" / "messages",
                 *sorted((self.spool / "execd").glob("*/messages"))]
        for path in paths:
            try:
                text = path.read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if text:
                parts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(no logs)"

    def stop(self) -> None:
        """Delete the jobs left, end the daemons by PID (reverse order), kill any job
        process of this cell still alive.  Idempotent."""
        if not self._daemons:
            return
        if all(p.poll() is None for _n, p in self._daemons) and len(self._daemons) == 2:
            with contextlib.suppress(proc.ProcessError):
                self._command(["qdel", "-u", "*", "-f"])
        shepherds = self._shepherds()
        self._stop_daemons()
        for step in shepherds:
            with contextlib.suppress(psutil.Error):
                for child in step.children(recursive=True):
                    child.kill()
                step.kill()

    def _shepherds(self) -> list[psutil.Process]:
        """The sge_shepherd processes of this cell's jobs (their cwd in its execd spool)."""
        spool = str(self.spool / "execd")
        found = []
        for p in psutil.process_iter(["name"]):
            if (p.info["name"] or "") != "sge_shepherd":
                continue
            with contextlib.suppress(psutil.Error):
                if p.cwd().startswith(spool):
                    found.append(p)
        return found

    def _stop_daemons(self) -> None:
        while self._daemons:
            _name, p = self._daemons.pop()
            if p.poll() is None:
                proc.kill_tree(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill_tree(p.pid, signal.SIGKILL)
                    p.wait(timeout=STOP_GRACE)

    def __enter__(self) -> PrivateGridEngine:
        return self.start() if not self._daemons else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
