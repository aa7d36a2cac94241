"""Unit tests of cluster.node.readlog: job logs turned into results (readlog.pl per job)."""

from __future__ import annotations

import re

import pytest

from cluster.jobs.commands import LANGUAGES, TWO_STAGE
from cluster.node.readlog import classify, final_md5, log_entry, with_wall_time
from cluster.records import ERROR_LOST, ERROR_NAMES, JobResult

NAME = "tests__x.ps.ppmraw.72.0"
MD5 = "ae41b24ea23bf25eb1c819220fc326d9"
MD5B = "d30f2d3dac973f4e42329c2384a622ac"
BANNER = ("GPL Ghostscript 10.0.0 (2022-09-21)\n"
          "Copyright (C) 2022 Artifex Software, Inc.  All rights reserved.\n")
GS_ECHO = "/n/bin/gs -sOutputFile='|md5sum >> /n/temp/x.md5' -sDEVICE=ppmraw - < /t/x.ps\n"


def raster_log(body: str = "", time: str = "0.05 0.01 0:00.07 98%\n") -> str:
    return "gs\n" + GS_ECHO + BANNER + body + time


def two_stage_log(stage1: str = "", stage2: str = "", label: str = "gs pdfwrite",
                  t1: str = "1.25 0.02 0:01.30 97%\n", t2: str = "0.50 0.01 0:00.52 99%\n"
                  ) -> str:
    return (f"{label}\n/n/bin/gs -sOutputFile=/n/temp/x.pdf -sDEVICE=pdfwrite - < /t/x.ps\n"
            + BANNER + stage1 + t1 + "---\n" + f"{MD5B}  /n/temp/x.pdf\n"
            + "/n/bin/gs -sOutputFile='|md5sum >> /n/temp/x.md5' /n/temp/x.pdf\n"
            + BANNER + stage2 + t2)


UNRECOVERABLE = ("Error: /undefined in bar\nGPL Ghostscript 10.00.0: Unrecoverable error, "
                 "exit code 1\nCommand exited with non-zero status 1\n")
SEGV = "Command terminated by signal 11\n"


def test_clean_raster_job() -> None:
    """A clean log with an md5 is error 0 with that md5, the label and the CPU time."""
    r = classify(NAME, raster_log(), f"{MD5}  -\n", killed=False, machine="node1")
    assert r == JobResult(NAME, 0, 0.05, 0.0, 0.0, MD5, "gs", "node1")


def test_clean_two_stage_job_uses_the_md5_file_not_the_log() -> None:
    """The stage-1 md5 in the log is informational; the .md5 file decides; times per stage."""
    r = classify(NAME, two_stage_log(), f"{MD5}  -\n", killed=False)
    assert (r.error, r.md5, r.product) == (0, MD5, "gs pdfwrite")
    assert (r.time1, r.time2, r.time3) == (1.25, 0.50, 0.0)


def test_last_md5_of_the_md5_file_wins() -> None:
    """With several md5 lines the last one is the result."""
    assert classify(NAME, raster_log(), f"{MD5B}  -\n{MD5}  -\n", False).md5 == MD5


@pytest.mark.parametrize("line", [
    MD5, f"{MD5}  -", f"{MD5}  ./temp/x.ppm", f"{MD5} *-", f"MD5 (x.ppm) = {MD5}",
    f"  {MD5}  -  ", f"{MD5}  -\r",
])
def test_md5_line_forms(line: str) -> None:
    """Bare digests, md5sum lines and BSD md5 lines are recognised."""
    assert final_md5(f"noise\n{line}\n") == MD5


@pytest.mark.parametrize("line", [MD5.upper(), MD5[:31], MD5 + "0", f"x{MD5}", f"{MD5}-"])
def test_not_md5_lines(line: str) -> None:
    """Other lines are not md5 results."""
    assert final_md5(line + "\n") is None


# --- error codes: every code of ARTIFEX.md §2.5 -----------------------------------------------

