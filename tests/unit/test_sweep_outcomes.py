"""Which try stands for a task at the end of a run (cluster.sweep.outcomes.FinalAttempts)."""

from __future__ import annotations

from pathlib import Path

from cluster.sweep.attempts import Attempt, format_attempt
from cluster.sweep.outcomes import FinalAttempts

TASK = "0123456789abcdef01234567"


def tried(*tries: tuple[str, str, bool]) -> tuple[Attempt, ...]:
    return tuple(Attempt(TASK, node, 100.0 + i, 0.25, 0, i, status, i + 1, final)
                 for i, (node, status, final) in enumerate(tries))


def standing(tries: tuple[Attempt, ...]) -> tuple[Attempt, int]:
    finals = FinalAttempts()
    for attempt in tries:
        finals.add(attempt)
    got = finals.get(TASK)
    assert got is not None
    return got.attempt, got.tries


def test_the_first_valid_final_try_stands_and_every_try_is_counted() -> None:
    tries = tried(("n1", "invalid: x", False), ("n2", "ok", True), ("n1", "ok", True))
    assert standing(tries) == (tries[1], 3)


def test_a_final_try_outranks_a_later_retry_line() -> None:
    tries = tried(("n1", "failed: exit status 1", True), ("n2", "invalid: x", False))
    assert standing(tries) == (tries[0], 2)


def test_without_a_final_try_the_last_try_stands() -> None:
    tries = tried(("n1", "invalid: a", False), ("n2", "invalid: b", False))
    assert standing(tries) == (tries[1], 2)


def test_a_later_final_replaces_an_earlier_failed_final() -> None:
    tries = tried(("n1", "failed: exit status 1", True), ("n2", "timeout", True))
    assert standing(tries) == (tries[1], 2)


def test_read_from_a_file_with_a_torn_last_line_and_an_untried_task(tmp_path: Path) -> None:
    tries = tried(("n1", "ok", True))
    path = tmp_path / "sweep-attempts.tsv"
    path.write_text(format_attempt(tries[0]) + format_attempt(tries[0])[:10])
    finals = FinalAttempts.read(path)
    assert len(finals) == 1
    assert finals.get(TASK) is not None and finals.get("f" * 24) is None
    assert len(FinalAttempts.read(tmp_path / "missing.tsv")) == 0
