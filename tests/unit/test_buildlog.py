"""Unit tests of cluster.node.buildlog, fed with what the real gcc and make print.

Every log here is made by running the machine's own make and gcc in ``tmp_path`` (C
locale, so the words are gcc's English ones), never written by hand: the recogniser must
know the real tools' words, not our idea of them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cluster.node import buildlog
from cluster.node.buildlog import Diagnosis, diagnose

BROKEN_C = "int main(void)\n{\n  int x = 1\n  return x;\n}\n"


def build(tmp_path: Path, makefile: str, files: dict[str, str] | None = None,
          argv: tuple[str, ...] = ("make",)) -> tuple[int, str]:
    """Write ``makefile`` and ``files`` into tmp_path, run ``argv`` there through sh (as a
    node runs its build command); return its status and its output, stderr mixed in."""
    for name, text in {"Makefile": makefile, **(files or {})}.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "LC_ALL": "C"}
    done = subprocess.run(" ".join(argv), shell=True, cwd=tmp_path, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    return done.returncode, done.stdout


def test_a_syntax_error_is_the_trees_fault_and_quoted_with_makes_line(tmp_path: Path) -> None:
    status, log = build(tmp_path, "all: broken.o\nbroken.o: broken.c\n\tgcc -c broken.c\n",
                        {"broken.c": BROKEN_C})
    assert status != 0
    found = diagnose(log)
    assert found.errors[0].startswith("broken.c:4:3: error: expected ")
    assert any(line.startswith("make: *** [Makefile:3: broken.o] Error 1")
               for line in found.errors)
    assert not any(line.startswith("gcc ") for line in found.errors)  # not the command
    assert not found.local
    assert found.summary() == found.errors[0]
    assert found.quote()[0] == "error lines:"


def test_a_missing_header_of_the_tree_is_the_trees_fault(tmp_path: Path) -> None:
    status, log = build(tmp_path, "all:\n\tgcc -c xpsjxr.c\n",
                        {"xpsjxr.c": '#include "jpegxr.h"\nint x;\n'})
    assert status != 0
    found = diagnose(log)
    assert found.errors[0] == "xpsjxr.c:1:10: fatal error: jpegxr.h: No such file or directory"
    assert not found.local


def test_a_missing_system_header_is_the_nodes_fault(tmp_path: Path) -> None:
    status, log = build(tmp_path, "all:\n\tgcc -c uses.c\n",
                        {"uses.c": "#include <nosuchlibrary.h>\nint x;\n"})
    assert status != 0
    found = diagnose(log)
    assert found.local
    assert found.summary() == ("uses.c:1:10: fatal error: nosuchlibrary.h: "
                               "No such file or directory")


def test_a_missing_compiler_is_the_nodes_fault(tmp_path: Path) -> None:
    status, log = build(tmp_path, "CC = no-such-cc-here\nall: broken.o\n",
                        {"broken.c": BROKEN_C})
    assert status != 0
    found = diagnose(log)
    assert found.local
    assert found.summary() == "make: no-such-cc-here: No such file or directory"
    assert any(line.endswith("] Error 127") for line in found.errors)


def test_a_missing_make_is_the_nodes_fault(tmp_path: Path) -> None:
    status, log = build(tmp_path, "all:\n", argv=("no-such-make-here", "all"))
    assert status == 127
    found = diagnose(log)
    assert found.local and "no-such-make-here: not found" in found.summary()


def test_a_tool_of_the_tree_that_is_missing_is_the_trees_fault(tmp_path: Path) -> None:
    status, log = build(tmp_path, "all:\n\t./obj/genarch arch.h\n")
    assert status != 0
    found = diagnose(log)
    assert found.errors and not found.local


def test_an_undefined_reference_is_the_trees_and_a_missing_library_the_nodes(
        tmp_path: Path) -> None:
    status, log = build(tmp_path, "all:\n\tgcc link.c -o link\n",
                        {"link.c": "int foo(void);\nint main(void) { return foo(); }\n"})
    assert status != 0
    found = diagnose(log)
    assert any("undefined reference to `foo'" in line for line in found.errors)
    assert "collect2: error: ld returned 1 exit status" in found.errors
    assert not found.local
    status, log = build(tmp_path, "all:\n\tgcc ok.c -lnosuchlibrary -o ok\n",
                        {"ok.c": "int main(void) { return 0; }\n"})
    assert status != 0
    found = diagnose(log)
    assert found.local and "cannot find -lnosuchlibrary" in found.summary()


def test_a_compile_error_wins_over_a_missing_program(tmp_path: Path) -> None:
    """One tree error among node errors: every node would fail on it, so it is -1's."""
    status, log = build(tmp_path, "all:\n\t-no-such-tool-here\n\tgcc -c broken.c\n",
                        {"broken.c": BROKEN_C})
    assert status != 0
    found = diagnose(log)
    assert not found.local and found.summary().startswith("broken.c:4:3: error:")


