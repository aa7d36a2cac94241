"""The node's baseline build (job.start ``baseline``) and its bmpcmp upload, against a
scripted master on loopback: built once, reused by the next run, rebuilt when the baseline
tree changes; ``__baseline__``/``__python__`` substituted; images uploaded within the limit."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster import bmpcmp
from cluster.defaults import NODE_EXIT_DONE as EXIT_DONE
from cluster.defaults import NODE_EXIT_FAILED as EXIT_FAILED
from cluster.node import nodeupload
from cluster.records import Job
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import Reply, Request
from tests.component.test_node_run import SECRET, ScriptedMaster, make_node_home, node
from tests.helpers import give_key

MARKER = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = make_node_home(tmp_path)
    (root / "ghostpdl").mkdir()
    write_baseline_makefile(root, tmp_path / "baseline-builds.txt")
    (root / "ghostpdl" / "base.c").write_text("int x;\n")
    return root


def write_baseline_makefile(home: Path, counter: Path, fail: bool = False) -> None:
    """The baseline's build appends a line to ``counter`` (outside the tree) per build."""
    (home / "ghostpdl" / "Makefile").write_text(
        "all:\n"
        f"\techo built >> {counter}\n"
        "\tmkdir -p bin\n"
        f"\techo {MARKER} > bin/marker\n"
        + ("\texit 1\n" if fail else ""))


def builds(tmp_path: Path) -> int:
    counter = tmp_path / "baseline-builds.txt"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def write_start(home: Path, run_id: str, baseline: str = "ghostpdl") -> None:
    start = JobStart(id=run_id, priority=0, queue="user t gs bmpcmp", kind="user", ref="t",
                     products=("gs",), tree="ghostpdl", source="src", build="make",
                     tests="tests", options=("bmpcmp",), baseline=baseline)
    (home / "job.start").write_text(start.format())
    give_key(home, "n1", SECRET)  # node n1's own key, which the scripted master knows


def script_run(jobs: list[Job]) -> Callable[[Request, list[Request]], bytes]:
    """BUILD, the jobs, UPLOAD once every result is in, ABORT "run complete" after it."""
    state = {"given": False, "upload": False}

    def reply(verb: str, **kw: object) -> bytes:
        return protocol.format_reply(Reply(verb, **kw))  # type: ignore[arg-type]

    def script(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            return reply(protocol.BUILD)
        if req.failure:
            return reply(protocol.ABORT, reason="dropped")
        if req.busy:
            return reply(protocol.CONTINUE)
        if not state["given"]:
            state["given"] = True
            return protocol.format_reply(Reply(protocol.JOBS, tuple(j.line for j in jobs)))
        if state["upload"]:
            return reply(protocol.ABORT, reason="run complete")
        if sum(len(r.results) for r in seen) >= len(jobs):
            state["upload"] = True
            return reply(protocol.UPLOAD)
        return reply(protocol.CONTINUE)

    return script


def bmpcmp_like_jobs() -> list[Job]:
    """Jobs using __baseline__ and __python__ and leaving an image set, as bmpcmp jobs do."""
    a, b = "t__f.ps.ppmraw.72.0", "t__f.ps.pgmraw.72.0"
    return [
        Job(a, f"__temp__/{a}.log",
            f"echo gs > __temp__/{a}.log ; cat __baseline__/marker > __temp__/{a}.md5 ; "
            f"mkdir -p __temp__/bmpcmp ; "
            + " ; ".join(f"echo {kind} > __temp__/bmpcmp/{a}.00000.{kind}"
                         for kind in ("base.png", "cand.png", "diff.png", "meta"))),
        # From another directory: the node's PYTHONPATH makes the package importable.
        Job(b, f"__temp__/{b}.log",
            f"echo gs > __temp__/{b}.log ; cd / && __python__ -c "
            "'import cluster.bmpcmp as b; print(b.MAX_IMAGES)' "
            f"| md5sum > __temp__/{b}.md5"),
    ]


def run_node(home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int],
             run_id: str, jobs: list[Job]) -> tuple[int, ScriptedMaster]:
    write_start(home, run_id)
    master = ScriptedMaster(script_run(jobs))
    code = node(home, tmp_path, serve(master)).run()
    return code, master


