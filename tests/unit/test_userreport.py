"""Unit tests of cluster.report.userreport: the user run's report and the source diff in it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.report.compare import STARS, RunFacts
from cluster.report.md5cache import Seen, SeenCache
from cluster.report.tab import Table, TabRow
from cluster.report.userreport import (
    NO_BASELINE,
    NO_CLEAN_TREE,
    NO_PREVIOUS_PUSH,
    NO_SOURCE_DIFFERENCES,
    source_diff,
    user_report,
)

A = "a" * 32
B = "b" * 32
C = "c" * 32

HEADER = "User regression: user alice products gs options - run 20240101000000-p0-abcd"
FACTS = RunFacts(tests=4, seconds=95.2, nodes=2, lost_nodes=("n9 (no heartbeat)",),
                 duplicates=2, header=HEADER)
DIFF_TITLE = "Source differences from trunk (first 2500 lines):"
PUSH_TITLE = "Differences from previous clusterpush:"


def r(name: str, md5: str = A, error: int = 0, machine: str = "m1") -> TabRow:
    return TabRow(name=name, error=error, time1=1.0, time2=0.0, time3=0.0,
                  md5=md5 if error == 0 else "0", rev="1", product="gs", machine=machine)


def table(*rows: TabRow) -> Table:
    return {row.name: row for row in rows}


def section(text: str, title: str, start: int = 0) -> list[str]:
    ls = text.split("\n")
    at = ls.index(title, start) + 1
    return ls[at:ls.index("", at)]


def trees(tmp_path: Path, clean: dict[str, str | bytes],
          pushed: dict[str, str | bytes]) -> tuple[Path, Path]:
    """Two trees under *tmp_path* with the given files (path -> text or bytes)."""
    roots = []
    for side, files in (("clean", clean), ("pushed", pushed)):
        root = tmp_path / side
        root.mkdir()
        for rel, content in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        roots.append(root)
    return roots[0], roots[1]


def test_both_comparisons_show_their_own_differences(tmp_path: Path) -> None:
    """The baseline comparison lists what differs from trunk, the second what differs from
    the previous push; header, 'ran' line, segfaults and lost nodes appear once."""
    baseline = table(r("mine"), r("reverted"), r("crash"), r("same"))
    previous_push = table(r("mine", B), r("reverted", B), r("crash"), r("same"))
    current = table(r("mine", B, machine="n1"), r("reverted", machine="n2"),
                    r("crash", error=8, machine="n1"), r("same"))
    clean, pushed = trees(tmp_path, {"a.c": "x\n"}, {"a.c": "x\n"})
    text = user_report(current, baseline, previous_push, FACTS, clean, pushed)
    ls = text.split("\n")
    assert ls[:3] == [HEADER, "", ""]
    assert ls[3] == STARS  # segfault block of the first comparison
    assert text.count("Seg faults with current rev:") == 1
    assert text.count("ran 4 tests in 95 seconds on 2 nodes") == 1
    assert text.count("Nodes lost during the run:") == 1
    assert text.count("2 late duplicate result(s) ignored.") == 1
    push = ls.index(PUSH_TITLE)
    # vs the baseline: "mine" changed (and "crash"); "reverted" is back to trunk's output
    assert section(text, "Differences in 2 of 4 non-pdfwrite/ps2write test(s):") == [
        "crash gs m1 n1", "mine gs m1 n1"]
    # vs the previous push: "reverted" changed back, "mine" is as it was
    assert section(text, "Differences in 2 of 4 non-pdfwrite/ps2write test(s):", push) == [
        "crash gs m1 n1", "reverted gs m1 n2"]
    assert ls.index("Differences in 2 of 4 non-pdfwrite/ps2write test(s):") < push
    assert "have been added" not in text and "have been removed" not in text
    diff = ls.index(DIFF_TITLE)
    assert push < diff
    assert ls[diff + 1:] == ["", NO_SOURCE_DIFFERENCES, ""]


def test_first_push_and_no_baseline(tmp_path: Path) -> None:
    """Without a baseline or a previous push the report says so and still lists errors."""
    current = table(r("ok"), r("bad", error=5, machine="n3"))
    text = user_report(current, None, None, FACTS, None, tmp_path)
    ls = text.split("\n")
    assert NO_BASELINE in ls and NO_PREVIOUS_PUSH in ls
    assert "this run is the baseline" not in text
    assert section(text, "The following 1 regression file(s) are producing errors:") == \
        ["bad n3 input missing"]
    assert ls[ls.index(DIFF_TITLE) + 2] == NO_CLEAN_TREE


def test_seen_cache_is_used_by_both_comparisons(tmp_path: Path) -> None:
    """A digest the md5 cache knows is listed as seen before, not as a difference."""
    seen = SeenCache({f"flaky {C}": Seen("r7", "gs", "n4", 5)})
    baseline = table(r("flaky"))
    current = table(r("flaky", C, machine="n1"))
    text = user_report(current, baseline, table(r("flaky", B)), FACTS, None, tmp_path,
                       seen=seen)
    title = ("The following 1 regression file(s) had differences but matched at least once "
             "in the previous 50 runs:")
    assert text.count(title) == 2
    assert section(text, title) == ["flaky gs n4 n1 r7 5"]
    assert "Differences in" not in text


def test_diff_shows_a_changed_line(tmp_path: Path) -> None:
    """A changed line of a real file is shown as a unified diff with a/ and b/ paths."""
    clean, pushed = trees(tmp_path, {"base/gxfill.c": "one\ntwo\nthree\n", "same.h": "s\n"},
                          {"base/gxfill.c": "one\nTWO\nthree\n", "same.h": "s\n"})
    assert source_diff(clean, pushed).split("\n") == [
        "--- a/base/gxfill.c",
        "+++ b/base/gxfill.c",
        "@@ -1,3 +1,3 @@",
        " one",
        "-two",
        "+TWO",
        " three",
        "",
    ]


def test_build_outputs_vcs_and_dropping_are_excluded(tmp_path: Path) -> None:
    """bin/, obj/, *.o, .git and the cluster_command.run dropping are never compared."""
    clean, pushed = trees(
        tmp_path,
        {"a.c": "x\n", "bin/gs": b"\x7fELF\0old", ".git/HEAD": "ref: main\n",
         "sub/obj/t.o": b"\0", "b.o": b"\0old"},
        {"a.c": "y\n", "bin/gs": b"\x7fELF\0new", ".git/HEAD": "ref: mine\n",
         "sub/obj/u.o": b"\0", "b.o": b"\0new", "cluster_command.run": "user alice gs\n",
         ".cluster_command.run.42.tmp": "x\n", "bin2/tool": "kept\n"})
    out = source_diff(clean, pushed)
    for word in ("bin/gs", ".git", "obj", "b.o", "cluster_command"):
        assert word not in out
    assert "+++ b/a.c" in out
    assert "+++ b/bin2/tool" in out  # only names that are exactly excluded


def test_cut_at_the_limit(tmp_path: Path) -> None:
    """The diff stops after limit lines, then says how many lines were left out."""
    clean, pushed = trees(tmp_path, {"big.txt": "".join(f"{i}\n" for i in range(3000))},
                          {"big.txt": "".join(f"{i}!\n" for i in range(3000))})
    full = source_diff(clean, pushed, limit=10**6).split("\n")[:-1]
    assert len(full) == 2 + 1 + 6000  # headers, one hunk, every line out and in
    cut = source_diff(clean, pushed).split("\n")
    assert cut[:2500] == full[:2500]
    assert cut[2500:] == [f"[diff cut at 2500 lines: {len(full) - 2500} more line(s) left out]",
                          ""]
    exact = source_diff(clean, pushed, limit=len(full)).split("\n")
    assert exact[:-1] == full  # exactly at the limit: nothing is left out


def test_no_clean_tree(tmp_path: Path) -> None:
    """Without a clean tree (None or absent) the diff is one line saying so."""
    assert source_diff(None, tmp_path) == NO_CLEAN_TREE + "\n"
    assert source_diff(tmp_path / "nope", tmp_path) == NO_CLEAN_TREE + "\n"


def test_binary_file(tmp_path: Path) -> None:
    """A file with a NUL byte is reported as differing binary files, not shown."""
    clean, pushed = trees(tmp_path, {"img/logo.bin": b"PNG\0\1\2"},
                          {"img/logo.bin": b"PNG\0\1\3", "new.bin": b"\0\0"})
    assert source_diff(clean, pushed).split("\n") == [
        "Binary files a/img/logo.bin and b/img/logo.bin differ",
        "Binary files /dev/null and b/new.bin differ",
        "",
    ]


def test_file_on_one_side_only(tmp_path: Path) -> None:
    """An added file diffs against /dev/null, so does a removed one; folder order as diff -r."""
    clean, pushed = trees(tmp_path, {"gone.c": "bye\n", "z/keep.c": "k\n", "e.c": ""},
                          {"added.c": "hi\nthere", "z/keep.c": "k\n", "f.c": ""})
    assert source_diff(clean, pushed).split("\n") == [
        "--- /dev/null",
        "+++ b/added.c",
        "@@ -0,0 +1,2 @@",
        "+hi",
        "+there",
        "\\ No newline at end of file",
        "Only in the clean tree: a/e.c (an empty file)",
        "Only in the pushed tree: b/f.c (an empty file)",
        "--- a/gone.c",
        "+++ /dev/null",
        "@@ -1 +0,0 @@",
        "-bye",
        "",
    ]


def test_symlinks_are_compared_not_followed(tmp_path: Path) -> None:
    """Links are compared by target; a link out of the tree is never read; FIFOs never open."""
    outside = tmp_path / "secret.txt"
    outside.write_text("TOP SECRET\n")
    clean, pushed = trees(tmp_path, {"real.c": "r\n"}, {"real.c": "r\n"})
    (clean / "lib").symlink_to("real.c")
    (pushed / "lib").symlink_to(str(outside))
    (pushed / "etc").symlink_to(str(tmp_path))  # a folder outside: not walked
    (clean / "same").symlink_to("real.c")
    (pushed / "same").symlink_to("real.c")
    (clean / "kind.c").write_text("k\n")
    (pushed / "kind.c").symlink_to("real.c")
    os.mkfifo(pushed / "pipe")
    out = source_diff(clean, pushed)
    assert "TOP SECRET" not in out
    assert out.split("\n") == [
        f"Only in the pushed tree: b/etc (a symbolic link to {tmp_path})",
        "File a/kind.c is a regular file while file b/kind.c is a symbolic link to real.c",
        f"Symbolic links a/lib -> real.c and b/lib -> {outside} differ",
        "Only in the pushed tree: b/pipe (a special file)",
        "",
    ]


def test_invalid_utf8_is_shown_replaced(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 still count as a difference and show as U+FFFD."""
    clean, pushed = trees(tmp_path, {"l.ps": b"caf\xe9\n"}, {"l.ps": b"caf\xe8\n"})
    out = source_diff(clean, pushed)
    assert "-caf\ufffd" in out.split("\n") and "+caf\ufffd" in out.split("\n")
    out.encode("utf-8")  # the report can be written as UTF-8


def test_negative_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        source_diff(tmp_path, tmp_path, limit=-1)
