"""Unit tests of cluster.sweep.expand: a row to a task (placeholders, quoting, task ids).

The quoting is checked by running the expanded commands through the real ``sh``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import os
import subprocess
import types
from pathlib import Path

import pytest

from cluster.errors import SweepError
from cluster.sweep import collect, expand
from cluster.sweep.expand import (
    MAX_COMMAND_BYTES,
    SLOT_TEXT,
    SLOT_VARIABLE,
    Expander,
    Task,
    task_id,
    tasks,
)
from cluster.sweep.spec import SweepSpec, load
from cluster.sweep.table import Row

HOSTILE_VALUES = ["a b;rm x", "", "'", "''", "it's", '"', "$(touch pwned)", "`touch pwned`",
                  "$HOME", "${HOME}", "*", "-n", "a\\b", "\\", "{alpha}", "{%}", "{#}",
                  "\t", " lead", "trail ", "~", "!", "#x", "日本", "a\x01b", "&&", "|", ">o"]


def make_sweep(folder: Path, text: str, table: str = "alpha|n\n0.1|10\n0.2|100\n") -> SweepSpec:
    folder.mkdir(exist_ok=True)
    (folder / "params.csv").write_text(table, encoding="utf-8")
    (folder / "sweep.toml").write_text(text, encoding="utf-8")
    return load(folder / "sweep.toml")


def sweep_of(tmp_path: Path, command: str, extra: str = "",
             table: str = "alpha|n\n0.1|10\n0.2|100\n") -> SweepSpec:
    text = f"command = '''{command}'''\ntable = \"params.csv\"\n{extra}"
    return make_sweep(tmp_path / "sweep", text, table)


def shell_argv(command: str, slot: str = "1") -> list[str]:
    """What ``sh`` passes as arguments to ``printf`` at the head of ``command``."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=10,
                          env={"PATH": os.environ["PATH"], SLOT_VARIABLE: slot, "HOME": "/h"})
    assert done.returncode == 0, done.stderr
    return done.stdout.decode("utf-8").split("\0")[:-1]


def refused(tmp_path: Path, command: str, extra: str = "") -> SweepError:
    spec = sweep_of(tmp_path, command, extra)
    with pytest.raises(SweepError) as info:
        tasks(spec)
    return info.value


# ---------------------------------------------------------------------------------------
# The command


def test_the_issues_example_expands(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "python3 model.py --alpha {alpha} --n {n} > out.txt",
                    '[inputs]\n"config.ini" = "alpha = {alpha}\\nn = {n}\\n"\n'
                    '[results]\nout = "out.txt"\n[collect]\n"all.txt" = { from = "out" }\n'
                    '"by-alpha/{alpha}.txt" = { from = "out" }\n')
    made = list(tasks(spec))
    assert [t.command for t in made] == [
        "python3 model.py --alpha 0.1 --n 10 > out.txt",
        "python3 model.py --alpha 0.2 --n 100 > out.txt"]
    assert [t.inputs for t in made] == [(("config.ini", "alpha = 0.1\nn = 10\n"),),
                                        (("config.ini", "alpha = 0.2\nn = 100\n"),)]
    assert [t.collect_targets for t in made] == [("all.txt", "by-alpha/0.1.txt"),
                                                 ("all.txt", "by-alpha/0.2.txt")]
    assert [t.number for t in made] == [1, 2]
    assert [t.row for t in made] == [Row(1, ("0.1", "10"), "params.csv:2"),
                                     Row(2, ("0.2", "100"), "params.csv:3")]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_every_value_stays_one_argument_in_the_shell(tmp_path: Path, value: str) -> None:
    """Whatever a value holds, the shell gets it back as one argument, byte for byte, and
    runs nothing of it."""
    line = io.StringIO()
    csv.writer(line, lineterminator="\n").writerow([value, "w"])
    table = "v,w\n" + line.getvalue()   # two columns: an empty value is no blank line
    spec = sweep_of(tmp_path, "printf '%s\\0' {v} {v}x", table=table)
    (task,) = list(tasks(spec))
    cwd = tmp_path / "run"
    cwd.mkdir()
    done = subprocess.run(["sh", "-c", task.command], capture_output=True, timeout=10,
                          cwd=cwd, env={"PATH": os.environ["PATH"], "HOME": "/h"})
    assert done.returncode == 0
    assert done.stdout.decode("utf-8").split("\0")[:-1] == [value, value + "x"]
    assert list(cwd.iterdir()) == []


def test_the_issues_hostile_value_is_quoted(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "echo {v}", table="v\na b;rm x\n")
    assert next(tasks(spec)).command == "echo 'a b;rm x'"


