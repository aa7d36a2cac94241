"""A program's digest covers what it loads and runs (docs/results.md, "A job's key"):
real files, a real compiler, the real dynamic loader.

A tiny shared library and a program linking it are compiled with gcc (rpath into the
test's folder); a wrapper script names the program; the tree has files outside ghostpdl's
three resource folders.  Each change that can change a job's output changes the digest
of the programs it concerns, and the ``keychanges`` the node sends names it; what cannot
(object files, another program's rebuild) leaves it alone.  The file hash cache is proven
by counting the files this process opens (a Python audit hook sees every ``open``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import configfile
from cluster.errors import ConfigError
from cluster.node import builddigest, loadset, treefiles
from cluster.node.builddigest import BuildKeys, build_keys
from cluster.node.hashcache import HashCache
from cluster.wire.protocol import Request, format_request, parse_request

LIB_C = "int answer(void) { return %d; }\n"
PROG_C = "int answer(void);\nint main(void) { return answer() == %d ? 0 : 1; }\n"

#: Paths this process opened while :data:`_WATCHING` is set (the audit hook below).
_OPENED: list[str] = []
_WATCHING: list[bool] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _WATCHING and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))  # type: ignore[arg-type]


sys.addaudithook(_audit)  # cannot be removed: it records only while a test watches


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The files opened by this process from now until the test ends."""
    _OPENED.clear()
    _WATCHING.append(True)
    try:
        yield _OPENED
    finally:
        _WATCHING.clear()


def compile_lib(folder: Path, value: int) -> Path:
    """``folder/libanswer.so`` returning ``value``, written in place (same inode) when it
    exists: a library upgraded under a program that keeps running."""
    src = folder / f"answer{value}.c"
    src.write_text(LIB_C % value, encoding="utf-8")
    built = folder / f"libanswer{value}.so.tmp"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(built), str(src)], check=True)
    lib = folder / "libanswer.so"
    with open(lib, "ab") as fh:  # in place: same inode, new bytes
        fh.truncate(0)
        fh.write(built.read_bytes())
    built.unlink()
    return lib


