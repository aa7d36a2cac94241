"""cluster.sweep.checks: a task's result judged by the [validate] rules, with real files in
tmp_path and real check scripts run as processes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

from cluster.sweep import checks
from cluster.sweep.checks import Verdict, contains, validate
from cluster.sweep.rules import ValidateRules


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    folder = tmp_path / "sweep"
    folder.mkdir()
    return folder


@pytest.fixture()
def task(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "t1"
    folder.mkdir(parents=True)
    (folder / "out").write_text("0.5 1.25\n")
    (folder / "log").write_text("iter 1\niter 2\nconverged after 2\n")
    return folder


def _script(sweep: Path, body: str, name: str = "check.sh") -> str:
    path = sweep / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return name


def _judge(task: Path, sweep: Path, status: int = 0, timeout: float = 10,
           **rules: object) -> Verdict:
    return validate(task, status, ValidateRules(**rules), sweep, timeout)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# exit status, presence, emptiness

def test_defaults_accept_a_task_that_exited_0(task: Path, sweep: Path) -> None:
    verdict = _judge(task, sweep)
    assert verdict.ok and verdict.status == "ok" and str(verdict) == "ok"
    assert verdict.reason == "" and verdict.output == ""


def test_an_exit_status_outside_the_allowed_ones_is_invalid(task: Path, sweep: Path) -> None:
    assert _judge(task, sweep, status=3).status == "invalid: exit status 3 (allowed: 0)"
    assert _judge(task, sweep, status=3, exit_status=(0, 3)).ok
    assert (_judge(task, sweep, status=2, exit_status=(0, 3)).status
            == "invalid: exit status 2 (allowed: 0, 3)")


def test_a_task_killed_by_a_signal_is_named_so(task: Path, sweep: Path) -> None:
    assert (_judge(task, sweep, status=-9).status
            == "invalid: terminated by SIGKILL (allowed: 0)")


def test_an_empty_exit_status_list_accepts_any_status(task: Path, sweep: Path) -> None:
    assert _judge(task, sweep, status=7, exit_status=()).ok


def test_a_required_result_must_exist_but_may_be_empty(task: Path, sweep: Path) -> None:
    (task / "err").write_bytes(b"")
    assert validate(task, 0, ValidateRules(), sweep, 10, required=["out", "err"]).ok
    verdict = validate(task, 0, ValidateRules(), sweep, 10, required=["out", "data"])
    assert verdict.status == "invalid: result data is missing"


def test_a_result_that_is_not_a_regular_file_is_invalid(task: Path, sweep: Path) -> None:
    (task / "dir").mkdir()
    (task / "link").symlink_to(task / "out")
    assert _judge(task, sweep, nonempty=("dir",)).reason == "result dir is not a regular file"
    assert _judge(task, sweep, nonempty=("link",)).reason == "result link is not a regular file"


def test_nonempty_results(task: Path, sweep: Path) -> None:
    (task / "empty").write_bytes(b"")
    assert _judge(task, sweep, nonempty=("out", "log")).ok
    assert _judge(task, sweep, nonempty=("out", "empty")).status == "invalid: result empty is empty"
    assert _judge(task, sweep, nonempty=("gone",)).status == "invalid: result gone is missing"


def test_the_first_failing_rule_is_the_reason(task: Path, sweep: Path) -> None:
    (task / "empty").write_bytes(b"")
    marker = sweep / "ran"
    script = _script(sweep, f"touch {marker}\nexit 1\n")
    verdict = _judge(task, sweep, status=1, nonempty=("empty",), script=script)
    assert verdict.reason.startswith("exit status 1")
    verdict = _judge(task, sweep, nonempty=("empty",), match=(("out", "nothing"),),
                     script=script)
    assert verdict.reason == "result empty is empty"
    verdict = _judge(task, sweep, match=(("out", "nothing"),), script=script)
    assert verdict.reason == "result out has no match for 'nothing'"
    assert not marker.exists(), "the check script ran although an earlier rule failed"


@pytest.mark.parametrize("name", ["../out", "a/b", "..", ".", "", "x\0y"])
def test_a_result_name_that_is_not_plain_is_the_callers_error(task: Path, sweep: Path,
                                                              name: str) -> None:
    with pytest.raises(ValueError, match="expected a plain file name"):
        _judge(task, sweep, nonempty=(name,))


# ----------------------------------------------------------------------------------------------
# match

def test_match_finds_a_regular_expression_per_line(task: Path, sweep: Path) -> None:
    assert _judge(task, sweep, match=(("log", r"converged after \d+"),)).ok
    assert _judge(task, sweep, match=(("log", r"^iter 2$"),)).ok, "^ and $ are per line"
    assert not _judge(task, sweep, match=(("log", r"^after"),)).ok
    verdict = _judge(task, sweep, match=(("log", "converged"), ("out", "NaN")))
    assert verdict.status == "invalid: result out has no match for 'NaN'"
    assert _judge(task, sweep, match=(("gone", "x"),)).reason == "result gone is missing"


def test_a_bad_regular_expression_is_the_callers_error(task: Path, sweep: Path) -> None:
    with pytest.raises(ValueError, match=r"match for result log: '\(' is not a regular"):
        _judge(task, sweep, match=(("log", "("),))


def _pattern(text: str) -> re.Pattern[str]:
    return checks.compile_match("r", text)


def test_contains_finds_a_match_at_the_end_of_a_result_larger_than_a_window(
        tmp_path: Path) -> None:
    path = tmp_path / "big"
    with path.open("w") as fh:
        for i in range(200_000):  # about 2.3 MB, several default windows
            fh.write(f"step {i}\n")
        fh.write("converged\n")
    assert contains(path, _pattern("^converged$"))
    assert contains(path, _pattern(r"step 199999\nconverged"))
    assert not contains(path, _pattern("^diverged$"))


@pytest.mark.parametrize("window", [1, 2, 3, 5, 7, 16, 1000])
def test_contains_across_window_boundaries(tmp_path: Path, window: int) -> None:
    path = tmp_path / "r"
    path.write_text("alpha beta\ngamma delta\nepsilon\n")
    for pattern, expected in [("beta", True), ("a beta", True), (r"beta\ngamma", True),
                              (r"^gamma delta$", True), ("^delta", False), ("^beta", False),
                              ("alpha$", False), ("gam$", False), ("epsilon$", True),
                              (r"epsilon\n", True), (r"delta\nepsilon\n", True),
                              ("zeta", False)]:
        assert contains(path, _pattern(pattern), window=window, overlap=64) is expected, \
            (pattern, window)


def test_contains_misses_only_a_match_longer_than_the_overlap_across_a_boundary(
        tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.write_text("aaaa\nbbbb\ncccc\n")
    multi_line = _pattern(r"aaaa\nbbbb\ncccc")
    assert contains(path, multi_line, window=4, overlap=64)
    assert not contains(path, multi_line, window=4, overlap=5)  # the documented limit


def test_contains_decodes_a_character_split_between_two_reads(tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.write_bytes("résultat: ∑ converged\n".encode())
    for window in range(1, 8):
        assert contains(path, _pattern("∑ converged"), window=window)
        assert contains(path, _pattern("^résultat"), window=window)
    path.write_bytes(b"\xff\xfe bad bytes then converged\n")
    assert contains(path, _pattern("converged"), window=3)


def test_contains_memory_is_bounded_on_a_line_without_newlines(tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.write_bytes(b"x" * 100_000 + b"needle" + b"y" * 100_000)
    seen: list[int] = []

    class Spy:
        """A pattern that records how much text each search was given."""

        def search(self, text: str, pos: int = 0, endpos: int | None = None) -> None:
            seen.append(len(text))

    assert not contains(path, Spy(), window=1000, overlap=100)  # type: ignore[arg-type]
    assert max(seen) <= 2 * (1000 + 100)
    assert contains(path, _pattern("needle"), window=1000, overlap=100)


def test_contains_on_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "r"
    path.write_bytes(b"")
    assert contains(path, _pattern("^$"))
    assert not contains(path, _pattern("x"))


# ----------------------------------------------------------------------------------------------
# the check script

def test_a_check_script_gets_the_result_folder_and_runs_in_the_sweep_folder(
        task: Path, sweep: Path) -> None:
    (sweep / "expected.txt").write_text("0.5 1.25\n")
    script = _script(sweep, 'cmp -s "$1/out" expected.txt || { echo "out differs in $1"; '
                            'exit 1; }\necho fine\n')
    verdict = _judge(task, sweep, script=script)
    assert verdict.ok and verdict.output == "fine\n"
    (task / "out").write_text("other\n")
    verdict = _judge(task, sweep, script=script)
    assert verdict.status == f"invalid: check.sh exited 1: out differs in {task.resolve()}"


def test_a_check_scripts_reason_is_its_first_nonblank_line_from_stdout_or_stderr(
        task: Path, sweep: Path) -> None:
    script = _script(sweep, "echo\necho '  row 7 diverged  ' >&2\necho second\nexit 4\n")
    verdict = _judge(task, sweep, script=script)
    assert verdict.status == "invalid: check.sh exited 4: row 7 diverged"
    assert "second" in verdict.output
    script = _script(sweep, "exit 2\n")
    assert _judge(task, sweep, script=script).status == "invalid: check.sh exited 2 (no output)"
    script = _script(sweep, f"printf '%0{checks.REASON_LINE_CHARS + 50}d\\n' 0; exit 1\n")
    reason = _judge(task, sweep, script=script).reason
    assert reason.endswith("0" * checks.REASON_LINE_CHARS + "...")


def test_a_check_script_killed_by_a_signal(task: Path, sweep: Path) -> None:
    script = _script(sweep, "echo dying\nkill -SEGV $$\n")
    assert (_judge(task, sweep, script=script).status
            == "invalid: check.sh terminated by SIGSEGV: dying")


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_hanging_check_script_times_out_and_its_process_tree_is_killed(
        task: Path, sweep: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # A child in the background and the script itself ignore nothing but sleep for long.
    script = _script(sweep, f"sleep 300 &\necho $! > {pids}\necho checking\nsleep 300\n")
    started = time.monotonic()
    verdict = _judge(task, sweep, timeout=1, script=script)
    assert time.monotonic() - started < 1 + checks.proc.KILL_GRACE
    assert verdict.status == "invalid: check.sh timed out after 1 s"
    assert verdict.output == "checking\n"
    assert _wait_gone(int(pids.read_text()), 5), "the script's background child survived"


def test_a_check_script_that_ignores_sigterm_is_killed(task: Path, sweep: Path) -> None:
    script = _script(sweep, "trap '' TERM\nwhile :; do sleep 0.1; done\n")
    ran = checks.run_check([str(sweep / script)], cwd=sweep, timeout=0.5, kill_grace=0.5)
    assert ran.timed_out and ran.returncode == -9
    assert ran.elapsed < 3


def test_a_script_that_exits_leaving_a_child_holding_its_output_is_not_waited_for(
        task: Path, sweep: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = _script(sweep, f"sleep 300 &\necho $! > {pids}\necho done\nexit 0\n")
    started = time.monotonic()
    verdict = _judge(task, sweep, timeout=30, script=script)
    assert verdict.ok and verdict.output == "done\n"
    assert time.monotonic() - started < 5
    assert _wait_gone(int(pids.read_text()), 5), "the script's leftover child survived"


def test_a_check_scripts_output_is_kept_bounded(task: Path, sweep: Path) -> None:
    # 20 MB of output then a failure, and endless output until the timeout.
    script = _script(sweep, "echo first line\nhead -c 20000000 /dev/zero | tr '\\0' x\n"
                            "exit 1\n")
    verdict = _judge(task, sweep, script=script)
    assert verdict.status == "invalid: check.sh exited 1: first line"
    assert len(verdict.output) == checks.CHECK_OUTPUT_BYTES
    script = _script(sweep, "yes flood\n", name="flood.sh")
    verdict = _judge(task, sweep, timeout=1, script=script)
    assert verdict.status == "invalid: flood.sh timed out after 1 s"
    assert len(verdict.output) == checks.CHECK_OUTPUT_BYTES


def test_a_missing_or_unexecutable_check_script_makes_the_task_invalid(
        task: Path, sweep: Path) -> None:
    assert (_judge(task, sweep, script="nope.sh").status
            == "invalid: check script nope.sh not found in the sweep folder")
    (sweep / "plain.sh").write_text("#!/bin/sh\nexit 0\n")
    assert (_judge(task, sweep, script="plain.sh").status
            == "invalid: check script plain.sh is not executable")
    bad = sweep / "bad.sh"
    bad.write_text("#!/no/such/interpreter\n")
    bad.chmod(0o755)
    assert _judge(task, sweep, script="bad.sh").reason.startswith(
        "check script bad.sh could not start: cannot start")


def test_a_check_script_in_a_subfolder(task: Path, sweep: Path) -> None:
    (sweep / "tools").mkdir()
    _script(sweep / "tools", "test -s \"$1/out\"\n")
    assert _judge(task, sweep, script="tools/check.sh").ok


@pytest.mark.parametrize("script", ["../check.sh", "/bin/true", "tools/../../x", "a\0b"])
def test_a_check_script_outside_the_sweep_folder_is_the_callers_error(
        task: Path, sweep: Path, script: str) -> None:
    with pytest.raises(ValueError, match="relative to the sweep folder"):
        _judge(task, sweep, script=script)


def test_the_check_script_sees_no_terminal_on_stdin(task: Path, sweep: Path) -> None:
    script = _script(sweep, "cat > /dev/null; exit 0\n")  # would hang if stdin were open
    assert _judge(task, sweep, timeout=5, script=script).ok


def test_run_check_raises_when_the_program_cannot_start(sweep: Path) -> None:
    with pytest.raises(checks.proc.ProcessError, match="cannot start"):
        checks.run_check([str(sweep / "absent")], cwd=sweep, timeout=1)