def test_the_task_number_and_the_slot(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "printf '%s\\0' {#} {%} task{#}-slot{%} {alpha}")
    made = list(tasks(spec))
    assert made[1].command == f"printf '%s\\0' 2 {SLOT_TEXT} task2-slot{SLOT_TEXT} 0.2"
    assert SLOT_TEXT == "${CLUSTER_SLOT}"
    assert shell_argv(made[1].command, slot="3") == ["2", "3", "task2-slot3", "0.2"]


def test_a_value_that_looks_like_the_slot_is_never_the_slot(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "printf '%s\\0' {v}", table="v\n{%}\n${CLUSTER_SLOT}\n")
    assert [shell_argv(t.command, slot="7") for t in tasks(spec)] == [["{%}"],
                                                                     ["${CLUSTER_SLOT}"]]


@pytest.mark.parametrize("text", [
    "${HOME}", "${#}", "$#", "awk '{print $1}'", "{a,b}", "{1..3}", "{ alpha }", "{}",
    "{{alpha}}x", "f(){ :; }", "{alpha\"\"}", "{alpha-1}", "{9}", "{#x}", "{%%}",
    "$${alpha}"])
def test_other_braces_stay_as_they_are(tmp_path: Path, text: str) -> None:
    spec = sweep_of(tmp_path, "echo " + text, table="alpha|ALPHA_\n1|2\n")
    expected = "echo " + text
    if "{{alpha}}" in text:  # the inner {alpha} is a placeholder, its braces stay
        expected = "echo {1}x"
    assert next(tasks(spec)).command == expected


def test_an_unknown_placeholder_in_the_command_is_refused_naming_it(tmp_path: Path) -> None:
    error = refused(tmp_path, "run {alpha} {alhpa}")
    assert error.key == "command"
    assert error.where == "sweep.toml"
    assert str(error).startswith("sweep.toml: key command: unknown placeholder {alhpa}: "
                                 "expected one of the table's columns (alpha, n), {#}, {%}")


def test_placeholders_are_checked_before_any_row_is_read(tmp_path: Path) -> None:
    """The table's second line is ragged: the unknown placeholder is what is reported."""
    spec = sweep_of(tmp_path, "run {nope}", table="alpha|n\n1\n")
    with pytest.raises(SweepError, match=r"unknown placeholder \{nope\}"):
        tasks(spec)
    spec = sweep_of(tmp_path, "run {alpha}", table="alpha|n\n1\n")
    made = tasks(spec)
    with pytest.raises(SweepError, match="params.csv:2: the line has 1 cells"):
        next(made)


def test_placeholders_are_case_sensitive(tmp_path: Path) -> None:
    assert refused(tmp_path, "run {Alpha}").key == "command"


# ---------------------------------------------------------------------------------------
# Inputs and collect targets


def test_input_texts_take_values_verbatim_and_the_task_number(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "true", '[inputs]\n"a.json" = \'{ "v": "{v}", "task": {#} }\'\n'
                    '"b.txt" = "${HOME} {v}"\n', table="v\na b;'x'\n")
    assert next(tasks(spec)).inputs == (("a.json", '{ "v": "a b;\'x\'", "task": 1 }'),
                                        ("b.txt", "${HOME} a b;'x'"))


def test_an_unknown_placeholder_in_an_input_is_refused_naming_it(tmp_path: Path) -> None:
    error = refused(tmp_path, "true", '[inputs]\n"config.ini" = "n = {nn}"\n')
    assert error.key == 'inputs."config.ini"'
    assert "unknown placeholder {nn}: expected one of the table's columns (alpha, n), {#}" \
        in str(error)


def test_the_slot_is_refused_in_inputs(tmp_path: Path) -> None:
    error = refused(tmp_path, "true", '[inputs]\n"a" = "slot {%}"\n')
    assert error.key == "inputs.a"
    assert "{%} (the slot) is known only when the command runs on its node" in str(error)


COLLECT = '[results]\nout = "stdout"\n[collect]\n'


@pytest.mark.parametrize("placeholder", ["{#}", "{%}"])
def test_collect_targets_take_column_names_only(tmp_path: Path, placeholder: str) -> None:
    error = refused(tmp_path, "true", COLLECT + f'"x{placeholder}" = {{ from = "out" }}\n')
    assert error.key == f'collect."x{placeholder}"'
    assert f"{placeholder} is not allowed in a collect target" in str(error)


