"""A node's sweep results (cluster.node.sweepresults): the md5 rule of a task's result
line, reading a task's result folder (links and non-files never read, the limit), the
bundle read back as a real tar, and job.start's two sweep keys."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest

from cluster.node import sweepresults
from cluster.node.sweepresults import (
    NEXT_BUNDLE,
    TASKS_JSON,
    XFSZ_STATUS,
    Outbox,
    over_limit_reason,
    result_md5,
)
from cluster.sweep import spec
from cluster.wire import protocol
from cluster.wire.jobstart import RESULT_NAME, STREAM_SOURCES, JobStart

INSTANCE = "0123456789abcdef"


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_the_md5_of_a_tasks_results_is_that_of_its_name_md5_lines_in_name_order() -> None:
    files = {"out": (3, md5(b"abc")), "log": (0, md5(b""))}
    assert result_md5(files) == md5(f"log {md5(b'')}\nout {md5(b'abc')}\n".encode())
    assert result_md5({}) == md5(b"")
    changed = {**files, "out": (3, md5(b"abd"))}
    assert result_md5(changed) != result_md5(files)
    # A renamed result changes it too: the names are part of it.
    assert result_md5({"out2": files["out"], "log": files["log"]}) != result_md5(files)


def _res(folder: Path, files: dict[str, bytes]) -> Path:
    """A task's folder holding ``files`` (what its command left)."""
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def _take(outbox: Outbox, task: str, folder: Path, exit_status: int | None, start: float,
          runtime: float) -> sweepresults.TaskResults:
    """``outbox.take`` with one result per file the folder holds, named as the file."""
    names = sorted(os.listdir(folder)) if folder.is_dir() else []
    return outbox.take(task, folder, [(n, n) for n in names], exit_status, start, runtime)


