"""The plain cron schedules are checked without python-crontab, and agree with it."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

from crontab import CronSlices

from cluster.datatypes import _plain_schedule, is_schedule
from cluster.defaults import REPO_ROOT

#: Items around every edge of the five fields' ranges and steps.
ITEMS = ["*", "*/0", "*/1", "*/7", "*/8", "*/12", "*/13", "*/23", "*/24", "*/31", "*/32",
         "*/59", "*/60", "0", "1", "7", "8", "12", "13", "23", "24", "31", "32", "59", "60",
         "00", "1-5", "5-1", "3-3", "0-7", "1-12", "0-59", "10-20/5", "1-5/59", "1-5/60",
         "1,2,3", "0,60", "MON", "jan", "?", "", "-1", "1-", "*/", "**"]


def test_the_plain_form_is_a_subset_of_what_crontab_accepts() -> None:
    rng = random.Random(20261123)
    accepted = 0
    for _ in range(30000):
        fields = [rng.choice(ITEMS) for _ in range(5)]
        if _plain_schedule(fields):
            accepted += 1
            assert CronSlices.is_valid(" ".join(fields)), fields
    assert accepted > 100  # the sample did exercise the fast path


def test_every_field_edge_agrees_with_crontab() -> None:
    for position, item in itertools.product(range(5), ITEMS):
        fields = ["*"] * 5
        fields[position] = item
        text = " ".join(fields)
        if _plain_schedule(fields):
            assert CronSlices.is_valid(text), text
        # Whatever the fast path leaves to crontab, is_schedule answers as crontab does.
        assert is_schedule(text) == bool(item and CronSlices.is_valid(text)), text


def test_specials_and_names_still_go_through_crontab() -> None:
    assert is_schedule("@daily")
    assert is_schedule("0 1 * * MON")
    assert not is_schedule("@fortnightly")
    assert not is_schedule("0 1 * *")
    assert not is_schedule("")


def test_loading_the_default_configuration_does_not_import_crontab() -> None:
    code = ("import sys, cluster.configfile as c; c.validate(c.load()); "
            "print('crontab' in sys.modules, 'asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert out == ["False", "False"]
