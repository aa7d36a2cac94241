"""Unit tests of cluster.sweep.spec (the sweep file) and cluster.sweep.names (its paths)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cluster.errors import SweepError
from cluster.sweep import spec as spec_module
from cluster.sweep.names import check_relative_path, path_problem, toml_key
from cluster.sweep.rules import CollectRule, ValidateRules
from cluster.sweep.spec import Input, Result, SweepSpec, load
from cluster.sweep.table import Axes, TableFile

REPO = Path(__file__).resolve().parents[2]

#: The issue's example, word for word (its comments included).
EXAMPLE = '''\
command = "python3 model.py --alpha {alpha} --n {n} > out.txt"
table = "params.csv"   # header row of names; separator ',' TAB or '|' (seed 002), found from the header
timeout = 120          # seconds per task
retries = 2            # a failed or invalid task is tried again, on another node when there is one
[inputs]               # files written into the task's folder before the command runs
"config.ini" = "alpha = {alpha}\\nn = {n}\\n"
[results]              # name = "stdout" | "stderr" | a file the command leaves in its folder
out = "out.txt"
log = "stdout"
[validate]             # all optional
exit_status = [0]
nonempty = ["out"]
match = { log = "converged" }      # a regular expression each named result must contain
script = "check.sh"                # run on the master with the task's result folder; exit 0 = valid
[collect]              # files made on the master from all valid results, in task order
"all.txt" = { from = "out" }                  # plain concatenation
"by-alpha/{alpha}.txt" = { from = "out" }     # blockwise: one file per value of a column
'''  # noqa: E501 (the issue's lines as they are)

#: The smallest sweep file: a command and its rows.
MINIMAL = 'command = "echo {a}"\ntable = "params.csv"\n'


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A sweep folder with a table and a check script."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "params.csv").write_text("alpha,n\n0.1,10\n0.2,100\n", encoding="utf-8")
    (sweep / "check.sh").write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    return sweep


def load_text(folder: Path, text: str) -> SweepSpec:
    path = folder / "sweep.toml"
    path.write_text(text, encoding="utf-8")
    return load(path)


def refused(folder: Path, text: str) -> SweepError:
    with pytest.raises(SweepError) as info:
        load_text(folder, text)
    assert info.value.where == "sweep.toml"
    return info.value


# ---------------------------------------------------------------------------------------
# What a good file gives


def test_the_issues_example_gives_every_key(folder: Path) -> None:
    spec = load_text(folder, EXAMPLE)
    assert spec.path == folder / "sweep.toml"
    assert spec.folder == folder.resolve()
    assert spec.command == "python3 model.py --alpha {alpha} --n {n} > out.txt"
    assert spec.table == "params.csv"
    assert spec.axes is None
    assert spec.timeout == 120.0
    assert spec.retries == 2
    assert spec.inputs == (Input("config.ini", "alpha = {alpha}\nn = {n}\n"),)
    assert spec.results == (Result("out", "out.txt"), Result("log", "stdout"))
    assert spec.validate == ValidateRules(exit_status=(0,), nonempty=("out",),
                                          match=(("log", "converged"),), script="check.sh")
    assert spec.collect == (CollectRule("all.txt", "out"),
                            CollectRule("by-alpha/{alpha}.txt", "out"))
    assert spec.run == ()
    rows = spec.rows()
    assert isinstance(rows, TableFile)
    assert rows.header == ("alpha", "n")
    assert [row.values for row in rows] == [("0.1", "10"), ("0.2", "100")]


def test_the_documented_example_is_a_good_sweep_file(folder: Path) -> None:
    """docs/sweeps.md's first TOML block is the issue's example and loads."""
    doc = (REPO / "docs" / "sweeps.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", doc, re.S)
    assert block is not None
    assert block.group(1) == EXAMPLE
    assert load_text(folder, block.group(1)).command.startswith("python3 model.py")


def test_the_defaults_of_a_minimal_file(folder: Path) -> None:
    spec = load_text(folder, MINIMAL)
    assert spec.timeout == spec_module.DEFAULT_TIMEOUT
    assert spec.retries == spec_module.DEFAULT_RETRIES == 0
    assert spec.inputs == spec.results == spec.collect == ()
    assert spec.validate == ValidateRules(exit_status=(0,))
    assert spec.run == ()


def test_axes_instead_of_a_table(folder: Path) -> None:
    spec = load_text(folder, 'command = "m {alpha} {n}"\n[axes]\nalpha = [0.1, 0.2]\n'
                     'n = [10, 100]\n')
    assert spec.table == ""
    assert isinstance(spec.axes, Axes)
    rows = spec.rows()
    assert rows is spec.axes
    assert rows.header == ("alpha", "n")
    assert [row.values for row in rows] == [("0.1", "10"), ("0.1", "100"), ("0.2", "10"),
                                            ("0.2", "100")]


def test_axes_errors_name_the_sweep_file(folder: Path) -> None:
    error = refused(folder, 'command = "x"\n[axes]\nalpha = []\n')
    assert error.key == "axes.alpha"


def test_a_table_in_a_subfolder(folder: Path) -> None:
    (folder / "data").mkdir()
    (folder / "data" / "p.tsv").write_text("a\tb\n1\t2\n", encoding="utf-8")
    spec = load_text(folder, 'command = "x"\ntable = "data/p.tsv"\n')
    rows = spec.rows()
    assert rows.where == "data/p.tsv"
    assert rows.header == ("a", "b")


def test_the_run_table_becomes_the_runs_option_words(folder: Path) -> None:
    """The [run] table's checks are tests/unit/test_sweep_runtable.py's; load applies them."""
    spec = load_text(folder, MINIMAL + '[run]\njob_timeout = "2h"\nexclusive = true\n')
    assert spec.run == ("exclusive", "job_timeout=2h")
    assert refused(folder, MINIMAL + "[run]\nslots = 4\n").key == "run.slots"


def test_stdout_and_stderr_results_are_streams(folder: Path) -> None:
    spec = load_text(folder, MINIMAL + '[results]\no = "stdout"\ne = "stderr"\n'
                     'f = "sub/dir/f.bin"\n')
    assert [r.is_stream for r in spec.results] == [True, True, False]
    assert spec.result("f") == Result("f", "sub/dir/f.bin")
    with pytest.raises(KeyError):
        spec.result("nope")


def test_a_float_timeout_and_the_bounds_are_taken(folder: Path) -> None:
    assert load_text(folder, MINIMAL + "timeout = 0.5\n").timeout == 0.5
    assert load_text(folder, MINIMAL + f"timeout = {int(spec_module.MAX_TIMEOUT)}\n"
                     ).timeout == spec_module.MAX_TIMEOUT
    assert load_text(folder, MINIMAL + "retries = 0\n").retries == 0
    assert load_text(folder, MINIMAL + f"retries = {spec_module.MAX_RETRIES}\n"
                     ).retries == spec_module.MAX_RETRIES


def test_a_sweep_file_found_through_a_relative_path(folder: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "sweep.toml").write_text(MINIMAL, encoding="utf-8")
    monkeypatch.chdir(folder)
    spec = load(Path("sweep.toml"))
    assert spec.folder == folder.resolve()
    assert spec.rows().header == ("alpha", "n")


# ---------------------------------------------------------------------------------------
# The file itself


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="cannot read the sweep file"):
        load(tmp_path / "sweep.toml")


def test_a_file_that_is_not_toml_is_refused_with_the_line(folder: Path) -> None:
    error = refused(folder, 'command = "x"\ntable = \n')
    assert "not valid TOML" in str(error)
    assert "line 2" in str(error)


def test_duplicate_keys_are_refused_by_toml(folder: Path) -> None:
    error = refused(folder, MINIMAL + '[results]\nout = "a"\nout = "b"\n')
    assert "not valid TOML" in str(error)


def test_a_file_that_is_not_utf8_is_refused(folder: Path) -> None:
    (folder / "sweep.toml").write_bytes(b'command = "\xff"\n')
    with pytest.raises(SweepError, match="not UTF-8"):
        load(folder / "sweep.toml")


def test_a_file_too_large_is_refused(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_module, "MAX_FILE_BYTES", len(MINIMAL))
    assert load_text(folder, MINIMAL).command == "echo {a}"
    error = refused(folder, MINIMAL + "\n")
    assert f"larger than {len(MINIMAL)} bytes" in str(error)


@pytest.mark.parametrize(("extra", "key"), [
    ("retires = 2\n", "retires"),
    ("[inputz]\n", "inputz"),
    ('"with space" = 1\n', '"with space"'),
])
def test_an_unknown_top_key_is_refused_naming_it(folder: Path, extra: str, key: str) -> None:
    error = refused(folder, extra + MINIMAL)
    assert error.key == key
    assert "unknown key: expected one of command, table, axes, timeout, retries" in str(error)


def test_unknown_keys_in_validate_and_collect_are_refused(folder: Path) -> None:
    error = refused(folder, MINIMAL + "[validate]\nexitstatus = [0]\n")
    assert error.key == "validate.exitstatus"
    assert "expected one of exit_status, nonempty, match, script" in str(error)
    error = refused(folder, MINIMAL + '[results]\no = "stdout"\n[collect]\n'
                    '"a.txt" = { from = "o", sort = true }\n')
    assert error.key == 'collect."a.txt".sort'
    assert "expected one of from" in str(error)


# ---------------------------------------------------------------------------------------
# command, table and axes, timeout, retries


@pytest.mark.parametrize(("text", "message"), [
    ('table = "params.csv"\n', "missing: expected the command pattern"),
    ('command = 3\ntable = "params.csv"\n', "got an integer, expected a string"),
    ('command = ["echo", "x"]\ntable = "params.csv"\n', "got a list, expected a string"),
    ('command = "  "\ntable = "params.csv"\n', "empty: expected a command pattern"),
    ('command = "a\\u0000b"\ntable = "params.csv"\n', "holds a NUL"),
])
def test_a_bad_command_is_refused(folder: Path, text: str, message: str) -> None:
    error = refused(folder, text)
    assert error.key == "command"
    assert message in str(error)


def test_a_command_too_long_is_refused(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_module, "MAX_COMMAND_CHARS", 8)
    assert load_text(folder, 'command = "12345678"\ntable = "params.csv"\n')
    error = refused(folder, 'command = "123456789"\ntable = "params.csv"\n')
    assert "longer than 8 characters" in str(error)


@pytest.mark.parametrize(("text", "said"), [
    ('command = "x"\n', "neither"),
    ('command = "x"\ntable = "params.csv"\n[axes]\na = [1]\n', "both"),
])
def test_exactly_one_of_table_and_axes(folder: Path, text: str, said: str) -> None:
    error = refused(folder, text)
    assert error.key == "table"
    assert str(error).endswith(f"expected exactly one of 'table' (a parameter table file) "
                               f"and [axes] (name = [values], the cross product), got {said}")


@pytest.mark.parametrize(("table", "message"), [
    ("../params.csv", "has a '..' component"),
    ("/etc/passwd", "is an absolute path"),
    ("", "is empty"),
    ("a\\\\b", "holds a backslash"),
    ("data//p.csv", "has an empty component"),
    ("nope.csv", "'nope.csv' is not there"),
])
def test_a_bad_table_path_is_refused(folder: Path, table: str, message: str) -> None:
    error = refused(folder, f'command = "x"\ntable = "{table}"\n')
    assert error.key == "table"
    assert message in str(error)


def test_a_table_that_is_a_folder_is_refused(folder: Path) -> None:
    (folder / "data").mkdir()
    error = refused(folder, 'command = "x"\ntable = "data"\n')
    assert "is not a regular file" in str(error)


def test_a_table_linked_from_outside_the_folder_is_refused(folder: Path) -> None:
    outside = folder.parent / "secret.csv"
    outside.write_text("a\n1\n", encoding="utf-8")
    (folder / "link.csv").symlink_to(outside)
    error = refused(folder, 'command = "x"\ntable = "link.csv"\n')
    assert "'link.csv' leads outside the sweep folder" in str(error)


def test_a_table_linked_inside_the_folder_is_taken(folder: Path) -> None:
    (folder / "link.csv").symlink_to("params.csv")
    assert load_text(folder, 'command = "x"\ntable = "link.csv"\n').table == "link.csv"


def test_table_and_axes_of_the_wrong_type(folder: Path) -> None:
    assert refused(folder, 'command = "x"\ntable = 3\n').key == "table"
    error = refused(folder, 'command = "x"\naxes = [1, 2]\n')
    assert error.key == "axes"
    assert "got a list, expected a table ([axes])" in str(error)


@pytest.mark.parametrize("value", ["0", "-1", "0.0", "604801", "inf", "nan", "-inf"])
def test_a_timeout_out_of_bounds_is_refused(folder: Path, value: str) -> None:
    error = refused(folder, MINIMAL + f"timeout = {value}\n")
    assert error.key == "timeout"
    assert "expected seconds per task, more than 0 and at most 604800 (7 days)" in str(error)


@pytest.mark.parametrize("value", ["true", '"120"', "[120]"])
def test_a_timeout_that_is_no_number_is_refused(folder: Path, value: str) -> None:
    error = refused(folder, MINIMAL + f"timeout = {value}\n")
    assert error.key == "timeout"
    assert "expected a number" in str(error)


@pytest.mark.parametrize("value", ["-1", "11", "1.5", "true", '"2"'])
def test_bad_retries_are_refused(folder: Path, value: str) -> None:
    error = refused(folder, MINIMAL + f"retries = {value}\n")
    assert error.key == "retries"


# ---------------------------------------------------------------------------------------
# Hostile and bad names: inputs, results, collect targets, the script

HOSTILE = [
    ("../x", "has a '..' component"),
    ("a/../../x", "has a '..' component"),
    ("./x", "has a '.' component"),
    ("/etc/passwd", "is an absolute path"),
    ("x\\u0000y", "holds a NUL"),
    ("a\\\\b", "holds a backslash"),
    ("a//b", "has an empty component"),
    ("a/", "has an empty component"),
    ("", "is empty"),
    ("a\\nb", "holds a control character"),
]


@pytest.mark.parametrize(("name", "message"), HOSTILE)
def test_a_hostile_input_name_is_refused_naming_it(folder: Path, name: str,
                                                   message: str) -> None:
    error = refused(folder, MINIMAL + f'[inputs]\n"{name}" = "text"\n')
    assert error.key.startswith("inputs.")
    assert message in str(error)
    assert "the input name" in str(error)
    assert "expected a relative path" in str(error)


@pytest.mark.parametrize(("name", "message"), HOSTILE)
def test_a_hostile_result_name_is_refused_naming_it(folder: Path, name: str,
                                                    message: str) -> None:
    error = refused(folder, MINIMAL + f'[results]\n"{name}" = "stdout"\n')
    assert error.key.startswith("results.")
    assert "the result name" in str(error)
    assert message in str(error)


@pytest.mark.parametrize(("source", "message"), HOSTILE[:-2])
def test_a_hostile_result_file_is_refused_naming_it(folder: Path, source: str,
                                                    message: str) -> None:
    error = refused(folder, MINIMAL + f'[results]\nout = "{source}"\n')
    assert error.key == "results.out"
    assert "the result file" in str(error)
    assert message in str(error)


@pytest.mark.parametrize(("target", "message"), HOSTILE)
def test_a_hostile_collect_target_is_refused_naming_it(folder: Path, target: str,
                                                       message: str) -> None:
    error = refused(folder, MINIMAL + f'[results]\no = "stdout"\n[collect]\n'
                    f'"{target}" = {{ from = "o" }}\n')
    assert error.key.startswith("collect.")
    assert "the collect target" in str(error)
    assert message in str(error)


@pytest.mark.parametrize(("script", "message"), HOSTILE[:-1] + [("nope.sh", "is not there")])
def test_a_hostile_script_path_is_refused_naming_it(folder: Path, script: str,
                                                    message: str) -> None:
    error = refused(folder, MINIMAL + f'[validate]\nscript = "{script}"\n')
    assert error.key == "validate.script"
    assert "the check script" in str(error)
    assert message in str(error)


def test_a_script_linked_from_outside_the_folder_is_refused(folder: Path) -> None:
    (folder / "check-link.sh").symlink_to("/bin/true")
    error = refused(folder, MINIMAL + '[validate]\nscript = "check-link.sh"\n')
    assert "leads outside the sweep folder" in str(error)


def test_a_script_in_a_folder_linked_from_outside_is_refused(folder: Path) -> None:
    outside = folder.parent / "elsewhere"
    outside.mkdir()
    (outside / "check.sh").write_text("exit 0\n", encoding="utf-8")
    (folder / "tools").symlink_to(outside)
    error = refused(folder, MINIMAL + '[validate]\nscript = "tools/check.sh"\n')
    assert "leads outside the sweep folder" in str(error)


def test_the_error_shows_the_key_in_tomls_dotted_form(folder: Path) -> None:
    error = refused(folder, MINIMAL + '[inputs]\n"../x" = "t"\n')
    assert error.key == 'inputs."../x"'
    assert str(error).startswith("sweep.toml: key inputs.\"../x\": the input name '../x' is "
                                 "refused: it has a '..' component")


@pytest.mark.parametrize("name", ["a/b", ".hidden", "-x", "a b", "x" * 65, "a{b}"])
def test_a_result_name_must_be_a_plain_file_name(folder: Path, name: str) -> None:
    error = refused(folder, MINIMAL + f'[results]\n"{name}" = "stdout"\n')
    assert "the result name" in str(error)


def test_good_result_names(folder: Path) -> None:
    spec = load_text(folder, MINIMAL + '[results]\n"out.txt" = "stdout"\n"A_b-1.2" = "x"\n'
                     '"_" = "y"\n')
    assert [r.name for r in spec.results] == ["out.txt", "A_b-1.2", "_"]


def test_input_names_and_result_files_are_literal(folder: Path) -> None:
    error = refused(folder, MINIMAL + '[inputs]\n"in-{alpha}.txt" = "x"\n')
    assert "holds the placeholder {alpha}: expected a literal name" in str(error)
    error = refused(folder, MINIMAL + '[results]\nout = "out-{#}.txt"\n')
    assert error.key == "results.out"
    assert "holds the placeholder {#}" in str(error)
    spec = load_text(folder, MINIMAL + '[inputs]\n"{not a placeholder}" = "x"\n')
    assert spec.inputs[0].name == "{not a placeholder}"


def test_inputs_in_subfolders_are_taken(folder: Path) -> None:
    spec = load_text(folder, MINIMAL + '[inputs]\n"conf/a.ini" = "x"\n"conf/b.ini" = "y"\n')
    assert [i.name for i in spec.inputs] == ["conf/a.ini", "conf/b.ini"]


def test_an_input_below_another_input_file_is_refused(folder: Path) -> None:
    error = refused(folder, MINIMAL + '[inputs]\n"conf" = "x"\n"conf/a.ini" = "y"\n')
    assert error.key == 'inputs."conf/a.ini"'
    assert "needs 'conf' to be a folder, but 'conf' is an input file too" in str(error)


def test_an_input_that_is_not_text_is_refused(folder: Path) -> None:
    error = refused(folder, MINIMAL + '[inputs]\n"a.ini" = 3\n')
    assert error.key == 'inputs."a.ini"'
    assert "got an integer, expected the file's text" in str(error)


def test_an_input_text_too_long_is_refused(folder: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_module, "MAX_INPUT_CHARS", 4)
    assert load_text(folder, MINIMAL + '[inputs]\na = "1234"\n').inputs[0].text == "1234"
    error = refused(folder, MINIMAL + '[inputs]\na = "12345"\n')
    assert "longer than 4 characters" in str(error)


@pytest.mark.parametrize(("table", "value"), [
    ("inputs", "3"), ("results", '"x"'), ("validate", "[0]"), ("collect", "1"), ("run", '"x"')])
def test_a_section_that_is_no_table_is_refused(folder: Path, table: str, value: str) -> None:
    error = refused(folder, f"{table} = {value}\n" + MINIMAL)
    assert error.key == table
    assert f"expected a table ([{table}])" in str(error)


def test_a_result_that_is_no_string_is_refused(folder: Path) -> None:
    error = refused(folder, MINIMAL + "[results]\nout = 1\n")
    assert 'expected "stdout", "stderr" or a file the command leaves' in str(error)


# ---------------------------------------------------------------------------------------
# [validate] and [collect]

RESULTS = '[results]\nout = "out.txt"\nlog = "stdout"\n'


def test_validate_takes_several_exit_statuses(folder: Path) -> None:
    spec = load_text(folder, MINIMAL + "[validate]\nexit_status = [0, 1, 255]\n")
    assert spec.validate.exit_status == (0, 1, 255)


@pytest.mark.parametrize("value", ["[]", "0", "[256]", "[-1]", "[true]", '["0"]', "[0.0]"])
def test_bad_exit_statuses_are_refused(folder: Path, value: str) -> None:
    error = refused(folder, MINIMAL + f"[validate]\nexit_status = {value}\n")
    assert error.key == "validate.exit_status"
    assert "expected a list of at least one exit status, each a whole number 0..255" \
        in str(error)


def test_nonempty_and_match_must_name_results(folder: Path) -> None:
    error = refused(folder, MINIMAL + RESULTS + '[validate]\nnonempty = ["out", "outt"]\n')
    assert error.key == "validate.nonempty"
    assert "'outt' is not a result: expected one of [results] (out, log)" in str(error)
    error = refused(folder, MINIMAL + RESULTS + '[validate]\nmatch = { lg = "x" }\n')
    assert error.key == "validate.match.lg"
    error = refused(folder, MINIMAL + '[validate]\nnonempty = ["out"]\n')
    assert "(none: [results] is empty)" in str(error)


def test_nonempty_and_match_of_the_wrong_type(folder: Path) -> None:
    assert refused(folder, MINIMAL + RESULTS + '[validate]\nnonempty = "out"\n'
                   ).key == "validate.nonempty"
    assert refused(folder, MINIMAL + RESULTS + '[validate]\nnonempty = [1]\n'
                   ).key == "validate.nonempty"
    assert refused(folder, MINIMAL + RESULTS + '[validate]\nmatch = ["x"]\n'
                   ).key == "validate.match"
    error = refused(folder, MINIMAL + RESULTS + '[validate]\nmatch = { log = 1 }\n')
    assert error.key == "validate.match.log"
    assert "expected a regular expression" in str(error)
    assert refused(folder, MINIMAL + '[validate]\nscript = 1\n').key == "validate.script"


def test_a_bad_regular_expression_is_refused(folder: Path) -> None:
    error = refused(folder, MINIMAL + RESULTS + "[validate]\nmatch = { log = 'conv(erged' }\n")
    assert error.key == "validate.match.log"
    assert "not a regular expression (missing ), unterminated subpattern" in str(error)


def test_a_regular_expression_too_long_is_refused(folder: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_module, "MAX_PATTERN_CHARS", 3)
    error = refused(folder, MINIMAL + RESULTS + "[validate]\nmatch = { log = 'abcd' }\n")
    assert "longer than 3 characters" in str(error)


def test_collect_entries(folder: Path) -> None:
    error = refused(folder, MINIMAL + RESULTS + '[collect]\n"a.txt" = "out"\n')
    assert error.key == 'collect."a.txt"'
    assert 'expected { from = "<result name>" }' in str(error)
    error = refused(folder, MINIMAL + RESULTS + '[collect]\n"a.txt" = {}\n')
    assert error.key == 'collect."a.txt".from'
    error = refused(folder, MINIMAL + RESULTS + '[collect]\n"a.txt" = { from = "nope" }\n')
    assert error.key == 'collect."a.txt".from'
    assert "'nope' is not a result" in str(error)


# ---------------------------------------------------------------------------------------
# names.py


def test_toml_key_quotes_only_what_is_not_bare() -> None:
    assert toml_key("validate", "exit_status") == "validate.exit_status"
    assert toml_key("results", "../x") == 'results."../x"'
    assert toml_key("inputs", 'a"b\\c') == 'inputs."a\\"b\\\\c"'
    assert toml_key("inputs", "a\0b") == 'inputs."a\\u0000b"'


@pytest.mark.parametrize("path", ["a", "a/b/c.txt", "by-alpha/{alpha}.txt", "..a", "a..",
                                  "~", "a b", "日本.txt", "x" * 255])
def test_good_relative_paths(path: str) -> None:
    assert path_problem(path) == ""


@pytest.mark.parametrize(("path", "problem"), [
    ("x" * 256, "a component is longer than 255 characters"),
    ("a/" * 600 + "b", "it is longer than 1024 characters"),
    ("a\x7fb", "it holds a control character"),
    ("..", "it has a '..' component"),
    (".", "it has a '.' component"),
    ("a/./b", "it has a '.' component"),
])
def test_bad_relative_paths(path: str, problem: str) -> None:
    assert path_problem(path) == problem
    with pytest.raises(SweepError):
        check_relative_path(path, "w", "k", "the name")


def test_a_hostile_name_never_leaves_the_folder(tmp_path: Path) -> None:
    """Every name the check lets through, joined to a folder, stays inside it."""
    base = tmp_path / "task"
    base.mkdir()
    candidates = ["a", "a/b", "../a", "a/../../b", "/abs", "a/./b", "...", "a/...", ".../x",
                  "....//", "a\\..\\b", "\\..", "x/..", "..\\x"]
    for name in candidates:
        if path_problem(name) == "":
            resolved = os.path.normpath(os.path.join(base, name))
            assert resolved.startswith(str(base) + os.sep), name