CASES = [
    # (description, log, md5 text, killed, expected code)
    ("none", raster_log(), f"{MD5}  -\n", False, 0),
    ("gs error", raster_log(UNRECOVERABLE), f"{MD5}  -\n", False, 1),
    ("exit status only", raster_log("Command exited with non-zero status 2\n"), "", False, 1),
    ("old interpreter warning", raster_log("Warning interpreter exited with error code 5\n"),
     f"{MD5}  -\n", False, 1),
    ("initial device", raster_log("Unable to open the initial device, quitting.\n"), "",
     False, 1),
    ("unreadable pdf, gs 10", raster_log("   **** Error: Couldn't initialise file.\n"
                                         "   No pages will be processed (FirstPage > "
                                         "LastPage).\n"), "", False, 1),
    ("other signal", raster_log("Command terminated by signal 6\n", time=""), "", False, 1),
    ("stage 2 error", two_stage_log(stage2=UNRECOVERABLE), f"{MD5}  -\n", False, 2),
    ("stage 2 other signal", two_stage_log(stage2="Command terminated by signal 8\n"), "",
     False, 2),
    ("killed", raster_log(time=""), "", True, 3),
    ("killed after an error", raster_log(UNRECOVERABLE, time=""), "", True, 3),
    ("killed line in log", raster_log("killed: timeout\n", time=""), f"{MD5}  -\n", False, 3),
    ("killed in stage 2", two_stage_log(t2=""), "", True, 4),
    ("missing, sh", "gs\n" + GS_ECHO + "sh: 1: cannot open /t/x.ps: No such file\n", "",
     False, 5),
    ("missing, gs argument", raster_log("Error: /undefinedfilename in (/t/x.pdf)\n"
                                        + UNRECOVERABLE), "", False, 5),
    ("missing, mupdf", "mupdf\nmutool draw\nerror: cannot open /t/x.pdf: No such file or "
     "directory\nerror: cannot draw '/t/x.pdf'\nCommand exited with non-zero status 1\n"
     "0.00 0.00 0:00.01 90%\n", "d41d8cd98f00b204e9800998ecf8427e  -\n", False, 5),
    ("missing, old gs", raster_log("Unable to open /t/x.ps\n"), "", False, 5),
    ("missing intermediate", two_stage_log(stage2="Error: /undefinedfilename in "
                                           "(/n/temp/x.pdf)\n" + UNRECOVERABLE), "", False, 6),
    ("segfault in pdfwrite", two_stage_log(stage1=SEGV, t1=""), "", False, 7),
    ("segfault in ps2write", two_stage_log(stage1="Segmentation fault\n", label="gs ps2write"),
     "", False, 7),
    ("segfault in xpswrite", two_stage_log(stage1=SEGV, t1="", label="gs xpswrite"), "",
     False, 7),
    ("segfault in gpcl6's pdfwrite", two_stage_log(stage1=SEGV, t1="", label="pcl pdfwrite"),
     "", False, 7),
    ("segfault", raster_log(SEGV, time=""), f"{MD5}  -\n", False, 8),
    ("backtrace", raster_log("Backtrace:\n./gs(+0x1234)\n"), "", False, 8),
    ("segfault after error", raster_log(UNRECOVERABLE + SEGV), "", False, 8),
    ("segfault in stage 2", two_stage_log(stage2=SEGV, t2=""), f"{MD5}  -\n", False, 9),
    ("no md5", raster_log(), "", False, 10),
    ("no md5 in md5 file, only in log", two_stage_log(), "", False, 10),
    ("empty", "", "", False, 10),
    ("empty killed", "", "", True, 3),
]


