"""The status model (cluster.console.status) against master homes in known states: no run,
a run under way (job.start, live.json, a journal), a node down, a failed build, a run
starting; and its caches (archives by folder mtime, nodes/ at most every nodes_ttl)."""

from __future__ import annotations

import calendar
import json
import os
from pathlib import Path

import pytest

from cluster import configfile
from cluster.config import Config
from cluster.console import status
from cluster.console.status import StatusReader
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files import ending, journal
from cluster.master.files.ending import EndRecord, Outcome
from cluster.queue import QueueFile
from cluster.records import JobResult
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart

NOW = 1_800_000_000.0
RUN = "20270115080000-p1-beef"
SECRET = "ab" * 32


def make_home(tmp_path: Path) -> tuple[Home, Config]:
    home = Home(tmp_path / "home")
    home.create()
    return home, configfile.load(None, {"home": str(home.root)})


def start_of(run_id: str, line: str, priority: int) -> JobStart:
    spec = RunSpec.parse(line)
    return JobStart(id=run_id, priority=priority, queue=spec.line(), kind=spec.kind,
                    ref=spec.ref, products=spec.products, tree="ghostpdl", source="ghostpdl",
                    build="make", tests="tests", options=spec.options, secret=SECRET)


def heartbeat(home: Home, name: str, at: float, status_text: str = "idle",
              caps: str = "tools=md5sum") -> None:
    (home.nodes / f"{name}.status").write_text(status_text + "\n")
    (home.nodes / f"{name}.caps").write_text(caps + "\n")
    up = home.nodes / f"{name}.up"
    up.touch()
    os.utime(up, (at, at))


def archive(home: Home, run_id: str, line: str, outcome: str, *, rows: list[str] | None = None,
            summary: dict[str, int] | None = None, report: str = "report\n",
            bmpcmp: bool = False, elapsed: float = 12.5) -> Path:
    """An archive folder as the master's end steps leave it."""
    folder = home.archive / run_id
    folder.mkdir(parents=True)
    (folder / "report.txt").write_text(report)
    if rows is not None:
        (folder / f"{run_id}.tab").write_text("".join(r + "\n" for r in sorted(rows)))
    if bmpcmp:
        (folder / "bmpcmp").mkdir()
        (folder / "bmpcmp" / "index.html").write_text("<html></html>")
    start = start_of(run_id, line, int(run_id.split("-p")[1][0]))
    extra = "".join(f"{k} {v}\n" for k, v in (summary or {}).items())
    (folder / "run.info").write_text(start.format() + f"elapsed {elapsed:.1f}\n"
                                     f"outcome {outcome}\n" + extra)
    return folder


def row(name: str, error: int = 0, md5: str = "d41d8cd98f00b204e9800998ecf8427e",
        machine: str = "n1") -> str:
    return f"{name}\t{error}\t0.10\t0.00\t0.00\t0\t{md5 if error == 0 else '0'}\tr\tgs\t{machine}"


def fresh(home: Home, cfg: Config, now: float = NOW) -> dict:
    """A snapshot by a reader of its own (no cache shared between tests)."""
    return StatusReader().snapshot(home, cfg, now)


