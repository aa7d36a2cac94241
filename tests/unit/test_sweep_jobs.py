"""The jobs of product sweep (cluster.jobs.sweepjobs) and the pieces a sweep run adds
elsewhere: the queue's ``sweep=`` option, build.py's sweep form, readlog's sweep label, the
slot number, clusterpush --sweep's checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cluster.cli import build, clusterpush
from cluster.config import Config
from cluster.errors import QueueLineError, SweepError
from cluster.home import Home
from cluster.jobs import generate as jobgen
from cluster.jobs.sweepjobs import (
    node_job_timeout,
    size_limit_blocks,
    sweep_jobs,
    task_command,
    task_job,
)
from cluster.master.run.clustermaster import ClusterMaster
from cluster.node import readlog, slots
from cluster.records import ERROR_NONE, ERROR_READ, ERROR_TIMEOUT, Job
from cluster.runspec import RunSpec
from cluster.sweep import expand
from cluster.sweep.expand import Task
from cluster.sweep.spec import load
from cluster.sweep.table import Row
from cluster.triggers.droppings import DROPPING
from cluster.triggers.sweeppush import prepare_sweep
from cluster.wire.jobstart import JobStart

ID = "0123456789abcdef01234567"


def _task(command: str, inputs: tuple[tuple[str, str], ...] = ()) -> Task:
    return Task(number=1, task_id=ID, command=command, inputs=inputs,
                row=Row(1, ("x",), "params.csv:2"), collect_targets=())


def test_the_job_line_of_a_task_is_exactly_this() -> None:
    task = _task("python3 m.py --a 1 > out.txt", (("config.ini", "a = 1\n"),))
    job = task_job(task, 64 << 20)
    t = f"__temp__/{ID}"
    assert job.name == ID and job.logfile == f"{t}.log"
    assert job.command == (
        f"{{ cd {t} && "
        "{ ! { [ -e config.ini ] || [ -L config.ini ] ; } || rm -rf -- config.ini ; } && "
        "printf 'a = 1\\012' > config.ini && ulimit -f 131073 && "
        "CLUSTER_SWEEP_DIR=__tree__ && export CLUSTER_SWEEP_DIR && "
        f"eval 'python3 m.py --a 1 > out.txt' > {t}.out ; }} 2> {t}.err")
    # Streams that are not results go nowhere: no file is made for them.
    assert task_job(task, 64 << 20, stdout=False, stderr=False).command.endswith(
        "eval 'python3 m.py --a 1 > out.txt' > /dev/null ; } 2> /dev/null")
    assert Job.parse(job.line) == job  # one line, as a jobs file holds it


def test_the_limits_a_sweep_job_gets_from_max_result_bytes_and_timeout() -> None:
    # The fewest 512-byte blocks *more* than the limit: a stopped file is always over it.
    assert [size_limit_blocks(n) for n in (1, 511, 512, 4096, 64 << 20)] == [
        1, 1, 2, 9, 131073]
    assert node_job_timeout(120) == 120.0  # the node's own kill is the sweep's timeout


def test_hostile_texts_reach_the_shell_quoted_and_hide_from_the_nodes_placeholders(
        ) -> None:
    hostile = "$(touch pwned); `id` 'q' \"d\" __bin__ \\ %s -n\n{x}"
    task = _task(hostile, (("a b/c'd$(x).ini", hostile), ("e;rm -rf ~", ""),
                           ("a b/f", "2"), ("-x", "-y")))
    command = task_command(task, 1000)
    # One line; no node placeholder left to replace; every text single-quoted.
    assert "\n" not in command and "__bin__" not in command and "_''_bin_''_" in command
    assert "printf '$(touch pwned); `id` '\"'\"'q'\"'\"' \"d\" _''_bin_''_ \\\\ %%s -n\\012{x}' " \
           "> 'a b/c'\"'\"'d$(x).ini'" in command
    assert "mkdir -p -- 'a b' && " in command and command.count("mkdir -p") == 1
    assert ": > 'e;rm -rf ~'" in command  # an empty text
    assert "printf '\\055y' > -x" in command  # a format never starts with '-'
    # Each top-level name written loses a link of the sweep folder first, once.
    assert command.count("{ ! { [ -e 'a b' ] || [ -L 'a b' ] ; } || rm -rf -- 'a b' ; }") == 1
    # A command with a newline goes through printf, in a command substitution.
    assert "eval \"$(printf '$(touch pwned); " in command


def _sweep(folder: Path, rows: list[str], command: str = "echo {a}") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.csv").write_text("a\n" + "".join(r + "\n" for r in rows))
    (folder / "sweep.toml").write_text(f"command = {command!r}\ntable = 'params.csv'\n"
                                       "timeout = 9\n")
    return folder / "sweep.toml"


def test_sweep_jobs_stream_one_job_per_task_named_by_its_stable_id(tmp_path: Path) -> None:
    spec = load(_sweep(tmp_path / "s", ["1", "a b;rm x", "3"]))
    jobs = sweep_jobs(spec, 1000)
    assert iter(jobs) is jobs  # a stream, not a list
    got = list(jobs)
    ids = [expand.task_id(f"echo {v}", ("a",), (raw,)) for v, raw in
           (("1", "1"), ("'a b;rm x'", "a b;rm x"), ("3", "3"))]
    assert [j.name for j in got] == ids
    assert [j.command.split(" && eval ", 1)[1].split(" > ", 1)[0] for j in got] == [
        "'echo 1'", "'echo '\"'\"'a b;rm x'\"'\"''", "'echo 3'"]
    assert all("ulimit -f 2 &&" in j.command for j in got)  # max_result_bytes 1000


def test_a_bad_row_stops_the_stream_after_the_good_ones(tmp_path: Path) -> None:
    path = _sweep(tmp_path / "s", ["1", "2"])
    (tmp_path / "s" / "params.csv").write_text("a,b\n1,x\n2,y\n3\n")
    jobs = sweep_jobs(load(path), 1000)
    assert next(jobs).name and next(jobs).name
    with pytest.raises(SweepError, match=r"params.csv:4: the line has 1 cells, the header "
                       r"has 2"):
        next(jobs)


def test_the_queue_line_of_a_sweep_run() -> None:
    spec = RunSpec.parse("user bob sweep sweep=my-sweep.toml")
    assert spec.tree == "sweep" and spec.sweep_file == "my-sweep.toml"
    assert RunSpec.parse("user bob sweep").sweep_file == "sweep.toml"
    assert RunSpec.parse("user bob gs").sweep_file is None
    with pytest.raises(QueueLineError, match="goes with product sweep only"):
        RunSpec.parse("user bob gs sweep=s.toml")
    with pytest.raises(QueueLineError, match="bad sweep file"):
        RunSpec.parse("user bob sweep sweep=../s.toml")
    with pytest.raises(QueueLineError, match="must be queued alone"):
        RunSpec.parse("user bob gs,sweep")
    assert RunSpec.parse("user bob sweep relaxtimeout").options == ("relaxtimeout",)
    for option in ("bmpcmp", "lowres", "filter=a", "tree=x"):
        with pytest.raises(QueueLineError, match=f"option '{option.partition('=')[0]}' "
                           "does not go with product sweep"):
            RunSpec.parse(f"user bob sweep {option}")


def test_generate_refuses_sweep_and_sweep_is_alone() -> None:
    assert jobgen.check_products(["sweep"]) == ["sweep"]
    with pytest.raises(ValueError, match="product sweep must be built alone"):
        jobgen.check_products(["sweep", "gs"])


def test_build_py_sweep_form_prints_the_jobs(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _sweep(tmp_path / "s", [str(i) for i in range(5)])
    assert build.main(["--home", str(tmp_path / "h"), "sweep", "--sweep", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [Job.parse(line).name for line in lines] == [j.name for j in
                                                         sweep_jobs(load(path), 1000)]


def test_build_py_sweep_form_names_file_and_key_of_a_bad_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _sweep(tmp_path / "s", ["1"], command="echo {alhpa}")
    assert build.main(["--home", str(tmp_path / "h"), "sweep", "--sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("build.py: sweep.toml: key command: unknown placeholder {alhpa}")
    assert build.main(["--home", str(tmp_path / "h"), "--sweep", str(path)]) == 2
    assert build.main(["--home", str(tmp_path / "h"), "sweep", "gs", "--sweep",
                       str(path)]) == 2


@pytest.mark.parametrize(("stderr", "status", "killed", "error"), [
    ("Segmentation fault\nUnrecoverable error\n", 0, False, ERROR_NONE),  # user's words
    ("", 3, False, ERROR_READ),
    ("some output\nkilled: timeout\n", 124, False, ERROR_TIMEOUT),
    ("", None, True, ERROR_TIMEOUT),
])
def test_readlog_reads_a_sweep_task_by_its_exit_status_and_timeout(
        stderr: str, status: int | None, killed: bool, error: int) -> None:
    result = readlog.classify(ID, "sweep\n" + stderr, f"{'0' * 32}  -\n", killed,
                              exit_status=status)
    assert (result.error, result.product) == (error, "sweep")
    assert readlog.is_sweep_log("sweep\nx") and not readlog.is_sweep_log("shell\n")


def test_the_slot_variable_is_the_one_sweeps_expand_to() -> None:
    assert slots.SLOT_VARIABLE == expand.SLOT_VARIABLE


def test_clusterpush_sweep_refuses_a_bad_sweep_and_queues_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(tmp_path / "home")
    home.create()
    path = _sweep(tmp_path / "s", ["1"], command="echo {b}")
    rc = clusterpush.main(["--home", str(home.root), "--user", "alice", "--sweep", str(path)])
    assert rc == 2
    assert "sweep.toml: key command: unknown placeholder {b}" in capsys.readouterr().err
    assert not (home.users / "alice").exists()


def test_clusterpush_sweep_pushes_the_folder_and_queues_a_sweep_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(tmp_path / "home")
    home.create()
    path = _sweep(tmp_path / "s", ["1", "2"])
    rc = clusterpush.main(["--home", str(home.root), "--user", "alice", "--copy",
                           "--sweep", str(path)])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "sweep: 2 task(s)" in out and "queueing: user alice sweep sweep=sweep.toml" in out
    pushed = home.users / "alice" / "sweep"
    assert (pushed / DROPPING).read_text() == "user alice sweep sweep=sweep.toml\n"
    assert (pushed / "params.csv").read_text() == "a\n1\n2\n"


def test_a_sweep_whose_table_would_not_travel_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    (folder / "build").mkdir(parents=True)
    (folder / "build" / "t.csv").write_text("a\n1\n")
    (folder / "sweep.toml").write_text("command = 'echo {a}'\ntable = 'build/t.csv'\n")
    with pytest.raises(SweepError, match=r"key table: 'build/t.csv' would not travel"):
        prepare_sweep(folder / "sweep.toml")
    with pytest.raises(SweepError, match="cannot be queued"):
        (folder / "my sweep.toml").write_text("")
        prepare_sweep(folder / "my sweep.toml")


def test_a_sweep_runs_job_start_carries_its_limits_from_the_runs_snapshot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(tmp_path / "home")
    home.create()
    path = _sweep(tmp_path / "s", ["1", "2"])  # timeout = 9
    assert clusterpush.main(["--home", str(home.root), "--user", "alice", "--copy",
                             "--sweep", str(path)]) == 0, capsys.readouterr().err
    cfg = Config().with_changes(home=home.root, max_result_bytes=12345)
    master = ClusterMaster(cfg, 0)
    master.queue.append(RunSpec.parse("user alice sweep sweep=sweep.toml"))  # as discovered
    spec = master.queue.head()
    assert spec is not None and spec.sweep_file == "sweep.toml"
    start = master.setup.job_start(spec)
    assert (start.max_result_bytes, start.job_timeout) == (12345, node_job_timeout(9))
    written = JobStart.parse(home.job_start(0).read_text())
    assert (written.id, written.max_result_bytes, written.job_timeout) == (
        start.id, 12345, node_job_timeout(9))
    # Another run's job.start has neither.
    plain = dataclasses.replace(start, queue="user alice gs", max_result_bytes=0,
                                job_timeout=0.0)
    assert master.setup.sweep_limits(RunSpec.parse("user alice gs"), plain) == plain