def test_an_unknown_column_in_a_collect_target_is_refused(tmp_path: Path) -> None:
    error = refused(tmp_path, "true", COLLECT + '"by/{alfa}.txt" = { from = "out" }\n')
    assert error.key == 'collect."by/{alfa}.txt"'
    assert "unknown placeholder {alfa}: expected one of the table's columns (alpha, n);" \
        in str(error)


def test_collect_targets_with_several_columns(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "true", COLLECT + '"{n}/{alpha}-{n}.txt" = { from = "out" }\n')
    assert [t.collect_targets for t in tasks(spec)] == [("10/0.1-10.txt",),
                                                        ("100/0.2-100.txt",)]


@pytest.mark.parametrize(("value", "problem"), [
    ("..", "it has a '..' component"), (".", "it has a '.' component"),
    ("", "it is an absolute path"),
    ("a\\b", "it holds a backslash"), ("a\x01", "it holds a control character")])
def test_a_value_that_makes_a_collect_target_leave_is_refused(tmp_path: Path, value: str,
                                                             problem: str) -> None:
    spec = sweep_of(tmp_path, "true", COLLECT + '"{v}/all.txt" = { from = "out" }\n',
                    table=f"v|w\nok|w\n{value}|w\n")
    made = tasks(spec)
    assert next(made).collect_targets == ("ok/all.txt",)
    with pytest.raises(SweepError) as info:
        next(made)
    assert info.value.where == "params.csv:3"
    assert info.value.key == 'collect."{v}/all.txt"'
    assert f"which is refused: {problem}" in str(info.value)


@pytest.mark.parametrize(("value", "name"), [
    ("a/b", "by/a%2Fb.txt"), ("/etc", "by/%2Fetc.txt"), ("a//b", "by/a%2F%2Fb.txt"),
    ("50%", "by/50%25.txt"), ("../x", "by/..%2Fx.txt")])
def test_a_value_in_a_collect_target_is_encoded_as_the_collection_names_it(
        tmp_path: Path, value: str, name: str) -> None:
    """One rule for collected file names: a value's '/' never makes a folder level (the
    collection, cluster.sweep.collect, encodes it so; expansion says the same name)."""
    spec = sweep_of(tmp_path, "true", COLLECT + '"by/{v}.txt" = { from = "out" }\n',
                    table=f"v\n{value}\n")
    task = next(tasks(spec))
    assert task.collect_targets == (name,)
    assert collect.substitute("by/{v}.txt", {"v": value}) == name


# ---------------------------------------------------------------------------------------
# Task ids


def test_the_task_id_is_the_documented_hash(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "run {alpha} {n}")
    first = next(tasks(spec))
    hashed = (b"cluster-sweep-task 1\n" + b"run 0.1 10\0" + b"alpha=0.1\0" + b"n=10\0")
    assert first.task_id == hashlib.sha256(hashed).hexdigest()[:24]
    assert first.task_id == task_id("run 0.1 10", ("alpha", "n"), ("0.1", "10"))


def test_a_pinned_task_id_stays_the_same_across_versions() -> None:
    """The bytes are fixed: a change here breaks every user's resume."""
    assert task_id("echo 'a b'", ("v",), ("a b",)) == hashlib.sha256(
        b"cluster-sweep-task 1\necho 'a b'\0v=a b\0").hexdigest()[:24]
    assert task_id("echo 'a b'", ("v",), ("a b",)) == "be5893b1582cdad72800d39b"


def test_task_ids_are_stable_and_tell_tasks_apart(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "run {alpha}", table="alpha|n\n1|2\n1|3\n1|2\n")
    ids = [t.task_id for t in tasks(spec)]
    again = [t.task_id for t in tasks(load(spec.path))]
    assert ids == again
    assert ids[0] != ids[1]          # the row differs, though the command does not
    assert ids[0] == ids[2]          # equal rows are the same task
    other = sweep_of(tmp_path, "run  {alpha}", table="alpha|n\n1|2\n")
    assert next(tasks(other)).task_id != ids[0]   # the command differs


def test_the_task_number_changes_the_id_only_through_the_command(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "run {alpha} {#}", table="alpha\n1\n1\n")
    first, second = list(tasks(spec))
    assert first.task_id != second.task_id


def test_the_hashed_bytes_are_unambiguous() -> None:
    assert task_id("c", ("a", "b"), ("xy", "")) != task_id("c", ("a", "b"), ("x", "y"))
    assert task_id("c", ("a",), ("b",)) != task_id("c", ("b",), ("b",))
    for command, header, values in [("c\0a=b", (), ()), ("c", ("a",), ("b\0",)),
                                    ("c", ("a=b",), ("c",)), ("c", ("a\0",), ("b",))]:
        with pytest.raises(ValueError, match="without NUL"):
            task_id(command, header, values)


