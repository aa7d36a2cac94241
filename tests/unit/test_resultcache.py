"""The result cache (docs/results.md, "Results reused"): a job's key, the store (bounded,
read back by a new process, a corrupt file ignored), the node's build digests and the run
state's one pass."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from cluster import config
from cluster.master.cache import reuse
from cluster.master.cache.resultcache import FileDigests, ResultCache, job_inputs, key_of
from cluster.master.cache.reuse import RunReuse, load_builds, run_entries, store_run
from cluster.master.model.joblist import MemoryJobList
from cluster.master.model.results import Results
from cluster.master.state import runcore
from cluster.master.state.runstate import RunState
from cluster.node.builddigest import program_digests
from cluster.records import Job
from cluster.runoptions import RunOptionError, RunOptions, check_word
from cluster.wire import protocol
from cluster.wire.protocol import Request, format_request, parse_digests, parse_request

RUN = "run-2"
MD5 = "0123456789abcdef0123456789abcdef"
GS = ("gs", "a" * 64)
MUTOOL = ("mutool", "b" * 64)


def gs_line(name: str, path: str, opts: str = "-r72") -> Job:
    return Job(name, f"__temp__/{name}.log",
               f"__bin__/gs {opts} -sOutputFile=- __tests__/{path} | md5sum")


def mutool_line(name: str, path: str) -> Job:
    return Job(name, f"__temp__/{name}.log",
               f"__bin__/mutool draw -o - __tests__/{path} | md5sum")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "tests"
    root.mkdir()
    for name in ("a.ps", "b.ps", "c.pdf", "it's.ps"):
        (root / name).write_bytes(f"%!PS {name}\n".encode())
    return root


def key(job: Job, corpus: Path, builds: dict[str, str]) -> str | None:
    return key_of(job.line, FileDigests(corpus), builds)


# ------------------------------------------------------------------------------ the key
def test_job_inputs_are_the_programs_and_the_test_paths() -> None:
    assert job_inputs(gs_line("x", "a.ps").line) == (("gs",), ("a.ps",))
    # As the job list writes them: the command echoed, quoted, then run.
    echoed = Job("e", "__temp__/e.log", "echo '__bin__/gs - < __tests__/c/a.ps' >> l ; "
                                        "__bin__/gs - < __tests__/c/a.ps")
    assert job_inputs(echoed.line) == (("gs",), ("c/a.ps",))
    # A path shlex.quote had to quote: no key (the job runs).
    quoted = Job("q", "__temp__/q.log", "__bin__/gs __tests__/'it'\"'\"'s.ps' | md5sum")
    assert job_inputs(quoted.line) is None
    assert job_inputs("t l true ; __bin__/gs __baseline__/gs __tests__/a.ps") is None
    assert job_inputs("t l true ; echo __tests__/a.ps") is None  # no program: no key
    assert job_inputs("t l true ; cd __tree__ && __bin__/gs x") is None


def test_a_changed_byte_in_the_test_file_changes_the_key(corpus: Path) -> None:
    job = gs_line("a", "a.ps")
    before = key(job, corpus, dict([GS]))
    path = corpus / "a.ps"
    st = path.stat()
    path.write_bytes(path.read_bytes().replace(b"a", b"b", 1))  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    after = key(job, corpus, dict([GS]))
    assert before and after and before != after


def test_a_changed_byte_in_the_command_or_the_binary_changes_the_key(corpus: Path) -> None:
    builds = dict([GS])
    base = key(gs_line("a", "a.ps"), corpus, builds)
    assert base == key(gs_line("a", "a.ps"), corpus, builds)  # stable
    assert key(gs_line("a", "a.ps", "-r73"), corpus, builds) != base
    assert key(gs_line("a", "a.ps"), corpus, {"gs": "c" * 64}) != base
    # Only the programs the job calls are part of its key: a rebuilt mutool is not.
    assert key(gs_line("a", "a.ps"), corpus, dict([GS, MUTOOL])) == base
    assert key(gs_line("a", "a.ps"), corpus, dict([MUTOOL])) is None  # gs not built
    assert key(gs_line("a", "missing.ps"), corpus, builds) is None


def test_program_digests_are_per_program(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "gs").write_bytes(b"gs binary")
    (tree / "bin" / "mutool").write_bytes(b"mutool binary")
    first = dict(program_digests(tree, tree / "bin", ["gs", "mutool", "gxps"]))
    assert set(first) == {"gs", "mutool"}  # gxps was not built
    (tree / "bin" / "gs").write_bytes(b"gs binarY")
    second = dict(program_digests(tree, tree / "bin", ["gs", "mutool"]))
    assert second["gs"] != first["gs"] and second["mutool"] == first["mutool"]


def test_ghostpdl_resources_are_part_of_each_program_digest(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "Resource" / "Init").mkdir(parents=True)
    (tree / "bin" / "gs").write_bytes(b"gs")
    init = tree / "Resource" / "Init" / "gs_init.ps"
    init.write_bytes(b"init 1")
    first = program_digests(tree, tree / "bin", ["gs"])
    init.write_bytes(b"init 2")
    assert program_digests(tree, tree / "bin", ["gs"]) != first


def test_digests_travel_in_the_request() -> None:
    req = Request(node="n1", job_id=RUN, built=RUN, digests=(GS, MUTOOL))
    assert parse_request(format_request(req)).digests == (GS, MUTOOL)
    with pytest.raises(ValueError, match="64 lower-case hex"):
        parse_digests("gs=abc")
    with pytest.raises(ValueError, match="twice"):
        parse_digests(f"gs={'a' * 64},gs={'b' * 64}")


def test_reuse_is_a_per_run_option_and_a_setting() -> None:
    cfg = config.Config()
    assert RunOptions.of([], cfg).reuse is True
    assert RunOptions.of(["reuse=no"], cfg).reuse is False
    off = config.Config(result_cache=False)
    assert RunOptions.of([], off).reuse is False
    assert RunOptions.of(["reuse=yes"], off).reuse is True  # but for_run still says no
    with pytest.raises(RunOptionError, match="reuse=yes or reuse=no"):
        check_word("reuse", "maybe")


# ---------------------------------------------------------------------------- the store
def entries(n: int, tag: str = "") -> list[tuple[str, str]]:
    return [(f"{i:064x}", f"n1@r0 t{i}{tag} 0 0.10 0.00 0.00 {MD5} gs") for i in range(n)]


def test_the_store_is_read_back_by_a_new_process_and_bounded(tmp_path: Path) -> None:
    root = tmp_path / "result-cache"
    for run in range(7):
        ResultCache(root, 3).save_run(f"run{run}", [GS], entries(2, f"r{run}"))
    fresh = ResultCache(root, 3)  # as a restarted master sees it: files only
    assert [r.run_id for r in fresh.runs()] == ["run4", "run5", "run6"]
    table = fresh.table([GS])
    assert table[f"{0:064x}"].startswith("n1@r0 t0r6 ")  # the newest run wins a key
    assert fresh.table([MUTOOL]) == {}  # no run holds that build


def test_a_run_saved_again_replaces_its_file(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, 5)
    cache.save_run("r", [GS], entries(1))
    cache.save_run("r", [GS], entries(2))
    assert [r.run_id for r in cache.runs()] == ["r"]
    assert len(cache.table([GS])) == 2


@pytest.mark.parametrize("damage", ["truncate", "count", "garbage", "header"])
def test_a_corrupt_file_is_ignored_with_a_log_line(tmp_path: Path, damage: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    cache = ResultCache(tmp_path, 5)
    cache.save_run("good", [GS], entries(2, "g"))
    cache.save_run("bad", [GS], entries(3, "b"))
    path = next(p for p in tmp_path.iterdir() if p.name.endswith("-bad.results"))
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[:-9])
    elif damage == "count":
        path.write_text(text.replace("end 3", "end 4"))
    elif damage == "garbage":
        path.write_text(text.replace(" 0 0.10", " x 0.10", 1))
    else:
        path.write_text(text.replace("result-cache 2 bad", "result-cache 9 bad"))
    with caplog.at_level(logging.WARNING, logger="cluster.resultcache"):
        table = cache.table([GS])
    assert sorted(t.split()[1] for t in table.values()) == ["t0g", "t1g"]
    assert any(path.name in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- the run's one pass
def make_jobs() -> list[Job]:
    return [gs_line("a.gs", "a.ps"), gs_line("b.gs", "b.ps"), mutool_line("c.mu", "c.pdf"),
            Job("d.sh", "__temp__/d.log", "echo __tests__/a.ps | md5sum")]


def finished_results(jobs: list[Job], node: str) -> Results:
    results = Results(MemoryJobList(jobs))
    texts = [f"{j.name} 0 0.50 0.00 0.00 {MD5} gs" for j in jobs]
    results.add(list(range(len(jobs))), texts, f"{node} result ")
    return results


def test_a_run_stores_its_keyed_results_and_the_next_reuses_them(tmp_path: Path,
                                                                 corpus: Path) -> None:
    jobs = make_jobs()
    cache = ResultCache(tmp_path / "rc", 5)
    run1 = tmp_path / "run1"
    run1.mkdir()
    first = RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), run1 / "builds")
    first.learn("n1", (GS, MUTOOL))
    assert load_builds(run1 / "builds") == {"n1": (GS, MUTOOL)}
    stored = store_run(cache, "run1", MemoryJobList(jobs), finished_results(jobs, "n1"),
                       run1, FileDigests(corpus))
    assert stored == 3  # d.sh calls no program: no key

    (corpus / "b.ps").write_bytes(b"%!PS changed\n")
    state = RunState(RUN, jobs, 0)
    run2 = tmp_path / "run2"
    run2.mkdir()
    state.reuse = RunReuse(cache, FileDigests(corpus), state.jobs, run2 / "builds")
    assert state.handle(Request(node="n1", job_id=RUN, slots=1), 0).reply.verb == "BUILD"
    out = state.handle(Request(node="n1", job_id=RUN, built=RUN, slots=1,
                               digests=(GS, MUTOOL)), 1)
    # a.gs and c.mu reused; b.gs (its file changed) and d.sh (no key) handed out.
    assert state.reused == 2
    # Their machine: the node and run that made them, not the node they were served to.
    assert b"cache:n1@run1 result a.gs 0 0.50" in out.journal
    assert b"cache:n1@run1 result c.mu 0" in out.journal
    assert sorted(line.split()[0] for line in out.reply.jobs) == ["b.gs", "d.sh"]
    assert state.machines == set()  # the cache is not a node
    # A master taking over from the journal keeps them and their count.
    lines = [line for line in out.journal.decode().splitlines()]
    again = RunState(RUN, jobs, 0, done=lines)
    assert again.reused == 2 and again.results.count == 2
    # The reused rows are stored again (under the same key) at the run's end.
    results = state.results
    results.add([1, 3], [f"b.gs 0 0.1 0 0 {MD5} gs", f"d.sh 0 0.1 0 0 {MD5} shell"],
                "n1 result ")
    keyed = dict(run_entries(state.jobs, results, {"n1": (GS, MUTOOL)}, FileDigests(corpus),
                             RUN))
    assert len(keyed) == 3
    # The reused ones keep their maker; the run's own are made by n1 in this run.
    assert sorted(v.split(" ", 2)[0] + " " + v.split(" ", 2)[1] for v in keyed.values()) == [
        f"n1@{RUN} b.gs", "n1@run1 a.gs", "n1@run1 c.mu"]


def test_other_builds_keep_their_own_keys(tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    cache = ResultCache(tmp_path / "rc", 5)
    (tmp_path / "r1").mkdir()
    RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), tmp_path / "r1" / "builds") \
        .learn("n1", (GS, MUTOOL))
    store_run(cache, "r1", MemoryJobList(jobs), finished_results(jobs, "n1"),
              tmp_path / "r1", FileDigests(corpus))
    state = RunState(RUN, jobs, 0)
    (tmp_path / "r2").mkdir()
    state.reuse = RunReuse(cache, FileDigests(corpus), state.jobs, tmp_path / "r2" / "builds")
    other_gs = ("gs", "d" * 64)  # another compiler's gs
    state.handle(Request(node="n2", job_id=RUN, slots=1), 0)
    state.handle(Request(node="n2", job_id=RUN, built=RUN, slots=1,
                         digests=(other_gs, MUTOOL)), 1)
    assert state.reused == 1  # only the mutool job: the gs jobs' keys differ
    assert state.results.has(2) and not state.results.has(0)


def test_a_node_whose_build_changed_within_the_run_is_not_keyed(tmp_path: Path,
                                                               corpus: Path) -> None:
    run = RunReuse(ResultCache(tmp_path / "rc", 5), FileDigests(corpus),
                   MemoryJobList(make_jobs()), tmp_path / "builds")
    run.learn("n1", (GS,))
    run.learn("n1", (("gs", "e" * 64),))
    assert load_builds(tmp_path / "builds") == {"n1": ()}


def test_bypassed_jobs_and_reuse_off_are_never_served(tmp_path: Path, corpus: Path) -> None:
    jobs = make_jobs()
    cache = ResultCache(tmp_path / "rc", 5)
    (tmp_path / "r1").mkdir()
    RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), tmp_path / "r1" / "builds") \
        .learn("n1", (GS, MUTOOL))
    store_run(cache, "r1", MemoryJobList(jobs), finished_results(jobs, "n1"),
              tmp_path / "r1", FileDigests(corpus))
    run = RunReuse(cache, FileDigests(corpus), MemoryJobList(jobs), tmp_path / "b2")
    run.bypass.add("a.gs")
    found, _ = run.resolve("n1", (GS, MUTOOL), Results(MemoryJobList(jobs)).offsets,
                           bytearray(len(jobs)))
    assert found == [1, 2]
    state = RunState(RUN, jobs, 0)  # reuse None: off
    state.handle(Request(node="n1", job_id=RUN, slots=1), 0)
    out = state.handle(Request(node="n1", job_id=RUN, built=RUN, slots=1,
                               digests=(GS, MUTOOL)), 1)
    assert state.reused == 0 and out.reply.verb == protocol.JOBS


def test_the_prefixes_agree() -> None:
    assert reuse.CACHE_PREFIX == runcore.CACHE_PREFIX


@pytest.mark.parametrize(("line", "settings", "programs", "on"), [
    ("user bob gs", {}, ("gs",), True),
    ("user bob gs reuse=no", {}, ("gs",), False),
    ("user bob gs", {"result_cache": False}, ("gs",), False),
    ("user bob gs every_node", {}, ("gs",), False),
    ("user bob shell", {}, (), False),  # no job calls a program: none has a key
])
def test_which_runs_reuse(tmp_path: Path, line: str, settings: dict[str, bool],
                          programs: tuple[str, ...], on: bool) -> None:
    from cluster.home import Home
    from cluster.runspec import RunSpec
    from cluster.wire.jobstart import JobStart

    cfg = config.Config(**settings)  # type: ignore[arg-type]
    spec = RunSpec.parse(line)
    start = JobStart(id=RUN, priority=0, queue=line, kind="user", ref="bob",
                     products=("gs",), tree="ghostpdl", source="ghostpdl", build="make",
                     tests="tests", programs=programs)
    got = reuse.for_run(cfg, Home(tmp_path), spec, start, RunOptions.of(spec.options, cfg),
                        MemoryJobList(make_jobs()))
    # reuse=no: no lookup, but the builds are learnt (the results are stored, keyed).
    assert (got is not None and got.lookups) is on
    assert (got is not None) is (on or "reuse=no" in line)


def test_a_test_known_to_be_indeterminate_is_never_served_from_the_cache(
        tmp_path: Path) -> None:
    """A test in tables/indeterminate.tsv always runs (a cached output would hide that it
    changes by itself); its results are still stored (the next run's same-build check)."""
    from cluster.home import Home
    from cluster.report import indeterminate
    from cluster.runspec import RunSpec
    from cluster.wire.jobstart import JobStart

    indeterminate.record(tmp_path / "tables", [
        indeterminate.Flaky(1.8e9, "r0", "a.gs", ("n1", "n2"), ("x", "y"))], 10)
    cfg = config.Config()
    line = "user bob gs"
    spec = RunSpec.parse(line)
    start = JobStart(id=RUN, priority=0, queue=line, kind="user", ref="bob",
                     products=("gs",), tree="ghostpdl", source="ghostpdl", build="make",
                     tests="tests", programs=("gs",))
    got = reuse.for_run(cfg, Home(tmp_path), spec, start, RunOptions.of(spec.options, cfg),
                        MemoryJobList(make_jobs()))
    assert got is not None and got.bypass == {"a.gs"}
    assert reuse.stores(cfg, spec, start)