@pytest.mark.parametrize(("log", "md5", "killed", "code"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_error_codes(log: str, md5: str, killed: bool, code: int) -> None:
    """Each log situation gets its readlog.pl error code, and the md5 is 0 on error."""
    r = classify(NAME, log, md5, killed)
    assert r.error == code, ERROR_NAMES[r.error]
    assert (r.md5 == "0") == (code != 0)


def test_every_error_code_is_covered() -> None:
    """The table above exercises all eleven codes a node's log can give (ERROR_LOST is the
    master's own, for a lost node's jobs in a no_reschedule run)."""
    assert {c[4] for c in CASES} == set(ERROR_NAMES) - {ERROR_LOST}


@pytest.mark.parametrize(("lang", "kind"), [(lang, kind) for lang in LANGUAGES
                                             for kind in TWO_STAGE])
def test_two_stage_error_names_are_true_for_every_two_stage_test(lang: str, kind: str) -> None:
    """Every two-stage test (gs, gpcl6 or gxps writing PDF, PS or XPS) that crashes in stage
    1 is error 7, and its words name the device it ran; the stage-2 errors' words name the
    kind of file stage 1 generated."""
    stages = TWO_STAGE[kind]
    label = f"{LANGUAGES[lang].label} {stages.device}"
    r = classify(NAME, two_stage_log(stage1=SEGV, t1="", label=label), "", killed=False)
    assert (r.error, r.product) == (7, label)
    assert stages.device in ERROR_NAMES[7]
    for code in (2, 4, 6, 9):
        assert stages.suffix.upper() in re.split("[ /]", ERROR_NAMES[code]), code


def test_first_error_wins() -> None:
    """A stage-1 error stays when stage 2 then fails too (it had nothing to read)."""
    log = two_stage_log(stage1=UNRECOVERABLE, stage2="Error: /undefinedfilename in "
                        "(/n/temp/x.pdf)\n" + UNRECOVERABLE)
    assert classify(NAME, log, "", False).error == 1
    # ...and a missing input is not turned into a read error by gs's follow-up lines.
    assert classify(NAME, raster_log("Error: /undefinedfilename in (/t/x.pdf)\n"
                                     + UNRECOVERABLE), "", False).error == 5


def test_internal_file_errors_are_read_errors() -> None:
    """A PostScript file failing to open some other file is a read error, not missing input."""
    log = raster_log("Error: /undefinedfilename in --file--\n" + UNRECOVERABLE)
    assert classify(NAME, log, "", False).error == 1


# --- times ------------------------------------------------------------------------------------

def test_time_formats() -> None:
    """User CPU is taken from time lines, including h:mm:ss elapsed and '?%' CPU."""
    log = raster_log(time="3725.10 2.00 1:02:05 99%\n")
    assert classify(NAME, log, MD5, False).time1 == 3725.10
    assert classify(NAME, raster_log(time="0.00 0.00 0:00.00 ?%\n"), MD5, False).time1 == 0.0
    r = classify(NAME, raster_log(time="12.5 0.25 0:13.00 97%\n"), MD5, False)
    assert r.time1 == 12.5
    assert classify(NAME, raster_log(time="1,50 0,01 0:01,52 99%\n"), MD5, False).time1 == 1.5


def test_missing_stage1_time_keeps_stage2_in_time2() -> None:
    """When stage 1 has no time line, stage 2's time still lands in time2."""
    r = classify(NAME, two_stage_log(t1=""), MD5, False)
    assert (r.time1, r.time2) == (0.0, 0.5)


def test_third_time_goes_to_time3() -> None:
    """A third time line fills time3."""
    log = two_stage_log() + "0.75 0.00 0:00.80 94%\n"
    r = classify(NAME, log, MD5, False)
    assert (r.time1, r.time2, r.time3) == (1.25, 0.5, 0.75)


def test_interpreter_output_is_not_a_time_line() -> None:
    """Numbers in interpreter output are not taken for time lines."""
    r = classify(NAME, raster_log("Page 1 0.5 0.5\n", time=""), MD5, False)
    assert r.time1 == 0.0


# --- robustness -------------------------------------------------------------------------------

@pytest.mark.parametrize(("log", "md5"), [
    (None, None), (b"", b""), (b"gs\n\xff\xfe garbage\x00\n", b"\xff" + MD5.encode()),
    ("\n\n\n", "\n"), ("gs", MD5), ("x" * 100000, "y" * 100000),
])
def test_garbage_never_raises(log: str | bytes | None, md5: str | bytes | None) -> None:
    """Unreadable, binary or empty input yields a result, never an exception."""
    r = classify(NAME, log, md5, False)
    assert isinstance(r, JobResult)
    assert r.error in (0, 10)


def test_bytes_input_is_decoded() -> None:
    """Logs read as bytes classify like text."""
    r = classify(NAME, raster_log().encode(), f"{MD5}  -\n".encode(), False)
    assert (r.error, r.md5, r.product) == (0, MD5, "gs")


# --- the node log block -----------------------------------------------------------------------

def test_log_entry_format() -> None:
    """===name===, the log, the md5 text, the killed line and a blank line."""
    assert log_entry(NAME, "gs\nline", f"{MD5}  -\n", False) == (
        f"==={NAME}===\ngs\nline\n{MD5}  -\n\n")
    assert log_entry(NAME, "gs\n", "", True) == f"==={NAME}===\ngs\nkilled: timeout\n\n"
    assert log_entry(NAME, None, None, False) == f"==={NAME}===\n\n"


def test_log_entry_reclassifies_the_same() -> None:
    """A block's body (without its header) classifies like the separate texts."""
    block = log_entry(NAME, raster_log(), "", True)
    body = block.split("\n", 1)[1]
    assert classify(NAME, body, "", False).error == 3


def test_a_shell_job_without_a_time_line_gets_its_wall_seconds_as_time1() -> None:
    shell = classify("t", "shell\n", "d41d8cd98f00b204e9800998ecf8427e  -\n", False, "n1", 0)
    assert (shell.time1, shell.time2, shell.time3) == (0.0, 0.0, 0.0)
    timed = with_wall_time(shell, 2.3456)
    assert (timed.time1, timed.time2, timed.time3, timed.md5) == (2.35, 0.0, 0.0, shell.md5)
    # Other products keep their user CPU seconds, even a gs job whose time was 0.00.
    gs = JobResult("g", 0, 0.0, 0.0, 0.0, "a" * 32, "gs", "n1")
    assert with_wall_time(gs, 5.0) is gs