def test_baseline_is_built_once_reused_and_rebuilt_when_it_changes(
        home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    jobs = bmpcmp_like_jobs()
    code, master = run_node(home, tmp_path, serve, "20261122000001-p0-aaaa", jobs)
    assert code == EXIT_DONE
    results = {r.name: r for req in master.seen for r in req.results}
    assert results["t__f.ps.ppmraw.72.0"].md5 == MARKER  # __baseline__ is the build's bin
    assert results["t__f.ps.pgmraw.72.0"].md5 == hashlib.md5(b"100\n").hexdigest()
    assert all(r.error == 0 for r in results.values())
    assert builds(tmp_path) == 1
    work = tmp_path / "work" / "baseline"
    assert (work / "ghostpdl" / "bin" / "marker").is_file()
    assert (work / ".ghostpdl.stamp").is_file()
    uploaded = home / "runs" / "20261122000001-p0-aaaa" / "bmpcmp"
    assert sorted(p.name for p in uploaded.iterdir()) == [
        f"t__f.ps.ppmraw.72.0.00000.{k}" for k in ("base.png", "cand.png", "diff.png", "meta")]

    # Same baseline tree: the cached build is used.
    code, _ = run_node(home, tmp_path, serve, "20261122000002-p0-bbbb", jobs)
    assert code == EXIT_DONE and builds(tmp_path) == 1
    log = (home / "runs" / "20261122000002-p0-bbbb" / "logs" / "n1.build.log").read_text()
    assert "unchanged since its last build" in log

    # A changed file in the baseline tree: built again, from a fresh copy.
    (home / "ghostpdl" / "base.c").write_text("int x = 2;\n")
    (work / "ghostpdl" / "leftover").write_text("from the last build\n")
    code, _ = run_node(home, tmp_path, serve, "20261122000003-p0-cccc", jobs)
    assert code == EXIT_DONE and builds(tmp_path) == 2
    assert not (work / "ghostpdl" / "leftover").exists()
    assert (work / "ghostpdl" / "base.c").read_text() == "int x = 2;\n"


def test_a_failed_baseline_build_fails_the_node_and_is_retried(
        home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    write_baseline_makefile(home, tmp_path / "baseline-builds.txt", fail=True)
    code, master = run_node(home, tmp_path, serve, "20261122000004-p0-dddd",
                            bmpcmp_like_jobs())
    assert code == EXIT_FAILED
    failing = [r for r in master.seen if r.failure]
    assert failing[0].failure == protocol.FAILURE_BUILD
    assert "baseline build" in failing[0].failure_reason
    assert not (tmp_path / "work" / "baseline" / ".ghostpdl.stamp").exists()
    # Fixed: the next run builds again (no stamp was written for the failed build).
    write_baseline_makefile(home, tmp_path / "baseline-builds.txt")
    code, _ = run_node(home, tmp_path, serve, "20261122000005-p0-eeee", bmpcmp_like_jobs())
    assert code == EXIT_DONE and builds(tmp_path) == 2


def test_bmpcmp_uploads_stop_at_the_limit_and_say_what_was_dropped(
        home: Path, tmp_path: Path, serve: Callable[[ScriptedMaster], int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodeupload, "BMPCMP_UPLOAD_LIMIT", 1000)
    name = "t__f.ps.ppmraw.72.0"
    # Three sets of 4 x 100 bytes: two fit in 1000 bytes, the third does not.
    files = " ; ".join(f"head -c 100 /dev/zero > __temp__/bmpcmp/{name}.0000{n}.{kind}"
                       for n in range(3)
                       for kind in ("base.png", "cand.png", "diff.png", "meta"))
    job = Job(name, f"__temp__/{name}.log",
              f"echo gs > __temp__/{name}.log ; echo {MARKER} > __temp__/{name}.md5 ; "
              f"mkdir -p __temp__/bmpcmp ; {files}")
    run_id = "20261122000006-p0-ffff"
    code, _ = run_node(home, tmp_path, serve, run_id, [job])
    assert code == EXIT_DONE
    uploaded = home / "runs" / run_id / "bmpcmp"
    names = sorted(p.name for p in uploaded.iterdir())
    assert [n for n in names if n.endswith(".meta")] == [f"{name}.00000.meta",
                                                         f"{name}.00001.meta"]
    note = (uploaded / "DROPPED.n1").read_text().splitlines()
    assert note[0].startswith("# node n1: bmpcmp images past 1000 bytes")
    assert sorted(note[1:]) == sorted(f"{name}.00002.{k}" for k in
                                      ("base.png", "cand.png", "diff.png", "meta"))
    # The master's page says so.
    page = tmp_path / "index.html"
    bmpcmp.write_html(uploaded, page, "run")
    assert "1 image set(s) (4 file(s)) are not shown" in page.read_text()


@pytest.mark.parametrize("baseline", ["../etc", ".", "a b"])
def test_a_baseline_that_is_not_a_tree_name_is_refused(home: Path, tmp_path: Path,
                                                        baseline: str) -> None:
    """It becomes a folder name under work_dir/baseline: no escaping it, no odd names."""
    write_start(home, "20261122000007-p0-abcd", baseline=baseline)
    assert node(home, tmp_path, 1).run() == EXIT_FAILED
    assert not (tmp_path / "work" / "baseline").exists()
