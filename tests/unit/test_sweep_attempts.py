"""sweep-attempts.tsv: its lines, its reader and its appending writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.sweep.attempts import (
    HEADER,
    Attempt,
    AttemptsError,
    AttemptsWriter,
    format_attempt,
    parse_attempt,
    read_attempts,
)


def attempt(**kw: object) -> Attempt:
    values: dict[str, object] = dict(task="ab12", node="n1", start=1700000000.25,
                                     runtime=1.5, exit_status=0, receive=12, status="ok",
                                     attempt=1, final=True)
    values.update(kw)
    return Attempt(**values)  # type: ignore[arg-type]


def test_a_line_has_the_columns_in_order() -> None:
    line = format_attempt(attempt(status="invalid: check.sh exited 1", final=False,
                                  attempt=2, exit_status=-9))
    assert line == "ab12\tn1\t1700000000.250\t1.500\t-9\t12\tinvalid: check.sh exited 1\t2\tretry\n"
    assert parse_attempt(line[:-1]) == attempt(status="invalid: check.sh exited 1",
                                               final=False, attempt=2, exit_status=-9)


def test_tabs_and_newlines_in_a_reason_are_escaped() -> None:
    a = attempt(status="failed: line one\nline\ttwo \\ three", final=False)
    line = format_attempt(a)
    assert line.count("\n") == 1 and line.count("\t") == 8
    assert parse_attempt(line[:-1]) == a


@pytest.mark.parametrize("bad", [attempt(status="fine"), attempt(attempt=0),
                                 attempt(receive=-1)])
def test_a_bad_attempt_is_refused(bad: Attempt) -> None:
    with pytest.raises(ValueError):
        format_attempt(bad)


@pytest.mark.parametrize("line", ["ab12\tn1\t1\t1\t0\t0\tok\t1",  # a field short
                                  "ab12\tn1\t1\t1\t0\t0\tok\t1\tlast",
                                  "ab12\tn1\tx\t1\t0\t0\tok\t1\tfinal",
                                  "ab12\tn1\t1\t1\t0\t0\tmaybe\t1\tfinal"])
def test_a_malformed_line_says_what_is_wrong(line: str) -> None:
    with pytest.raises(ValueError, match="expected|bad field"):
        parse_attempt(line)


def test_writer_and_reader_round_trip_and_a_torn_line_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "sweep-attempts.tsv"
    assert list(read_attempts(path)) == []
    writer = AttemptsWriter(path)
    tries = [attempt(final=False, status="timeout"), attempt(attempt=2, node="n2")]
    for a in tries:
        writer.write(a)
    assert writer.dirty
    writer.close()
    assert path.read_text().startswith(HEADER)
    assert list(read_attempts(path)) == tries
    with path.open("a") as fh:
        fh.write("cd34\tn1\t1.0")  # a writer killed mid-line
    assert list(read_attempts(path)) == tries
    writer = AttemptsWriter(path)  # a successor: the torn line goes, the header stays
    writer.write(attempt(task="cd34"))
    writer.close()
    assert [a.task for a in read_attempts(path)] == ["ab12", "ab12", "cd34"]
    assert path.read_text().count(HEADER) == 1


def test_a_malformed_line_in_the_file_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "sweep-attempts.tsv"
    path.write_text(HEADER + format_attempt(attempt()) + "garbage\n")
    with pytest.raises(AttemptsError, match=r"sweep-attempts.tsv: line 3"):
        list(read_attempts(path))
    path.write_text("not the header\n")
    with pytest.raises(AttemptsError, match="line 1"):
        list(read_attempts(path))
