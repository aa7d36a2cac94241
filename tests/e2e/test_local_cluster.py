"""End to end: real scripts, real ghostscript and mutool, a master and two nodes on loopback."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from cluster.demotree import write_demo_tree
from cluster.home import Home
from cluster.jobs import generate as jobgen
from cluster.localcluster import LocalCluster
from cluster.node import readlog
from cluster.records import BIN, TEMP, TESTS
from cluster.report import compare as report
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.helpers import FAST, REPO, free_port, slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e

SMALL_GS = "ppmraw.72.0 pbmraw.72.0 pgmraw.300.1 pkmraw.72.0"
#: Slow trees (slow_demo_tree) give the runs a node or the master is killed in the time to do it.
HEAVY_GS = "ppmraw.72.0 ppmraw.72.1 pbmraw.72.0 pkmraw.72.1 pgmraw.72.0 pkmraw.72.0"


def run_once(cluster: LocalCluster, product: str = "gs", options: tuple[str, ...] = (),
             timeout: float = 300) -> Path:
    tree = write_demo_tree(cluster.home_dir / "demo" / product, product, list(options))
    before = cluster.archives()
    spec = cluster.push(tree, "tester", [product], [])
    return cluster.wait_for_run(spec, before, timeout)


def tab_names(archive: Path) -> list[str]:
    """Test names in the run's .tab, with repeats if there are any."""
    text = (archive / f"{archive.name}.tab").read_text()
    return [line.split("\t", 1)[0] for line in text.splitlines()]


def direct_md5s(cluster: LocalCluster, product: str, options: tuple[str, ...],
                work: Path) -> dict[str, str]:
    """Run every job of the run's job list by hand (sh), outside the cluster."""
    cfg = cluster.config()
    tree = write_demo_tree(work / "tree", product, list(options))
    subprocess.run(["make"], cwd=tree, check=True, capture_output=True)
    temp = work / "temp"
    temp.mkdir()
    out: dict[str, str] = {}
    for job in jobgen.generate(cfg, [product], cluster.home_dir / "tests"):
        command = (job.command.replace(TEMP, str(temp)).replace(BIN, str(tree / "bin"))
                   .replace(TESTS, str(cluster.home_dir / "tests")))
        subprocess.run(["sh", "-c", command], check=False)
        log = (temp / f"{job.name}.log").read_text(errors="replace")
        md5 = (temp / f"{job.name}.md5").read_text()
        out[job.name] = readlog.classify(job.name, log, md5, False).md5
    return out


def test_gs_run_every_test_once_and_md5s_match_direct_runs(make_cluster, tmp_path: Path
                                                           ) -> None:
    """Two nodes, real gs over the whole corpus: one .tab line per test, true md5s."""
    cluster = make_cluster(gs_configs=SMALL_GS)
    cluster.start()
    archive = run_once(cluster)
    names = tab_names(archive)
    expected = direct_md5s(cluster, "gs", (), tmp_path / "direct")
    assert sorted(names) == sorted(expected)
    assert len(names) == len(set(names)) == 15 * 4
    table = read_tab(archive / f"{archive.name}.tab")
    assert {n: r.md5 for n, r in table.items()} == expected
    assert all(r.error == 0 for r in table.values())
    assert {r.machine for r in table.values()} == {"node1", "node2"}
    text = (archive / "report.txt").read_text()
    assert "ran 60 tests in" in text and "on 2 nodes" in text
    assert sorted(p.name for p in (archive / "logs").iterdir()) == [
        "node1.build.log", "node1.log", "node2.build.log", "node2.log"]


def test_same_run_twice_no_differences_then_an_option_change_names_exactly_the_changes(
        make_cluster) -> None:
    cluster = make_cluster(gs_configs=SMALL_GS)
    cluster.start()
    first = run_once(cluster)
    second = run_once(cluster)
    text2 = (second / "report.txt").read_text()
    assert "No differences in 60 non-pdfwrite/ps2write tests" in text2
    third = run_once(cluster, options=("-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"))
    old = read_tab(second / f"{second.name}.tab")
    new = read_tab(third / f"{third.name}.tab")
    changed = sorted(n for n in new if new[n].md5 != old[n].md5)
    assert changed and len(changed) < len(new)  # some outputs change, not all
    listed = report.analyse(new, old).differences["raster"]
    assert sorted(listed) == changed
    text3 = (third / "report.txt").read_text()
    assert f"Differences in {len(changed)} of 60 non-pdfwrite/ps2write test" in text3
    for name in changed:
        assert name.replace("__", "/") in text3
    assert first != second != third


