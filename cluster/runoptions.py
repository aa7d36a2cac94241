"""Per-run options (docs/runoptions.md; prun's job file keys): the words a queue line may
carry to give one run its own limits, placement and order, and each run's effective
settings.

docs/runoptions.md is the user's page.  The grammar, one word each on the queue line after
the products (``cluster.queue`` checks every word with :func:`check_word`)::

    job_timeout=DURATION          the run's whole wall time, over every master that served it
    queue_timeout=DURATION        the longest a run may wait in its queue before it starts
    task_timeout=DURATION         each job's timeout on the node
    adaptive_timeout=N            each job's timeout N times its median recorded time (0: off)
    num_execution=N               product shell: each job run N times, as ranks 0..N-1
                                  (1 <= N <= MAX_NUM_EXECUTION; docs/runoptions.md section 7)
    max_failed_nodes=N            nodes lost or failed before the run is stopped (N >= 0)
    max_worker_instances=N        at most N of the run's jobs at once on one node (N >= 1)
    max_cluster_instances=N       at most N of the run's jobs in flight in all (N >= 1)
    min_nodes=N                   preemption never takes the run below N nodes (N >= 0)
    share=N                       the run's fair-share weight among the priority-0 runs served
                                  at once (1 <= N <= MAX_SHARE; default: its user's weight in
                                  master.conf's user_shares, else 1)
    exclusive                     a node taking this run's jobs runs nothing else meanwhile
    no_reschedule                 a lost node's jobs are reported lost, never handed out again
    every_node                    the run is one job per enabled node
    groups=G[,G...]               only nodes of these groups (``groups/<G>`` in the home)
    nodes=NODE[,NODE...]          only these nodes (``clusteradmin repro`` pins its run so)
    exclude=NODE[,NODE...]        never these nodes
    name=NAME                     the run's name, for ``after=`` of other runs
    after=REF[,REF...]            start only once these runs have ended well (a run id or name)
    reuse=yes|no                  take results of earlier complete runs for jobs whose key is
                                  unchanged (default: master.conf's ``result_cache``)
    confirm=yes|no                run changed tests again before reporting (docs/results.md), or not
    order=N                       the run's place among the waiting runs of its queue: the
                                  lowest value starts first, equal values in queue order
                                  (an integer from ORDER_MIN to ORDER_MAX; default 0)

``DURATION`` is a number of seconds with at most one suffix ``s``, ``m``, ``h`` or ``d``
(``90``, ``90s``, ``15m``, ``1.5h``, ``2d``), more than 0 and at most 30 days.  Names
(``G``, ``NODE``, ``NAME``, ``REF``) are 1 to 64 of letters, digits, ``.``, ``_`` and ``-``,
starting with a letter or digit (so never a ``/``); a list has no duplicates and at most
:data:`MAX_LIST` entries.  Each option at most once (``cluster.queue`` checks that).  A
run may not be ``after`` its own name.

:class:`RunOptions` is a run's effective settings: each option given, else the global
setting it overrides (``job_timeout`` <- master.conf's ``max_run_time``, ``task_timeout`` <-
the node's ``job_timeout``, ``max_failed_nodes`` <- master.conf's ``max_failed_nodes``,
``adaptive_timeout`` <- master.conf's ``adaptive_timeout``), else "no limit".  Every error
is a :class:`RunOptionError` (a ``ValueError``) naming the option and what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from cluster.config import Config

#: Options with a value (``key=value``).
DURATION_KEYS = ("job_timeout", "queue_timeout", "task_timeout")
COUNT_KEYS = ("max_failed_nodes", "max_worker_instances", "max_cluster_instances",
              "adaptive_timeout", "num_execution", "min_nodes", "share")
LIST_KEYS = ("groups", "nodes", "exclude", "after")
NAME_KEYS = ("name",)
#: Options whose value is ``yes`` or ``no``.
SWITCH_KEYS = ("reuse", "confirm")
SWITCH_VALUES = {"yes": True, "no": False}
#: The option that orders the waiting runs of one queue (prun's per-job ``priority``; named
#: ``order`` because a queue's number 0/1/2 is already its priority, and a ``.dag`` line's
#: ``priority=`` picks that queue).  Lower first, as prun and nice: see :func:`parse_order`.
ORDER_KEY = "order"
VALUE_KEYS = DURATION_KEYS + COUNT_KEYS + LIST_KEYS + NAME_KEYS + SWITCH_KEYS + (ORDER_KEY,)
#: Options that are flags.
FLAGS = ("exclusive", "no_reschedule", "every_node")
#: Every per-run option, for messages and for the other modules' lists.
KEYS = VALUE_KEYS + FLAGS

#: The longest duration accepted [seconds] (as master.conf's max_run_time).
MAX_DURATION = 30 * 86400.0
#: The largest count accepted.
MAX_COUNT = 100_000
#: The most entries of a list option.
MAX_LIST = 64
#: The most copies of each job ``num_execution=`` may ask for (a run of one command line
#: makes this many jobs; more is a sweep's work: docs/sweeps.md).
MAX_NUM_EXECUTION = 1000
#: The smallest value of each count option.
COUNT_LOW = {"max_failed_nodes": 0, "max_worker_instances": 1, "max_cluster_instances": 1,
             "adaptive_timeout": 0, "num_execution": 1, "min_nodes": 0, "share": 1}
#: The largest fair-share weight of a run (``share=``) or a user (``user_shares``).
MAX_SHARE = 100
#: The largest value of each count option, where it is not :data:`MAX_COUNT`.
COUNT_HIGH = {"num_execution": MAX_NUM_EXECUTION, "share": MAX_SHARE}

#: The range of ``order=`` (as nice's -20..19, wider), and a run's value without it.
ORDER_MIN, ORDER_MAX, ORDER_DEFAULT = -100, 100, 0
_ORDER = re.compile(r"-?(0|[1-9][0-9]{0,2})")

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class RunOptionError(ValueError):
    """A per-run option that is not valid; the message names it and what was expected."""


def parse_duration(key: str, value: str) -> float:
    """``value`` of option ``key`` in seconds; RunOptionError unless it is a DURATION."""
    match = _DURATION.fullmatch(value)
    if match is None:
        raise RunOptionError(f"option {key}={value}: expected a duration in seconds, with at "
                             "most one suffix s, m, h or d (90, 15m, 1.5h)")
    seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if not (0 < seconds <= MAX_DURATION) or not math.isfinite(seconds):
        raise RunOptionError(f"option {key}={value}: expected more than 0 and at most "
                             f"{MAX_DURATION / 86400:g} days")
    return seconds


def parse_count(key: str, value: str) -> int:
    """``value`` of option ``key`` as an integer; RunOptionError unless it is a whole number
    in the key's range."""
    low, high = COUNT_LOW[key], COUNT_HIGH.get(key, MAX_COUNT)
    if not value.isascii() or not value.isdigit():
        raise RunOptionError(f"option {key}={value}: expected a whole number from {low} to "
                             f"{high}")
    number = int(value)
    if not low <= number <= high:
        raise RunOptionError(f"option {key}={value}: expected a whole number from {low} to "
                             f"{high}")
    return number