def test_the_id_hashes_the_slot_as_its_variable(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "run {%}", table="alpha\n1\n")
    task = next(tasks(spec))
    assert task.task_id == task_id("run ${CLUSTER_SLOT}", ("alpha",), ("1",))


# ---------------------------------------------------------------------------------------
# Limits, streams, axes


def test_a_command_too_long_for_linux_is_refused_naming_the_row(tmp_path: Path) -> None:
    fits = "x" * (MAX_COMMAND_BYTES - len("echo "))
    spec = sweep_of(tmp_path, "echo {v}", table=f"v\n{fits}\n{fits}y\n")
    made = tasks(spec)
    assert len(next(made).command.encode()) == MAX_COMMAND_BYTES
    with pytest.raises(SweepError) as info:
        next(made)
    assert info.value.where == "params.csv:3"
    assert info.value.key == "command"
    assert f"longer than {MAX_COMMAND_BYTES} bytes" in str(info.value)


def test_the_command_limit_counts_bytes_and_quotes(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expand, "MAX_COMMAND_BYTES", 10)
    assert next(tasks(sweep_of(tmp_path, "e {v}", table="v\nabcdefgh\n"))).command \
        == "e abcdefgh"
    for value in ["日本語", "abc'de", "a b c d"]:   # 11+ bytes once encoded or quoted
        with pytest.raises(SweepError, match="longer than 10 bytes"):
            next(tasks(sweep_of(tmp_path, "e {v}", table=f"v\n{value}\n")))


def test_inputs_too_large_are_refused_naming_the_row(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expand, "MAX_INPUT_BYTES", 10)
    extra = '[inputs]\na = "{v}"\nb = "{v}{v}"\n'
    assert next(tasks(sweep_of(tmp_path, "true", extra, table="v\nabc\n"))).inputs \
        == (("a", "abc"), ("b", "abcabc"))
    with pytest.raises(SweepError) as info:
        next(tasks(sweep_of(tmp_path, "true", extra, table="v\nabcd\n")))
    assert info.value.key == "inputs"
    assert info.value.where == "params.csv:2"
    with pytest.raises(SweepError):
        next(tasks(sweep_of(tmp_path, "true", extra, table="v\nééé\n")))


def test_a_repeated_huge_value_is_refused_before_it_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 MB value used a thousand times would be a 1 GB text: the bound is computed first."""
    big = "x" * 1_000_000
    text = "{v}" * 1000
    spec = sweep_of(tmp_path, "true", f'[inputs]\na = "{text}"\n', table=f"v\n{big}\n")
    rendered: list[int] = []
    original = expand._Template.render

    def spy(self: expand._Template, *args: object, **kwargs: object) -> str:
        rendered.append(1)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(expand._Template, "render", spy)
    with pytest.raises(SweepError, match="input files for this row hold more than"):
        next(tasks(spec))
    assert rendered == [1]  # the command only


def test_tasks_stream_from_a_large_table(tmp_path: Path) -> None:
    table = "i\n" + "".join(f"{i}\n" for i in range(200_000))
    spec = sweep_of(tmp_path, "echo {i}", table=table)
    made = tasks(spec)
    assert isinstance(made, types.GeneratorType)
    assert [t.command for t in itertools.islice(made, 3)] == ["echo 0", "echo 1", "echo 2"]


def test_tasks_from_axes(tmp_path: Path) -> None:
    spec = make_sweep(tmp_path / "s", "command = 'm {alpha} {n} {#}'\n[axes]\n"
                      "alpha = [0.1, 0.2]\nn = [10, 100]\n")
    assert [t.command for t in tasks(spec)] == ["m 0.1 10 1", "m 0.1 100 2", "m 0.2 10 3",
                                                "m 0.2 100 4"]


def test_axes_placeholders_are_checked_too(tmp_path: Path) -> None:
    spec = make_sweep(tmp_path / "s", "command = 'm {alpha} {m}'\n[axes]\nalpha = [1]\n")
    with pytest.raises(SweepError, match=r"unknown placeholder \{m\}: expected one of the "
                       r"table's columns \(alpha\)"):
        tasks(spec)


def test_an_expander_refuses_a_row_of_another_width(tmp_path: Path) -> None:
    spec = sweep_of(tmp_path, "echo {alpha}")
    expander = Expander(spec, ("alpha", "n"))
    assert isinstance(expander.task(Row(1, ("1", "2"), "here")), Task)
    with pytest.raises(ValueError, match="here: 1 values for 2 columns"):
        expander.task(Row(1, ("1",), "here"))
