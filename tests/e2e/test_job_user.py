"""End to end (docs/runoptions.md, section 6): a node running as root runs its jobs as ``job_user``.

A real local cluster, its node root (the tests run as root) with ``job_user`` a real
system account (tests/jobaccount.py), runs one small product shell run whose one job is
hostile: it tries to read cluster.secret, the node's config, the node's key, job.start and
the node's ssh key; to write into the product's build, into the work folder and into
/root; to signal the node's run.py; and it leaves three background children (one in a new
session).  Each attempt's outcome goes to the job's stderr, which lands in the node's log
in the run's archive.  The test asserts that every attempt failed, that what a job needs
(its input in the corpus mirror, the product, its own HOME) worked, that the job ran as
job_user's uid with umask 077 and HOME and TMPDIR in a folder of its own, and that no
process of job_user is left after the run (psutil), though one was running during it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest

from cluster.demotree import write_demo_tree
from cluster.node import jobuser
from tests.jobaccount import ACCOUNT, made_account, searchable

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="a node drops to job_user only "
                                                           "when it runs as root")]

#: The hostile job: one line per attempt, ``ATTEMPT <what>: ok|denied``, on stderr.
HOSTILE = r"""
attempt() {
    what=$1; shift
    if "$@" >/dev/null 2>&1; then echo "ATTEMPT $what: ok" >&2
    else echo "ATTEMPT $what: denied" >&2; fi
}
echo "UID $(id -u)" >&2
echo "UMASK $(umask)" >&2
echo "HOME $HOME" >&2
echo "TMPDIR $TMPDIR" >&2
echo "PWD $(pwd)" >&2
# The first ancestor that is not ours: the node's run.py.
node=$PPID
for _ in 1 2 3 4 5 6 7 8; do
    [ "$(stat -c %u /proc/$node)" = 0 ] && break
    node=$(awk '/^PPid:/ {print $2}' /proc/$node/status)
done
echo "NODE $node $(tr '\0' ' ' < /proc/$node/cmdline)" >&2
attempt read-cluster-secret cat "$HOSTILE_HOME/cluster.secret"
attempt read-node-conf cat "$HOSTILE_HOME/cluster.conf"
attempt read-node-key cat "$HOSTILE_HOME/node-keys/node1.key"
attempt read-job-start cat "$HOSTILE_HOME/job.start"
attempt read-ssh-key cat "$HOSTILE_SSH_KEY"
attempt list-root ls /root
attempt write-product sh -c "echo planted > '$1/planted'"
attempt write-work sh -c "echo planted > '$HOSTILE_WORK/planted'"
attempt write-root sh -c 'echo planted > /root/planted'
attempt signal-node kill -0 "$node"
attempt need-input cat "$0"
attempt need-product cat "$1/Makefile"
attempt need-home sh -c 'echo mine > "$HOME/mine" && echo mine > "$TMPDIR/tmp"'
sleep 300 &
echo "CHILD $!" >&2
setsid sleep 301 &
nohup sleep 302 >/dev/null 2>&1 &
exit 0
"""

DENIED = ("read-cluster-secret", "read-node-conf", "read-node-key", "read-job-start",
          "read-ssh-key", "list-root", "write-product", "write-work", "write-root",
          "signal-node")
NEEDED = ("need-input", "need-product", "need-home")


def test_a_root_nodes_hostile_job_runs_as_job_user_and_every_attempt_fails(
        make_cluster, tmp_path: Path) -> None:
    with made_account() as account, searchable(tmp_path):
        corpus = tmp_path / "hostile"
        corpus.mkdir()
        (corpus / "hostile.sh").write_text(HOSTILE, encoding="utf-8")
        (corpus / "jobs.cmds").write_text("sh __tests__/hostile/hostile.sh __tree__\n",
                                          encoding="utf-8")
        # The node's ssh key (unused by a local node, but where node.conf would name it).
        keys = tmp_path / "node-ssh"
        keys.mkdir(mode=0o700)
        ssh_key = keys / "id_ed25519"
        ssh_key.write_text("PRIVATE KEY\n")
        ssh_key.chmod(0o600)
        cluster = make_cluster(nodes=1, corpus=corpus, job_user=ACCOUNT, slots="1",
                               ssh_key=str(ssh_key))
        home = cluster.home_dir
        work = home / "node-work" / "node1"
        # An older master's cluster-wide secret, as it was kept: 0600.
        (home / "cluster.secret").write_text("0" * 64 + "\n")
        (home / "cluster.secret").chmod(0o600)
        # Each secret is there and readable by the node: a refusal is the account's.
        assert (home / "cluster.conf").stat().st_mode & 0o077 == 0, "node config is 0600"
        cluster.start(node_env={"node1": {"HOSTILE_HOME": str(home),
                                          "HOSTILE_SSH_KEY": str(ssh_key),
                                          "HOSTILE_WORK": str(work)}})
        tree = write_demo_tree(home / "demo" / "shell", "shell", [])
        before = cluster.archives()
        spec = cluster.push(tree, "tester", ["shell"], [])
        try:
            archive = cluster.wait_for_run(spec, before, timeout=300)
        finally:
            cluster.stop(grace=10)  # before the account goes

        [node_log] = [p for p in archive.rglob("node1.log")]
        text = node_log.read_text(encoding="utf-8", errors="replace")
        outcomes = dict(re.findall(r"^ATTEMPT (\S+): (ok|denied)$", text, re.M))
        assert set(outcomes) == {*DENIED, *NEEDED}, text
        assert {what for what in DENIED if outcomes[what] != "denied"} == set(), text
        assert {what for what in NEEDED if outcomes[what] != "ok"} == set(), text
        assert re.search(rf"^UID {account.uid}$", text, re.M), text
        assert re.search(r"^UMASK 0?077$", text, re.M), text
        [home_line] = re.findall(r"^HOME (.*)$", text, re.M)
        assert home_line == str(work / "runs" / archive.name / "homes" / "slot1"), text
        assert re.search(rf"^TMPDIR {re.escape(home_line)}$", text, re.M), text
        # The process it failed to signal was the node's run.py, alive then, as root.
        node = re.search(r"^NODE (\d+) (.*)$", text, re.M)
        assert node is not None and "run.py" in node.group(2), text
        # The job's children were running while it ended, and none outlived the run.
        assert re.search(r"^CHILD \d+$", text, re.M), text
        assert jobuser.processes_of(account.uid) == [], [
            (p.pid, p.info) for p in psutil.process_iter(["uids", "cmdline"])
            if p.info["uids"] and p.info["uids"].real == account.uid]
        # Nothing was planted, and the slot's folder went with the run.
        assert not list(work.rglob("planted"))
        assert not (work / "runs" / archive.name / "homes").exists()
