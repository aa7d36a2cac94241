"""Setting up a node over ssh (seed 002's initialisation; ``bootstrap_node.py``).

Seed 002: "for every slave: try to start client (ssh).  If it fails: check ssh connection
with dummy ssh command.  Success -> copy client to slave using scp and try to start it."
:class:`Bootstrap` does, over one paramiko connection (:mod:`cluster.runtime.ssh`), in order:

1. **connect and run ``true``**: a refusal says which of the cases it is, each with its own
   exit status (:data:`EXIT_CODES`): the host is unreachable (3), our key was refused (4),
   the host key is not in our known_hosts (5) or differs from the one recorded there (6), or
   the server broke the protocol or did not answer in time (7); ``true`` failing (no shell
   that works) is 1;
2. **tools**: which of :data:`TOOLS` and of the Python modules the node code imports
   (:func:`cluster.node.code.third_party_modules`) the host lacks.  Missing tools are
   listed and the node is still set up (its caps tell the master what it cannot do); a
   missing Python or module stops the bootstrap before step 6 (exit 1), because clusterpull
   could not run;
3. **the node code** (:func:`cluster.node.code.node_files`) into ``REMOTE_DIR``: files whose
   md5 differs from the copy there (one remote Python command hashes them all; without
   Python, size and mtime are compared, as rsync does) are uploaded with
   :func:`cluster.runtime.ssh.put_atomic` (a reader never sees a part; times and modes
   kept), and modules under ``REMOTE_DIR/cluster`` that left the set are deleted;
4. **the job account** (docs/runoptions.md, section 6): when the node's account is root,
   ``job_user`` (default :data:`DEFAULT_JOB_USER`, ``--job-user``; a ``--node-set
   job_user=...`` wins) is made a system account with no login unless it exists
   (:func:`cluster.node.jobuser.ensure_command`), and node.conf names it, so every job runs
   as that account; the account must be able to enter ``REMOTE_DIR`` (its jobs use the
   node code and the work folder there: root's own home, mode 0700, is no place for it;
   give ``--dir /opt/cluster-node``), else the step fails saying so.  The account is
   denied cron and at (:func:`cluster.node.jobuser.deny_command`: its name in
   ``/etc/cron.deny``, and in ``/etc/at.deny`` where at is installed), so no job can
   schedule anything to run after its run; ``--allow-job-cron`` leaves them as they are.
   ``job_user`` '' makes none and writes none (jobs run as root), and a node account that
   is not root needs none (jobs run as it);
5. **``REMOTE_DIR/node.conf``** (mode 0600: only the node's account reads it; and the
   key and known_hosts file for the node's own connection to the master, when given to
   upload): written only if its text differs;
6. **the crontab entry**: ``<python> REMOTE_DIR/clusterpull.py --config REMOTE_DIR/node.conf
   --install-cron``, which is idempotent (:mod:`cluster.cron`); it counts as a change when
   ``crontab -l`` differs afterwards;
7. **send_caps** once, and its capability line printed.

Every step says what it changed; when nothing changed the last line says so, and a second
run against a node that is set up writes nothing (no file, no crontab).

Exit status: 0 done (missing tools are listed, not fatal), 1 a step on the host failed, 2
bad usage, 3-7 the ssh connection failed (see step 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import shlex
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from cluster import config
from cluster.defaults import EXIT_FAILED, EXIT_OK, REPO_ROOT
from cluster.errors import ClusterError, SshError
from cluster.node import code, jobuser
from cluster.runtime import ssh
from cluster.runtime.ssh import SshTarget

#: Exit status per SshError kind (the connection or ``true`` failed).
EXIT_UNREACHABLE = 3
EXIT_AUTH = 4
EXIT_HOSTKEY_UNKNOWN = 5
EXIT_HOSTKEY_CHANGED = 6
EXIT_SSH_OTHER = 7
EXIT_CODES = {"unreachable": EXIT_UNREACHABLE, "auth": EXIT_AUTH,
              "hostkey-unknown": EXIT_HOSTKEY_UNKNOWN,
              "hostkey-changed": EXIT_HOSTKEY_CHANGED, "protocol": EXIT_SSH_OTHER,
              "timeout": EXIT_SSH_OTHER}
#: What each of those means, for the first line of the error message.
EXIT_MEANING = {"unreachable": "the host is unreachable",
                "auth": "the host refused our key",
                "hostkey-unknown": "the host's key is unknown (not in our known_hosts)",
                "hostkey-changed": "the host's key CHANGED (differs from known_hosts)",
                "protocol": "the ssh connection failed",
                "timeout": "the host did not answer in time"}
#: Programs a node needs (seed 000's jobs: gs, mutool, make, md5sum; rsync for the ssh
#: transport's trees; crontab for the clusterpull entry).  Python is checked separately.
TOOLS = ("gs", "mutool", "make", "md5sum", "rsync", "crontab")
#: Default directory on the node (relative: to the login directory there).
DEFAULT_DIR = "cluster-node"
#: node.conf's work_dir, relative to node.conf's directory (the config loader's rule).
WORK_DIR = "work"
#: The account a root node's jobs run as unless told otherwise (``--job-user``).
DEFAULT_JOB_USER = "cluster-job"
#: node.conf's mode: it names the node's key and the master; no one else reads it.
CONF_MODE = 0o600
#: Names in REMOTE_DIR of the files uploaded for the node's own ssh to the master.
UPLOADED_KEY = "master_key"
UPLOADED_KNOWN_HOSTS = "known_hosts"
#: Bounds on the remote commands [seconds].
QUICK_TIMEOUT = 60.0
SLOW_TIMEOUT = 300.0

#: Hashes the listed files under a root and lists stale modules; run by the node's Python
#: (the root and the file list are substituted in).
_HASH_PROGRAM = """\
import hashlib, os
root = %(root)r
files = set(%(files)r)
for rel in sorted(files):
    path = os.path.join(root, rel)
    try:
        with open(path, 'rb') as fh:
            print('md5', hashlib.md5(fh.read()).hexdigest(), rel)
    except OSError:
        pass