def count_in(words: Iterable[str], key: str) -> int | None:
    """The value of count option ``key`` among ``words`` (a job.start's or a queue line's
    words; others are ignored), or None when it is absent or not a valid count (the queue
    never lets a bad one in: a reader of a file it wrote falls back to its default)."""
    for word in words:
        name, _, value = word.partition("=")
        if name == key:
            try:
                return parse_count(key, value)
            except RunOptionError:
                return None
    return None

def parse_order(value: str, key: str = ORDER_KEY) -> int:
    """``value`` of ``order=`` as an integer; RunOptionError unless it is a whole number
    written as Python writes it (``-5``, ``0``, ``12``: so a queue line has one spelling)
    from ORDER_MIN to ORDER_MAX."""
    if not _ORDER.fullmatch(value) or value == "-0" or \
            not ORDER_MIN <= int(value) <= ORDER_MAX:
        raise RunOptionError(f"option {key}={value}: expected a whole number from "
                             f"{ORDER_MIN} to {ORDER_MAX} (lower starts first; default "
                             f"{ORDER_DEFAULT})")
    return int(value)


def order_of(option_words: Iterable[str]) -> int:
    """The ``order=`` value among a queue line's option words (a parsed line's are
    valid), else ORDER_DEFAULT."""
    for word in option_words:
        key, eq, value = word.partition("=")
        if key == ORDER_KEY and eq:
            return parse_order(value)
    return ORDER_DEFAULT


