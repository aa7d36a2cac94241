"""When a crontab schedule next fires (cluster.cron.next_time, for ``clusteradmin cron``)
and reading our entries back from crontab lines (cluster.cron's parser of its own lines).
Pure logic: the real crontab is tests/component/test_clusteradmin_cron.py's."""

from __future__ import annotations

import datetime as dt

import pytest

from cluster import cron
from cluster.cron import CronEntry, CronError, next_time, render

#: Thursday 26 November 2026, 11:30:15 local time.
AFTER = dt.datetime(2026, 11, 26, 11, 30, 15)


@pytest.mark.parametrize(("schedule", "expected"), [
    ("0 1 * * *", dt.datetime(2026, 11, 27, 1, 0)),
    ("*/15 * * * *", dt.datetime(2026, 11, 26, 11, 45)),
    ("31 11 * * *", dt.datetime(2026, 11, 26, 11, 31)),       # the next minute counts
    ("30 11 26 11 *", dt.datetime(2027, 11, 26, 11, 30)),     # this minute has begun: next year
    ("0 3 * * 6", dt.datetime(2026, 11, 28, 3, 0)),           # the default weekly_schedule
    ("0 0 * * 7", dt.datetime(2026, 11, 29, 0, 0)),           # 7 is Sunday as 0 is
    ("0 0 * * sun", dt.datetime(2026, 11, 29, 0, 0)),
    ("0 9 * * mon-fri", dt.datetime(2026, 11, 27, 9, 0)),
    ("0 9 1 jan *", dt.datetime(2027, 1, 1, 9, 0)),
    ("@weekly", dt.datetime(2026, 11, 29, 0, 0)),
    ("@monthly", dt.datetime(2026, 12, 1, 0, 0)),
    ("@hourly", dt.datetime(2026, 11, 26, 12, 0)),
    ("0 0 29 2 *", dt.datetime(2028, 2, 29, 0, 0)),
    ("5 4 1 * mon", dt.datetime(2026, 11, 30, 4, 5)),         # both day fields: either
    ("5 4 */2 * *", dt.datetime(2026, 11, 27, 4, 5)),          # a '*' day field: both
    ("5 4 1-31/2 * 1", dt.datetime(2026, 11, 27, 4, 5)),       # 27 is odd; either rule
])
def test_next_time_as_cron_computes_it(schedule: str, expected: dt.datetime) -> None:
    assert next_time(schedule, AFTER) == expected


def test_never_and_at_reboot_have_no_next_time() -> None:
    assert next_time("0 0 31 2 *", AFTER) is None
    assert next_time("@reboot", AFTER) is None


def test_a_schedule_that_is_not_cron_is_refused_naming_it() -> None:
    with pytest.raises(CronError, match="'61 \\* \\* \\* \\*' is not five cron fields"):
        next_time("61 * * * *", AFTER)


def test_our_lines_are_read_back_and_others_ignored() -> None:
    entry = CronEntry("enqueue_auto-nightly:/srv/home x", "0 1 * * *", "cd /r && py a.py")
    line = render(entry)
    assert cron._parse_ours(line) == cron.Listed("enqueue_auto-nightly:/srv/home x",
                                                 "0 1 * * *", "cd /r && py a.py", True)
    assert cron._parse_ours("# " + line) == cron.Listed(
        "enqueue_auto-nightly:/srv/home x", "0 1 * * *", "cd /r && py a.py", False)
    special = cron._parse_ours(render(CronEntry("clusterpull:/w", "@hourly", "run")))
    assert special is not None and special.schedule == "@hourly"
    assert cron._parse_ours("17 5 * * * echo x # not ours") is None
    assert cron._parse_ours("MAILTO=x") is None