def test_pdfwrite_and_mupdf_products(make_cluster, tmp_path: Path) -> None:
    """The two-stage product and the mutool product run and match direct runs."""
    cluster = make_cluster(pdfwrite_configs="pdf.ppmraw.72.0")
    cluster.start()
    pdf = run_once(cluster, "pdfwrite")
    table = read_tab(pdf / f"{pdf.name}.tab")
    assert len(table) == 15 and {r.product for r in table.values()} == {"gs pdfwrite"}
    assert all(r.error == 0 and r.time2 >= 0 for r in table.values())
    mu = run_once(cluster, "mupdf")
    mutable = read_tab(mu / f"{mu.name}.tab")
    expected = direct_md5s(cluster, "mupdf", (), tmp_path / "mu")
    assert {n: r.md5 for n, r in mutable.items()} == expected
    assert len(expected) == 2 * 3  # the corpus has two PDFs


def _processes_of(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


def _journal_machines(home: Home) -> Counter[str]:
    try:
        lines = home.results(0).read_text().splitlines()[1:]
    except FileNotFoundError:
        return Counter()
    return Counter(line.split(" ", 1)[0] for line in lines)


def test_node_killed_mid_run_run_completes_and_report_names_it(make_cluster) -> None:
    cluster = make_cluster(gs_configs=HEAVY_GS)
    cluster.start()
    tree = slow_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    wait_for(lambda: _journal_machines(cluster.home)["node1"] >= 5, 120, "node1's results")
    for proc in _processes_of(cluster.node_procs["node1"]):
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    archive = cluster.wait_for_run(spec, before, 300)
    names = tab_names(archive)
    assert len(names) == len(set(names)) == 15 * 6
    text = (archive / "report.txt").read_text()
    assert "Nodes lost during the run:" in text
    assert re.search(r"node1 \(not heard from for \d+ s", text)


def test_master_killed_mid_run_is_taken_over_without_rerunning_journaled_jobs(
        make_cluster) -> None:
    cluster = make_cluster(gs_configs=HEAVY_GS)
    cluster.start()
    tree = slow_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    home = cluster.home
    wait_for(lambda: sum(_journal_machines(home).values()) >= 10, 120, "10 journaled results")
    pid = int(home.pid_file(0).read_text().split("\n", 1)[0])
    psutil.Process(pid).send_signal(signal.SIGKILL)
    journaled = {line.split(" ")[2] for line in home.results(0).read_text().splitlines()[1:]}
    assert len(journaled) >= 10
    archive = cluster.wait_for_run(spec, before, 300)
    names = tab_names(archive)
    assert len(names) == len(set(names)) == 15 * 6
    log = (home.log_dir / "clustermaster.log").read_text()
    took = re.findall(r"taking over, (\d+) results already journaled", log)
    assert took and int(took[-1]) >= len(journaled)
    runs = Counter()
    for node_log in (archive / "logs").glob("node?.log"):
        runs.update(re.findall(r"^===(.+)===$", node_log.read_text(), re.M))
    assert all(runs[name] == 1 for name in journaled), {n: runs[n] for n in journaled}
    assert shutil.which("gs")


#: A C file with a syntax error (a missing ';'), for the real gcc.
BROKEN_C = "int main(void)\n{\n  int x = 1\n  return x;\n}\n"


def test_a_build_failure_aborts_the_run_with_a_report_quoting_the_compilers_words(
        tmp_path: Path) -> None:
    """localcluster.py --tree with a tree whose make runs the real gcc on a C file with a
    syntax error: the run is aborted (failure -1), the report quotes gcc's ``file:line:
    error:`` line with the node's name, the command, its status and the whole log's place,
    no table is written, and localcluster.py exits 3 saying so."""
    tree = tmp_path / "broken"
    tree.mkdir()
    (tree / "gdevxyz.c").write_text(BROKEN_C)
    # Many command lines before the error, as a real build has: the report must not be them.
    (tree / "Makefile").write_text(
        "all:\n\t@for i in $$(seq 1 150); do echo gcc -DFOO=$$i -c other$$i.c; done\n"
        "\tgcc -c gdevxyz.c -o gdevxyz.o\n")
    home = tmp_path / "h"
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
            "--tree", str(tree), "--set", f"base_port={free_port(5)}",
            "--set", f"monitor_port={free_port()}", "--set", "status_port=0",
            "--set", f"gs_configs={SMALL_GS}"]
    for key, value in FAST.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, (done.stdout[-2000:], done.stderr[-2000:])
    archive = Path(done.stdout.splitlines()[-1])
    text = (archive / "report.txt").read_text()
    assert text in done.stdout
    assert "An error occurred that prevented the local cluster run from finishing" in text
    failed = re.search(r"node (node\d) failed with code -1: build failed: 'make' exited with "
                       r"status 2: gdevxyz\.c:4:3: error: expected ", text)
    assert failed, text
    node = failed.group(1)
    assert f"The build failed on node {node}:\n  command: make\n" in text
    assert "  result:  'make' exited with status 2\n" in text
    log = archive / "logs" / f"{node}.build.log"
    assert f"  whole log: {log}\n" in text and log.is_file()
    quoted = text[text.index("  error lines:\n"):]
    assert re.search(r"^    gdevxyz\.c:4:3: error: expected .* before .*return", quoted, re.M)
    assert "    make: *** [Makefile:3: all] Error 1" in quoted
    assert "-DFOO=" not in text  # the command lines stay in the log
    assert "-DFOO=150" in log.read_text()
    assert not (archive / f"{archive.name}.tab").exists()
    assert not (home / "tables" / "user-local.tab").exists()  # the baseline is kept
    assert "outcome failed\n" in (archive / "run.info").read_text()
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("localcluster.py: the run did not complete: failed: node node")
    assert "gdevxyz.c:4:3: error: expected" in last and str(archive / "report.txt") in last


