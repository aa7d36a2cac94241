"""The confirm phase's files in ``runs/<id>/`` and the verdicts read from them.

The plan (which changed tests run again, their first digests and nodes, their baseline's)
is ``confirm.plan``; the confirm results ``confirm.journal``; why the phase ended early
``confirm.end``.  The confirm phase (:mod:`cluster.master.serve.confirm`) writes them; the
end of the run (:mod:`cluster.master.end.finish`) reads the verdicts for the report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.master.files import journal
from cluster.report.indeterminate import Verdict, digest, judge
from cluster.runtime import fsutil
from cluster.wire.protocol import parse_result

log = logging.getLogger("cluster.master")

#: In ``runs/<id>/``: the plan, the confirm results, and why the phase ended early.
PLAN_FILE = "confirm.plan"
JOURNAL_FILE = "confirm.journal"
END_FILE = "confirm.end"


def choose(changed: Sequence[str], cap: int) -> tuple[list[str], list[str]]:
    """(the tests run again, those over the cap): the first ``cap`` of ``changed`` in
    report order, and the rest."""
    return list(changed[:cap]), list(changed[cap:])


@dataclass(frozen=True)
class Plan:
    """Which changed tests a run runs again, and what is known of each already:
    ``first`` (test -> (digest, node) of its first result), ``baseline`` (test -> the
    baseline's digest).  ``over_cap``: changed tests not run again."""

    tests: tuple[str, ...] = ()
    over_cap: tuple[str, ...] = ()
    cap: int = 0
    first: dict[str, tuple[str, str]] = field(default_factory=dict)
    baseline: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        fsutil.atomic_write(path, json.dumps({
            "tests": list(self.tests), "over_cap": list(self.over_cap), "cap": self.cap,
            "first": {t: list(v) for t, v in self.first.items()},
            "baseline": self.baseline}) + "\n", fsync=True)

    @classmethod
    def load(cls, path: Path) -> Plan | None:
        """The plan in ``path``; None when there is none (or it is unreadable)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(tuple(data["tests"]), tuple(data["over_cap"]), int(data["cap"]),
                       {t: (str(v[0]), str(v[1])) for t, v in data["first"].items()},
                       {t: str(v) for t, v in data["baseline"].items()})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("%s: unreadable confirm plan (%s); no test is confirmed", path, exc)
            return None


def verdicts(run_dir: Path, run_id: str) -> list[Verdict]:
    """The verdict of every changed test of the run whose folder is ``run_dir``, from its
    plan and confirm journal (none without a plan): those run again, then those over the
    cap, in report order each."""
    plan = Plan.load(run_dir / PLAN_FILE)
    if plan is None:
        return []
    second: dict[str, tuple[str, str]] = {}
    for line in journal.load_lines(run_dir / JOURNAL_FILE, run_id) or []:
        machine, text = journal.split_line(line)
        result = parse_result(text, machine)
        second.setdefault(result.name, (digest(result.error, result.md5), machine))
    try:
        ended = (run_dir / END_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        ended = ""
    missing = ended or "its second run gave no result"
    out = [judge(t, plan.baseline[t], plan.first[t], second.get(t), missing)
           for t in plan.tests]
    out += [judge(t, plan.baseline[t], plan.first[t], None,
                  f"over confirm_max ({plan.cap} tests run again)") for t in plan.over_cap]
    return out
