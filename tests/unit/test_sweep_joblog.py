"""cluster.sweep.joblog: results.tsv written and read back, on real files in tmp_path."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.sweep import joblog
from cluster.sweep.joblog import (
    JoblogError,
    JoblogRow,
    JoblogWriter,
    exit_columns,
    open_joblog,
    read_joblog,
    read_parameters,
    valid_seqs,
)

PARAMS = ("alpha", "n")


def _row(seq: int, status: str = "ok", alpha: str = "0.1", n: str = "10",
         command: str = "python3 model.py", host: str = "node1") -> JoblogRow:
    return JoblogRow(seq, host, 1795674974.7931, 0.1066, 12, 345, 0, 0, command,
                     (("alpha", alpha), ("n", n)), status, 1)


def test_a_file_has_the_header_and_parallels_formats(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
        log.write(_row(2, "invalid: result out is empty", alpha="0.2"))
    assert path.read_text().splitlines() == [
        "Seq\tHost\tStarttime\tJobRuntime\tSend\tReceive\tExitval\tSignal\tCommand\talpha\tn"
        "\tstatus\tattempts",
        "1\tnode1\t1795674974.793\t     0.107\t12\t345\t0\t0\tpython3 model.py\t0.1\t10\tok\t1",
        "2\tnode1\t1795674974.793\t     0.107\t12\t345\t0\t0\tpython3 model.py\t0.2\t10"
        "\tinvalid: result out is empty\t1",
    ]


@pytest.mark.skipif(shutil.which("parallel") is None, reason="GNU parallel not installed")
def test_the_first_columns_are_formatted_as_gnu_parallel_writes_them(tmp_path: Path) -> None:
    theirs = tmp_path / "parallel.log"
    subprocess.run(["parallel", "--joblog", str(theirs), ":::", "sleep 0.2"], check=True,
                   timeout=60, capture_output=True)
    their_header, their_row = theirs.read_text().splitlines()
    ours = tmp_path / "results.tsv"
    fields = their_row.split("\t")
    with open_joblog(ours, ()) as log:
        log.write(JoblogRow(int(fields[0]), fields[1], float(fields[2]), float(fields[3]),
                            int(fields[4]), int(fields[5]), int(fields[6]), int(fields[7]),
                            fields[8], (), "ok", 1))
    our_header, our_row = ours.read_text().splitlines()
    assert our_header.split("\t")[:9] == their_header.split("\t")
    assert our_row.split("\t")[:9] == fields, "same text, field for field"


def test_rows_read_back_equal_to_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    rows = [_row(1), _row(2, "failed: node1 died", alpha="x"), _row(3, "timeout")]
    with open_joblog(path, PARAMS) as log:
        for row in rows:
            log.write(row)
    back = list(read_joblog(path))
    assert [r.seq for r in back] == [1, 2, 3]
    assert back[1].parameters == {"alpha": "x", "n": "10"}
    assert back[1].status == "failed: node1 died" and not back[1].ok and back[0].ok
    assert back[0].start == 1795674974.793 and back[0].runtime == 0.107  # as written
    assert read_parameters(path) == PARAMS


def test_tabs_newlines_and_backslashes_never_break_a_row(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    nasty = "a\tb\nc\\d\re \\t not a tab\\"
    params = ("we\tird", "plain")
    row = JoblogRow(1, "host\t1", 1.0, 2.0, 0, 0, 0, 0, f"printf '{nasty}'",
                    (("we\tird", nasty), ("plain", "")), f"invalid: check.sh exited 1: {nasty}",
                    2)
    with open_joblog(path, params) as log:
        log.write(row)
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[-1] == b"", "one header, one row"
    assert all(line.count(b"\t") == 12 for line in lines[:2]), "13 fields each"
    assert b"\r" not in path.read_bytes()
    assert b"a\\tb\\nc\\\\d\\re \\\\t not a tab\\\\" in lines[1]
    (back,) = read_joblog(path)
    assert back.params == row.params and back.command == row.command
    assert back.host == row.host and back.status == row.status
    assert read_parameters(path) == params


@pytest.mark.parametrize("text", ["", "plain", "\\", "\t", "\\t", "\\\\n", "é\u2028∑",
                                  "\x00\x1f", "end\\"])
def test_escape_round_trips(text: str) -> None:
    assert joblog.unescape(joblog.escape(text)) == text
    assert "\t" not in joblog.escape(text) and "\n" not in joblog.escape(text)


@pytest.mark.parametrize("bad", ["\\x", "end\\", "\\ "])
def test_unescape_refuses_a_stray_backslash(bad: str) -> None:
    with pytest.raises(ValueError, match="bad escape"):
        joblog.unescape(bad)


def test_the_file_is_readable_as_plain_tsv_when_no_value_needs_escaping(
        tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
    table = list(csv.DictReader(io.StringIO(path.read_text()), delimiter="\t"))
    assert table[0]["alpha"] == "0.1" and table[0]["status"] == "ok"
    assert float(table[0]["JobRuntime"]) == 0.107


def test_text_that_is_not_utf8_goes_through(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    value = b"caf\xe9".decode("utf-8", "surrogateescape")
    with open_joblog(path, ("f",)) as log:
        log.write(JoblogRow(1, "h", 0.0, 0.0, 0, 0, 0, 0, f"cat {value}", (("f", value),),
                            "ok", 1))
    assert b"cat caf\xe9" in path.read_bytes()
    assert next(read_joblog(path)).parameters == {"f": value}


# ----------------------------------------------------------------------------------------------
# appending, killed writers, malformed files

def test_appending_across_opens_writes_the_header_once(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
    with open_joblog(path, PARAMS) as log:
        log.write(_row(2))
    assert path.read_text().count("Seq\t") == 1
    assert [r.seq for r in read_joblog(path)] == [1, 2]


def test_each_row_is_readable_as_soon_as_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
        assert [r.seq for r in read_joblog(path)] == [1]
        log.write(_row(2))
        assert valid_seqs(path) == {1, 2}


def test_a_writer_on_a_stream_the_caller_opened(tmp_path: Path) -> None:
    stream = io.StringIO()
    writer = JoblogWriter(stream, PARAMS)
    writer.write(_row(5))
    assert stream.getvalue().startswith("Seq\t") and "\n5\tnode1\t" in stream.getvalue()
    with pytest.raises(ValueError, match="a name is repeated"):
        JoblogWriter(io.StringIO(), ("a", "a"))


def test_another_tables_file_is_not_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
    before = path.read_bytes()
    with pytest.raises(JoblogError, match="is not the one for the parameters"), \
            open_joblog(path, ("alpha",)):
        pass
    assert path.read_bytes() == before


def test_an_unfinished_last_row_is_skipped_and_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
    with path.open("a") as fh:
        fh.write("2\tnode1\t1795674974.793\t     0.1")  # killed mid-row
    assert [r.seq for r in read_joblog(path)] == [1]
    with open_joblog(path, PARAMS) as log:
        log.write(_row(3))
    assert [r.seq for r in read_joblog(path)] == [1, 3]
    assert "0.1\n" not in path.read_text().split("\n", 2)[2]


def test_an_unfinished_row_longer_than_the_tail_step_is_cut(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(joblog, "_TAIL_STEP", 7)
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
    good = path.read_bytes()
    with path.open("a") as fh:
        fh.write("2\t" + "x" * 100)
    with open_joblog(path, PARAMS):
        pass
    assert path.read_bytes() == good


def test_an_unfinished_header_is_started_over(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    path.write_text("Seq\tHo")
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
    assert [r.seq for r in read_joblog(path)] == [1]
    assert path.read_text().startswith("Seq\tHost\t")


@pytest.mark.parametrize("content, message", [
    ("", "line 1: expected the header line"),
    ("Seq\tHost\n", "line 1: expected a header"),
    ("a\tb\tc\td\te\tf\tg\th\ti\tstatus\tattempts\n", "line 1: expected a header"),
    (joblog.header(PARAMS) + "1\tonly\n", "line 2: 2 fields, expected 13"),
    (joblog.header(()) + "x\th\t1\t1\t0\t0\t0\t0\tc\tok\t1\n", "line 2: Seq 'x' is not an int"),
    (joblog.header(()) + "1\th\tsoon\t1\t0\t0\t0\t0\tc\tok\t1\n",
     "line 2: Starttime 'soon' is not a number"),
    (joblog.header(()) + "1\th\t1\t1\t0\t0\t0\t0\tc\tdone\t1\n", "line 2: status 'done'"),
    (joblog.header(()) + "1\th\t1\t1\t0\t0\t0\t0\tc\\q\tok\t1\n", r"line 2: bad escape '\\q'"),
])
def test_a_malformed_file_names_the_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "results.tsv"
    path.write_text(content)
    with pytest.raises(JoblogError, match=message) as caught:
        list(read_joblog(path))
    assert str(path) in str(caught.value)


def test_a_stray_carriage_return_does_not_split_a_row(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    path.write_text(joblog.header(()) + "1\th\t1\t1\t0\t0\t0\t0\tc\rd\tok\t1\n")
    assert next(read_joblog(path)).command == "c\rd"


# ----------------------------------------------------------------------------------------------
# values, statuses, resume

@pytest.mark.parametrize("status", ["ok", "timeout", "invalid: result out is empty",
                                    "failed: exit status 2"])
def test_the_statuses_a_row_may_carry(status: str) -> None:
    assert joblog.check_status(status) == status


@pytest.mark.parametrize("status", ["", "OK", "invalid", "invalid: ", "failed:x", "done",
                                    "timeout: 5 s"])
def test_other_statuses_are_refused(tmp_path: Path, status: str) -> None:
    with pytest.raises(ValueError, match="expected 'ok', 'timeout'"):
        joblog.check_status(status)
    with pytest.raises(ValueError), open_joblog(tmp_path / "r.tsv", PARAMS) as log:
        log.write(_row(1, status))


def test_a_row_with_other_parameters_or_bad_numbers_is_refused(tmp_path: Path) -> None:
    with open_joblog(tmp_path / "r.tsv", PARAMS) as log:
        with pytest.raises(ValueError, match=r"parameters \['alpha'\], expected"):
            log.write(JoblogRow(1, "h", 0, 0, 0, 0, 0, 0, "c", (("alpha", "1"),), "ok", 1))
        with pytest.raises(ValueError, match="expected"):
            log.write(JoblogRow(1, "h", 0, 0, 0, 0, 0, 0, "c", (("n", "1"), ("alpha", "1")),
                                "ok", 1))
        for bad in (dict(seq=0), dict(send=-1), dict(attempts=-1), dict(signal=-9)):
            fields = {**_row(1).__dict__, **bad}
            with pytest.raises(ValueError, match="must be >= "):
                log.write(JoblogRow(**fields))
        with pytest.raises(ValueError, match="must be finite"):
            log.write(JoblogRow(**{**_row(1).__dict__, "runtime": float("nan")}))
    assert list(read_joblog(tmp_path / "r.tsv")) == [], "nothing half-written"


def test_exit_columns_as_gnu_parallel_fills_them() -> None:
    assert exit_columns(0) == (0, 0)
    assert exit_columns(3) == (3, 0)
    assert exit_columns(-9) == (0, 9)
    assert exit_columns(-15, timed_out=True) == (-1, 15)


def test_valid_seqs_are_the_tasks_resume_need_not_run(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        log.write(_row(1))
        log.write(_row(2, "invalid: out is empty"))
        log.write(_row(3, "timeout"))
        log.write(_row(4, "failed: node died"))
        log.write(_row(5))
        log.write(_row(5, "failed: a speculative copy that lost"))
    assert valid_seqs(path) == {1, 5}


def test_many_rows_are_streamed(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    with open_joblog(path, PARAMS) as log:
        for seq in range(1, 20_001):
            log.write(_row(seq, "ok" if seq % 3 else "timeout"))
    rows = read_joblog(path)
    assert next(rows).seq == 1  # a generator: rows come before the file is read whole
    assert sum(1 for _ in rows) == 19_999
    assert len(valid_seqs(path)) == 20_000 - 20_000 // 3