def test_a_node_without_the_compiler_fails_with_code_1_and_the_run_goes_on(
        make_cluster) -> None:
    """node1's compiler does not exist (CC names no program): its build fails for its own
    reason, so it reports failure 1 quoting make's words, is dropped, and node2 runs every
    job; the run completes."""
    cluster = make_cluster(gs_configs="ppmraw.72.0")  # one node runs them all: 15 jobs
    cluster.start(node_env={"node1": {"CC": "no-such-cc-here"}})
    tree = write_demo_tree(cluster.home_dir / "needs-cc", "gs", [])
    (tree / "probe.c").write_text("int probe(void) { return 0; }\n")
    (tree / "Makefile").write_text("all:\n\t$(CC) -c probe.c -o probe.o\n"
                                   "\tsh ./make_wrapper.sh\n")
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    archive = cluster.wait_for_run(spec, before, 300)
    assert "outcome done\n" in (archive / "run.info").read_text()
    table = read_tab(archive / f"{archive.name}.tab")
    assert table and {row.machine for row in table.values()} == {"node2"}
    master_log = (cluster.home.log_dir / "clustermaster.log").read_text()
    assert ("failure 1 cannot build on this node: 'make' exited with status 2: "
            "make: no-such-cc-here: No such file or directory") in master_log
    assert "failed with code -1" not in master_log


def test_an_auto_run_queued_by_enqueue_auto_runs_at_priority_2(make_cluster) -> None:
    """enqueue_auto.py -> queue.2.lst -> clustermaster2.py on base_port+2 -> archive."""
    cluster = make_cluster(gs_configs="ppmraw.72.0")
    write_demo_tree(cluster.home_dir / "ghostpdl", "gs", [])  # the master's own tree
    jobdef = cluster.home_dir / "auto" / "nightly" / "smoke" / "jobdef.txt"
    jobdef.parent.mkdir(parents=True)
    jobdef.write_text("gs filter=golfer\n")
    done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--config",
                           str(cluster.conf_path), "nightly"], capture_output=True, text=True)
    assert done.returncode == 0 and "queued: auto nightly-smoke gs filter=golfer" in done.stdout
    cluster.start()
    spec = RunSpec.parse("auto nightly-smoke gs filter=golfer")
    archive = cluster.wait_for_run(spec, set(), 120, priority=2)
    assert tab_names(archive) == ["ghostpdl-examples__golfer.eps.ppmraw.72.0"]
    assert "priority 2\n" in (archive / "run.info").read_text()
    assert (cluster.home.tables / "current.tab").exists()  # auto runs feed the baseline
    log = (cluster.home.log_dir / "clustermaster.2.log").read_text()
    assert f"port {cluster.config().port_for(2)}" in log