def test_configure_errors_are_the_nodes_fault() -> None:
    # configure's words (autoconf's AC_MSG_ERROR), from a machine without a compiler.
    log = ("checking for gcc... no\nchecking for cc... no\n"
           "configure: error: in `/src/ghostpdl':\n"
           "configure: error: no acceptable C compiler found in $PATH\n")
    found = diagnose(log)
    assert found.local and found.total == 2


def test_many_errors_are_bounded_and_long_lines_cut(tmp_path: Path) -> None:
    body = "".join(f"int f{i}(void) {{ return {'x' * 400}{i} }}\n" for i in range(40))
    status, log = build(tmp_path, "all:\n\tgcc -c many.c\n", {"many.c": body})
    assert status != 0
    found = diagnose(log)
    assert len(found.errors) == buildlog.ERROR_LIMIT < found.total
    assert all(len(line) <= buildlog.LINE_WIDTH for line in found.errors)
    assert any(line.endswith(buildlog.CUT_MARK) for line in found.errors)
    assert found.quote()[0] == f"error lines (the first 20 of {found.total}):"


def test_no_recognised_line_falls_back_to_the_tail(tmp_path: Path) -> None:
    status, log = build(tmp_path, "all:\n\t@seq 1 50\n\t@false\n")
    assert status != 0
    found = diagnose(log)
    # make's own "*** [Makefile:3: all] Error 1" is recognised; without it, the tail.
    assert found.errors == ("make: *** [Makefile:3: all] Error 1",)
    found = diagnose("\n".join(str(i) for i in range(1, 51)) + "\n")
    assert found == Diagnosis((), 0, False, tuple(str(i) for i in range(31, 51)))
    assert found.quote()[0] == "no error line recognised; the last 20 lines:"
    assert found.summary() == "50"


@pytest.mark.parametrize("line", [
    "gdevxyz.c:12: error: expected ;",
    "make[2]: *** [Makefile:123: obj/x.o] Error 1",
    "/usr/bin/ld: cannot find -lz: No such file or directory",
])
def test_one_line_forms(line: str) -> None:
    assert diagnose(f"noise\n{line}\nmore noise\n").errors == (line,)


def test_the_failure_report_quotes_the_failing_nodes_error_lines(tmp_path: Path) -> None:
    """buildfailure.failure_report over real make and gcc output in an archive's logs
    folder: the failing node first, its words quoted, the other logs only named; a log
    without an error line is quoted by its tail."""
    from cluster.master.end import buildfailure
    from cluster.master.state.runstate import RunState

    status, log = build(tmp_path, "all:\n\tgcc -c broken.c\n", {"broken.c": BROKEN_C})
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "n2.build.log").write_text("node n2: building\n$ make\n" + log
                                       + f"node n2: 'make' exited with status {status}\n")
    (logs / "n1.build.log").write_text("node n1: building\n$ make\n"
                                       + "".join(f"line {i}\n" for i in range(30))
                                       + "node n1: 'make' exited with status 2\n")
    (logs / "n2.log").write_text("whatever\n")
    state = RunState("r1", [], 0.0)
    state.fatal = "node n2 failed with code -1: build failed: 'make' exited with status 2"
    text = buildfailure.failure_report("HEADER", state, logs, "make")
    n2 = text.index("The build failed on node n2:\n  command: make\n"
                    f"  result:  'make' exited with status {status}\n"
                    f"  whole log: {logs / 'n2.build.log'}\n  error lines:\n"
                    "    broken.c:4:3: error: expected ")
    n1 = text.index("The build failed on node n1:")  # its build failed too: quoted
    assert n2 < n1
    assert "  no error line recognised; the last 20 lines:\n    line 11\n" in text
    assert text.endswith(f"Other logs of the run:\n  {logs / 'n2.log'}\n\n")


def test_the_failure_report_names_the_command_the_node_ran(tmp_path: Path) -> None:
    """A ghostpdl tree is built with build_ghostpdl and the node's slots, not with
    job.start's ``build``: the report names what the build log says ran."""
    from cluster.master.end import buildfailure
    from cluster.master.state.runstate import RunState

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "n1.build.log").write_text(
        "node n1: building\n$ test -f Makefile || ./configure && make -j2 gs\n"
        "gdevx.c:1:1: error: expected ';'\nnode n1: 'sh' exited with status 2\n")
    state = RunState("r1", [], 0.0)
    state.fatal = "node n1 failed with code -1: build failed: 'sh' exited with status 2"
    text = buildfailure.failure_report("HEADER", state, logs, "make")
    assert "  command: test -f Makefile || ./configure && make -j2 gs\n" in text
    assert "command: make\n" not in text
