"""The one configuration table of the cluster.

Every tunable is a field of :class:`Config` below: its default, its unit and its meaning live
there and nowhere else.  A configuration file is INI with a ``[master]`` and a ``[node]``
section (one file may hold both); each key belongs to the section its field names.  The
commented examples in ``etc/`` are generated from this table (``python -m
cluster.cli.config_example master``) and a test keeps them in step.  Keys are looked up by
name in either section; the section a field names is where the examples show it (``both``:
in each).

Reading a file into a :class:`Config`, checking it, and writing the examples are
:mod:`cluster.configfile`'s.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import datatypes

MASTER = "master"
NODE = "node"
#: The values of the node key ``transport``, the default first.
TRANSPORTS = ("local", "ssh")
DEFAULT_TRANSPORT = TRANSPORTS[0]
#: What ``job_user`` may be: a portable POSIX account name (useradd's default rule).
ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
BOTH = "both"  # keys a master and its nodes must agree on; allowed in either section


#: Units of the upper bounds below.
HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
MIB = 1024 * 1024
GIB = 1024 * MIB


def _opt(default: Any, section: str, unit: str, doc: str, *, positive: bool = False,
         high: float | None = None) -> Any:
    """A field of Config: its default, the section it belongs to, its unit and its meaning.

    Every int and float field has a range (:func:`validate`): at least 0, or more than 0
    with ``positive=True`` (for a limit that would refuse everything, a timeout that would
    fail everything, an interval that would make a loop spin), and at most ``high``, which
    every number must give: a value past it is a typo or an attack (``linger = 1e308``
    would keep a master answering ABORT forever; a batch of 10**20 jobs per slot
    overflows every count it touches), never a setting.  A field whose unit is ``cron
    schedule`` must be cron syntax.
    """
    return field(default=default, metadata={"section": section, "unit": unit, "doc": doc,
                                            "positive": positive, "high": high})


@dataclass(frozen=True)
class Config:
    """All settings of a master and of a node, with their defaults."""

    # --- shared by master and node -------------------------------------------------------
    base_port: int = _opt(9000, BOTH, "TCP port",
                          "clustermaster of priority p listens on base_port + p "
                          "(so at most 65533: the three priorities' ports must exist)",
                          high=65533)
    monitor_port: int = _opt(9010, BOTH, "TCP port",
                             "heartbeat listener (monitor_port.py); seed 000 says 9001, which is "
                             "priority 1's port, so we moved it", high=65533)
    # --- master ----------------------------------------------------------------------------
    home: Path = _opt(Path("cluster-home"), MASTER, "directory",
                      "master home: queues, job.start, jobs, results, archive, users/, tests/")
    listen_address: str = _opt("127.0.0.1", MASTER, "address",
                               "address the master and the monitor listen on; 0.0.0.0 for "
                               "a real cluster")
    status_address: str = _opt("127.0.0.1", MASTER, "address",
                               "address the status page (clusterstatus.py) listens on; loopback "
                               "by default: put it behind a reverse proxy, or set 0.0.0.0 on a "
                               "trusted network, to let others see it")
    status_port: int = _opt(9020, MASTER, "TCP port",
                            "the status page and its JSON API (clusterstatus.py); 0 = not served",
                            high=65535)
    node_down_after: float = _opt(300.0, MASTER, "seconds",
                                  "a node not heard from for this long shows as down on the "
                                  "status page, clusteradmin and clustermonitor (the Perl's 300 s)",
                                  positive=True, high=WEEK)
    supervisor_interval: float = _opt(10.0, MASTER, "seconds",
                                      "run_clustermaster.py starts clustermaster 0/1/2 this often",
                                      positive=True, high=HOUR)
    pid_stale: float = _opt(600.0, MASTER, "seconds",
                            "a clustermaster.pid its master has not refreshed for this long "
                            "(on the monotonic clock) belongs to a dead or frozen master",
                            positive=True, high=DAY)
    pid_wait: float = _opt(300.0, MASTER, "seconds",
                           "after taking over a stale PID file, wait this long before freeing it",
                           high=DAY)
    pid_check_interval: float = _opt(2.0, MASTER, "seconds",
                                     "how often a running master refreshes its PID file and "
                                     "checks it is still its own", high=HOUR)
    max_run_time: float = _opt(7200.0, MASTER, "seconds",
                               "a run still unfinished after this long (counted across "
                               "takeovers) ends with a report listing the tests not run",
                               positive=True, high=30 * DAY)
    adaptive_timeout: float = _opt(10.0, MASTER, "times",
                                   "each job with recorded times is killed after this many "
                                   "times its median recorded time (at least "
                                   "adaptive_timeout_floor, never past the node's "
                                   "job_timeout); 0 = every job gets the node's job_timeout "
                                   "(a run's adaptive_timeout=N overrides; docs/results.md, "
                                   "\"Timeouts that fit each test\")", high=1000)
    adaptive_timeout_floor: float = _opt(60.0, MASTER, "seconds",
                                         "the shortest timeout adaptive_timeout gives a job",
                                         positive=True, high=DAY)
    no_node_timeout: float = _opt(600.0, MASTER, "seconds",
                                  "a run that had nodes and has had none alive for this long "
                                  "is queued again (see max_tries)", positive=True, high=WEEK)
    max_failed_nodes: int = _opt(10, MASTER, "nodes",
                                 "a run that loses more nodes than this is queued again "
                                 "(seed 000: if we drop too many nodes, we try again)",
                                 positive=True, high=100_000)
    max_tries: int = _opt(2, MASTER, "attempts",
                          "attempts of one queued run before it is reported as failed",
                          positive=True, high=100)
    heartbeat_timeout: float = _opt(180.0, MASTER, "seconds",
                                    "a node not heard from this long is dead; its jobs go back",
                                    positive=True, high=DAY)
    connection_deadline: float = _opt(10.0, MASTER, "seconds",
                                      "a node connection must deliver its request within this",
                                      positive=True, high=HOUR)
    max_line_bytes: int = _opt(65536, MASTER, "bytes", "longest protocol line accepted",
                               positive=True, high=16 * MIB)
    max_request_lines: int = _opt(200000, MASTER, "lines",
                                  "most header and result lines in one node request",
                                  positive=True, high=10_000_000)
    max_request_bytes: int = _opt(64 * 1024 * 1024, MASTER, "bytes",
                                  "largest node request or heartbeat accepted; a bigger one "
                                  "is refused with one log line", positive=True, high=4 * GIB)
    max_buffered_bytes: int = _opt(256 * 1024 * 1024, MASTER, "bytes",
                                   "most memory all open node connections may hold together; "
                                   "a request that would pass it is refused",
                                   positive=True, high=64 * GIB)
    journal_sync_interval: float = _opt(1.0, MASTER, "seconds",
                                        "results journal is fsync'ed at most this often", high=HOUR)
    linger: float = _opt(15.0, MASTER, "seconds",
                         "after a run ends, keep answering ABORT this long so nodes leave cleanly",
                         high=HOUR)
    upload_timeout: float = _opt(300.0, MASTER, "seconds",
                                 "longest wait for nodes' log uploads after the last result",
                                 high=DAY)
    # --- nodes on demand from a batch system (docs/provisioning.md) ----------
    resource_file: str = _opt("", MASTER, "path",
                              "the resource file the master rewrites for provisioners and "
                              "ephemeral nodes ('' = <home>/resources.json)")
    resource_interval: float = _opt(10.0, MASTER, "seconds",
                                    "the resource file is rewritten this often (and at once "
                                    "when a run starts or ends)", positive=True, high=HOUR)
    max_nodes: int = _opt(4, MASTER, "nodes",
                          "the most ephemeral nodes the provisioner keeps (0 = none)",
                          high=100_000)
    node_slots: int = _opt(2, MASTER, "slots",
                           "the slots an ephemeral node brings (its Slurm job's CPUs)",
                           positive=True, high=4096)
    node_prefix: str = _opt("slurm", MASTER, "name",
                            "ephemeral nodes are named <prefix>-<batch job id>")
    node_config: str = _opt("", MASTER, "path",
                            "the node.conf an ephemeral node starts with, as the batch nodes "
                            "see it (--config; '' = none: a node on this machine or a shared "
                            "file system, transport local)")
    slurm_partition: str = _opt("", MASTER, "name",
                                "the Slurm partition of the provisioner's jobs ('' = the "
                                "default)")
    slurm_account: str = _opt("", MASTER, "name",
                              "the Slurm account of the provisioner's jobs ('' = none)")
    slurm_time_limit: str = _opt("", MASTER, "Slurm time",
                                 "sbatch --time of each ephemeral node's job ('' = the "
                                 "partition's)")
    slurm_options: str = _opt("", MASTER, "words",
                              "more sbatch words for each ephemeral node's job "
                              "(shell-quoted)")
    slurm_max_submit_rate: float = _opt(30.0, MASTER, "jobs per minute",
                                        "the provisioner submits at most this many Slurm "
                                        "jobs a minute", positive=True, high=100_000)
    provision_engine: str = _opt("slurm", MASTER, "engine",
                                 "the provisioner's batch system: slurm, gridengine, or "
                                 "module:Class (docs/provisioning.md, \"The engine "
                                 "interface\")")
    gridengine_queue: str = _opt("", MASTER, "name",
                                 "qsub -q of each ephemeral node's job ('' = any queue)")
    gridengine_pe: str = _opt("smp", MASTER, "name",
                              "the parallel environment a job of more than one slot asks "
                              "for (qsub -pe PE SLOTS)")
    gridengine_options: str = _opt("", MASTER, "words",
                                   "more qsub words for each ephemeral node's job "
                                   "(shell-quoted)")
    node_python: str = _opt("", MASTER, "path",
                            "the Python that runs an ephemeral node in its batch job ('' = "
                            "the provisioner's own interpreter)")
    pilot_log: str = _opt("", MASTER, "path",
                          "the folder each batch job's output goes to, as the batch nodes "
                          "see it ('' = <home>/log/pilots)")
    pilot_log_keep: int = _opt(200, MASTER, "files",
                               "the pilot logs kept (the oldest removed beyond)",
                               positive=True, high=1_000_000)
    pilot_min_life: float = _opt(60.0, MASTER, "seconds",
                                 "a batch job that ends sooner, other than by exit 0 or a "
                                 "stop signal, counts as a failed pilot", high=DAY)
    pilot_backoff: float = _opt(20.0, MASTER, "seconds",
                                "after a failed pilot, the pause before the next submit "
                                "(doubling with each failure in a row)", positive=True,
                                high=DAY)
    pilot_backoff_max: float = _opt(1800.0, MASTER, "seconds",
                                    "the longest pause between submits while pilots fail",
                                    positive=True, high=WEEK)
    pilot_exclude_after: int = _opt(3, MASTER, "pilots",
                                    "this many failed pilots on one host exclude it from the "
                                    "submissions until cleared (0 = never)", high=1000)
    max_result_bytes: int = _opt(64 << 20, MASTER, "bytes",
                                 "a sweep task whose command writes more than this (its result "
                                 "files, stdout and stderr together) is failed and nothing of it "
                                 "kept (docs/sweeps.md)", positive=True, high=1 << 40)
    sweep_check_workers: int = _opt(4, MASTER, "processes",
                                    "a sweep's check scripts run at most this many at a "
                                    "time, off the master's request path: a slow check "
                                    "delays only its own task (docs/sweeps.md)",
                                    positive=True, high=256)
    max_upload_bytes: int = _opt(4 * GIB, MASTER, "bytes",
                                 "the most one run's upload area may hold when a node "
                                 "writes to it through the node gate (bootstrap_node.py "
                                 "--restrict): every regular file in runs/<id>/logs, "
                                 "runs/<id>/bmpcmp and runs/<id>/results/incoming counted by "
                                 "its size; a write that would pass it is refused and the "
                                 "file it was writing removed (docs/security.md)",
                                 positive=True, high=1 << 40)
    batch_per_slot: int = _opt(2, MASTER, "jobs",
                               "a node is kept holding at least this many jobs per slot",
                               positive=True, high=10_000)
    batch_seconds: float = _opt(1.0, MASTER, "seconds",
                                "and at most about this much work by its measured rate, so "
                                "nodes running tiny jobs call once per batch, not per job",
                                high=HOUR)
    slowdown_factor: float = _opt(2.0, MASTER, "times",
                                  "a report lists as slower the tests whose time grew to more "
                                  "than this many times their median over the last "
                                  "slowdown_runs baseline runs", positive=True, high=1000.0)
    slowdown_min_seconds: float = _opt(1.0, MASTER, "seconds",
                                       "and grew by at least this many seconds over that median",
                                       high=DAY)
    slowdown_runs: int = _opt(5, MASTER, "runs",
                              "the baseline runs whose median time a test's time is "
                              "compared with (0 = no Slower tests section)", high=50)
    preempt: bool = _opt(True, MASTER, "flag",
                         "a master whose run is less urgent than one waiting sends some of its "
                         "nodes there at their next job boundary when no node is free "
                         "(docs/runoptions.md, \"Preemption\")")
    user_lanes: int = _opt(3, MASTER, "runs",
                           "how many priority-0 runs of different users are served at once, "
                           "each by its own clustermaster on base_port + 0, + 3, + 4 ...; the "
                           "nodes are shared between them by their shares (docs/runoptions.md, "
                           "\"Fair share\"); 1 = one run at a time, as seed 000",
                           positive=True, high=8)
    user_shares: str = _opt("", MASTER, "user=weight list",
                            "fair-share weights of users' priority-0 runs, e.g. 'alice=2 bob=1' "
                            "(a user not named weighs 1; a run's share=N overrides)")
    min_nodes: int = _opt(0, MASTER, "nodes",
                          "preemption never takes a run below this many nodes (a run's "
                          "min_nodes=N overrides)", high=100_000)
    speculate_tail: bool = _opt(True, MASTER, "flag",
                                "when no job is left to hand out, give idle nodes copies of "
                                "jobs still running elsewhere (first result wins)")
    result_cache: bool = _opt(True, MASTER, "flag",
                              "take a job's result from an earlier complete run when its key "
                              "(the node's build of the programs it calls, its test file's "
                              "content, its command line) is the same, instead of running it "
                              "(a run's reuse=no turns it off for that run; docs/results.md)")
    reuse_verify: float = _opt(0.02, MASTER, "fraction",
                               "the share of the results a run would take from the result "
                               "cache that it runs again as a check, at least one per "
                               "program build and node that made them, on another node "
                               "where there is one; a mismatch withdraws that build's "
                               "cached results (0 = no check; docs/results.md)", high=1.0)
    result_cache_runs: int = _opt(5, MASTER, "runs",
                                  "how many complete runs' results the result cache keeps "
                                  "(the newest; older runs' files are removed)",
                                  positive=True, high=1000)
    # --- differences confirmed, indeterminate tests (docs/results.md) -------------
    confirm_differences: bool = _opt(True, MASTER, "flag",
                                     "before a run reports a test as changed, run it again "
                                     "(on another node where there is one); a difference "
                                     "that does not reproduce is reported as indeterminate")
    confirm_max: int = _opt(50, MASTER, "tests",
                            "at most this many changed tests of a run are run again; the "
                            "others are reported as changed, unconfirmed", positive=True,
                            high=100_000)
    confirm_timeout: float = _opt(600.0, MASTER, "seconds",
                                  "longest confirm phase of a run; the tests left are "
                                  "reported as changed, unconfirmed", high=DAY)
    indeterminate_keep: int = _opt(2000, MASTER, "records",
                                   "newest indeterminate-test records kept in "
                                   "tables/indeterminate.tsv (clusteradmin flaky)",
                                   positive=True, high=1_000_000)
    build_command: str = _opt("make", MASTER, "shell command",
                              "how a node builds a product tree of no known kind (run in the "
                              "tree's top directory; its binaries are taken from bin/)")
    build_ghostpdl: str = _opt(
        "test -f Makefile || { if test -x ./configure; then ./configure --without-x; "
        "else ./autogen.sh --without-x; fi; } && make -j__slots__ __targets__",
        MASTER, "shell command",
        "how a node builds a ghostpdl tree (base/, psi/ and configure.ac or autogen.sh at its "
        "top): __slots__ becomes the node's slot count, __targets__ the programs the run's "
        "products need (gs, gpcl6, gxps); binaries from bin/.  A tree's own cluster-build "
        "script overrides it")
    build_mupdf: str = _opt(
        "make -j__slots__ build=release tools", MASTER, "shell command",
        "how a node builds a MuPDF tree (source/fitz/ and a Makefile at its top; __slots__ "
        "as above); binaries from build/release/.  A tree's cluster-build script overrides "
        "it")
    build_timeout: float = _opt(3600.0, BOTH, "seconds",
                                "longest a build step may run (a node's build of the product "
                                "and of the baseline tree, the master's build.py); past it "
                                "the step's process tree is killed and the build fails",
                                positive=True, high=WEEK)
    tests_dir: Path = _opt(Path("tests"), MASTER, "directory",
                           "test corpus, relative to home; nodes mirror it during BUILD")
    gs_configs: tuple[str, ...] = _opt(
        ("pbmraw.72.0", "pbmraw.300.0", "pbmraw.300.1",
         "pgmraw.72.0", "pgmraw.300.0", "pgmraw.300.1",
         "pkmraw.72.0", "pkmraw.300.0", "pkmraw.300.1",
         "ppmraw.72.0", "ppmraw.300.0", "ppmraw.300.1",
         "pam.72.0", "psdcmyk.72.0", "cups.300.1"),
        MASTER, "device.res.band list", "raster configurations of product gs (band 1 = banded)")
    pdfwrite_configs: tuple[str, ...] = _opt(
        ("pdf.ppmraw.72.0", "pdf.ppmraw.300.0", "pdf.pkmraw.300.0"),
        MASTER, "pdf.device.res.band list", "two-stage configurations of product pdfwrite")
    ps2write_configs: tuple[str, ...] = _opt(
        ("ps.ppmraw.72.0", "ps.ppmraw.300.0", "ps.pkmraw.300.0"),
        MASTER, "ps.device.res.band list", "two-stage configurations of product ps2write")
    xpswrite_configs: tuple[str, ...] = _opt(
        ("xps.ppmraw.72.0", "xps.ppmraw.300.0", "xps.pkmraw.300.0"),
        MASTER, "xps.device.res.band list",
        "two-stage configurations of product xpswrite (gs writes XPS, gxps rasterises it)")
    pcl_configs: tuple[str, ...] = _opt(
        ("pbmraw.75.0", "pbmraw.600.1", "ppmraw.75.0", "ppmraw.600.1",
         "pdf.ppmraw.75.0", "pdf.ppmraw.600.0"),
        MASTER, "device.res.band list",
        "configurations of product pcl (gpcl6 on PCL and PCL-XL; in a pdf.* one gpcl6 "
        "writes the PDF, gs rasterises it)")
    xps_configs: tuple[str, ...] = _opt(
        ("pbmraw.72.0", "ppmraw.72.0", "bitrgb.72.0", "pdf.ppmraw.72.0"),
        MASTER, "device.res.band list",
        "configurations of product xps (gxps; in a pdf.* one gxps writes the PDF, gs "
        "rasterises it)")
    mupdf_configs: tuple[str, ...] = _opt(
        ("ppmraw.72.0", "ppmraw.300.0", "ppmraw.300.1"),
        MASTER, "device.res.band list", "configurations of product mupdf (mutool draw)")
    gs_extensions: tuple[str, ...] = _opt(("ps", "eps", "pdf", "ai"), MASTER, "suffix list",
                                          "test files gs, pdfwrite, ps2write and xpswrite "
                                          "run on")
    pcl_extensions: tuple[str, ...] = _opt(("pcl", "px", "pxl", "prn"), MASTER, "suffix list",
                                           "test files product pcl (gpcl6: PCL and PCL-XL) "
                                           "runs on")
    xps_extensions: tuple[str, ...] = _opt(("xps",), MASTER, "suffix list",
                                           "test files product xps (gxps) runs on")
    mupdf_extensions: tuple[str, ...] = _opt(("pdf", "xps", "cbz", "epub"), MASTER, "suffix list",
                                             "test files mupdf runs on")
    required_tools: tuple[str, ...] = _opt(("md5sum",), MASTER, "tool list",
                                           "a node whose caps lack one of these is culled")
    min_ram_mb: int = _opt(0, MASTER, "MiB", "a node with less RAM is culled (0 = no limit)",
                           high=16 * MIB)
    shell_extensions: tuple[str, ...] = _opt(("cmds",), MASTER, "suffix list",
                                             "files of product shell: one shell command "
                                             "per line, each line a job")
    gs_memory_kb: int = _opt(1000000, MASTER, "KiB", "gs -K memory limit of every gs job",
                             positive=True, high=GIB)
    nightly_schedule: str = _opt("0 1 * * *", MASTER, "cron schedule",
                                 "when the crontab entry of enqueue_auto.py --install-cron "
                                 "queues the nightly auto runs")
    weekly_schedule: str = _opt("0 3 * * 6", MASTER, "cron schedule",
                                "when the crontab entry of enqueue_auto.py --install-cron "
                                "queues the weekly auto runs")
    smtp_host: str = _opt("", MASTER, "host",
                          "SMTP server the reports are mailed through; empty: reports are "
                          "only archived, not mailed")
    smtp_port: int = _opt(25, MASTER, "TCP port", "port of that SMTP server",
                           positive=True, high=65535)
    mail_from: str = _opt("regression@localhost", MASTER, "address", "From: of report mails")
    list_address: str = _opt("gs-regression@localhost", MASTER, "address",
                             "where the reports of commit and auto runs go")
    maintainer: str = _opt("regression-maintainer@localhost", MASTER, "address",
                           "Cc of user run reports; gets the reports of unknown users")
    emails_table: Path = _opt(Path("emails.tab"), MASTER, "file",
                              "'user<TAB>address' lines (# comments); the default is in home, "
                              "a path set in a config file is relative to that file")
    # --- commit runs (cluster.triggers.git; priority 1) -----------------------------------
    repositories: tuple[str, ...] = _opt(
        (), MASTER, "tree=url list",
        "git repositories whose new commits are queued at priority 1, e.g. "
        "'ghostpdl=https://git.ghostscript.com/ghostpdl.git mupdf=/srv/git/mupdf.git'; "
        "tree is a plain name (ghostpdl, mupdf, ...), url anything git clones (a local "
        "path must be absolute); the master keeps a bare clone in <home>/repos/<tree>.git")
    git_branch: str = _opt("master", MASTER, "branch name",
                           "the branch of each repository whose commits are tested")
    # ghostpdl's folders as the Artifex commit hook mapped them (ARTIFEX.md 7.1): PCL's and
    # XPS's own sources test their language only; pcl/pl/, the language switch gpcl6 and gxps
    # both link, tests both; gxps also rasterises xpswrite's XPS, so its tests come along.
    path_products: tuple[str, ...] = _opt(
        ("doc/=", "examples/=", "pcl/=pcl", "pcl/pl/=xpswrite,pcl,xps", "pcl/examples/=",
         "pcl/tools/=", "xps/=xpswrite,xps", "=gs,pdfwrite,ps2write"), MASTER,
        "[tree:]prefix=products list",
        "which products a commit tests: for each changed path the entry with the longest "
        "matching prefix gives its products (empty = the path needs no test; the empty "
        "prefix is the fallback; 'tree:' limits an entry to one tree and beats an "
        "unqualified one of the same prefix); a commit tests the union, and is skipped when "
        "it is empty; a tree named like a product that runs alone (mupdf, shell) tests just "
        "that product; products are " + ", ".join(datatypes.MAP_PRODUCTS))
    # --- node ------------------------------------------------------------------------------
    node_name: str = _opt("", NODE, "name",
                          "this node's name (letters, digits, . _ -); empty = the host name")
    master_host: str = _opt("127.0.0.1", NODE, "host", "where the clustermaster listens")
    master_home: Path = _opt(Path("cluster-home"), NODE, "directory",
                             "the master home: as this node sees it (transport local), or its "
                             "path on master_host (transport ssh; relative = to the ssh "
                             "user's home there)")
    transport: str = _opt(DEFAULT_TRANSPORT, NODE, "name",
                          "how the node reaches the master's files: 'local' (a shared or the "
                          "same file system) or 'ssh' (paramiko for files, rsync over ssh "
                          "for trees)")
    ssh_port: int = _opt(22, NODE, "TCP port", "the master's sshd (transport ssh)",
                          positive=True, high=65535)
    ssh_user: str = _opt("", NODE, "name",
                         "the account on master_host that owns the master home (transport "
                         "ssh); empty = this node's user name")
    ssh_key: str = _opt("", NODE, "file",
                        "the private key the node logs in with (transport ssh); empty = "
                        "ssh's usual keys (~/.ssh/id_ed25519, id_ecdsa, id_rsa)")
    ssh_known_hosts: Path = _opt(Path("~/.ssh/known_hosts"), NODE, "file",
                                 "the known_hosts file master_host's key must be in (transport "
                                 "ssh); an unknown or changed key is refused, never added")
    self_update: bool = _opt(True, NODE, "flag",
                             "clusterpull.py fetches the node code the master publishes "
                             "(node-code/ in its home) when its manifest changed, and starts "
                             "run.py from that copy")
    job_user: str = _opt("", NODE, "account",
                         "when the node runs as root, every job runs as this account (a "
                         "system account with no login: bootstrap_node.py makes it), with "
                         "umask 077 and HOME and TMPDIR in a folder of its own; its "
                         "processes left at the end of a run are killed, so it serves one "
                         "node; empty = jobs run as the node's own account (as root: they "
                         "can read node.conf and the node's keys); ignored when the node "
                         "is not root")
    work_dir: Path = _opt(Path("node-work"), NODE, "directory",
                          "the node's own directory: source, build, temp, logs")
    slots: int = _opt(0, NODE, "jobs", "jobs run at once; 0 = the CPU count", high=4096)
    build_cache: str = _opt("", NODE, "directory",
                            "ccache directory (absolute; ~ expanded) shared by the nodes of "
                            "one machine; when set and ccache is installed, builds run with "
                            "CC='ccache gcc' and CCACHE_DIR set to it (empty: no compiler "
                            "cache)")
    build_keep: int = _opt(4, NODE, "build folders",
                           "the build folders (work_dir/build/<tree>, ~200 MB for ghostpdl; "
                           "one per user's tree) kept between runs: at the start of a "
                           "build the least recently built beyond this many are removed "
                           "with their mirrors (work_dir/src/<tree>), never one a run is "
                           "using; 0 = keep them all", high=10_000)
    reuse_environment: tuple[str, ...] = _opt(
        (), NODE, "absolute paths",
        "files or folders (space separated; ~ expanded) whose content is part of every "
        "program's key in the master's result cache, beside what the node finds by "
        "looking (its libraries, the programs a wrapper runs, the tree's files, the OS): "
        "what a product reads that cannot be found so, e.g. a font folder or a licence "
        "file; a change there makes the jobs run again rather than be reused "
        "(docs/results.md)")
    poll_interval: float = _opt(2.0, NODE, "seconds",
                                "run.py calls the master at least this often (its heartbeat)",
                                positive=True, high=HOUR)
    report_interval: float = _opt(0.25, NODE, "seconds",
                                  "finished results wait at most this long before being sent",
                                  high=HOUR)
    heartbeat_interval: float = _opt(10.0, NODE, "seconds",
                                     "clusterpull.py sends a heartbeat to the monitor this often",
                                     positive=True, high=HOUR)
    clusterpull_schedule: str = _opt("*/10 * * * *", NODE, "cron schedule",
                                     "when the crontab entry of clusterpull.py --install-cron "
                                     "restarts clusterpull.py if it is not running")
    job_timeout: float = _opt(450.0, NODE, "seconds",
                              "a test running longer is killed (whole process tree)",
                              positive=True, high=DAY)
    kill_grace: float = _opt(2.0, NODE, "seconds",
                             "between SIGHUP and SIGKILL when a test is killed", high=HOUR)
    max_output_bytes: int = _opt(256 << 20, NODE, "bytes",
                                 "a shell job (product shell) may write no file larger than "
                                 "this (ulimit -f, as a sweep task's max_result_bytes): one "
                                 "that does is stopped and fails (error 1), its output never "
                                 "hashed (docs/runoptions.md)", positive=True, high=1 << 40)
    max_timeouts: int = _opt(20, NODE, "tests",
                             "more timeouts than max(this, 1% of started tests) fail the node",
                             high=1_000_000)
    connect_retries: int = _opt(10, NODE, "attempts", "tries to reach the master before giving up",
                                positive=True, high=1000)
    connect_retry_delay: float = _opt(5.0, NODE, "seconds", "pause between those tries", high=HOUR)
    ephemeral_idle: float = _opt(60.0, NODE, "seconds",
                                 "an ephemeral node (clusterpull.py --ephemeral) exits 0 when "
                                 "nothing was wanted of it this long", positive=True, high=DAY)
    rejoin_delay: float = _opt(30.0, NODE, "seconds",
                               "after run.py exits 3 (master unreachable) or 4 (aborted for a "
                               "reason that may pass, e.g. the master was replaced), "
                               "clusterpull.py waits this long before joining that run again",
                               positive=True, high=DAY)
    io_timeout: float = _opt(60.0, NODE, "seconds", "longest wait for the master's reply",
                             positive=True, high=DAY)
    ssh_retry_time: float = _opt(60.0, NODE, "seconds",
                                 "transport ssh: a read, upload, listing or rsync whose "
                                 "connection is cut is tried again on a new connection after "
                                 "0.2, 0.5, 1, 2, 5, 5, ... s for at most this long from its "
                                 "start (and at most half of heartbeat_timeout, when the "
                                 "node's file has the master's too), then the master counts "
                                 "as unreachable; keep it well below the master's "
                                 "heartbeat_timeout: a node may say nothing to its master "
                                 "meanwhile",
                                 positive=True, high=DAY)

    # ------------------------------------------------------------------------------------------
    def port_for(self, lane: int) -> int:
        """The TCP port of the clustermaster of ``lane`` (a priority's own lane is its
        number: cluster.lanes)."""
        return self.base_port + lane

    def effective_node_name(self) -> str:
        """The configured node name, or the host's short name."""
        return self.node_name or socket.gethostname().split(".")[0]

    def effective_slots(self) -> int:
        """The configured slot count, or the number of CPUs."""
        return self.slots if self.slots > 0 else (os.cpu_count() or 1)

    def with_changes(self, **changes: Any) -> Config:
        """A copy with some fields replaced (values already converted)."""
        return dataclasses.replace(self, **changes)



#: Every setting at its default: code that needs a default outside a loaded configuration
#: (a keyword argument's default, a test's setup) reads it here, never restates the number.
DEFAULTS = Config()
