"""cluster.sweep.collect: the [collect] rules applied to real result folders in tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from cluster.sweep import collect as collect_module
from cluster.sweep.collect import Collected, Task, collect, encode_value, substitute
from cluster.sweep.rules import CollectRule


def _tasks(root: Path, rows: list[dict[str, str]], name: str = "out",
           skip: tuple[int, ...] = ()) -> list[Task]:
    """One result folder per row, its `name` result saying which task it is."""
    made: list[Task] = []
    for number, row in enumerate(rows, start=1):
        folder = root / "results" / f"t{number}"
        folder.mkdir(parents=True)
        if number not in skip:
            (folder / name).write_bytes(f"task {number} {sorted(row.items())}\n".encode())
        made.append((number, row, folder))
    return made


def _line(number: int, row: Mapping[str, str]) -> str:
    return f"task {number} {sorted(row.items())}\n"


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


ROWS = [{"alpha": "0.1", "n": "10"}, {"alpha": "0.2", "n": "10"},
        {"alpha": "0.1", "n": "100"}, {"alpha": "0.2", "n": "100"}, {"alpha": "0.3", "n": "10"}]


def test_plain_and_blockwise_collection_in_task_order(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, ROWS)
    out = tmp_path / "collected"
    rules = [CollectRule("all.txt", "out"), CollectRule("by-alpha/{alpha}.txt", "out"),
             CollectRule("grid/{n}/{alpha}.txt", "out")]
    done = collect(iter(tasks), rules, out)  # a one-pass iterator is enough
    line = [_line(i + 1, row) for i, row in enumerate(ROWS)]
    assert _tree(out) == {
        "all.txt": "".join(line),
        "by-alpha/0.1.txt": line[0] + line[2],
        "by-alpha/0.2.txt": line[1] + line[3],
        "by-alpha/0.3.txt": line[4],
        "grid/10/0.1.txt": line[0], "grid/10/0.2.txt": line[1], "grid/10/0.3.txt": line[4],
        "grid/100/0.1.txt": line[2], "grid/100/0.2.txt": line[3],
    }
    assert done[0] == Collected("all.txt", "out", ("all.txt",), 5, 0)
    assert done[1].files == ("by-alpha/0.1.txt", "by-alpha/0.2.txt", "by-alpha/0.3.txt")
    assert all(d.ok and d.tasks == 5 for d in done)
    assert [p.name for p in out.iterdir()] and not list(out.glob(".collecting*"))
    assert (out / "all.txt").stat().st_mode & 0o777 == 0o644


def test_only_the_valid_tasks_given_are_collected_and_gaps_are_fine(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, ROWS)
    out = tmp_path / "collected"
    collect([tasks[0], tasks[3]], [CollectRule("by-n/{n}.txt", "out")], out)
    assert _tree(out) == {"by-n/10.txt": _line(1, ROWS[0]), "by-n/100.txt": _line(4, ROWS[3])}


def test_a_plain_target_exists_empty_when_nothing_is_valid(tmp_path: Path) -> None:
    out = tmp_path / "collected"
    done = collect([], [CollectRule("all.txt", "out"), CollectRule("{alpha}.txt", "out")], out)
    assert _tree(out) == {"all.txt": ""}
    assert done[1] == Collected("{alpha}.txt", "out")


def test_binary_results_are_copied_byte_for_byte(tmp_path: Path) -> None:
    blobs = [bytes(range(256)) * 3, b"\x00\r\n\xff", b""]
    tasks = []
    for number, blob in enumerate(blobs, start=1):
        folder = tmp_path / f"t{number}"
        folder.mkdir()
        (folder / "img").write_bytes(blob)
        tasks.append((number, {"k": "x"}, folder))
    collect(tasks, [CollectRule("all.bin", "img")], tmp_path / "c")
    assert (tmp_path / "c" / "all.bin").read_bytes() == b"".join(blobs)


def test_a_valid_task_without_the_source_result_is_counted_missing(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, ROWS, skip=(2,))
    done = collect(tasks, [CollectRule("all.txt", "out")], tmp_path / "c")
    assert done[0].tasks == 4 and done[0].missing == 1
    assert "task 2 " not in (tmp_path / "c" / "all.txt").read_text()


def test_tasks_out_of_order_make_nothing(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, ROWS)
    out = tmp_path / "c"
    with pytest.raises(ValueError, match="task 2 came after task 3"):
        collect([tasks[0], tasks[2], tasks[1]], [CollectRule("all.txt", "out")], out)
    with pytest.raises(ValueError, match="task 1 came after task 1"):
        collect([tasks[0], tasks[0]], [CollectRule("all.txt", "out")], out)
    assert list(out.iterdir()) == [], "a failed collection left files or its staging folder"


def test_an_existing_collected_file_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "c"
    out.mkdir()
    (out / "all.txt").write_text("old content that is longer than the new one\n" * 10)
    tasks = _tasks(tmp_path, ROWS[:1])
    collect(tasks, [CollectRule("all.txt", "out")], out)
    assert (out / "all.txt").read_text() == _line(1, ROWS[0])


# ----------------------------------------------------------------------------------------------
# hostile values never leave the collected folder

def test_values_are_encoded_so_they_never_add_a_folder_level() -> None:
    assert encode_value("a/b") == "a%2Fb"
    assert encode_value("../x") == "..%2Fx"
    assert encode_value("50%") == "50%25"
    assert encode_value("%2F") == "%252F", "distinct values name distinct files"
    assert encode_value("a\0b") == "a%00b"
    assert encode_value(0.5) == "0.5"
    assert substitute("by/{a}-{b}.txt", {"a": "x/y", "b": "1"}) == "by/x%2Fy-1.txt"
    assert substitute("{a}{#}{other}", {"a": "1"}) == "1{#}{other}", "only columns replaced"
    # The sweep file's one placeholder rule (names.PLACEHOLDER), as in expand.py: shell
    # text like ${a} and braces holding no name stay as written.
    assert substitute("${a}/{a}.txt", {"a": "1"}) == "${a}/1.txt"
    assert substitute("{a b}{}/{a}", {"a": "1", "a b": "2"}) == "{a b}{}/1"


def test_slashes_dots_and_percents_in_values_stay_inside_the_folder(tmp_path: Path) -> None:
    rows = [{"v": "../../escape"}, {"v": "a/b"}, {"v": "/etc/passwd"}, {"v": "..."},
            {"v": "%2F"}, {"v": ".hidden"}]
    tasks = _tasks(tmp_path, rows)
    out = tmp_path / "deep" / "collected"
    done = collect(tasks, [CollectRule("by-v/{v}.txt", "out")], out)
    assert done[0].ok
    assert sorted(_tree(out)) == sorted(["by-v/%252F.txt", "by-v/%2Fetc%2Fpasswd.txt",
                                         "by-v/....txt", "by-v/..%2F..%2Fescape.txt",
                                         "by-v/.hidden.txt", "by-v/a%2Fb.txt"])
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["collected"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "results"]


@pytest.mark.parametrize("value", ["..", ".", ""])
def test_a_value_that_fills_a_component_with_dots_or_nothing_refuses_the_target(
        tmp_path: Path, value: str) -> None:
    rows = [{"v": "ok"}, {"v": value}, {"v": "fine"}]
    tasks = _tasks(tmp_path, rows)
    out = tmp_path / "collected"
    done = collect(tasks, [CollectRule("{v}/result.txt", "out"),
                           CollectRule("all.txt", "out")], out)
    assert not done[0].ok and done[0].files == ()
    assert done[0].error == (f"task 2 (v={value!r}) would make '{value}/result.txt', with a "
                             f"path component {value!r} (it could leave collected/)")
    assert _tree(out) == {"all.txt": "".join(_line(i + 1, r) for i, r in enumerate(rows))}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collected", "results"]


def test_a_value_too_long_for_a_file_name_refuses_the_target(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, [{"v": "x" * 300}])
    done = collect(tasks, [CollectRule("{v}.txt", "out")], tmp_path / "c")
    assert "longer than 255 bytes" in done[0].error
    assert list((tmp_path / "c").iterdir()) == []


@pytest.mark.parametrize("target", ["/abs.txt", "../up.txt", "a/../b.txt", "a//b", "./a",
                                    "", "a\0b", "dir/"])
def test_a_target_that_is_not_a_relative_path_is_the_callers_error(tmp_path: Path,
                                                                   target: str) -> None:
    with pytest.raises(ValueError, match="expected a relative path"):
        collect([], [CollectRule(target, "out")], tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("source", ["", "../out", "a/b", ".."])
def test_a_source_that_is_not_a_result_name_is_the_callers_error(tmp_path: Path,
                                                                 source: str) -> None:
    with pytest.raises(ValueError, match="is not a result name"):
        collect([], [CollectRule("all.txt", source)], tmp_path / "c")


# ----------------------------------------------------------------------------------------------
# bounds and clashes

def test_the_number_of_blockwise_files_is_bounded(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect_module, "MAX_FILES_PER_TARGET", 3)
    rows = [{"seed": str(i)} for i in range(5)]
    tasks = _tasks(tmp_path, rows)
    out = tmp_path / "c"
    done = collect(tasks, [CollectRule("by-seed/{seed}.txt", "out"),
                           CollectRule("all.txt", "out")], out)
    assert done[0].error == ("more than 3 files (one per value of seed; task 4 would make "
                             "another): collect by a column with fewer values")
    assert not (out / "by-seed").exists()
    assert done[1].ok and (out / "all.txt").exists()


def test_the_default_bound_is_ten_thousand_files() -> None:
    assert collect_module.MAX_FILES_PER_TARGET == 10_000


def test_a_column_of_many_distinct_values_is_refused_without_making_a_file_each(
        tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "out").write_bytes(b"x")

    def many() -> Iterator[Task]:
        for number in range(1, 200_001):  # 20 times the bound
            yield (number, {"seed": str(number)}, folder)

    done = collect(many(), [CollectRule("{seed}.txt", "out")], tmp_path / "c")
    assert done[0].error.startswith("more than 10000 files")
    assert done[0].tasks == 10_000
    assert list((tmp_path / "c").iterdir()) == []


def test_two_targets_making_the_same_file_the_later_gives_way(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, [{"v": "all"}, {"v": "x"}])
    out = tmp_path / "c"
    done = collect(tasks, [CollectRule("all.txt", "out"), CollectRule("{v}.txt", "out")], out)
    assert done[0].ok
    assert done[1].error == "it would make all.txt, which clashes with what all.txt makes"
    assert _tree(out) == {"all.txt": _line(1, {"v": "all"}) + _line(2, {"v": "x"})}


def test_a_file_where_another_target_needs_a_folder_clashes(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, [{"v": "a"}])
    done = collect(tasks, [CollectRule("{v}/x.txt", "out"), CollectRule("a", "out")],
                   tmp_path / "c")
    assert done[0].ok and "clashes" in done[1].error
    done = collect(tasks, [CollectRule("a", "out"), CollectRule("{v}/x.txt", "out")],
                   tmp_path / "d")
    assert done[0].ok and "clashes" in done[1].error


def test_targets_may_share_a_folder(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, ROWS[:2])
    done = collect(tasks, [CollectRule("by/{alpha}.txt", "out"),
                           CollectRule("by/all.txt", "out")], tmp_path / "c")
    assert all(d.ok for d in done)
    assert sorted(_tree(tmp_path / "c")) == ["by/0.1.txt", "by/0.2.txt", "by/all.txt"]


def test_something_in_the_way_on_disk_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "c"
    (out / "all.txt").mkdir(parents=True)
    (out / "all.txt" / "keep").write_text("x")
    done = collect(_tasks(tmp_path, ROWS[:1]), [CollectRule("all.txt", "out")], out)
    assert done[0].error.startswith("cannot make all.txt: ")
    assert (out / "all.txt" / "keep").read_text() == "x"
    assert not list(out.glob(".collecting*"))


# ----------------------------------------------------------------------------------------------
# streaming and staging

def test_a_large_result_is_streamed_not_read_whole(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    size = 64 << 20
    with (folder / "out").open("wb") as fh:
        fh.truncate(size)  # a sparse 64 MiB file: cheap to make, real bytes to read
    code = ("import resource, sys\n"
            "from pathlib import Path\n"
            "from cluster.sweep.collect import collect\n"
            "from cluster.sweep.rules import CollectRule\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"collect([(1, {{}}, Path({str(folder)!r}))], [CollectRule('all', 'out')],"
            f" Path({str(tmp_path / 'c')!r}))\n"
            "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(after - before)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    grew_kib = int(subprocess.run([sys.executable, "-c", code], check=True, env=env,
                                  capture_output=True, text=True, timeout=120).stdout)
    assert (tmp_path / "c" / "all").stat().st_size == size
    assert grew_kib < 16 * 1024, f"collecting 64 MiB grew the process by {grew_kib} KiB"


def test_a_dead_collections_staging_folder_is_removed_and_a_live_ones_kept(
        tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = subprocess.Popen(["sleep", "0"])
    proc.wait()
    gone = out / f"{collect_module.STAGING_PREFIX}{proc.pid}.abc"
    alive = out / f"{collect_module.STAGING_PREFIX}{os.getppid()}.abc"
    for folder in (gone, alive):
        folder.mkdir(parents=True)
        (folder / "tmp1").write_text("half")
    collect([], [], out)
    assert not gone.exists() and alive.exists()
