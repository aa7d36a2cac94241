"""A node told "run aborted: clustermaster replaced" rejoins the successor master, and the run
completes -- with real processes only ("the PID dance": nodes told that the master
was replaced come back and join the successor; seed 001: a node may start again from
scratch and rejoin).

The cluster: a real master home, the real monitor (monitor_port.py) and supervisor
(run_clustermaster.py, which starts clustermaster2.py every half second), and one real node:
clusterpull (whose run.py children are the real run.py) running a product shell run whose
jobs sleep 0.2 s.  The replacement happens the way it does in the field: the master that
runs the run is frozen (SIGSTOP), its PID file goes stale, a clustermaster the supervisor
starts takes the file over and waits ``pid_wait``; the frozen master is continued during that
wait (a suspended machine or a ^Z'd process coming back), finds the file no longer its own,
tells the node ABORT "run aborted: clustermaster replaced" and leaves.  The node's run.py
exits 4, clusterpull starts it again for the same run after ``rejoin_delay``, and the next
clustermaster the supervisor starts resumes the run from its journal and completes it.
Checked: run.py exited 4 once and was started again for the same run id, the taker did not
need to kill the old master, the successor resumed the journal, and the run's table holds
every test exactly once with its job's real output; one archive, one report.  The node runs
whichever node code clusterpull picks (``self_update``, the default).

"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path

from cluster.defaults import NODE_EXIT_ABORTED, REPO_ROOT
from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.master.files import pidformat
from cluster.master.run import oldmaster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.runtime import proc
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from tests.helpers import FAST, free_port, wait_for

#: The run's jobs: this many lines of one command file, each a job of product shell.
JOBS = 80
#: What each job does: slow enough that the run is still going when its master is replaced.
JOB_SECONDS = 0.2
#: The node's rejoin_delay in this test [seconds] (the default is 30).
REJOIN_DELAY = 1.0
#: The run's results journaled before its master is frozen.
FREEZE_AFTER = 10
#: Small PID-dance settings: stale after 2 s without a refresh (a healthy master refreshes
#: every 0.2 s), and a takeover wait long enough to continue the frozen master within it.
PID_STALE = 2.0
PID_WAIT = 4.0
SETTINGS = {
    **FAST, "supervisor_interval": "0.5", "pid_stale": str(PID_STALE),
    "pid_wait": str(PID_WAIT), "pid_check_interval": "0.2", "linger": "2",
    "io_timeout": "20", "heartbeat_timeout": "10", "no_node_timeout": "60",
    "max_run_time": "120", "rejoin_delay": str(REJOIN_DELAY),
}
QUEUE_LINE = "auto nightly shell"
PRIORITY = 2  # auto runs
NODE = "rejoiner"

def _pid_owner(path: Path) -> int | None:
    """The PID file's first line as a pid (None: no file, or not a pid)."""
    try:
        first = pidformat.parse(path.read_text(encoding="utf-8"))[0]
    except FileNotFoundError:
        return None
    return int(first) if first.isdigit() else None