top = os.path.join(root, %(package)r)
for folder, dirs, names in os.walk(top):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    for name in names:
        rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, '/')
        if name.endswith('.py') and rel not in files:
            print('stale', rel)
"""


@dataclass(frozen=True)
class NodeSettings:
    """What ``node.conf`` says: the node's name and how it reaches the master."""

    node_name: str
    master_host: str
    master_home: str
    transport: str = "ssh"
    ssh_port: int = 22
    ssh_user: str = ""
    ssh_key: str = ""
    ssh_known_hosts: str = ""
    #: Further ``key = value`` lines for the [node] section, in order.
    extra: tuple[tuple[str, str], ...] = ()

    def conf_text(self) -> str:
        """node.conf's text (an INI file, section ``[node]``): every value given, nothing
        else, so the configuration's defaults apply to the rest."""
        lines = ["# Written by bootstrap_node.py; running it again rewrites this file only if",
                 "# its options changed.  Every key: etc/node.conf.",
                 "[node]",
                 f"node_name = {self.node_name}",
                 f"transport = {self.transport}",
                 f"master_host = {self.master_host}",
                 f"master_home = {self.master_home}",
                 f"work_dir = {WORK_DIR}"]
        if self.transport == "ssh":
            lines.append(f"ssh_port = {self.ssh_port}")
            for key in ("ssh_user", "ssh_key", "ssh_known_hosts"):
                if getattr(self, key):
                    lines.append(f"{key} = {getattr(self, key)}")
        lines += [f"{key} = {value}" for key, value in self.extra]
        return "\n".join(lines) + "\n"


@dataclass
class Outcome:
    """What one bootstrap found and did."""

    exit_code: int = EXIT_OK
    changed: list[str] = field(default_factory=list)
    missing_tools: list[str] = field(default_factory=list)
    missing_modules: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    caps: str = ""
    remote_dir: str = ""


class StepFailed(ClusterError):
    """A step on the host failed (the message names the step and the command's output)."""


