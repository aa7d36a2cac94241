"""End to end: named schedules (docs/operating.md, "Schedules") and ``num_execution``
(docs/runoptions.md section 7) on the REAL crontab and a real local cluster.

``clusteradmin schedule add`` installs a real crontab entry (python-crontab's rendering, our
tag) for a shell run with ``num_execution=3`` at a five-field cron expression, one for a
whole ``.dag`` graph at ``@daily`` and one for a sweep; the test runs each entry's command as
cron runs it (``sh -c`` from the user's home with cron's bare environment: it does not wait
for cron), which queues the run, the graph (each run at its own priority) and the sweep;
the cluster then runs them all to their end.  The ranked run's ``.tab`` has one row per
rank, each the md5 of what its copy printed: its rank (0, 1, 2) and the count (3).  A bad
cron expression, name or run line is refused naming the field or word, with nothing
installed or queued; ``schedule rm`` takes the entry out.

The crontab is saved and restored by tests/e2e/test_cron.py's ``user_crontab`` fixture.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.localrunend import run_end
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from tests.e2e.conftest import MakeCluster
from tests.e2e.test_cron import command_of, crontab_l, ours, user_crontab  # noqa: F401
from tests.helpers import REPO, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("crontab")]

#: The one command of the corpus: each copy prints its rank and the count.
COMMAND = 'echo "rank=$CLUSTER_RANK count=$CLUSTER_COUNT"'
TEST = "examples__ranks.cmds.1"


def admin(cluster: LocalCluster, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), *words],
                          capture_output=True, text=True, timeout=60)


def queued(cluster: LocalCluster) -> dict[int, list[str]]:
    return {p: [s.line() for s in QueueFile.for_priority(cluster.home, p).read()]
            for p in (0, 1, 2)}


def archived(cluster: LocalCluster, line: str) -> Path | None:
    """The archive folder of the run of queue line ``line``, once its run.info is written."""
    for folder in sorted(cluster.home.archive.glob("*")):
        info = folder / "run.info"
        if info.exists() and f"queue {line}\n" in info.read_text():
            return folder
    return None


def as_cron_runs_it(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "HOME": str(cwd),
           "LOGNAME": getpass.getuser()}
    return subprocess.run(["sh", "-c", command_of(line)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_schedules_install_real_entries_whose_commands_queue_runs_that_complete(
        user_crontab: str, make_cluster: MakeCluster, tmp_path: Path) -> None:  # noqa: F811
    corpus = tmp_path / "corpus" / "examples"
    corpus.mkdir(parents=True)
    (corpus / "ranks.cmds").write_text(COMMAND + "\n")
    cluster = make_cluster(nodes=2, corpus=corpus)
    write_demo_tree(cluster.home_dir / "shell", "shell", [])  # what auto shell runs build
    home = cluster.home_dir.resolve()
    before_crontab = crontab_l()

    # Bad values: named, nothing installed, nothing written, nothing queued.
    for words, expected in (
            (("bad", "0 25 * * *", "--run", "shell"), "field 2 (hour) is '25'"),
            (("bad", "* * * * 8", "--run", "shell"), "field 5 (day of week) is '8'"),
            (("bad", "0 3 * *", "--run", "shell"), "has 4 field(s)"),
            (("bad/x", "@daily", "--run", "shell"), "schedule name 'bad/x'"),
            (("bad", "@daily", "--run", "shell num_execution=0"),
             "num_execution=0: expected a whole number from 1 to 1000"),
            (("bad", "@daily", "--run", "gs num_execution=3"),
             "num_execution= goes with product shell only")):
        refused = admin(cluster, "schedule", "add", *words)
        assert refused.returncode == 2, refused.stdout
        assert expected in refused.stderr and "nothing installed" in refused.stderr, \
            refused.stderr
    assert crontab_l() == before_crontab
    assert not (home / "auto" / "cron" / "bad").exists()
    assert queued(cluster) == {0: [], 1: [], 2: []}

    # A run, a whole graph and a sweep, each at its own cron expression.
    graph = tmp_path / "nightly graph.dag"
    graph.write_text("auto gA shell name=gA priority=1\nauto gB shell name=gB after=gA\n")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.toml").write_text("command = 'echo {a}'\n[axes]\na = [1, 2]\n")
    for words in (("ranked", "*/10 2-4 * * mon-fri", "--run", "shell num_execution=3"),
                  ("graph", "@daily", "--dag", str(graph)),
                  ("sw", "30 1 1 * *", "--sweep", str(sweep))):
        added = admin(cluster, "schedule", "add", *words)
        assert added.returncode == 0, added.stderr
        assert f"installed: {words[1]} cd " in added.stdout
    [ranked] = ours(f"schedule-ranked:{home}")
    [whole] = ours(f"schedule-graph:{home}")
    [swept] = ours(f"schedule-sw:{home}")
    assert ranked.startswith("*/10 2-4 * * mon-fri cd ") and whole.startswith("@daily cd ")
    assert command_of(ranked).endswith(" --quiet cron ranked")
    assert not any(queued(cluster).values()), "installing queues nothing"
    listed = json.loads(admin(cluster, "cron", "--json").stdout)
    mine = {e["name"]: e for e in listed["entries"] if "name" in e}
    assert set(mine) == {"ranked", "graph", "sw"}
    assert all(e["installed"] and e["next"] is not None for e in mine.values())
    assert mine["ranked"]["jobs"][0]["line"] == "shell num_execution=3"
    text = admin(cluster, "schedule", "ls").stdout
    assert "schedule-graph (this home): @daily, next " in text, text

    for line in (ranked, whole, swept):
        ran = as_cron_runs_it(line, tmp_path)
        assert ran.returncode == 0 and ran.stdout == ran.stderr == "", ran.stderr
    sweep_line = "auto cron-sw sweep sweep=sweep.toml"
    assert queued(cluster) == {0: [], 1: ["auto gA shell name=gA"],
                               2: ["auto cron-ranked shell num_execution=3",
                                   "auto gB shell after=gA name=gB", sweep_line]}

    cluster.start()
    lines = ("auto gA shell name=gA", "auto gB shell after=gA name=gB",
             "auto cron-ranked shell num_execution=3", sweep_line)
    wait_for(lambda: all(archived(cluster, line) for line in lines), 180, "the four runs")
    folders = {line: archived(cluster, line) for line in lines}
    for line, folder in folders.items():
        assert folder is not None and run_end(folder).outcome == "done", line
    done = folders["auto cron-ranked shell num_execution=3"]
    assert done is not None
    rows = wait_for(lambda: read_tab(done / f"{done.name}.tab") or None, 30, "the .tab")
    assert sorted(rows) == [f"{TEST}.rank{k}" for k in range(3)]
    for k in range(3):
        row = rows[f"{TEST}.rank{k}"]
        assert row.error == 0
        assert row.md5 == hashlib.md5(f"rank={k} count=3\n".encode()).hexdigest(), k

    removed = admin(cluster, "schedule", "rm", "ranked")
    assert removed.returncode == 0 and "1 crontab entry" in removed.stdout, removed.stderr
    assert ours(f"schedule-ranked:{home}") == [] and len(ours(f"schedule-graph:{home}")) == 1
    assert not (home / "auto" / "cron" / "ranked").exists()


def test_a_shell_push_with_a_bad_num_execution_queues_nothing(make_cluster: MakeCluster,
                                                              tmp_path: Path) -> None:
    cluster = make_cluster(nodes=1)
    tree = write_demo_tree(tmp_path / "tree", "shell", [])
    for option, expected in (("num_execution=0", "from 1 to 1000"),
                             ("num_execution=1001", "from 1 to 1000"),
                             ("num_execution=-1", "from 1 to 1000"),
                             ("num_execution=x", "from 1 to 1000")):
        done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"),
                               *cluster.config_args(), "--user", "carl", "--tree", str(tree),
                               "--opt", option, "shell"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and expected in done.stderr, (done.stdout, done.stderr)
    assert queued(cluster) == {0: [], 1: [], 2: []}


def test_install_cron_installs_hand_written_schedules_all_or_none(
        user_crontab: str, tmp_path: Path) -> None:  # noqa: F811
    """A schedule folder written by hand (a user's jobdef copied into ``auto/cron/<name>/``
    with a ``schedule.toml``) is installed by ``enqueue_auto.py --install-cron`` with the
    nightly and weekly entries; one bad schedule is named and nothing is installed."""
    home = (tmp_path / "home").resolve()
    for name, when, line in (("hand", "15 6 * * 1-5", "shell num_execution=2"),
                             ("broken", "15 6 * * 1-9", "gs")):
        folder = home / "auto" / "cron" / name
        folder.mkdir(parents=True)
        (folder / "jobdef.txt").write_text(f"# {name}\n{line}\n")
        (folder / "schedule.toml").write_text(f'cron = "{when}"\n')
    before = crontab_l()

    def enqueue_auto(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--home",
                               str(home), *words], capture_output=True, text=True, timeout=60)

    refused = enqueue_auto("--install-cron")
    assert refused.returncode == 2
    assert "schedule broken: cron expression '15 6 * * 1-9': field 5 (day of week)" in \
        refused.stderr and "nothing installed" in refused.stderr, refused.stderr
    assert crontab_l() == before
    (home / "auto" / "cron" / "broken" / "schedule.toml").write_text('cron = "@weekly"\n')
    done = enqueue_auto("--install-cron")
    assert done.returncode == 0, done.stderr
    [hand] = ours(f"schedule-hand:{home}")
    assert hand.startswith("15 6 * * 1-5 cd ")
    assert len(ours(f"schedule-broken:{home}")) == len(ours(f"enqueue_auto-nightly:{home}")) \
        == 1
    ran = as_cron_runs_it(hand, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (home / "queue.2.lst").read_text().splitlines() == [
        "auto cron-hand shell num_execution=2"]
    removed = enqueue_auto("--remove-cron")
    assert removed.returncode == 0 and "removed 4 crontab entries" in removed.stdout
    assert crontab_l() == before
