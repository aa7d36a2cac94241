"""The cluster's entries in the current user's crontab (lines rendered with python-crontab).

An entry is recognised only by its comment, ``regression-cluster:<tag>``; every other line
of the crontab is left alone.  The tag names the program and the instance it serves, e.g.
``enqueue_auto-nightly:/home/regression/cluster`` (a master home) or
``clusterpull:/srv/node-work`` (a node's work_dir), so two masters or two nodes on one
machine, or a test's temporary home, never touch each other's entries.

Contracts:

* :func:`install` is idempotent: afterwards there is exactly one enabled entry per tag,
  with the given schedule and command, whatever was there before (none, one, duplicates,
  or one commented out by hand).
* :func:`remove` deletes every entry with one of the tags and nothing else.
* Both read and write the crontab through the ``crontab`` program (``crontab -l`` /
  ``crontab -``), i.e. the real crontab that cron runs; failures raise :class:`CronError`.
* Every line that is not ours is written back byte for byte.  That is why the crontab is
  not round-tripped through python-crontab's ``CronTab(user=True)``: its parser silently
  drops valid lines such as ``MAILTO = x@y`` (blanks around ``=``) or a variable after the
  last job, and rewrites others (``0 0 * * 7`` becomes ``@weekly``, comments move).
  python-crontab is used for what it does well: checking schedules and rendering our lines.

:func:`listed` reads the cluster's entries back (every tag, enabled or commented out) and
:func:`next_time` computes when a schedule next fires, as cron does, for
``clusteradmin cron``.  python-crontab's own ``CronItem.schedule()`` would need croniter,
which the project does not depend on; :func:`next_time` takes python-crontab's parse of the
five fields (names, ranges, steps, @specials) and walks the days itself, at most
:data:`NEXT_TIME_DAYS` of them.

The commands are ``cd <repo> && <python> <repo>/<script> <config options> ...`` with every
path absolute, because cron runs them from the user's home with a minimal environment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.config import Config
from cluster.datatypes import is_schedule
from cluster.defaults import REPO_ROOT
from cluster.errors import ClusterError
from cluster.runtime import proc

TAG_PREFIX = "regression-cluster:"
#: The most days :func:`next_time` looks ahead: a schedule of 29 February on a given
#: weekday fires within 28 years; one that never fires (31 February) is "never".
NEXT_TIME_DAYS = 28 * 366
CRONTAB_TIMEOUT = 60.0  # seconds; `crontab` only copies a file, but must never hang a CLI


class CronError(ClusterError):
    """The crontab could not be read or written, or an entry cannot be expressed in it."""

    def __init__(self, action: str, problem: str) -> None:
        super().__init__(action, problem)
        self.action = action
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.action}: {self.problem}"


@dataclass(frozen=True)
class CronEntry:
    """One crontab line of ours: when (five cron fields or @special), what, and its tag."""

    tag: str
    schedule: str
    command: str

    @property
    def comment(self) -> str:
        """The comment that identifies the entry in the crontab."""
        return TAG_PREFIX + self.tag


def script_command(script: str, args: Sequence[str]) -> str:
    """The shell command that runs ``<REPO_ROOT>/<script> args`` as cron would: from there."""
    # absolute(), not resolve(): a virtualenv's python is a symlink, and following it would
    # run the base interpreter without the virtualenv's packages.
    python = Path(sys.executable).absolute()
    words = [str(python), str(REPO_ROOT / script), *args]
    return f"cd {shlex.quote(str(REPO_ROOT))} && " + " ".join(shlex.quote(w) for w in words)


def config_argv(config_file: Path | None, home: Path | None, sets: Sequence[str],
                cfg: Config, pin: Sequence[str] = ()) -> list[str]:
    """The --config/--home/--set options for a cron command, with every path made absolute.

    The cron command runs from the repo, not from the user's working directory, so:
    ``sets`` (the raw ``--set key=value`` pairs the user gave) pass on as given except that a
    path-valued key gets the absolute path it was resolved to; and each key in ``pin`` whose
    value is still the relative default (``home``, ``work_dir``: relative to the working
    directory) is added as ``--set key=<absolute path>``, so cron uses the same directory.
    """
    path_keys = {f.name for f in dataclasses.fields(Config) if f.type in ("Path", Path)}
    argv: list[str] = []
    if config_file is not None:
        argv += ["--config", str(config_file.resolve())]
    if home is not None:
        argv += ["--home", str(home.resolve())]
    for pair in sets:
        key = pair.partition("=")[0].strip()
        if key in path_keys:
            pair = f"{key}={getattr(cfg, key)}"
        argv += ["--set", pair]
    for key in pin:
        value = getattr(cfg, key)
        if not value.is_absolute():
            argv += ["--set", f"{key}={value.resolve()}"]
    return argv


def _check_entry(entry: CronEntry) -> None:
    # A crontab line ends at a newline and its command at the first " #" (for cron's
    # readers and for _is_ours): refuse rather than install an entry that reads back wrong.
    if "\n" in entry.tag or "\r" in entry.tag:
        raise CronError("install crontab entry", f"tag {entry.tag!r} contains a line break")
    for char in ("#", "\n", "\r"):
        if char in entry.command:
            raise CronError("install crontab entry " + entry.comment,
                            f"the command contains {char!r}, which a crontab line cannot "
                            f"hold (move the paths it names): {entry.command!r}")
    if not is_schedule(entry.schedule):
        raise CronError("install crontab entry " + entry.comment,
                        f"schedule {entry.schedule!r} is not five cron fields or an @special")


#: The five fields of a cron schedule, in order: name and what each takes (man 5 crontab).
FIELDS = (("minute", "0-59"), ("hour", "0-23"), ("day of month", "1-31"),
          ("month", "1-12 or jan-dec"), ("day of week", "0-7 or sun-sat, 0 and 7 Sunday"))
#: The @nicknames cron takes for a whole schedule.
NICKNAMES = ("@reboot", "@yearly", "@annually", "@monthly", "@weekly", "@daily",
             "@midnight", "@hourly")
_EXPECTED = ("five fields 'minute hour day-of-month month day-of-week' such as '0 3 * * 0' "
             f"(each '*', N, N-M, a list of them with ',', any with '/step'), or one of "
             f"{', '.join(NICKNAMES)}")


def schedule_problem(schedule: str) -> str | None:
    """What is wrong with the cron ``schedule`` (five fields or an @nickname), naming the
    field and what it takes; None when cron takes it (as :func:`cluster.datatypes.is_schedule`
    says)."""
    normal = " ".join(schedule.split())
    if not normal:
        return f"an empty schedule; expected {_EXPECTED}"
    if normal.startswith("@"):
        return None if normal in NICKNAMES else \
            f"{normal!r} is no cron nickname; expected {_EXPECTED}"
    fields = normal.split(" ")
    if len(fields) != 5:
        return f"{normal!r} has {len(fields)} field(s); expected {_EXPECTED}"
    from crontab import S_INFO, CronSlice  # noqa: PLC0415  (see render)

    for number, (text, info, (name, takes)) in enumerate(zip(fields, S_INFO, FIELDS,
                                                             strict=True), start=1):
        try:
            CronSlice(info, text)
        except (ValueError, KeyError) as exc:
            why = exc.args[0] if exc.args else type(exc).__name__
            return (f"field {number} ({name}) is {text!r} ({why}); expected {takes}, as '*', "
                    "N, N-M or a list of them with ',', any with '/step'")
    if not is_schedule(normal):
        return f"{normal!r} is not a schedule cron takes; expected {_EXPECTED}"
    return None


def render(entry: CronEntry) -> str:
    """The crontab line of ``entry`` (python-crontab's rendering: ``%`` escaped, comment last)."""
    _check_entry(entry)
    # Imported here, not at the top: python-crontab imports asyncio, a cost every command
    # line would pay at start (cli/common imports this module) though few install entries.
    from crontab import CronItem  # noqa: PLC0415

    item = CronItem(command=entry.command, comment=entry.comment)
    item.setall(" ".join(entry.schedule.split()))
    return item.render().strip()


def _is_ours(line: str, tag: str) -> bool:
    # Our lines end with " # regression-cluster:<tag>"; one commented out by hand
    # ("# 0 1 * * * ... # regression-cluster:<tag>") still counts, so install re-enables it.
    return re.search(r"\s#\s*" + re.escape(TAG_PREFIX + tag) + r"\s*$", line) is not None


def _crontab_program() -> str:
    program = shutil.which("crontab")
    if program is None:
        raise CronError("find the crontab program",
                        "not on PATH; install the cron package (apt-get install cron)")
    return program


def _crontab(action: str, args: Sequence[str], data: bytes | None = None) -> proc.Result:
    """Run ``crontab args``; CronError naming ``action`` if it cannot start or times out."""
    try:
        done = proc.run([_crontab_program(), *args], input=data, timeout=CRONTAB_TIMEOUT)
    except proc.ProcessError as exc:
        raise CronError(action, str(exc)) from None
    if done.timed_out:
        raise CronError(action, done.describe(CRONTAB_TIMEOUT))
    return done


def _failed(action: str, done: proc.Result) -> CronError:
    return CronError(action, f"{done.describe()}: {_text(done.stderr).strip()}")


def _read() -> list[str]:
    """The lines of the user's crontab ([] if the user has none), without line ends."""
    action = "read the crontab (crontab -l)"
    done = _crontab(action, ["-l"])
    if done.returncode != 0:
        if b"no crontab for" in done.stderr:
            return []
        raise _failed(action, done)
    # Bytes and surrogateescape, not text mode: other people's lines must come back
    # unchanged whatever their encoding or line ends, and whatever the locale cron gives us.
    text = _text(done.stdout)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _write(lines: list[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
    action = "write the crontab (crontab -)"
    done = _crontab(action, ["-"], data)
    if done.returncode != 0:
        raise _failed(action, done)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def install(entries: Iterable[CronEntry]) -> list[str]:
    """Make each entry present exactly once in the user's crontab; return the lines as written.

    An entry replaces the lines with its tag where the first of them was (so a reinstall
    does not reorder the file) and drops the others; a new entry goes at the end.  The
    crontab is rewritten only if it changes.
    """
    wanted = [(entry.tag, render(entry)) for entry in entries]
    old = _read()
    lines = list(old)
    for tag, text in wanted:
        positions = [i for i, line in enumerate(lines) if _is_ours(line, tag)]
        if not positions:
            lines.append(text)
            continue
        lines[positions[0]] = text
        for i in reversed(positions[1:]):
            del lines[i]
    if lines != old:
        _write(lines)
    return [text for _, text in wanted]


def remove(tags: Iterable[str]) -> int:
    """Delete every line carrying one of ``tags``; return how many were deleted.

    The crontab is rewritten only if something was deleted.
    """
    tags = list(tags)
    old = _read()
    lines = [line for line in old if not any(_is_ours(line, tag) for tag in tags)]
    if len(lines) != len(old):
        _write(lines)
    return len(old) - len(lines)



@dataclass(frozen=True)
class Listed:
    """One entry of ours as the crontab holds it: its tag, schedule (five fields or an
    @special), command, and whether it is enabled (a line commented out by hand is not)."""

    tag: str
    schedule: str
    command: str
    enabled: bool


def _parse_ours(line: str) -> Listed | None:
    """The entry of one crontab line carrying our comment, or None for any other line."""
    match = re.search(r"\s#\s*" + re.escape(TAG_PREFIX) + r"(\S.*?)\s*$", line)
    if match is None:
        return None
    body = line[:match.start()].strip()
    enabled = not body.startswith("#")
    words = body.lstrip("#").split()
    count = 1 if words and words[0].startswith("@") else 5
    if len(words) <= count:
        return None
    return Listed(tag=match.group(1), schedule=" ".join(words[:count]),
                  command=" ".join(words[count:]), enabled=enabled)


def listed() -> list[Listed]:
    """Every entry of ours in the user's crontab, in the crontab's order (CronError when it
    cannot be read)."""
    return [entry for entry in map(_parse_ours, _read()) if entry is not None]


def next_time(schedule: str, after: dt.datetime) -> dt.datetime | None:
    """The first minute after ``after`` (naive local time, as cron keeps it) at which
    ``schedule`` fires; None for ``@reboot`` or a schedule that never fires.  CronError
    unless ``schedule`` is five cron fields or an @special.

    cron's rule for the two day fields: when both are restricted (neither starts with
    ``*``), a day matches either; otherwise it must match both."""
    normal = " ".join(schedule.split())
    if normal == "@reboot":
        return None
    if not is_schedule(normal):
        raise CronError("compute the next time", f"schedule {schedule!r} is not five cron "
                        "fields or an @special")
    from crontab import CronItem  # noqa: PLC0415  (see render)

    item = CronItem(command="true")
    item.setall(normal)
    fields = [_values(part) for part in item.slices]
    minutes, hours, days, months, weekdays = fields
    # The fields as written: python-crontab renders 1-31/2 as */2, which cron reads as
    # unrestricted.  An @special's day fields are '*'.
    written = normal.split() if not normal.startswith("@") else item.slices.render().split()
    either = len(written) == 5 and not any(written[i].startswith("*") for i in (2, 4))
    start = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    day = start.date()
    for _ in range(NEXT_TIME_DAYS):  # bounded: see NEXT_TIME_DAYS
        by_day, by_weekday = day.day in days, day.isoweekday() % 7 in weekdays
        if day.month in months and ((by_day or by_weekday) if either
                                    else (by_day and by_weekday)):
            for hour in sorted(hours):
                for minute in sorted(minutes):
                    when = dt.datetime.combine(day, dt.time(hour, minute))
                    if when >= start:
                        return when
        day += dt.timedelta(days=1)
    return None


def _values(cron_slice: Any) -> set[int]:
    """The numbers one field of python-crontab's parse stands for (weekday 7 is 0)."""
    values: set[int] = set()
    for part in cron_slice.parts:
        if hasattr(part, "range"):
            values.update(int(v) for v in part.range())
        else:
            values.add(int(part))
    return {0 if v == 7 else v for v in values} if cron_slice.max == 6 \
        else values
