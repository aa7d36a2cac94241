"""End to end: commits to a real git repository become priority-1 runs, mailed to the list.

The product is the demo gs product (a Makefile writing ``bin/gs``, the installed gs plus the
options in the tree's ``options`` file) committed to a real git repository; a commit that
adds an option changes the output of some tests.  The master polls the repository (and, in
the second test, a post-receive hook queues the pushed commit at once); nodes build the
exact commit; the report names the tests whose output changed; the mail arrives at a real
SMTP server (aiosmtpd).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report import compare as report
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.helpers import wait_for
from tests.smtp import smtp_server

pytestmark = pytest.mark.e2e

LIST = "gs-regression@example.org"
#: Every corpus file once, at 72 dpi: 15 jobs a run.
SETTINGS = {"gs_configs": "ppmraw.72.0", "path_products": "=gs", "git_branch": "master",
            "list_address": LIST, "smtp_host": "127.0.0.1"}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=Dev Eloper", "-c", "user.email=dev@example.org",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip() + done.stderr.strip()


def commit(repo: Path, message: str, options: list[str] | None = None) -> str:
    """Commit (optionally new options of the demo product); return the full sha."""
    if options is not None:
        (repo / "options").write_text("".join(o + "\n" for o in options), encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def spec_of(sha: str) -> RunSpec:
    return RunSpec("git", sha, ("gs",), ("tree=ghostpdl",))


def write_settings(cluster: LocalCluster, settings: dict[str, str]) -> None:
    """Put ``settings`` into cluster.conf too: the git hook reads only the file."""
    text = cluster.conf_path.read_text(encoding="utf-8")
    lines = "".join(f"{k} = {v}\n" for k, v in settings.items())
    cluster.conf_path.write_text(text.replace("[master]\n", "[master]\n" + lines, 1),
                                 encoding="utf-8")


def changed_tests(old_archive: Path, new_archive: Path) -> list[str]:
    old = read_tab(old_archive / f"{old_archive.name}.tab")
    new = read_tab(new_archive / f"{new_archive.name}.tab")
    return sorted(n for n in new if new[n].md5 != old[n].md5)


def assert_report_names_exactly(text: str, changed: list[str], total: int) -> None:
    assert f"Differences in {len(changed)} of {total} non-pdfwrite/ps2write test(s):" in text
    section = text.split("non-pdfwrite/ps2write test(s):\n", 1)[1].split("\n\n", 1)[0]
    listed = sorted(line.split()[0] for line in section.splitlines())
    assert listed == sorted(report.display_name(n) for n in changed)


def test_polled_commits_run_oldest_first_untested_skipped_and_mailed(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    write_demo_tree(upstream, "gs", [])
    git(upstream, "init", "-q", "-b", "master")
    first = commit(upstream, "Demo product, plain gs")
    with smtp_server() as (mails, port):
        cluster = make_cluster(repositories=f"ghostpdl={upstream}", smtp_port=str(port),
                               **SETTINGS)
        cluster.start()
        # The first poll queues the tip: the first baseline.
        base = cluster.wait_for_run(spec_of(first), set(), 180, priority=1)
        assert "No previous results to compare with" in (base / "report.txt").read_text()
        # Two commits at once: the untested one is skipped, the other runs.
        untested = commit(upstream, "Tweak the docs CLUSTER_UNTESTED", ["-dNOINTERPOLATE"])
        changed_sha = commit(upstream, "Antialias text", ["-dTextAlphaBits=4"])
        run = cluster.wait_for_run(spec_of(changed_sha), {base.name}, 180, priority=1)
        text = (run / "report.txt").read_text()
        changed = changed_tests(base, run)
        assert changed and len(changed) < 15  # text files change, pictures do not
        assert_report_names_exactly(text, changed, 15)
        # The commit is named, with its message and changed files.
        assert f"commit {changed_sha}" in text and "Antialias text" in text
        assert "Changed files:\n  options" in text
        # The nodes built exactly that commit (not the tip, nor the clean tree), in the build
        # folder they keep for the commit runs' tree (the last run built there is this one).
        built = list((cluster.home_dir / "node-work").glob("node*/build/*__ghostpdl/bin/gs"))
        assert len(built) == 2 and all("-dTextAlphaBits=4" in b.read_text() for b in built)
        # Mail: the baseline report and this one, to the list.
        received = mails.wait_for(2, 60)
        assert [m.rcpt_tos for m in received] == [[LIST], [LIST]]
        assert received[1].body.strip() == text.strip()
        assert changed_sha in received[1].message["Subject"]
        # The untested commit never became a run of its own (the culprit search of the
        # run's differences may bisect it: docs/results.md, "Finding the culprit commit").
        infos = [p.read_text() for p in cluster.home.archive.glob("*/run.info")]
        infos = [info for info in infos if "culprit=" not in info]
        assert not any(untested in info for info in infos)
        assert not any(untested in line and "culprit=" not in line
                       for line in cluster.home.queue(1).read_text().splitlines())
        assert len(infos) == 2


def test_a_pushed_commit_is_queued_by_the_hook_and_run_once(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    """post-receive on a bare repository queues at once; the poller does not queue it again.

    The supervisor's interval is an hour: after the start-up poll, the only thing that can
    start the priority-1 clustermaster is the queue changing, i.e. the hook.
    """
    central = tmp_path / "central.git"
    work = tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "master", str(central))
    write_demo_tree(work, "gs", [])
    git(work, "init", "-q", "-b", "master")
    git(work, "remote", "add", "origin", str(central))
    first = commit(work, "Demo product, plain gs")
    git(work, "push", "-q", "origin", "master")
    with smtp_server() as (mails, port):
        settings = {**SETTINGS, "repositories": f"ghostpdl={central}"}
        cluster = make_cluster(smtp_port=str(port), **{**settings, "supervisor_interval": "3600"})
        write_settings(cluster, settings)
        done = subprocess.run([sys.executable, "-m", "cluster.commits", "install-hook",
                               "--repo", str(central), "--tree", "ghostpdl", "--config",
                               str(cluster.conf_path), "--kind", "post-receive"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        cluster.start()
        base = cluster.wait_for_run(spec_of(first), set(), 180, priority=1)
        sha = commit(work, "Antialias graphics and text",
                     ["-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"])
        pushed = git(work, "push", "origin", "master")
        assert f"queued git {sha} gs tree=ghostpdl" in pushed  # the hook's words
        run = cluster.wait_for_run(spec_of(sha), {base.name}, 180, priority=1)
        changed = changed_tests(base, run)
        assert changed
        assert_report_names_exactly((run / "report.txt").read_text(), changed, 15)
        mails.wait_for(2, 60)
        # Queued once: one run for the commit, and the poll that ran with it queued nothing.
        wait_for(lambda: not cluster.home.queue(1).read_text().strip(), 30, "an empty queue")
        infos = [p.read_text() for p in cluster.home.archive.glob("*/run.info")]
        assert sum(sha in info for info in infos) == 1
        log = (cluster.home.log_dir / "clustermaster.1.log").read_text()
        assert f"priority 1: queued git {sha}" not in log