def parse_names(key: str, value: str) -> tuple[str, ...]:
    """``value`` of list option ``key`` as its names; RunOptionError for an empty entry, a
    bad name (a ``/`` included), a duplicate or too many."""
    what = {"groups": "group names", "nodes": "node names", "exclude": "node names",
            "after": "run ids or names"}[key]
    names = value.split(",")
    if len(names) > MAX_LIST:
        raise RunOptionError(f"option {key}= has {len(names)} entries; expected at most "
                             f"{MAX_LIST}")
    seen: set[str] = set()
    for name in names:
        if not NAME.fullmatch(name):
            raise RunOptionError(f"option {key}={value}: bad entry {name!r}; expected "
                                 f"comma-separated {what} (letters, digits, '.', '_' or '-', "
                                 "starting with a letter or digit, at most 64; no '/')")
        if name in seen:
            raise RunOptionError(f"option {key}={value}: {name!r} listed twice; expected each "
                                 "at most once")
        seen.add(name)
    return tuple(names)


def check_word(key: str, value: str | None) -> None:
    """Check one option word of a queue line: ``key=value`` (``value`` given) or the flag
    ``key`` (``value`` None).  RunOptionError naming it unless it is a valid per-run option
    of that form; a ``key`` that is no per-run option is not checked here."""
    if key in FLAGS:
        if value is not None:
            raise RunOptionError(f"option {key} is a flag; expected {key} without '='")
        return
    if key not in VALUE_KEYS:
        return
    if value is None or value == "":
        raise RunOptionError(f"option {key} needs a value; expected {key}=<value>")
    if key in DURATION_KEYS:
        parse_duration(key, value)
    elif key in COUNT_KEYS:
        parse_count(key, value)
    elif key in LIST_KEYS:
        parse_names(key, value)
    elif key == ORDER_KEY:
        parse_order(value)
    elif key in SWITCH_KEYS:
        if value not in SWITCH_VALUES:
            raise RunOptionError(f"option {key}={value}: expected {key}=yes or {key}=no")
    elif not NAME.fullmatch(value):
        raise RunOptionError(f"option name={value}: expected a run name (letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit, at most 64)")


def check_words(words: Iterable[str]) -> None:
    """Check the per-run options among a queue line's option words together: each one
    (:func:`check_word`), and that ``after=`` does not name the run's own ``name=``."""
    values: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        check_word(key, value if eq else None)
        if eq:
            values[key] = value
    name = values.get("name")
    if name is not None and name in values.get("after", "").split(","):
        raise RunOptionError(f"option after={values['after']} names the run itself "
                             f"(name={name}); expected other runs")


