"""Exceptions of the cluster. Every message names the thing, the bad value and what was expected."""

from __future__ import annotations


class ClusterError(Exception):
    """Base class of every error the cluster raises on purpose."""


class ConfigError(ClusterError):
    """A configuration value is missing or malformed."""

    def __init__(self, key: str, value: object, expected: str, source: str = "") -> None:
        super().__init__(key, value, expected, source)
        self.key = key
        self.value = value
        self.expected = expected
        self.source = source

    def __str__(self) -> str:
        where = f" in {self.source}" if self.source else ""
        return f"config key {self.key!r}{where}: got {self.value!r}, expected {self.expected}"


class ProtocolError(ClusterError):
    """A message on the node protocol broke its grammar or its limits."""

    def __init__(self, problem: str, line: str | None = None, lineno: int | None = None) -> None:
        super().__init__(problem, line, lineno)
        self.problem = problem
        self.line = line
        self.lineno = lineno

    def __str__(self) -> str:
        text = self.problem
        if self.lineno is not None:
            text = f"line {self.lineno}: {text}"
        if self.line is not None:
            shown = self.line if len(self.line) <= 80 else self.line[:77] + "..."
            text = f"{text} (got {shown!r})"
        return text


class QueueLineError(ClusterError):
    """A queue file line (or a clusterpush dropping) is not a valid run description."""

    def __init__(self, line: str, problem: str, source: str = "",
                 lineno: int | None = None) -> None:
        super().__init__(line, problem, source, lineno)
        self.line = line
        self.problem = problem
        self.source = source
        self.lineno = lineno

    def __str__(self) -> str:
        where = self.source or "queue"
        if self.lineno is not None:
            where = f"{where}:{self.lineno}"
        return f"{where}: {self.problem} (line {self.line!r})"


class SweepError(ClusterError):
    """A sweep file, its parameter table or a task made from them is not usable (docs/sweeps.md);
    nothing of the sweep is submitted.

    ``where`` names the file, with ``:<line>`` for a line of a table; ``key`` is the sweep
    file's key in TOML's dotted form (``results."../x"``), '' when the problem is not one
    key's; ``problem`` says what is wrong and what was expected.
    """

    def __init__(self, where: str, problem: str, key: str = "") -> None:
        super().__init__(where, problem, key)
        self.where = where
        self.problem = problem
        self.key = key

    def __str__(self) -> str:
        if self.key:
            return f"{self.where}: key {self.key}: {self.problem}"
        return f"{self.where}: {self.problem}"


class AlreadyRunning(ClusterError):
    """Another instance of a single-instance program holds its lock."""

    def __init__(self, program: str, lock_path: str) -> None:
        super().__init__(program, lock_path)
        self.program = program
        self.lock_path = lock_path

    def __str__(self) -> str:
        return f"{self.program} is already running (lock {self.lock_path} is held)"


class TransportError(ClusterError):
    """Fetching from or uploading to the master failed."""

    def __init__(self, action: str, path: str, reason: str) -> None:
        super().__init__(action, path, reason)
        self.action = action
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.action} {self.path}: {self.reason}"


class MasterUnreachable(TransportError):
    """The master's machine could not be reached, or the link kept breaking, after the
    transport's own retries: nothing was refused, so a node that cannot even read job.start
    so exits 3 (unreachable), not 1."""


class SshError(ClusterError):
    """An ssh connection or command to another machine failed.

    ``kind`` says why, so callers can tell the cases apart without parsing the message:
    "unreachable" (no TCP connection, or it was lost, also during the login or under a
    command; the only kind worth a retry), "auth" (the server refused our key),
    "hostkey-unknown" (the server's key is not in our known_hosts), "hostkey-changed" (it
    differs from the one recorded there), "protocol" (the server does not speak ssh, or
    broke it) and "timeout" (a remote command ran past its time limit).
    ``where`` names the server (``user@host:port``).
    """

    KINDS = ("unreachable", "auth", "hostkey-unknown", "hostkey-changed", "protocol",
             "timeout")

    def __init__(self, kind: str, where: str, reason: str) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"SshError kind {kind!r}: expected one of {', '.join(self.KINDS)}")
        super().__init__(kind, where, reason)
        self.kind = kind
        self.where = where
        self.reason = reason

    def __str__(self) -> str:
        return f"ssh {self.where}: {self.reason}"


class LocalClusterError(ClusterError):
    """The local cluster cannot go on: a port it needs is taken, or a daemon it started
    (the monitor, the supervisor) has exited.  The message says which and why."""
