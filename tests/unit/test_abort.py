"""clusterpush abort: queued runs of the user go, the running one is named in abort.job."""

from __future__ import annotations

from pathlib import Path

from cluster.home import Home
from cluster.master.files import abort
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart


def make_home(tmp_path: Path) -> Home:
    home = Home(tmp_path / "home")
    home.create()
    return home


def queue_of(home: Home) -> QueueFile:
    return QueueFile(home.queue(0), home.queue_lock(0))


def start_run(home: Home, spec: RunSpec, run_id: str) -> None:
    home.job_start(0).write_text(JobStart(
        id=run_id, priority=0, queue=spec.line(), kind=spec.kind, ref=spec.ref,
        products=spec.products, tree=spec.tree, source=f"users/{spec.ref}/{spec.tree}",
        build="make", tests="tests").format())


def test_queued_runs_of_the_user_are_removed_others_kept(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    q = queue_of(home)
    mine = [RunSpec.parse("user ann gs"), RunSpec.parse("user ann gs lowres")]
    theirs = RunSpec.parse("user bob gs")
    for spec in (mine[0], theirs, mine[1]):
        q.append(spec)
    outcome = abort.request_abort(home, "ann")
    assert outcome == abort.AbortOutcome(removed=2, running=None)
    assert q.read() == [theirs]
    assert not (home.root / abort.ABORT_FILE).exists()


def test_the_running_run_stays_queued_and_is_named_by_id(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    q = queue_of(home)
    running, later = RunSpec.parse("user ann gs"), RunSpec.parse("user ann mupdf")
    q.append(running)
    q.append(later)
    start_run(home, running, "20261122-p0-abcd")
    outcome = abort.request_abort(home, "ann")
    assert outcome == abort.AbortOutcome(removed=1, running="20261122-p0-abcd")
    assert q.read() == [running]  # the master dequeues it after stopping the nodes
    assert abort.requested(home, "20261122-p0-abcd")
    assert not abort.requested(home, "20261122-p0-ffff")


def test_another_users_running_run_is_not_touched(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    running = RunSpec.parse("user bob gs")
    queue_of(home).append(running)
    start_run(home, running, "run-of-bob")
    assert abort.request_abort(home, "ann") == abort.AbortOutcome(0, None)
    assert not abort.requested(home, "run-of-bob")


def test_clear_removes_only_its_own_request(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    (home.root / abort.ABORT_FILE).write_text("run-a\n")
    abort.clear(home, "run-b")
    assert abort.requested(home, "run-a")
    abort.clear(home, "run-a")
    assert not (home.root / abort.ABORT_FILE).exists()
    abort.clear(home, "run-a")  # nothing there: no error


def test_garbage_in_abort_job_names_no_run(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    (home.root / abort.ABORT_FILE).write_bytes(b"\xff\xfe\x00junk")
    assert not abort.requested(home, "run-a")


def test_a_run_in_a_user_lane_is_kept_and_named(tmp_path: Path) -> None:
    """Priority 0's lane 3 runs carol's push while lane 0 runs bob's (cluster.lanes)."""
    home = make_home(tmp_path)
    q = queue_of(home)
    bob, carol, later = (RunSpec.parse(line) for line in
                         ("user bob gs", "user carol gs", "user carol gs lowres"))
    for spec in (bob, carol, later):
        q.append(spec)
    start_run(home, bob, "run-of-bob")
    home.job_start(3).write_text(JobStart(
        id="run-of-carol", priority=0, queue=carol.line(), kind="user", ref="carol",
        products=carol.products, tree=carol.tree, source="users/carol/ghostpdl",
        build="make", tests="tests", lane_number=3).format())
    outcome = abort.request_abort(home, "carol")
    assert outcome == abort.AbortOutcome(removed=1, running="run-of-carol")
    assert q.read() == [bob, carol]
    assert abort.requested(home, "run-of-carol") and not abort.requested(home, "run-of-bob")


def test_clear_takes_out_only_its_own_id_of_several(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    (home.root / abort.ABORT_FILE).write_text("run-a\nrun-b\n")
    assert abort.requested(home, "run-a") and abort.requested(home, "run-b")
    abort.clear(home, "run-a")
    assert not abort.requested(home, "run-a") and abort.requested(home, "run-b")
    abort.clear(home, "run-b")
    assert not (home.root / abort.ABORT_FILE).exists()