class Bootstrap:
    """Sets up one node (see the module docstring).  ``out`` receives each line of the
    report (default: print); ``python`` is the node's Python interpreter (a name on the
    node's PATH, or a path)."""

    def __init__(self, target: SshTarget, settings: NodeSettings, *,
                 remote_dir: str = DEFAULT_DIR, repo_root: Path = REPO_ROOT,
                 python: str = "python3", upload_key: Path | None = None,
                 upload_known_hosts: Path | None = None, timeout: float = 15.0,
                 out: Callable[[str], None] = print,
                 job_user: str = DEFAULT_JOB_USER, deny_job_cron: bool = True) -> None:
        self.target = target
        self.settings = settings
        #: The job account for a root node: a --node-set job_user wins over job_user.
        self.job_user = dict(settings.extra).get("job_user", job_user)
        #: Whether the job account is denied cron and at (``--allow-job-cron``: not).
        self.deny_job_cron = deny_job_cron
        self.remote_dir = remote_dir
        self.repo_root = Path(repo_root)
        self.python = python
        self.upload_key = upload_key
        self.upload_known_hosts = upload_known_hosts
        self.timeout = timeout
        self.out = out
        self.outcome = Outcome()

    # -- the whole ------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Do every step; the outcome's ``exit_code`` is the command's exit status."""
        outcome = self.outcome
        try:
            client = ssh.connect(self.target, timeout=self.timeout)
        except SshError as exc:
            return self._ssh_failed(exc)
        try:
            self._check_shell(client)
            with contextlib.closing(client.open_sftp()) as sftp:
                outcome.remote_dir = self._resolve_dir(client, sftp)
                self.out(f"node {self.settings.node_name}: {self.target.where()}, "
                         f"directory {outcome.remote_dir}")
                python_ok = self._check_tools(client)
                self._copy_code(client, sftp, python_ok)
                self._job_account(client)
                self._write_config(sftp)
                if not python_ok:
                    raise StepFailed(f"{self.python} or its modules are missing on the host: "
                                     "install them, then run bootstrap_node.py again (the "
                                     "crontab entry and send_caps need them)")
                self._install_cron(client)
                self._send_caps(client)
        except SshError as exc:
            return self._ssh_failed(exc)
        except (StepFailed, OSError, paramiko.SSHException) as exc:
            self.out(f"FAILED: {exc}")
            outcome.exit_code = EXIT_FAILED
        finally:
            client.close()
        if outcome.exit_code == EXIT_OK:
            self.out("changed: " + ", ".join(outcome.changed) if outcome.changed
                     else "nothing changed: the node was already set up")
        elif outcome.changed:
            self.out("changed before the failure: " + ", ".join(outcome.changed))
        return outcome

    def _ssh_failed(self, exc: SshError) -> Outcome:
        self.outcome.exit_code = EXIT_CODES.get(exc.kind, EXIT_SSH_OTHER)
        self.out(f"FAILED: {EXIT_MEANING.get(exc.kind, 'ssh failed')}: {exc}")
        return self.outcome

    # -- steps ----------------------------------------------------------------------------
    def _run(self, client: paramiko.SSHClient, command: str, what: str,
             timeout: float = QUICK_TIMEOUT, *, check: bool = True) -> tuple[int, str, str]:
        status, out, err = ssh.run_command(client, command, timeout)
        if check and status != 0:
            detail = (err.strip() or out.strip() or "no output")[-2000:]
            raise StepFailed(f"{what}: `{command}` exited with {status}: {detail}")
        return status, out, err

    def _check_shell(self, client: paramiko.SSHClient) -> None:
        """Seed 002's dummy command: a shell that runs ``true``."""
        self._run(client, "true", "the harmless command")
        self.out("ssh: connected, `true` ran")

    def _resolve_dir(self, client: paramiko.SSHClient, sftp: paramiko.SFTPClient) -> str:
        """REMOTE_DIR as an absolute path on the node (relative = to the login directory)."""
        home = sftp.normalize(".")
        return posixpath.normpath(posixpath.join(home, self.remote_dir))

    def _check_tools(self, client: paramiko.SSHClient) -> bool:
        """List the missing tools and Python modules; whether Python and its modules are
        all there."""
        outcome = self.outcome
        wanted = [*TOOLS, self.python]
        probe = "; ".join(f"command -v {shlex.quote(t)} >/dev/null 2>&1 || echo {shlex.quote(t)}"
                          for t in wanted)
        _, out, _ = self._run(client, probe, "looking for the tools", check=False)
        outcome.missing_tools = [t for t in wanted if t in out.split("\n")]
        self.out("tools: " + ("all there (" + ", ".join(wanted) + ")"
                              if not outcome.missing_tools
                              else "MISSING: " + ", ".join(outcome.missing_tools)))
        if self.python in outcome.missing_tools:
            return False
        modules = code.third_party_modules(self.repo_root)
        check = (f"import importlib.util; print(' '.join(m for m in {modules!r} "
                 "if importlib.util.find_spec(m) is None))")
        _, out, _ = self._run(client, shlex.join([self.python, "-c", check]),
                              "looking for the Python modules")
        outcome.missing_modules = out.split()
        self.out("python modules: " + ("all there (" + ", ".join(modules) + ")"
                                       if not outcome.missing_modules
                                       else "MISSING: " + ", ".join(outcome.missing_modules)))
        return not outcome.missing_modules

    def _remote_state(self, client: paramiko.SSHClient, sftp: paramiko.SFTPClient,
                      files: Sequence[str], python_ok: bool) -> tuple[dict[str, str], list[str]]:
        """The node copy's ``{path: md5}`` (without Python: ``{path: "size mtime"}``) and
        its stale modules."""
        root = self.outcome.remote_dir
        if python_ok:
            program = _HASH_PROGRAM % {"root": root, "files": sorted(files),
                                       "package": code.PACKAGE}
            _, out, _ = self._run(client, shlex.join([self.python, "-c", program]),
                                  "hashing the node's copy", SLOW_TIMEOUT)
            have: dict[str, str] = {}
            stale: list[str] = []
            for line in out.splitlines():
                kind, _, rest = line.partition(" ")
                if kind == "md5":
                    md5, _, rel = rest.partition(" ")
                    have[rel] = md5
                elif kind == "stale":
                    stale.append(rest)
            return have, stale
        quick: dict[str, str] = {}
        for rel in files:
            with contextlib.suppress(FileNotFoundError):
                st = sftp.stat(posixpath.join(root, rel))
                quick[rel] = f"{st.st_size} {int(st.st_mtime or 0)}"
        return quick, []

    def _copy_code(self, client: paramiko.SSHClient, sftp: paramiko.SFTPClient,
                   python_ok: bool) -> None:
        outcome = self.outcome
        files = code.node_files(self.repo_root)
        have, stale = self._remote_state(client, sftp, files, python_ok)
        for rel in files:
            local = self.repo_root / rel
            if python_ok:
                same = have.get(rel) == code.file_md5(local)
            else:
                st = local.stat()
                same = have.get(rel) == f"{st.st_size} {int(st.st_mtime)}"
            if not same:
                ssh.put_atomic(sftp, local, posixpath.join(outcome.remote_dir, rel))
                outcome.copied.append(rel)
        for rel in stale:
            sftp.remove(posixpath.join(outcome.remote_dir, rel))
            outcome.removed.append(rel)
        if outcome.copied or outcome.removed:
            outcome.changed.append(f"node code ({len(outcome.copied)} file(s) copied, "
                                   f"{len(outcome.removed)} removed)")
            self.out(f"node code: {len(outcome.copied)} of {len(files)} file(s) copied, "
                     f"{len(outcome.removed)} stale removed")
        else:
            self.out(f"node code: unchanged ({len(files)} files)")

    def _put_if_different(self, sftp: paramiko.SFTPClient, data: bytes, name: str,
                          mode: int) -> bool:
        """Write ``REMOTE_DIR/name`` with ``data`` and ``mode`` unless it holds exactly that;
        whether it was written."""
        remote = posixpath.join(self.outcome.remote_dir, name)
        try:
            with sftp.open(remote, "rb") as fh:
                same = fh.read() == data
            same = same and stat.S_IMODE(sftp.stat(remote).st_mode or 0) == mode
        except FileNotFoundError:
            same = False
        if same:
            return False
        with _local_copy(data, mode) as local:
            ssh.put_atomic(sftp, local, remote)
        return True

    def _job_account(self, client: paramiko.SSHClient) -> None:
        """Step 4: on a root node, make the job account unless it exists, deny it cron and
        at (:meth:`_deny_schedules`) and name it in node.conf (:attr:`settings`); else say
        why there is none."""
        _, out, _ = self._run(client, "id -u", "asking for the node account's uid")
        if out.strip() != "0":
            self.out(f"job account: none; the node's account (uid {out.strip()}) is not "
                     "root, so its jobs run as that account")
            return
        name = self.job_user
        if not name:
            self.out("job account: none (job_user is empty); the node runs as root and so do "
                     "its jobs")
            return
        if not config.ACCOUNT_NAME.fullmatch(name):
            raise StepFailed(f"job_user {name!r}: expected an account name (a lower-case "
                             "letter or '_', then up to 31 of a-z 0-9 _ -)")
        status, _, _ = self._run(client, f"id -u {shlex.quote(name)}",
                                 "looking for the job account", check=False)
        if status != 0:
            self._run(client, jobuser.ensure_command(name), "making the job account")
            self.outcome.changed.append(f"job account {name}")
            self.out(f"job account: {name} made (system account, no login)")
        else:
            self.out(f"job account: {name} exists")
        where = self.outcome.remote_dir
        status, _, err = self._run(client, shlex.join(["runuser", "-u", name, "--", "test",
                                                       "-x", where]),
                                   "checking that the job account reaches the node's "
                                   "directory", check=False)
        if status != 0:
            why = err.strip() or "no search permission on it or on a folder above it"
            raise StepFailed(f"job account {name} cannot enter {where} ({why}): its jobs "
                             "need the node code and work folder there; give --dir a "
                             "folder others may enter (e.g. /opt/cluster-node), or chmod "
                             "o+x the folders above it")
        self._deny_schedules(client, name)
        if "job_user" not in dict(self.settings.extra):
            self.settings = dataclasses.replace(
                self.settings, extra=(*self.settings.extra, ("job_user", name)))

    def _deny_schedules(self, client: paramiko.SSHClient, name: str) -> None:
        """The job account ``name`` denied cron and at, unless told not to: its name added
        to ``/etc/cron.deny`` (and ``/etc/at.deny`` where at is installed) where it is not
        listed yet.  A node also removes the account's crontab and at jobs at each run's
        start and end (:func:`cluster.node.jobuser.remove_schedules`); this keeps a job
        from scheduling anything in the first place."""
        if not self.deny_job_cron:
            self.out(f"job account: {name} may use cron and at (--allow-job-cron); the node "
                     "still removes its crontab and at jobs after each run")
            return
        _, out, _ = self._run(client, jobuser.deny_command(name),
                              "denying the job account cron and at")
        added = [line.split(" ", 1)[1] for line in out.splitlines()
                 if line.startswith("added ")]
        files = [line.split(" ", 1)[1] for line in out.splitlines()
                 if line.startswith(("added ", "listed "))]
        what = " and ".join(w for w, f in (("cron", jobuser.CRON_DENY),
                                           ("at", jobuser.AT_DENY)) if f in files)
        if added:
            self.outcome.changed.append(", ".join(added))
            self.out(f"job account: {name} denied {what} (added to {', '.join(added)}): "
                     "its jobs cannot schedule anything to run later")
        else:
            self.out(f"job account: {name} already denied {what} ({', '.join(files)})")

    def _write_config(self, sftp: paramiko.SFTPClient) -> None:
        outcome = self.outcome
        settings = self.settings
        uploads = ((self.upload_key, UPLOADED_KEY, 0o600, "ssh_key"),
                   (self.upload_known_hosts, UPLOADED_KNOWN_HOSTS, 0o644, "ssh_known_hosts"))
        for local, name, mode, key in uploads:
            if local is None:
                continue
            if self._put_if_different(sftp, Path(local).read_bytes(), name, mode):
                outcome.changed.append(name)
                self.out(f"{name}: written from {local}")
            else:
                self.out(f"{name}: unchanged")
            settings = _replace(settings, key, posixpath.join(outcome.remote_dir, name))
        if self._put_if_different(sftp, settings.conf_text().encode(), "node.conf",
                                  CONF_MODE):
            outcome.changed.append("node.conf")
            self.out("node.conf: written")
        else:
            self.out("node.conf: unchanged")

    def _node_command(self, script: str, *args: str) -> str:
        root = self.outcome.remote_dir
        return shlex.join([self.python, posixpath.join(root, script),
                           "--config", posixpath.join(root, "node.conf"), *args])

    def _install_cron(self, client: paramiko.SSHClient) -> None:
        read = "crontab -l 2>/dev/null || true"
        _, before, _ = self._run(client, read, "reading the crontab")
        _, out, _ = self._run(client, self._node_command("clusterpull.py", "--install-cron"),
                              "installing the clusterpull crontab entry")
        _, after, _ = self._run(client, read, "reading the crontab")
        line = next((x.removeprefix("installed: ") for x in out.splitlines()
                     if x.startswith("installed: ")), "")
        if after != before:
            self.outcome.changed.append("crontab")
            self.out(f"crontab: installed {line}")
        else:
            self.out("crontab: unchanged")

    def _send_caps(self, client: paramiko.SSHClient) -> None:
        _, out, _ = self._run(client, self._node_command("send_caps.py"), "running send_caps",
                              SLOW_TIMEOUT)
        self.outcome.caps = out.strip()
        self.out(f"capabilities: {self.outcome.caps}")


def _replace(settings: NodeSettings, key: str, value: str) -> NodeSettings:
    """``settings`` with the path ``key`` (ssh_key or ssh_known_hosts) set to ``value``."""
    if key == "ssh_key":
        return dataclasses.replace(settings, ssh_key=value)
    return dataclasses.replace(settings, ssh_known_hosts=value)


@contextlib.contextmanager
def _local_copy(data: bytes, mode: int) -> Iterator[Path]:
    """A private temporary local file holding ``data`` with ``mode`` (put_atomic copies
    the local file's mode to the node)."""
    with tempfile.TemporaryDirectory(prefix="bootstrap-") as folder:
        path = Path(folder) / "data"
        path.write_bytes(data)
        path.chmod(mode)
        yield path