def test_a_home_with_no_run_shows_empty_queues_no_run_no_node(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    snap = fresh(home, cfg)
    assert snap["version"] == 1 and snap["now"] == NOW and snap["master"]
    assert [q["priority"] for q in snap["queues"]] == [0, 1, 2]
    assert all(q["runs"] == [] for q in snap["queues"])
    assert snap["running"] == [] and snap["nodes"] == [] and snap["recent"] == []
    json.dumps(snap)  # JSON-able


def test_a_home_that_is_not_there_yet_gives_an_empty_snapshot(tmp_path: Path) -> None:
    cfg = configfile.load(None, {"home": str(tmp_path / "none")})
    snap = StatusReader().snapshot(Home(tmp_path / "none"), cfg, NOW)
    assert snap["running"] == [] and snap["nodes"] == [] and snap["recent"] == []


def running_home(tmp_path: Path) -> tuple[Home, Config]:
    """Priority 1 runs RUN (job.start, live.1.json, results.1) with nodes n1 and n2; one
    more commit waits behind it; n3 was last heard 400 s ago."""
    home, cfg = make_home(tmp_path)
    line = "git 0123abcd gs"
    queue = QueueFile.for_priority(home, 1)
    queue.append(RunSpec.parse(line))
    queue.append(RunSpec.parse("git 4567cdef gs,pdfwrite"))
    (home.job_start(1)).write_text(start_of(RUN, line, 1).format(with_secret=True))
    live = {"version": 1, "run": RUN, "priority": 1, "kind": "git", "queue": line,
            "products": ["gs"], "started": NOW - 42, "updated": NOW - 0.5,
            "jobs": {"total": 10, "done": 3, "running": 4, "left": 3}, "rate": 0.5,
            "eta": NOW + 14, "lost": [], "fatal": "", "stopping": "",
            "nodes": {"n1": {"state": "ready", "slots": 2, "done": 2, "running": 2,
                             "errors": 1, "timeouts": 0, "last_seen": NOW - 1,
                             "caps": "tools=md5sum", "status": "working"},
                      "n2": {"state": "ready", "slots": 2, "done": 1, "running": 2,
                             "errors": 0, "timeouts": 1, "last_seen": NOW - 2,
                             "caps": "tools=md5sum", "status": "working"}}}
    home.live(1).write_text(json.dumps(live))
    results = [JobResult("ex__a.ps.ppmraw.72.0", 0, 0.1, 0.0, 0.0, "aa" * 16, "gs", "n1"),
               JobResult("ex__b.ps.ppmraw.72.0", 1, 0.1, 0.0, 0.0, "0", "gs", "n1"),
               JobResult("ex__c.ps.ppmraw.72.0", 0, 0.1, 0.0, 0.0, "cc" * 16, "gs", "n2")]
    jrnl = journal.Journal(home.results(1), RUN)
    jrnl.append(results)
    jrnl.close()
    (home.status(1)).write_text(f"run {RUN} - 3/10 done\n")
    heartbeat(home, "n1", NOW - 5, "working")
    heartbeat(home, "n2", NOW - 6, "working")
    heartbeat(home, "n3", NOW - 400, "idle")
    return home, cfg


def test_a_run_under_way_shows_in_the_queues_running_and_nodes(tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    snap = fresh(home, cfg)
    q1 = snap["queues"][1]["runs"]
    assert [(r["line"], r["running"], r["id"]) for r in q1] == [
        ("git 0123abcd gs", True, RUN), ("git 4567cdef gs,pdfwrite", False, "p1:2")]
    assert q1[1]["kind"] == "git" and q1[1]["who"] == "4567cdef"
    assert q1[1]["products"] == ["gs", "pdfwrite"]
    assert isinstance(q1[1]["queued"], float)  # the queue file's mtime at the first look
    [run] = snap["running"]
    assert run["run"] == RUN and run["state"] == "running"
    assert run["jobs"] == {"total": 10, "done": 3, "running": 4, "left": 3}
    assert run["elapsed"] == pytest.approx(42) and run["eta"] == NOW + 14
    assert run["status"] == f"run {RUN} - 3/10 done" and run["stop_requested"] is None
    nodes = {n["name"]: n for n in snap["nodes"]}
    assert set(nodes) == {"n1", "n2", "n3"}
    assert nodes["n1"]["run"] == RUN and nodes["n1"]["done"] == 2
    assert nodes["n1"]["errors"] == 1 and nodes["n2"]["timeouts"] == 1
    assert nodes["n1"]["last_heard"] == pytest.approx(NOW - 5)
    assert nodes["n1"]["status"] == "working" and nodes["n1"]["caps"] == "tools=md5sum"
    assert nodes["n1"]["down_since"] is None and not nodes["n1"]["down"]
    assert snap["status"] == [{"priority": 1, "lane": 1, "line": f"run {RUN} - 3/10 done"}]
    assert SECRET not in json.dumps(snap)


def test_a_node_not_heard_from_for_300_s_is_down_since_its_last_heartbeat_plus_300(
        tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    n3 = {n["name"]: n for n in fresh(home, cfg)["nodes"]}["n3"]
    assert n3["down"] and n3["down_since"] == pytest.approx(NOW - 100)
    assert n3["run"] is None and n3["done"] == 0
    # 299 s after its heartbeat it was not down yet.
    n3 = {n["name"]: n for n in fresh(home, cfg, NOW - 101)["nodes"]}["n3"]
    assert not n3["down"] and n3["down_since"] is None
    # node_down_after is the threshold.
    cfg2 = configfile.load(None, {"home": str(home.root), "node_down_after": "500"})
    assert {n["name"]: n for n in fresh(home, cfg2)["nodes"]}["n3"]["down_since"] is None


def test_a_disabled_node_shows_who_disabled_it_and_why(tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    home.node_down("n2").write_text("disabled by alice@host at 2027-01-15T08:00:00Z\n"
                                    "disk full\n")
    n2 = {n["name"]: n for n in fresh(home, cfg)["nodes"]}["n2"]
    assert n2["disabled"] == "disabled by alice@host at 2027-01-15T08:00:00Z"
    assert n2["disabled_reason"] == "disk full"


def test_run_detail_of_a_running_run_comes_from_its_journal(tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    reader = StatusReader()
    detail = reader.run_detail(home, RUN)
    assert detail["state"] == "running" and detail["run"] == RUN
    assert detail["info"]["queue"] == "git 0123abcd gs" and "secret" not in detail["info"]
    assert detail["by_node"] == {"n1": ["ex__a.ps.ppmraw.72.0", "ex__b.ps.ppmraw.72.0"],
                                 "n2": ["ex__c.ps.ppmraw.72.0"]}
    assert detail["failed"] == [{"test": "ex__b.ps.ppmraw.72.0", "error": 1, "machine": "n1"}]
    assert detail["counts"]["done"] == 3 and detail["counts"]["total"] == 10
    assert detail["live"]["jobs"]["done"] == 3
    assert SECRET not in json.dumps(detail)
    # The journal grows: only what was appended is read, and a torn last line waits.
    with open(home.results(1), "a") as fh:
        fh.write(journal.format_line(JobResult("ex__d.ps.ppmraw.72.0", 0, 0.1, 0, 0,
                                               "dd" * 16, "gs", "n2")) + "\n")
        fh.write("n1 result ex__e.ps.ppm")
    detail = reader.run_detail(home, RUN)
    assert detail["by_node"]["n2"] == ["ex__c.ps.ppmraw.72.0", "ex__d.ps.ppmraw.72.0"]
    assert detail["counts"]["done"] == 4
    # The waiting run is named by its place in its queue.
    waiting = reader.run_detail(home, "p1:2")
    assert waiting["state"] == "queued" and waiting["info"]["line"] == "git 4567cdef gs,pdfwrite"
    assert reader.run_detail(home, "p1:1")["run"] == RUN  # the head is the running run


def test_a_live_file_left_by_a_killed_master_is_ignored(tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    home.job_start(1).unlink()  # the run is over; its live file was left
    snap = fresh(home, cfg)
    assert snap["running"] == []
    assert all(n["run"] is None for n in snap["nodes"])


def test_a_run_starting_is_listed_before_its_master_writes_its_live_file(
        tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    home.live(1).unlink()
    [run] = fresh(home, cfg)["running"]
    assert run["state"] == "starting" and run["run"] == RUN
    assert run["jobs"] == {"total": 0, "done": 0, "running": 0, "left": 0}
    assert run["elapsed"] is None and run["eta"] is None


def test_a_stop_request_shows_on_the_running_run(tmp_path: Path) -> None:
    home, cfg = running_home(tmp_path)
    home.stop_request(RUN).parent.mkdir(parents=True, exist_ok=True)
    home.stop_request(RUN).write_text("bob@host\nwrong commit\n")
    assert fresh(home, cfg)["running"][0]["stop_requested"] == "bob@host"
    assert StatusReader().run_detail(home, RUN)["stop_requested"] == "bob@host"


def test_recent_runs_newest_first_with_counts_links_and_failed_builds(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    done = archive(home, "20270101000000-p2-0001", "auto nightly gs", "done",
                   rows=[row("ex__a.ps.ppmraw.72.0"), row("ex__b.ps.ppmraw.72.0", 1)],
                   summary={"nodes": 2, "differences": 1, "errors": 1})
    # A failed build: a report with the failure, no .tab, no differences or errors lines.
    archive(home, "20270102000000-p1-0002", "git 0123abcd gs", "failed",
            report="An error occurred that prevented the local cluster run from finishing:\n"
                   "  build failed on n1\n", summary={"nodes": 1})
    archive(home, "20270103000000-p0-0003", "user alice gs bmpcmp", "done", bmpcmp=True,
            summary={"nodes": 2})
    # An older archive without summary lines (an earlier release's).
    archive(home, "20261231000000-p0-0000", "user bob gs", "done", rows=[row("x.ps.a")])
    (home.archive / "20270104000000-p0-0004").mkdir()  # being written: no run.info yet
    snap = fresh(home, cfg)
    recent = snap["recent"]
    assert [r["run"] for r in recent] == ["20270103000000-p0-0003", "20270102000000-p1-0002",
                                          "20270101000000-p2-0001", "20261231000000-p0-0000"]
    bmp, failed, nightly, old = recent
    assert nightly["kind"] == "auto" and nightly["who"] == "nightly"
    assert nightly["what"] == "auto nightly gs" and nightly["outcome"] == "done"
    assert (nightly["nodes"], nightly["differences"], nightly["errors"]) == (2, 1, 1)
    assert nightly["elapsed"] == 12.5
    assert nightly["ended"] == pytest.approx((done / "run.info").stat().st_mtime)
    assert nightly["started"] == calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert nightly["links"] == {
        "report": "/archive/20270101000000-p2-0001/report.txt",
        "tab": "/archive/20270101000000-p2-0001/20270101000000-p2-0001.tab", "bmpcmp": None,
        "junit": None, "json": None}
    assert failed["outcome"] == "failed" and failed["links"]["tab"] is None
    assert (failed["nodes"], failed["differences"], failed["errors"]) == (1, None, None)
    assert bmp["links"]["bmpcmp"] == "/archive/20270103000000-p0-0003/bmpcmp/index.html"
    (done / "junit.xml").write_text("<testsuites/>")  # the CI files, once archived
    (done / "result.json").write_text("{}")
    links = fresh(home, cfg)["recent"][2]["links"]
    assert (links["junit"], links["json"]) == ("/archive/20270101000000-p2-0001/junit.xml",
                                               "/archive/20270101000000-p2-0001/result.json")
    assert bmp["who"] == "alice"
    assert (old["nodes"], old["differences"], old["errors"]) == (None, None, None)


def test_run_detail_of_finished_and_failed_runs_and_unknown_ones(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    archive(home, "20270101000000-p2-0001", "auto nightly gs", "done",
            rows=[row("ex__a.ps.ppmraw.72.0", machine="n1"),
                  row("ex__b.ps.ppmraw.72.0", 1, machine="n2"),
                  row("ex__c.ps.ppmraw.72.0", machine="n2")], summary={"nodes": 2})
    archive(home, "20270102000000-p1-0002", "git 0123abcd gs", "failed",
            report="header\n\nAn error occurred that prevented the local cluster run from "
                   "finishing:\n  build failed on n1\n")
    reader = StatusReader()
    detail = reader.run_detail(home, "20270101000000-p2-0001")
    assert detail["state"] == "finished" and detail["info"]["outcome"] == "done"
    assert detail["by_node"] == {"n1": ["ex__a.ps.ppmraw.72.0"],
                                 "n2": ["ex__b.ps.ppmraw.72.0", "ex__c.ps.ppmraw.72.0"]}
    assert detail["failed"] == [{"test": "ex__b.ps.ppmraw.72.0", "error": 1, "machine": "n2"}]
    assert detail["counts"]["tests"] == 3 and detail["counts"]["nodes"] == 2
    failed = reader.run_detail(home, "20270102000000-p1-0002")
    assert failed["info"]["outcome"] == "failed" and failed["by_node"] == {}
    assert "  build failed on n1" in failed["report_head"]
    for bad in ("20270109000000-p0-ffff", "p0:1", "p7:1", "../etc"):
        with pytest.raises(ClusterError, match="run|priority|queue"):
            reader.run_detail(home, bad)
    with pytest.raises(ClusterError, match="20270109000000-p0-ffff is not queued, running or "
                                           "archived"):
        reader.run_detail(home, "20270109000000-p0-ffff")


def test_a_run_whose_end_steps_are_under_way_is_shown_as_ending(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    start = start_of(RUN, "git 0123abcd gs", 1)
    EndRecord.create(home.run_dir(RUN), start, Outcome.ABORTED, "stopped by bob@host",
                     elapsed=30.0)
    detail = StatusReader().run_detail(home, RUN)
    assert detail["state"] == "running" and detail["ending"] is True
    assert detail["info"]["outcome"] == "aborted"
    assert detail["info"]["reason"] == "stopped by bob@host"
    assert (home.run_dir(RUN) / ending.FILE_NAME).exists()


def test_a_queued_time_is_kept_from_the_first_look(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    queue = QueueFile.for_priority(home, 0)
    queue.append(RunSpec.parse("user alice gs"))
    os.utime(queue.path, (NOW - 60, NOW - 60))
    reader = StatusReader()
    first = reader.snapshot(home, cfg, NOW)["queues"][0]["runs"][0]
    assert first["queued"] == pytest.approx(NOW - 60)
    queue.append(RunSpec.parse("user bob gs"))
    os.utime(queue.path, (NOW - 10, NOW - 10))
    runs = reader.snapshot(home, cfg, NOW)["queues"][0]["runs"]
    assert [r["queued"] for r in runs] == [pytest.approx(NOW - 60), pytest.approx(NOW - 10)]
    assert [r["id"] for r in runs] == ["p0:1", "p0:2"]


def big_home(tmp_path: Path, archives: int = 200, nodes: int = 1000) -> tuple[Home, Config]:
    home, cfg = make_home(tmp_path)
    for i in range(archives):
        archive(home, f"2027010{1 + i // 100}{i % 100:06d}-p1-{i:04x}", "git 0123abcd gs",
                "done", rows=[row("ex__a.ps.ppmraw.72.0")],
                summary={"nodes": 3, "differences": i % 5, "errors": 0})
    for i in range(nodes):
        heartbeat(home, f"n{i:04d}", NOW - i % 600)
    return home, cfg


def test_the_archive_is_read_once_per_change_and_nodes_at_most_every_ttl(
        tmp_path: Path) -> None:
    home, cfg = big_home(tmp_path)
    reader = StatusReader(nodes_ttl=3600.0)
    first = reader.snapshot(home, cfg, NOW)
    assert len(first["recent"]) == status.RECENT and len(first["nodes"]) == 1000
    reads = reader.archive_reads
    assert reads == status.RECENT  # only the 20 newest folders are read
    again = reader.snapshot(home, cfg, NOW)
    assert reader.archive_reads == reads  # nothing re-read
    assert again["recent"] == first["recent"] and again["nodes"] == first["nodes"]
    # A new archived run: exactly one more folder read.
    archive(home, "20270201000000-p1-ffff", "git 89abcdef gs", "done", rows=[],
            summary={"nodes": 1, "differences": 0, "errors": 0})
    newest = reader.snapshot(home, cfg, NOW)["recent"]
    assert newest[0]["run"] == "20270201000000-p1-ffff"
    assert reader.archive_reads == reads + 1
    # Nodes: the listing is reused within the ttl (a new node shows after it).
    heartbeat(home, "zz-new", NOW)
    assert "zz-new" not in {n["name"] for n in reader.snapshot(home, cfg, NOW)["nodes"]}
    reader.nodes_ttl = 0.0
    assert "zz-new" in {n["name"] for n in reader.snapshot(home, cfg, NOW)["nodes"]}
    # Down states follow ``now`` even from a reused listing.
    later = {n["name"]: n for n in reader.snapshot(home, cfg, NOW + 1000)["nodes"]}
    assert all(n["down"] for n in later.values())


def test_a_finished_run_detail_is_cached_until_its_folder_changes(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    folder = archive(home, "20270101000000-p2-0001", "auto nightly gs", "done",
                     rows=[row("ex__a.ps.ppmraw.72.0")])
    reader = StatusReader()
    one = reader.run_detail(home, "20270101000000-p2-0001")
    one["by_node"].clear()  # the caller's copy
    two = reader.run_detail(home, "20270101000000-p2-0001")
    assert two["by_node"] == {"n1": ["ex__a.ps.ppmraw.72.0"]}
    (folder / "mail.log").write_text("mailed\n")  # a new file: the folder changed
    (folder / f"{folder.name}.tab").write_text(row("ex__z.ps.ppmraw.72.0") + "\n")
    assert reader.run_detail(home, folder.name)["by_node"] == {"n1": ["ex__z.ps.ppmraw.72.0"]}
