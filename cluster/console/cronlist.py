"""``clusteradmin cron`` (docs/runoptions.md; prun's ``cron``): every scheduled entry of the cluster
in the crontab of the user running it, with when it next fires.

The entries are the ones the cluster's scripts install (:mod:`cluster.cron`: each carries
its tag, ``<program>:<instance>``): ``enqueue_auto.py --install-cron``'s nightly and weekly
entries of a master home and its named schedules' entries (any cron expression:
:mod:`cluster.triggers.schedules`, ``auto/cron/<name>/``), and a node's
``clusterpull.py --install-cron`` entry.  Each is
listed with its schedule and next time (:func:`cluster.cron.next_time`, local time as cron
keeps it); one commented out by hand is listed as disabled.  For this master home's
schedules the named runs each entry queues are listed under it (``auto/<schedule>/<name>/``,
their jobdef's line), and a schedule with job definitions but no entry is listed as not
installed, so a nightly job that never runs is seen.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from cluster import cron
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.triggers import auto, schedules

JSON = dict[str, Any]


def _jobs(home: Home, schedule: str) -> list[JSON]:
    """The named runs of ``schedule`` in ``home``: each jobdef's name and line (or what is
    wrong with it)."""
    jobs: list[JSON] = []
    for jobdef in auto.definitions(home, schedule):
        try:
            line = auto.first_line(jobdef)
        except (ClusterError, OSError, ValueError) as exc:
            line = f"(unreadable: {exc})"
        jobs.append({"name": jobdef.parent.name, "line": line, "jobdef": str(jobdef)})
    return jobs


def _entry(entry: cron.Listed, now: dt.datetime) -> JSON:
    program, _, instance = entry.tag.partition(":")
    try:
        when = cron.next_time(entry.schedule, now) if entry.enabled else None
        problem = ""
    except cron.CronError as exc:
        when, problem = None, exc.problem
    return {"tag": entry.tag, "program": program, "instance": instance,
            "schedule": entry.schedule, "enabled": entry.enabled, "command": entry.command,
            "next": None if when is None else when.timestamp(), "problem": problem,
            "installed": True}


def _named(home: Home, name: str, entries: list[JSON]) -> None:
    """Mark the entry of ``home``'s schedule ``name`` in ``entries`` with its name and
    jobdef line, or add it as not installed (with its cron expression, or what is wrong)."""
    tag = schedules.tag(home, name)
    mine = [e for e in entries if e["tag"] == tag]
    jobdef = schedules.folder_of(home, name) / schedules.JOBDEF_FILE
    problem, when = "", ""
    try:
        found = schedules.read(home, name)
        line, when = found.line, found.cron
    except ClusterError as exc:
        problem = str(exc)
        try:
            line = auto.first_line(jobdef)
        except (ClusterError, OSError, ValueError) as why:
            line = f"(unreadable: {why})"
    if not mine:
        program, _, instance = tag.partition(":")
        mine = [{"tag": tag, "program": program, "instance": instance, "schedule": when,
                 "enabled": False, "command": "", "next": None, "problem": problem,
                 "installed": False}]
        entries.append(mine[0])
    for entry in mine:
        entry.update({"auto": auto.NAMED, "name": name,
                      "jobs": [{"name": name, "line": line, "jobdef": str(jobdef)}]})
        if problem and not entry["problem"]:
            entry["problem"] = problem


def listing(home: Home, now: float | None = None) -> JSON:
    """The cluster's crontab entries (the module's docstring) as JSON: ``entries``, each
    with ``tag``, ``program``, ``instance``, ``schedule``, ``enabled``, ``command``,
    ``next`` (epoch seconds, None for never or disabled), ``installed`` and, for this
    home's enqueue_auto entries and named schedules, ``auto`` (``nightly``, ``weekly`` or
    ``cron``) and ``jobs``, and for a named schedule its ``name``.  CronError when the
    crontab cannot be read."""
    moment = dt.datetime.fromtimestamp(time.time() if now is None else now)
    entries = [_entry(e, moment) for e in cron.listed()]
    for schedule in auto.SCHEDULES:
        tag = auto.cron_tag(home, schedule)
        mine = [e for e in entries if e["tag"] == tag]
        jobs = _jobs(home, schedule)
        if not mine and jobs:
            program, _, instance = tag.partition(":")
            mine = [{"tag": tag, "program": program, "instance": instance, "schedule": "",
                     "enabled": False, "command": "", "next": None, "problem": "",
                     "installed": False}]
            entries.append(mine[0])
        for entry in mine:
            entry.update({"auto": schedule, "jobs": jobs})
    for name in schedules.names(home):
        _named(home, name, entries)
    return {"home": str(home.root.resolve()), "now": moment.timestamp(), "entries": entries}


def _local(epoch: float, now: float) -> str:
    text = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(epoch))
    minutes = max(0, round((epoch - now) / 60))
    days, rest = divmod(minutes, 1440)
    span = (f"{days} d " if days else "") + f"{rest // 60} h {rest % 60} min"
    return f"{text} (in {span})"


def format_listing(data: JSON) -> list[str]:
    """``listing`` as text: one line per entry (tag, schedule, next time), its named runs
    below it."""
    if not data["entries"]:
        return ["no scheduled entry of the cluster in this user's crontab (enqueue_auto.py "
                "--install-cron installs the nightly and weekly ones)"]
    lines: list[str] = []
    for entry in data["entries"]:
        where = entry["instance"]
        if entry.get("auto") and Path(where) == Path(data["home"]):
            where = "this home"
        head = f"{entry['program']} ({where})"
        if not entry["installed"]:
            lines.append(f"{head}: not in the crontab, so never run (enqueue_auto.py "
                         "--install-cron puts it there)"
                         + (f"; {entry['problem']}" if entry["problem"] else ""))
        elif not entry["enabled"]:
            lines.append(f"{head}: {entry['schedule']}, commented out: never run")
        elif entry["problem"]:
            lines.append(f"{head}: {entry['schedule']}, {entry['problem']}")
        elif entry["next"] is None:
            lines.append(f"{head}: {entry['schedule']}, next: never (no such date, or "
                         "@reboot)")
        else:
            lines.append(f"{head}: {entry['schedule']}, next {_local(entry['next'], data['now'])}")
        for job in entry.get("jobs", []):
            lines.append(f"  auto/{entry['auto']}/{job['name']}: {job['line']}")
    return lines
