"""The hosts the provisioner keeps its pilots off: ``<home>/provision-excluded.json``.

docs/provisioning.md, "Pilots that cannot start".  When ``pilot_exclude_after`` pilots in a
row failed on one host, the provisioner adds the host here, and every later submission
asks the batch system for any host but these (Slurm's ``--exclude``, Grid Engine's
``-l h=!host``).  A host stays until an administrator clears it
(``clusterscale.py --clear-host HOST``, or ``--clear-host all``), which the running
provisioner sees at its next look: the file is read again whenever it changed.

Format (JSON, one object, mode 0644, never a secret)::

    {"format": 1,
     "hosts": {"node7": {"since": 1795691442.0, "failures": 3,
                         "last": "pilot: end 1795691442 exit 1"}}}

Every change is made under ``<file>.lock`` (an flock) and written atomically, so the
provisioner adding a host and an administrator clearing one never lose each other's change.
A file that cannot be read or is malformed is logged (once while it lasts) and taken as
empty: it never stops the provisioner.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from cluster.runtime import fsutil

logger = logging.getLogger("cluster.provision")

FORMAT = 1
FILE_NAME = "provision-excluded.json"


@dataclass(frozen=True)
class Excluded:
    """One excluded host: since when (epoch seconds), after how many failed pilots, and
    the last line of the last one."""

    host: str
    since: float
    failures: int
    last: str


def parse(text: str) -> dict[str, Excluded]:
    """The file's hosts; ValueError naming what is wrong."""
    document = json.loads(text)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"expected a JSON object with \"format\": {FORMAT}")
    hosts = document.get("hosts")
    if not isinstance(hosts, dict):
        raise ValueError("\"hosts\": expected an object of host names")
    found = {}
    for host, info in hosts.items():
        if not isinstance(info, dict):
            raise ValueError(f"hosts.{host}: expected an object")
        since, failures, last = info.get("since"), info.get("failures"), info.get("last", "")
        if not isinstance(since, int | float) or not isinstance(failures, int) \
                or not isinstance(last, str):
            raise ValueError(f"hosts.{host}: expected since (seconds), failures (a count) "
                             "and last (text)")
        found[str(host)] = Excluded(str(host), float(since), failures, last)
    return found


def format_hosts(hosts: dict[str, Excluded]) -> str:
    return json.dumps({"format": FORMAT, "hosts": {
        h.host: {"since": round(h.since, 3), "failures": h.failures, "last": h.last}
        for h in sorted(hosts.values(), key=lambda h: h.host)}}, indent=1) + "\n"


class Exclusions:
    """The excluded hosts of the file at ``path`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = self.path.with_name(self.path.name + ".lock")
        self._stamp: tuple[int, int] | None = None
        self._hosts: dict[str, Excluded] = {}
        self._failing = False

    def hosts(self) -> dict[str, Excluded]:
        """The hosts excluded now (the file read again when it changed)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._hosts = None, {}
            return {}
        except OSError as exc:
            self._trouble(f"cannot look at {self.path}: {exc.strerror or exc}")
            return dict(self._hosts)
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp != self._stamp:
            self._hosts = self._read()
            self._stamp = stamp
        return dict(self._hosts)

    def _read(self) -> dict[str, Excluded]:
        try:
            hosts = parse(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._trouble(f"{self.path} ignored: {exc}")
            return {}
        self._failing = False
        return hosts

    def _trouble(self, message: str) -> None:
        if not self._failing:
            logger.warning("%s (no host is excluded until it is fixed)", message)
        self._failing = True

    def add(self, host: str, since: float, failures: int, last: str) -> None:
        """Exclude ``host`` (kept when already there)."""
        with fsutil.flocked(self.lock, file_mode=0o644):
            hosts = self._read()
            if host not in hosts:
                hosts[host] = Excluded(host, since, failures, last)
                fsutil.atomic_write(self.path, format_hosts(hosts), fsync=False, mode=0o644)
        self._stamp = None

    def clear(self, host: str) -> list[str]:
        """Clear ``host`` ("all": every host); the hosts cleared."""
        with fsutil.flocked(self.lock, file_mode=0o644):
            hosts = self._read()
            gone = sorted(hosts) if host == "all" else [h for h in hosts if h == host]
            if gone:
                for name in gone:
                    del hosts[name]
                fsutil.atomic_write(self.path, format_hosts(hosts), fsync=False, mode=0o644)
        self._stamp = None
        return gone