@dataclass(frozen=True)
class RunOptions:
    """One run's effective settings (see the module docstring).  ``None`` is "no limit"
    (or, for ``task_timeout``, the node's own ``job_timeout``)."""

    job_timeout: float
    queue_timeout: float | None = None
    task_timeout: float | None = None
    max_failed_nodes: int = 10
    max_worker_instances: int | None = None
    max_cluster_instances: int | None = None
    exclusive: bool = False
    no_reschedule: bool = False
    every_node: bool = False
    groups: tuple[str, ...] = ()
    #: ``nodes=``: only these nodes may take the run (empty: any the other options let).
    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    name: str = ""
    after: tuple[str, ...] = ()
    #: Whether the run may take results from the result cache (``reuse=``, else
    #: master.conf's ``result_cache``).
    reuse: bool = True
    #: ``confirm=yes|no`` (docs/results.md, "Differences confirmed, indeterminate tests
    #: named"); None: master.conf's ``confirm_differences``.
    confirm: bool | None = None
    #: ``adaptive_timeout=N`` (docs/results.md, "Timeouts that fit each test"), else
    #: master.conf's ``adaptive_timeout``: each job's timeout as a multiple of its median
    #: recorded time; 0: the node's limit for every job.
    adaptive_timeout: float = 0.0
    #: ``num_execution=N`` (product shell): each job run N times, ranks 0..N-1
    #: (:mod:`cluster.jobs.ranks`); None: once, as written.
    num_execution: int | None = None
    #: ``min_nodes=N``, else master.conf's ``min_nodes``: preemption (docs/runoptions.md,
    #: "Preemption") never takes the run below N nodes.
    min_nodes: int = 0
    #: ``share=N``: the run's fair-share weight (docs/runoptions.md, "Fair share"); None:
    #: its user's weight in master.conf's ``user_shares``, else 1.
    share: int | None = None
    #: ``order=N``: the run's place among the waiting runs of its queue (lower first).
    order: int = ORDER_DEFAULT
    #: The per-run options the queue line gave, as ``key=value`` or the flag (for display).
    given: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, option_words: Iterable[str], cfg: Config) -> RunOptions:
        """The effective settings of a run whose queue line has ``option_words`` (every
        option word of the line; those that are no per-run option are ignored), with
        ``cfg``'s global settings where an option is not given.  RunOptionError for a bad
        word (a queue line parsed by ``cluster.queue`` has none)."""
        words = [w for w in option_words if w.partition("=")[0] in KEYS]
        check_words(words)
        values = {k: v for k, _, v in (w.partition("=") for w in words)}
        flags = {w for w in words if "=" not in w}

        def duration(key: str) -> float | None:
            return parse_duration(key, values[key]) if key in values else None

        def count(key: str) -> int | None:
            return parse_count(key, values[key]) if key in values else None

        def names(key: str) -> tuple[str, ...]:
            return parse_names(key, values[key]) if key in values else ()

        failed = count("max_failed_nodes")
        return cls(job_timeout=duration("job_timeout") or cfg.max_run_time,
                   queue_timeout=duration("queue_timeout"),
                   task_timeout=duration("task_timeout"),
                   max_failed_nodes=cfg.max_failed_nodes if failed is None else failed,
                   max_worker_instances=count("max_worker_instances"),
                   max_cluster_instances=count("max_cluster_instances"),
                   exclusive="exclusive" in flags, no_reschedule="no_reschedule" in flags,
                   every_node="every_node" in flags, groups=names("groups"),
                   nodes=names("nodes"), exclude=names("exclude"), name=values.get("name", ""),
                   after=names("after"),
                   reuse=SWITCH_VALUES[values["reuse"]] if "reuse" in values
                   else cfg.result_cache,
                   confirm=SWITCH_VALUES[values["confirm"]] if "confirm" in values else None,
                   adaptive_timeout=cfg.adaptive_timeout if "adaptive_timeout" not in values
                   else float(parse_count("adaptive_timeout", values["adaptive_timeout"])),
                   num_execution=count("num_execution"),
                   min_nodes=cfg.min_nodes if "min_nodes" not in values
                   else parse_count("min_nodes", values["min_nodes"]),
                   share=count("share"),
                   order=parse_order(values[ORDER_KEY]) if ORDER_KEY in values
                   else ORDER_DEFAULT,
                   given=tuple(sorted(words)))

    def placed(self, node: str, node_groups: Iterable[str]) -> bool:
        """Whether node ``node``, a member of ``node_groups``, may take this run's jobs:
        not excluded, one of ``nodes`` when the run names nodes, and in one of ``groups``
        when the run names groups."""
        if node in self.exclude or (self.nodes and node not in self.nodes):
            return False
        return not self.groups or any(g in self.groups for g in node_groups)