def test_an_outbox_takes_a_result_folder_reading_only_regular_files(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox", "n1", INSTANCE, 1000)
    res = _res(tmp_path / "temp" / "t1", {"out": b"abc", "log": b"hello\n"})
    secret = tmp_path / "secret"
    secret.write_text("not a result\n")
    (res / "link").symlink_to(secret)
    (res / "dir").mkdir()
    os.mkfifo(res / "fifo")
    os.link(secret, res / "hard")
    (tmp_path / "temp" / "t1.out").write_bytes(b"printed\n")
    task = outbox.take("t1", res, [("out", "out"), ("log", "log"), ("link", "link"),
                                   ("dir", "dir"), ("fifo", "fifo"), ("hard", "hard"),
                                   ("missing", "missing"), ("printed", "stdout"),
                                   ("errors", "stderr")], 0, 1700000000.5, 1.25)
    # Linked into the outbox, the task's folder and its stdout removed: a retry cannot
    # touch them.
    assert not res.exists() and not (tmp_path / "temp" / "t1.out").exists()
    assert task.files == {"out": (3, md5(b"abc")), "log": (6, md5(b"hello\n")),
                          "printed": (8, md5(b"printed\n"))}
    assert task.md5 == result_md5(task.files) and task.failed == ""
    assert task.folder is not None and sorted(os.listdir(task.folder)) == [
        "log", "out", "printed"]
    assert secret.read_text() == "not a result\n"
    assert task.record() == {"task": "t1", "start": 1700000000.5, "runtime": 1.25,
                             "exit": 0, "files": {"log": [6, md5(b"hello\n")],
                                                  "out": [3, md5(b"abc")],
                                                  "printed": [8, md5(b"printed\n")]},
                             "failed": ""}


def test_results_over_the_limit_or_stopped_by_it_fail_and_nothing_is_kept(
        tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox", "n1", INSTANCE, 10)
    exact = _take(outbox, "t1", _res(tmp_path / "a", {"a": b"12345", "b": b"67890"}), 0, 0, 0)
    assert exact.failed == "" and exact.size == 10  # exactly the limit is allowed
    over = _take(outbox, "t2", _res(tmp_path / "b", {"a": b"12345", "b": b"678901"}), 0, 0, 0)
    stopped = _take(outbox, "t3", _res(tmp_path / "c", {"a": b"1"}), XFSZ_STATUS, 0, 0)
    for task in (over, stopped):
        assert task.failed == over_limit_reason(10) == \
            "results over max_result_bytes (10 bytes)"
        assert task.files == {} and task.folder is None and task.md5 == "0"
    assert sorted(p.name for p in outbox.root.iterdir()) == ["1.t1"]
    missing = _take(outbox, "t4", tmp_path / "none", 1, 0, 0)  # killed before it ran
    assert missing.files == {} and missing.failed == "" and missing.md5 == md5(b"")


def test_a_bundle_is_a_pax_tar_with_tasks_json_first_then_each_file(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox", "n1", INSTANCE, 1 << 20)
    binary = bytes(range(256)) * 10
    one = _take(outbox, "t1", _res(tmp_path / "a", {"out": binary, "log": b""}), 0, 100.0, 2.0)
    two = _take(outbox, "t2", _res(tmp_path / "b", {"out": b"x"}), 3, 101.0, 1.0)
    failed = _take(outbox, "t3", _res(tmp_path / "c", {}), XFSZ_STATUS, 102.0, 0.5)
    bundle = outbox.pack(["t1", "t2", "t3"])
    assert bundle.name == f"n1.{INSTANCE}.1.tar"
    assert protocol.BUNDLE_NAME.fullmatch(bundle.name)
    with tarfile.open(bundle.path) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [TASKS_JSON, "t1/log", "t1/out", "t2/out"]
        assert all(m.isreg() and m.mode == 0o644 for m in members)
        listing = json.loads(tar.extractfile(TASKS_JSON).read())  # type: ignore[union-attr]
        assert listing == {"node": "n1", "tasks": [one.record(), two.record(),
                                                   failed.record()]}
        assert listing["tasks"][2]["failed"] == over_limit_reason(1 << 20)
        assert tar.extractfile("t1/out").read() == binary  # type: ignore[union-attr]
        assert tar.extractfile("t2/out").read() == b"x"  # type: ignore[union-attr]
    # PAX: the file starts with a ustar header (uncompressed).
    assert bundle.path.read_bytes()[257:262] == b"ustar"
    # A failed call: the bundle goes, the results stay, the next bundle has a new name.
    outbox.discard(bundle)
    assert not bundle.path.exists() and len(outbox.pending) == 3
    again = outbox.pack(["t1", "t2", "t3"])
    assert again.name == f"n1.{INSTANCE}.2.tar"
    outbox.sent(again)
    assert outbox.pending == [] and sorted(p.name for p in outbox.root.iterdir()) == [
        NEXT_BUNDLE]
    # A node process started again in the run keeps counting, and clears what was left.
    (outbox.root / "9.t9").mkdir()
    restarted = Outbox(outbox.root, "n1", INSTANCE, 1 << 20)
    assert restarted.next_bundle == 3 and not (outbox.root / "9.t9").exists()


def test_a_call_carries_each_task_once_and_a_bounded_bundle(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    outbox = Outbox(tmp_path / "outbox", "n1", INSTANCE, 1 << 20)
    for i, task in enumerate(("a", "b", "a", "c")):
        _take(outbox, task, _res(tmp_path / str(i), {"out": b"x" * 100}), 0, 0, 0)
    assert outbox.batch(["a", "b", "a", "c"]) == 2  # "a" again waits for the next call
    monkeypatch.setattr(sweepresults, "BUNDLE_BYTES", 150)
    assert outbox.batch(["a", "b"]) == 1
    monkeypatch.setattr(sweepresults, "BUNDLE_BYTES", 10)
    assert outbox.batch(["a"]) == 1  # the first always goes
    bundle = outbox.pack(["a"])
    outbox.sent(bundle)
    assert [t.task for t in outbox.pending] == ["b", "a", "c"]  # the oldest "a" went


def test_the_node_knows_result_names_by_the_sweep_files_rule() -> None:
    assert RESULT_NAME.pattern == spec.RESULT_NAME.pattern
    assert STREAM_SOURCES == (spec.STDOUT, spec.STDERR)


def test_job_start_carries_a_sweeps_limits_and_leaves_them_out_otherwise() -> None:
    plain = JobStart(id="r", priority=0, queue="user u sweep", kind="user", ref="u",
                     products=("sweep",), tree="sweep", source="runs/r/source/sweep",
                     build="true", tests="tests")
    assert "max_result_bytes" not in plain.format() and "job_timeout" not in plain.format()
    assert "sweep_results" not in plain.format()
    sweep = JobStart(**{**plain.__dict__, "max_result_bytes": 64 << 20,
                        "job_timeout": 155.0, "sweep_results": (
                            ("log", "stdout"), ("out", "res dir/o%1.txt"), ("e", "stderr"))})
    text = sweep.format()
    assert "max_result_bytes 67108864\n" in text and "job_timeout 155.0\n" in text
    assert "sweep_results log=stdout out=res%20dir/o%251.txt e=stderr\n" in text
    assert JobStart.parse(text) == sweep
    assert JobStart.parse(plain.format()) == plain
    for line in ("job_timeout nan", "job_timeout -1", "max_result_bytes 1.5",
                 "job_timeout 1e9"):
        with pytest.raises(ValueError, match=f"job.start {line.split()[0]} "):
            JobStart.parse(plain.format() + line + "\n")
    for words in ("out=../x", "out=/etc/passwd", "out=a//b", "out=", "out", "o/t=x",
                  "out=a out=b", "out=a%00b", "out=%ff"):
        with pytest.raises(ValueError, match="job.start sweep_results word"):
            JobStart.parse(plain.format() + f"sweep_results {words}\n")


def test_a_folder_bundle_moves_the_task_folders_in_and_back_out(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox", "n1", INSTANCE, 1 << 20)
    one = _take(outbox, "t1", _res(tmp_path / "a", {"out": b"1"}), 0, 100.0, 2.0)
    none = _take(outbox, "t2", _res(tmp_path / "b", {}), 1, 101.0, 1.0)
    assert one.folder is not None and none.folder is None
    inode = (one.folder / "out").stat().st_ino
    bundle = outbox.pack_folder(["t1", "t2"])
    assert bundle.folder and bundle.name == f"n1.{INSTANCE}.1.d"
    assert protocol.BUNDLE_NAME.fullmatch(bundle.name)
    assert sorted(p.name for p in bundle.path.iterdir()) == ["t1", TASKS_JSON]
    assert (bundle.path / "t1" / "out").stat().st_ino == inode  # moved, not copied
    listing = json.loads((bundle.path / TASKS_JSON).read_text())
    assert listing == {"node": "n1", "tasks": [one.record(), none.record()]}
    # It could not go (another file system): the folders go back, the bundle folder goes.
    outbox.unpack_folder(bundle)
    assert not bundle.path.exists() and (one.folder / "out").read_bytes() == b"1"
    tar = outbox.pack(["t1", "t2"])  # the tar file it goes as instead
    assert tar.name == f"n1.{INSTANCE}.2.tar" and not tar.folder