def test_the_readme_command_runs_a_cluster_and_prints_the_archive_last(tmp_path: Path) -> None:
    """localcluster.py itself: report on stdout, archive folder as the last line."""
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(tmp_path / "h"),
            "--set", f"base_port={free_port(5)}", "--set", f"monitor_port={free_port()}",
            "--set", f"status_port={free_port()}",
            "--set", "gs_configs=ppmraw.72.0 pbmraw.300.1"]
    for key, value in FAST.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    archive = Path(lines[-1])
    assert archive.is_dir() and archive.parent.name == "archive"
    assert "ran 30 tests in" in done.stdout and "on 2 nodes" in done.stdout
    assert (archive / "report.txt").read_text() in done.stdout
    leftover = [p for p in psutil.process_iter(["cmdline", "status"])
                if str(tmp_path / "h") in " ".join(p.info["cmdline"] or [])
                and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert leftover == []  # it stopped everything it started


def test_the_readme_command_with_the_ssh_transport_goes_through_its_own_sshd(
        tmp_path: Path) -> None:
    """localcluster.py --transport ssh: the nodes fetch, read and upload through a private
    sshd on loopback whose keys are made in the home; the run is the same as with local."""
    corpus = tmp_path / "mini"
    corpus.mkdir()
    for name in ("golfer.eps", "spots.ps", "spots2.pdf"):
        shutil.copyfile(REPO / "corpus" / "ghostpdl-examples" / name, corpus / name)
    home = tmp_path / "h"
    user_ssh = Path.home() / ".ssh"
    before = sorted((p.name, p.stat().st_mtime) for p in user_ssh.iterdir()) \
        if user_ssh.is_dir() else None
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
            "--transport", "ssh", "--corpus", str(corpus),
            "--set", f"base_port={free_port(5)}", "--set", f"monitor_port={free_port()}",
            "--set", f"status_port={free_port()}",
            "--set", "gs_configs=ppmraw.72.0 pbmraw.300.1"]
    for key, value in FAST.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    archive = Path(done.stdout.splitlines()[-1])
    assert "ran 6 tests in" in done.stdout and "on 2 nodes" in done.stdout
    table = read_tab(archive / f"{archive.name}.tab")
    assert len(table) == 6 and all(r.error == 0 for r in table.values())
    assert {r.machine for r in table.values()} == {"node1", "node2"}
    # Its sshd, its keys, in the home; both nodes logged in with the key made there, and
    # used sftp (job.start, the uploads) and commands (rsync's server, for the trees).
    ssh_dir = home / "ssh"
    for name in ("sshd_config", "ssh_host_ed25519_key", "client_key", "known_hosts"):
        assert (ssh_dir / name).is_file(), name
    sshd_log = (ssh_dir / "sshd.log").read_text()
    assert len(re.findall(r"Accepted publickey for \S+ from 127\.0\.0\.1", sshd_log)) >= 2
    assert "Starting session: subsystem 'sftp'" in sshd_log
    assert "Starting session: command" in sshd_log
    assert sorted(p.name for p in (archive / "logs").iterdir()) == [
        "node1.build.log", "node1.log", "node2.build.log", "node2.log"]
    # Nothing outside the home: the user's own ~/.ssh is as it was.
    after = sorted((p.name, p.stat().st_mtime) for p in user_ssh.iterdir()) \
        if user_ssh.is_dir() else None
    assert after == before
    leftover = [p for p in psutil.process_iter(["cmdline", "status"])
                if str(home) in " ".join(p.info["cmdline"] or [])
                and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert leftover == []  # the sshd and its sessions stopped with the rest