def compile_prog(dest: Path, libdir: Path, value: int) -> Path:
    """A program linking ``libdir/libanswer.so`` (rpath ``libdir``), at ``dest``."""
    src = dest.parent / f"{dest.name}.c"
    src.write_text(PROG_C % value, encoding="utf-8")
    built = dest.parent / f".{dest.name}.new"
    subprocess.run(["gcc", "-o", str(built), str(src), f"-L{libdir}", "-lanswer",
                    f"-Wl,-rpath,{libdir}"], check=True)
    src.unlink()
    with open(dest, "ab") as fh:
        fh.truncate(0)
        fh.write(built.read_bytes())
    built.unlink()
    dest.chmod(0o755)
    return dest


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    """An installed program outside the tree (``inst/prog`` linking ``lib/libanswer.so``),
    a tree whose ``bin/gs`` is a wrapper around it and whose ``bin/tool`` is that program
    built in the tree, and a few tree files."""
    lib_dir = tmp_path / "lib"
    inst = tmp_path / "inst"
    lib_dir.mkdir()
    inst.mkdir()
    lib = compile_lib(lib_dir, 42)
    prog = compile_prog(inst / "prog", lib_dir, 42)
    tree = tmp_path / "build" / "tree"
    (tree / "bin").mkdir(parents=True)
    wrapper = tree / "bin" / "gs"
    wrapper.write_text(f'#!/bin/sh\nexec {prog} -q "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    compile_prog(tree / "bin" / "tool", lib_dir, 42)
    (tree / "Resource" / "Init").mkdir(parents=True)
    (tree / "Resource" / "Init" / "gs_init.ps").write_text("% init\n", encoding="utf-8")
    (tree / "examples").mkdir()
    (tree / "examples" / "page.ps").write_text("showpage\n", encoding="utf-8")
    (tree / "obj").mkdir()
    (tree / "obj" / "gx.o").write_bytes(b"object 1")
    (tree / "base").mkdir()
    (tree / "base" / "gx.c").write_text("int x;\n", encoding="utf-8")
    (tree / "base" / "gx.o").write_bytes(b"object 1")
    return {"tree": tree, "lib": lib, "lib_dir": lib_dir, "prog": prog, "wrapper": wrapper,
            "cache": tmp_path / "work" / builddigest.KEYCACHE}


def keys(s: dict[str, Path], run: str = "r1", **options: object) -> BuildKeys:
    return build_keys(s["tree"], s["tree"] / "bin", ["gs", "tool", "gxps"],
                      cache_dir=s["cache"], run=run, **options)  # type: ignore[arg-type]


def changed(result: BuildKeys) -> dict[str, tuple[int, tuple[str, ...]]]:
    return {name: (count, parts) for name, count, parts in result.keychanges}


def test_a_library_changed_in_place_changes_the_programs_that_load_it(
        setup: dict[str, Path]) -> None:
    first = keys(setup)
    assert {name for name, _ in first.digests} == {"gs", "tool"}  # gxps was not built
    assert first.keychanges == ()  # nothing to compare with yet
    assert keys(setup, run="r2").digests == first.digests
    compile_lib(setup["lib_dir"], 43)
    second = keys(setup, run="r3")
    assert dict(second.digests)["tool"] != dict(first.digests)["tool"]
    assert dict(second.digests)["gs"] != dict(first.digests)["gs"]  # through the wrapper
    lib = str(setup["lib"])
    assert changed(second) == {"tool": (1, (lib,)), "gs": (1, (lib,))}
    # The header the node sends carries it, the path intact.
    req = Request(node="n1", job_id="r3", built="r3", digests=second.digests,
                  keychanges=second.keychanges)
    assert parse_request(format_request(req)).keychanges == second.keychanges


def test_the_installed_program_behind_a_wrapper_is_part_of_its_key(
        setup: dict[str, Path]) -> None:
    first = keys(setup)
    compile_prog(setup["prog"], setup["lib_dir"], 7)  # the installed program, in place
    second = keys(setup, run="r2")
    assert dict(second.digests)["gs"] != dict(first.digests)["gs"]
    assert dict(second.digests)["tool"] == dict(first.digests)["tool"]
    assert changed(second) == {"gs": (1, (str(setup["prog"]),))}
    # The wrapper's own text is a part too, named as a tree file.
    setup["wrapper"].write_text(f'#!/bin/sh\nexec {setup["prog"]} -r300 "$@"\n',
                                encoding="utf-8")
    third = keys(setup, run="r3")
    assert changed(third) == {"gs": (1, ("tree:bin/gs",))}


def test_a_script_named_by_a_wrapper_is_followed_to_its_program(
        setup: dict[str, Path], tmp_path: Path) -> None:
    middle = tmp_path / "inst" / "middle"
    middle.write_text(f"#!/bin/sh\n# calls the real one\nexec {setup['prog']} \"$@\"\n",
                      encoding="utf-8")
    middle.chmod(0o755)
    setup["wrapper"].write_text(f'#!/bin/sh\nexec {middle} "$@"\n', encoding="utf-8")
    first = keys(setup)
    compile_lib(setup["lib_dir"], 5)
    second = keys(setup, run="r2")
    assert changed(second)["gs"] == (1, (str(setup["lib"]),))
    assert dict(second.digests)["gs"] != dict(first.digests)["gs"]


def test_a_bare_command_word_is_resolved_on_the_jobs_path(
        setup: dict[str, Path], tmp_path: Path) -> None:
    setup["wrapper"].write_text('#!/bin/sh\nexec prog "$@"\n', encoding="utf-8")
    env = dict(os.environ, PATH=f"{tmp_path / 'inst'}:{os.environ.get('PATH', '')}")
    first = keys(setup, env=env)
    compile_prog(setup["prog"], setup["lib_dir"], 8)
    second = keys(setup, run="r2", env=env)
    assert changed(second)["gs"] == (1, (str(setup["prog"]),))
    assert dict(second.digests)["gs"] != dict(first.digests)["gs"]


def test_the_loader_resolves_with_the_jobs_environment(
        setup: dict[str, Path], tmp_path: Path) -> None:
    first = keys(setup)
    other = tmp_path / "other"
    other.mkdir()
    other_lib = compile_lib(other, 42)  # the same source, elsewhere
    env = dict(os.environ, LD_LIBRARY_PATH=str(other))  # wins over the program's RUNPATH
    second = keys(setup, run="r2", env=env)
    count, parts = changed(second)["tool"]
    assert str(other_lib) in parts and str(setup["lib"]) in parts
    assert "env:LD_LIBRARY_PATH" in parts
    assert dict(second.digests)["tool"] != dict(first.digests)["tool"]


def test_a_library_the_loader_does_not_find_is_a_part(setup: dict[str, Path]) -> None:
    hidden = setup["lib"].with_name("hidden.so")
    setup["lib"].rename(hidden)
    first = keys(setup)
    assert "tool" in dict(first.digests)  # it cannot run, but its key is known
    hidden.rename(setup["lib"])
    second = keys(setup, run="r2")
    assert set(changed(second)["tool"][1]) == {"missing:libanswer.so", str(setup["lib"])}


def test_a_tree_file_read_at_run_time_changes_every_program_of_the_tree(
        setup: dict[str, Path]) -> None:
    first = keys(setup)
    (setup["tree"] / "examples" / "page.ps").write_text("% more\nshowpage\n",
                                                        encoding="utf-8")
    second = keys(setup, run="r2")
    assert changed(second) == {"gs": (1, ("tree:examples/page.ps",)),
                               "tool": (1, ("tree:examples/page.ps",))}
    assert not set(dict(second.digests).values()) & set(dict(first.digests).values())
    (setup["tree"] / "examples" / "new.ps").write_text("showpage\n", encoding="utf-8")
    assert changed(keys(setup, run="r3"))["gs"] == (1, ("tree:examples/new.ps",))


def test_build_outputs_and_other_programs_leave_a_key_alone(setup: dict[str, Path]) -> None:
    first = keys(setup)
    tree = setup["tree"]
    (tree / "obj" / "gx.o").write_bytes(b"object 2")
    (tree / "base" / "gx.o").write_bytes(b"object 2")
    (tree / "debugobj").mkdir()
    (tree / "debugobj" / "gx.o").write_bytes(b"object")
    (tree / "config.log").write_text("configure ran at noon\n", encoding="utf-8")
    (tree / ".git").mkdir()
    (tree / ".git" / "index").write_bytes(b"index")
    compile_prog(tree / "bin" / "tool", setup["lib_dir"], 9)  # another program rebuilt
    second = keys(setup, run="r2")
    assert dict(second.digests)["gs"] == dict(first.digests)["gs"]
    assert changed(second) == {"tool": (1, ("tree:bin/tool",))}


def test_a_declared_runtime_list_is_the_tree_part(setup: dict[str, Path]) -> None:
    tree = setup["tree"]
    listed = tree / treefiles.RUNTIME_LIST
    listed.write_text("# what gs reads\nResource\nexamples/*.ps\n", encoding="utf-8")
    first = keys(setup)
    (tree / "base" / "gx.c").write_text("int y;\n", encoding="utf-8")  # not listed
    assert keys(setup, run="r2").digests == first.digests
    (tree / "Resource" / "Init" / "gs_init.ps").write_text("% 2\n", encoding="utf-8")
    assert changed(keys(setup, run="r3"))["gs"] == (1, ("tree:Resource/Init/gs_init.ps",))
    listed.write_text("Resource\n", encoding="utf-8")  # the list itself is a part
    assert set(changed(keys(setup, run="r4"))["gs"][1]) == {
        f"tree:{treefiles.RUNTIME_LIST}", "tree:examples/page.ps"}
    listed.write_text("../outside\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"cluster-runtime-files line 1: '\.\./outside'"):
        keys(setup, run="r5")


def test_glob_patterns() -> None:
    def match(pattern: str, path: str) -> bool:
        return treefiles.glob_regex(pattern).fullmatch(path) is not None
    assert match("lib", "lib/gs_init.ps") and match("lib/", "lib/a/b")
    assert match("lib/*.ps", "lib/a.ps") and not match("lib/*.ps", "lib/x/a.ps")
    assert match("examples/**/*.pdf", "examples/a.pdf")
    assert match("examples/**/*.pdf", "examples/x/y/a.pdf")
    assert match("?.ps", "a.ps") and not match("?.ps", "ab.ps")
    assert not match("lib", "library/x")
    for bad in ("/etc/passwd", "a/../../b", ""):
        with pytest.raises(ValueError):
            treefiles.glob_regex(bad)


def test_reuse_environment_paths_are_parts_of_every_key(setup: dict[str, Path],
                                                        tmp_path: Path) -> None:
    fonts = tmp_path / "fonts"
    (fonts / "type1").mkdir(parents=True)
    font = fonts / "type1" / "a.t1"
    font.write_bytes(b"font 1")
    licence = tmp_path / "licence.key"
    later = tmp_path / "later.conf"
    environment = [str(fonts), str(licence), str(later)]
    licence.write_text("key 1\n", encoding="utf-8")
    first = keys(setup, environment=environment)
    assert keys(setup, run="r2", environment=environment).digests == first.digests
    font.write_bytes(b"font 2")
    assert changed(keys(setup, run="r3", environment=environment)) == {
        "gs": (1, (str(font),)), "tool": (1, (str(font),))}
    later.write_text("now here\n", encoding="utf-8")  # missing before: a part that moves
    assert changed(keys(setup, run="r4", environment=environment))["gs"] == (1, (str(later),))
    licence.write_text("key 2\n", encoding="utf-8")
    assert changed(keys(setup, run="r5", environment=environment))["gs"] == (
        1, (str(licence),))


def test_the_os_and_the_architecture_are_parts(setup: dict[str, Path]) -> None:
    keys(setup)
    import json
    stored = json.loads((setup["cache"] / "tree.keys").read_text(encoding="utf-8"))
    parts = stored["programs"]["gs"]["parts"]
    assert parts["arch"] == os.uname().machine
    assert parts["os"] == HashCache(None).sha256("/etc/os-release")
    assert parts["/bin/sh"] and parts[str(setup["prog"])] and parts[str(setup["lib"])]


def test_a_second_computation_reads_no_unchanged_file(setup: dict[str, Path],
                                                      opened: list[str]) -> None:
    first = keys(setup)
    hashed = [p for p in opened if not p.startswith(str(setup["cache"]))]
    assert str(setup["lib"]) in hashed and str(setup["prog"]) in hashed
    assert str(setup["tree"] / "examples" / "page.ps") in hashed
    opened.clear()
    assert keys(setup, run="r2").digests == first.digests
    # Only the caches themselves are read; no tree file, program or library (the
    # loader's trace, a child process, gets /dev/null as its input).
    assert [p for p in opened if not p.startswith((str(setup["cache"]), "/dev/"))] == []
    # A touched file (same bytes, new mtime) is read again, and only it.
    page = setup["tree"] / "examples" / "page.ps"
    st = page.stat()
    os.utime(page, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    opened.clear()
    third = keys(setup, run="r3")
    assert [p for p in opened
            if not p.startswith((str(setup["cache"]), "/dev/"))] == [str(page)]
    assert third.digests == first.digests and third.keychanges == ()


def test_a_restarted_node_names_the_same_changes_within_its_run(
        setup: dict[str, Path]) -> None:
    keys(setup, run="r1")
    compile_lib(setup["lib_dir"], 11)
    moved = keys(setup, run="r2").keychanges
    assert moved
    assert keys(setup, run="r2").keychanges == moved  # run.py restarted in run r2
    assert keys(setup, run="r3").keychanges == ()  # the next run: nothing moved since


def test_many_changes_are_counted_and_the_first_named(setup: dict[str, Path]) -> None:
    keys(setup)
    for i in range(20):
        (setup["tree"] / "examples" / f"n{i:02}.ps").write_text("x\n", encoding="utf-8")
    compile_lib(setup["lib_dir"], 12)
    count, parts = changed(keys(setup, run="r2"))["gs"]
    assert count == 21 and len(parts) == 8
    assert parts[0] == str(setup["lib"])  # outside the tree first
    assert parts[1] == "tree:examples/n00.ps"


def test_a_program_whose_loader_fails_gets_no_digest(setup: dict[str, Path]) -> None:
    broken = setup["tree"] / "bin" / "gxps"
    data = bytearray((setup["tree"] / "bin" / "tool").read_bytes())
    broken.write_bytes(bytes(data[:4096]))  # an ELF header whose body is cut
    broken.chmod(0o755)
    result = keys(setup)
    assert "gxps" not in dict(result.digests) and "gs" in dict(result.digests)


def test_describe_reads_elf_interpreters_and_script_words() -> None:
    with open(shutil.which("sh") or "/bin/sh", "rb") as fh:
        note = loadset.describe(fh.read(65536))
    assert note.startswith("elf /") and "ld-linux" in note
    script = b"#!/usr/bin/env python3\n# gs in a comment\nPATH=/opt/x:/usr/bin\ncat \"$1\" |" \
             b" /usr/bin/tr a b\n"
    kind, *words = loadset.describe(script).split("\n")
    assert kind == "script /usr/bin/env"
    assert words == ["python3", "PATH", "/opt/x", "/usr/bin", "cat", "/usr/bin/tr", "a", "b"]
    assert loadset.describe(b"\0\1binary") == "data"


def test_a_corrupt_cache_is_an_empty_one(setup: dict[str, Path]) -> None:
    first = keys(setup)
    (setup["cache"] / "tree.hashes").write_text("{not json", encoding="utf-8")
    (setup["cache"] / "tree.keys").write_text("[]", encoding="utf-8")
    assert keys(setup, run="r2").digests == first.digests


def test_caches_of_removed_build_folders_are_pruned(setup: dict[str, Path]) -> None:
    keys(setup)
    gone = setup["cache"] / "removed.hashes"
    gone.write_text("{}", encoding="utf-8")
    keys(setup, run="r2")
    assert not gone.exists() and (setup["cache"] / "tree.hashes").exists()


def test_reuse_environment_setting(tmp_path: Path) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text("[node]\nreuse_environment = /usr/share/fonts ~/licence.key\n",
                    encoding="utf-8")
    assert configfile.load(conf).reuse_environment == ("/usr/share/fonts", "~/licence.key")
    conf.write_text("[node]\nreuse_environment = fonts\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="reuse_environment"):
        configfile.load(conf)


def test_a_tree_given_by_a_relative_path_has_the_same_keys(
        setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = keys(setup)
    monkeypatch.chdir(setup["tree"].parent)
    relative = build_keys(Path("tree"), Path("tree/bin"), ["gs", "tool"],
                          cache_dir=setup["cache"], run="r2")
    assert relative.digests == absolute.digests and relative.keychanges == ()
