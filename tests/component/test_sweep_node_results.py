"""A node in a sweep run against a scripted master on loopback (real NodeRun, real slot
shells, real job lines, a LocalTransport): each call carrying sweep results names a bundle
that is already in place in ``runs/<id>/results/incoming/`` when the master reads the
call; the bundle holds exactly the tasks of the call and their files; a task over
max_result_bytes is failed and sends nothing; job.start's job_timeout, not the node's,
bounds the tasks; a failed upload is a failed call whose results go in a later bundle."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE
from cluster.jobs.sweepjobs import node_job_timeout, sweep_jobs
from cluster.node.noderun import NodeRun
from cluster.node.sweepresults import NEXT_BUNDLE, OUTBOX_DIR, over_limit_reason, result_md5
from cluster.node.transport import LocalTransport
from cluster.records import ERROR_NONE, ERROR_READ
from cluster.sweep.expand import tasks
from cluster.sweep.spec import load
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import Reply, Request
from tests.helpers import give_key

RUN = "20261126000000-p0-cafe"
SECRET = signing.new_secret()
LIMIT = 4096
SWEEP = """\
command = 'case {v} in big) head -c 5000 /dev/zero ;; slow) sleep 1.5; echo slow ;; \
*) echo {v}; echo {v}-file > out.txt ;; esac'
timeout = 20
[axes]
v = ['a', 'b', 'big', 'slow']
[results]
log = 'stdout'
out = 'out.txt'
"""


@dataclass
class BundleReadingMaster:
    """BUILD, the sweep's jobs once, CONTINUE until every result is in, then ABORT; each
    call's bundle is read from the master home the moment the call arrives."""

    home: Path
    jobs: tuple[str, ...]
    on_jobs_given: threading.Event = field(default_factory=threading.Event)
    seen: list[Request] = field(default_factory=list)
    #: Each bundle as it was when its call came: (tasks.json, {member: bytes}).
    bundles: dict[str, tuple[dict[str, object], dict[str, bytes]]] = field(
        default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def handler(self, data: bytes, peer: str) -> bytes:
        key = signing.run_key(signing.parse_secret(SECRET), RUN)
        _, nonce = signing.verify_request(data, key)
        req = protocol.parse_request(data)
        if req.bundle and not self.dropped:
            # The first call with a bundle goes unanswered (a lost reply): the node calls
            # again with the same results.
            self.dropped.append(req.bundle)
            return b"no reply\n"
        self.seen.append(req)
        if req.bundle:
            path = self.home / "runs" / RUN / "results" / "incoming" / req.bundle
            self.bundles[req.bundle] = _bundle(path)  # there before the call
        return signing.sign_reply(protocol.format_reply(self.reply(req)), key, nonce)

    def reply(self, req: Request) -> Reply:
        if not req.built:
            return Reply(protocol.CONTINUE if req.busy else protocol.BUILD)
        if not self.on_jobs_given.is_set():
            self.on_jobs_given.set()
            return Reply(protocol.JOBS, self.jobs)
        if sum(len(r.results) for r in self.seen) >= len(self.jobs):
            return Reply(protocol.ABORT, reason="run complete")
        return Reply(protocol.CONTINUE)


def _bundle(path: Path) -> tuple[dict[str, object], dict[str, bytes]]:
    """(tasks.json, {member: bytes}) of a bundle: a tar file read back with tarfile, or a
    folder (``<task id>/<result name>`` files beside tasks.json)."""
    if path.is_dir():
        listing = json.loads((path / "tasks.json").read_text())
        files = {f"{d.name}/{f.name}": f.read_bytes()
                 for d in sorted(path.iterdir()) if d.is_dir() for f in sorted(d.iterdir())}
        return listing, files
    with tarfile.open(fileobj=io.BytesIO(path.read_bytes())) as tar:
        names = tar.getnames()
        assert names[0] == "tasks.json"
        files = {m: tar.extractfile(m).read() for m in names[1:]}  # type: ignore[union-attr]
        listing = json.loads(tar.extractfile("tasks.json").read())  # type: ignore[union-attr]
    return listing, files


class TarOnlyTransport(LocalTransport):
    """A LocalTransport that cannot move a folder: the node's bundles go as tar files, as
    over ssh or to a master home on another file system."""

    def move_folder(self, src: Path, rel: str) -> bool:
        return False


@pytest.mark.parametrize("form", ["folder", "tar"])
def test_a_sweep_nodes_results_come_home_in_bundles_put_in_place_before_each_call(
        tmp_path: Path, serve, form: str) -> None:
    home = tmp_path / "home"
    (home / "tests").mkdir(parents=True)
    folder = home / "sweepsrc"
    folder.mkdir()
    (folder / "sweep.toml").write_text(SWEEP)
    spec = load(folder / "sweep.toml")
    start = JobStart(id=RUN, priority=0, queue="user u sweep", kind="user", ref="u",
                     products=("sweep",), tree="sweep", source="sweepsrc", build="true",
                     tests="tests", max_result_bytes=LIMIT,
                     job_timeout=node_job_timeout(spec.timeout),
                     sweep_results=tuple((r.name, r.source) for r in spec.results))
    (home / "job.start").write_text(start.format())
    give_key(home, "n1", SECRET)
    # The first uploads fail (a file stands where the folder must be made), until it goes.
    blocker = home / "runs" / RUN / "results" / "incoming"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way\n")
    master = BundleReadingMaster(home, tuple(j.line for j in sweep_jobs(spec, LIMIT)))
    port = serve(master)

    def unblock() -> None:
        master.on_jobs_given.wait(30)
        threading.Event().wait(0.6)  # the quick tasks' uploads fail meanwhile
        blocker.unlink()

    threading.Thread(target=unblock, daemon=True).start()
    cfg = Config(base_port=port, node_name="n1", work_dir=tmp_path / "work", slots=2,
                 poll_interval=0.2, report_interval=0.05, connect_retry_delay=0.1,
                 connect_retries=60, io_timeout=5, job_timeout=1.0, kill_grace=0.5)
    transport = LocalTransport(home) if form == "folder" else TarOnlyTransport(home)
    assert NodeRun(cfg, transport, 0, "tools=md5sum").run() == NODE_EXIT_DONE

    results = {r.name: r for req in master.seen for r in req.results}
    by_name = {t.row.values[0]: t.task_id for t in tasks(spec)}
    assert sorted(results) == sorted(by_name.values())
    # Every call with results named a bundle holding exactly its tasks.
    records: dict[str, dict[str, object]] = {}
    members: dict[str, bytes] = {}
    for req in master.seen:
        assert bool(req.bundle) == bool(req.results)
        if req.bundle:
            assert req.bundle.endswith(".d" if form == "folder" else ".tar")
            listing, files = master.bundles[req.bundle]
            assert listing["node"] == "n1"
            assert [t["task"] for t in listing["tasks"]] == [r.name for r in req.results]
            records.update({t["task"]: t for t in listing["tasks"]})
            members.update(files)
    # After the lost reply: a folder bundle, already on the master, goes again as it is;
    # a tar file is packed anew.
    again = next(req.bundle for req in master.seen if req.bundle)
    assert (again == master.dropped[0]) == (form == "folder")
    numbers = sorted(int(name.split(".")[2]) for name in master.bundles)
    assert numbers[0] > 1  # the failed uploads' bundles were made, discarded, not reused
    for value in ("a", "b"):
        task = by_name[value]
        expected = {"log": f"{value}\n".encode(), "out": f"{value}-file\n".encode()}
        assert {n: members[f"{task}/{n}"] for n in expected} == expected
        files = {n: (len(d), hashlib.md5(d).hexdigest()) for n, d in expected.items()}
        assert records[task]["files"] == {n: list(v) for n, v in files.items()}
        assert (results[task].error, results[task].md5) == (ERROR_NONE, result_md5(files))
        assert records[task]["exit"] == 0 and records[task]["failed"] == ""
    big = by_name["big"]
    assert records[big]["failed"] == over_limit_reason(LIMIT) and records[big]["files"] == {}
    assert (results[big].error, results[big].md5) == (ERROR_READ, "0")
    assert not any(m.startswith(big) for m in members)
    slow = by_name["slow"]  # 1.5 s: past the node's job_timeout, within job.start's
    assert results[slow].error == ERROR_NONE and members[f"{slow}/log"] == b"slow\n"
    assert 1.4 < float(records[slow]["runtime"]) < 10  # type: ignore[arg-type]
    assert abs(float(records[slow]["start"]) - time.time()) < 60  # type: ignore[arg-type]
    # The node's copy of the sweep folder is read-only: its files have no write bits.
    build = [p for p in (tmp_path / "work" / "build").rglob("sweep.toml")]
    assert build and all(p.stat().st_mode & 0o222 == 0 for p in build)
    # Nothing is left on the node: the sent results and bundles are gone, and the temp
    # folder holds no task folder, stdout, stderr or result folder.
    work_run = tmp_path / "work" / "runs" / RUN
    assert [p.name for p in (work_run / OUTBOX_DIR).iterdir()] == [NEXT_BUNDLE]
    assert list((work_run / "temp").iterdir()) == []
