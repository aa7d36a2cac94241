"""A sweep file's ``[run]`` table (docs/runoptions.md): the sweep run's per-run options, written as
TOML values, turned into the option words of its queue line.

Each key is a per-run option of :mod:`cluster.runoptions` (docs/runoptions.md); its value
is the option's value as TOML writes it:

* a duration (``job_timeout``, ``queue_timeout``, ``task_timeout``): a string with the
  queue line's grammar (``"2h"``, ``"90s"``) or a number of seconds (``7200``, ``1.5``);
* a count (``max_failed_nodes``, ``max_worker_instances``, ``max_cluster_instances``): a
  whole number (``1``) or a string of one (``"1"``);
* a list (``groups``, ``exclude``, ``after``): a string, comma-separated (``"win64,fast"``),
  or an array of strings (``["win64", "fast"]``);
* ``name``: a string;
* a flag (``exclusive``, ``no_reschedule``, ``every_node``): ``true`` gives the flag,
  ``false`` leaves it out.

:func:`run_words` checks every key and value with :mod:`cluster.runoptions` and returns the
words, sorted; every problem is a :class:`~cluster.errors.SweepError` naming the file and
``run.<key>`` with what was expected.  The words go onto the sweep run's queue line when it
is submitted (:class:`cluster.triggers.sweeppush.SweepSubmission`), so the queue line is the
one place the master reads a run's options from, for a sweep as for any run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster import runoptions
from cluster.errors import SweepError
from cluster.runoptions import RunOptionError
from cluster.sweep.names import kind, toml_key


def _value_text(key: str, value: Any, where: str) -> str:
    """The queue-line text of the value of option ``key``; SweepError for a TOML type the
    option does not take."""
    name = toml_key("run", key)
    if isinstance(value, bool):  # before int: a TOML boolean is a Python int too
        raise SweepError(where, f"got a boolean, expected {_expected(key)}", name)
    if isinstance(value, str):
        return value
    if isinstance(value, int) and key in runoptions.DURATION_KEYS + runoptions.COUNT_KEYS + \
            (runoptions.ORDER_KEY,):
        return str(value)
    if isinstance(value, float) and key in runoptions.DURATION_KEYS:
        return repr(value)
    if isinstance(value, list) and key in runoptions.LIST_KEYS:
        if not value or not all(isinstance(item, str) for item in value):
            raise SweepError(where, f"got {kind(value)}, expected {_expected(key)}", name)
        return ",".join(value)
    raise SweepError(where, f"got {kind(value)}, expected {_expected(key)}", name)


def _expected(key: str) -> str:
    """What option ``key`` takes in a ``[run]`` table, for messages."""
    if key in runoptions.DURATION_KEYS:
        return 'a duration: a string such as "2h" or "90s", or a number of seconds'
    if key in runoptions.COUNT_KEYS or key == runoptions.ORDER_KEY:
        return "a whole number"
    if key in runoptions.LIST_KEYS:
        return 'a string of comma-separated names or an array of strings ("a,b" or ["a", "b"])'
    return "a string"


def run_words(table: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The option words of the ``[run]`` table ``table`` of the sweep file ``where``, sorted
    (the module's docstring); SweepError naming ``run.<key>`` for an unknown key or a bad
    value."""
    words: list[str] = []
    for key, value in table.items():
        name = toml_key("run", key)
        if key not in runoptions.KEYS:
            raise SweepError(where, "not a per-run option; expected one of "
                             f"{', '.join(runoptions.KEYS)} (docs/runoptions.md)", name)
        if key in runoptions.FLAGS:
            if not isinstance(value, bool):
                raise SweepError(where, f"got {kind(value)}, expected true or false (a flag)",
                                 name)
            if value:
                words.append(key)
            continue
        text = _value_text(key, value, where)
        try:
            runoptions.check_word(key, text)
        except RunOptionError as exc:
            raise SweepError(where, str(exc), name) from None
        words.append(f"{key}={text}")
    try:
        runoptions.check_words(words)
    except RunOptionError as exc:
        raise SweepError(where, str(exc), toml_key("run", "after")) from None
    return tuple(sorted(words))