def _journaled(path: Path) -> int:
    """Result lines in a run's journal (its first line names the run)."""
    try:
        return max(0, len(path.read_text(encoding="utf-8").splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _text(folder: Path, pattern: str = "*.log") -> str:
    return "".join(p.read_text(encoding="utf-8", errors="replace")
                   for p in sorted(folder.glob(pattern)))


def test_a_node_told_the_master_was_replaced_rejoins_the_successor(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus" / "rejoin"
    corpus.mkdir(parents=True)
    (corpus / "jobs.cmds").write_text(
        "".join(f"sleep {JOB_SECONDS}; echo job {i}\n" for i in range(1, JOBS + 1)))
    cluster = LocalCluster(tmp_path / "home", 0, corpus, {
        **SETTINGS, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
        "status_port": str(free_port())})
    cluster.prepare()
    home = cluster.home
    write_demo_tree(home.root / "shell", "shell", [])
    QueueFile(home.queue(PRIORITY), home.queue_lock(PRIORITY)).append(
        RunSpec.parse(QUEUE_LINE))
    work = tmp_path / "node-work"
    pull_log_path = work / "log" / "clusterpull.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    frozen: int | None = None
    try:
        cluster.start()  # the monitor and the supervisor; no node of its own
        with open(home.log_dir / "rejoiner.out", "ab") as out:
            node = proc.spawn([sys.executable, str(REPO_ROOT / "clusterpull.py"),
                               *cluster.config_args(),
                               "--set", f"node_name={NODE}", "--set", f"work_dir={work}"],
                              stdout=out, stderr=proc.STDOUT, cwd=home.root, env=env)
        cluster.procs.append(node)  # stopped (its whole tree) with the cluster

        # The run starts and the node works in it.
        wait_for(lambda: home.job_start(PRIORITY).exists(), 30, "the run's job.start")
        run_id = JobStart.parse(home.job_start(PRIORITY).read_text()).id
        wait_for(lambda: _journaled(home.results(PRIORITY)) >= FREEZE_AFTER, 30,
                 f"{FREEZE_AFTER} results journaled")
        old = _pid_owner(home.pid_file(PRIORITY))
        assert old is not None and oldmaster.is_clustermaster(old)

        # Freeze its master: the PID file goes stale, a successor takes it over.
        os.kill(old, signal.SIGSTOP)
        frozen = old
        assert _journaled(home.results(PRIORITY)) < JOBS, "the run ended before the freeze"
        taker = wait_for(lambda: (p := _pid_owner(home.pid_file(PRIORITY))) != old and p,
                         PID_STALE + 20, "a clustermaster to take the stale PID file over")
        # Within the taker's wait the old master comes back: it finds the file not its own,
        # tells its node ABORT (clustermaster replaced) and leaves, before it could be killed.
        os.kill(old, signal.SIGCONT)
        frozen = None
        wait_for(lambda: not oldmaster.is_clustermaster(old), PID_WAIT + 10,
                 "the replaced master to leave")

        # The successor resumes the run, the node rejoins it, the run completes.
        wait_for(lambda: (home.archive / run_id / "run.info").exists(), 40,
                 "the resumed run's archive")
        wait_for(lambda: not QueueFile(home.queue(PRIORITY), home.queue_lock(PRIORITY)
                                       ).read(), 10, "the run to leave its queue")
        # The rejoined run.py hears "run complete" at its next call and exits 0.
        done = f"run.py for run {run_id} exited with 0"
        wait_for(lambda: done in pull_log_path.read_text(encoding="utf-8"), 20,
                 "the rejoined run.py to exit 0")
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)  # a stopped master would outlive its SIGTERM
        cluster.stop(grace=10)

    master_log = _text(home.log_dir, "clustermaster*.log")
    node_logs = _text(work / "log")
    pull_log = pull_log_path.read_text(encoding="utf-8")

    # The old master really was replaced and said so to its node; the taker did not kill it.
    assert f"pid {taker} takes over" in master_log, master_log[-3000:]
    assert f"old clustermaster {old} has ended" in master_log, master_log[-3000:]
    assert "the PID file is no longer ours; aborting nodes" in master_log
    assert f"told ABORT ({protocol.RUN_ABORTED}: {protocol.REPLACED})" in node_logs, \
        node_logs[-3000:]
    # run.py exited 4 once, and clusterpull started it again for the same run.
    exits = re.findall(rf"run\.py for run {re.escape(run_id)} exited with (-?\d+)", pull_log)
    assert exits == [str(NODE_EXIT_ABORTED), "0"], pull_log
    assert "told ABORT (run complete)" in node_logs
    # (clusterpull names the run.py it starts: the installed one or a self-updated copy.)
    starts = re.findall(r"starting \S*run\.py for run (\S+)", pull_log)
    assert starts == [run_id, run_id], pull_log
    assert f"run {run_id}: taking over" in master_log  # the successor resumed the journal

    # The run completed once: every test exactly once in its table, one archive, one report.
    assert [p.name for p in home.archive.iterdir()] == [run_id]
    table = home.archive / run_id / f"{run_id}.tab"
    names = Counter(line.split("\t", 1)[0] for line in table.read_text().splitlines() if line)
    assert [name for name, n in names.items() if n != 1] == []
    # Each test's result is its job's real output (product shell: the md5 of its stdout).
    expected = {f"{corpus.name}__jobs.cmds.{i}": hashlib.md5(f"job {i}\n".encode()).hexdigest()
                for i in range(1, JOBS + 1)}
    results = read_tab(table)
    assert {name: r.md5 for name, r in results.items()} == expected
    assert [name for name, r in results.items() if r.error != 0] == []
    assert len(list(home.archive.glob("*/report.txt"))) == 1
    report = (home.archive / run_id / "report.txt").read_text()
    assert re.search(rf"ran {JOBS} tests in \d+ seconds on 1 node", report), report
