"""Where every file of the master home lives.

Per-priority files carry the priority as a suffix: none for priority 0, ``.1`` and ``.2``
otherwise.  Names with an extension take the suffix before it, as seed 000 writes
``job.1.start`` and ``queue.1.lst``: ``queue.lst`` -> ``queue.1.lst``, ``job.start`` ->
``job.1.start``, ``clustermaster.pid`` -> ``clustermaster.1.pid``.  (Seed 000 also has one
sentence in which priority 0 appends to ``queue.1.lst``; we follow the suffix rule
throughout, see docs/deviations.md.)

Layout of a home::

    queue[.p].lst        runs waiting at priority p, one per line (seed 000's names); the
                         names of earlier releases (queue, queue.1, queue.2) are moved to
                         these once, by cluster.queue.QueueFile
    queue[.p].lck        the queue's lock file (ARTIFEX's queue.lck; the home directory
                         is locked too, see cluster.runtime.pathlock)
    queue[.p].lst.reported   sha256 of the bad queue lines already logged (only while any)
    job[.p].start        the running run: its id and what to build (nodes read it)
    jobs[.p]             build.py's job list for the running run
    results[.p]          journal of results received for the running run
    clustermaster[.p].pid   the PID-file semaphore of seed 000 phase 2
    status[.p]           one-line status for dashboards
    live[.p].json        the running run's live status (counts, rate, nodes), rewritten
                         each second by its master, for the status page and clusteradmin
    runs/<id>/           working files of a run (uploaded node logs, a user run's source
                         snapshot runs/<id>/source/<tree>)
    archive/<id>/        a finished run: .tab, report, logs
    names/<name>         the latest ended run named <name> (name=): its id and outcome,
                         for other runs' after= (cluster/deps.py)
    tables/              the previous result table of each stream (baselines)
    culprits/<id>.toml   the culprit search of commit run <id>: its commits, each changed
                         test's range, its bisection runs (cluster/master/files/culprits.py)
    users/<user>/<tree>/ trees pushed by clusterpush, with their droppings:
                         cluster_command.run, or the legacy gs.run / ghostscript.run
    users/<user>/.<tree>.lock   the tree's lock: a push's sync, a run's snapshot of it
    nodes/<name>.up|.status|.caps   what the monitor learnt of each node
    nodes/<name>.down    a node disabled by clusteradmin (the Perl's $m.down): no work
    groups/<name>        a node group: node names, one a line (docs/runoptions.md,
                         section 4; runs' groups=)
    runs/<id>/stop       an admin asked to stop run <id> (who, and why)
    runs/<id>/order      an admin's order= for run <id> while it ran (value, who, when)
    node-code/           the node side of the package, published for nodes to fetch, and
                         its MANIFEST (an md5 per file)
    node-code.lock       held by the supervisor while a tick publishes node-code/; a run
                         started at that tick waits for it (cluster/master/files/codelock.py)
    node-keys/<name>.key each node's own key (0600 in a 0700 folder; cluster/nodekeys.py)
    heartbeat.nonces     the monitor's replay guard, saved for the monitor after it
    runs/<id>/audit.log  every node connection of the run and every refusal (archived)
    tests/               the test corpus
    runs/<id>/leases     which node process was handed which jobs (one line per JOBS
                         reply), for a master that takes the run over (master/model/leases.py)
    runs/<id>/nonces     the nonces the run's masters accepted, for a successor's guard
    result-cache/        the results of the last complete runs by job key, each with the
                         node and run that made it (cluster/master/cache/resultcache.py);
                         result-cache/withdrawn: program builds a failed check withdrew
                         (cluster/master/cache/reuseverify.py); runs/<id>/builds: the program
                         digests of a running run's nodes, runs/<id>/keychanges: what
                         each node said moved in a program's key (cluster/master/cache/reuse.py);
                         runs/<id>/reuse-checks: the checks of the reused results
    log/                 logs of the master processes; log/admin.log: who changed what
                         with clusteradmin order (one line each)
    resources.json       the resource file (docs/provisioning.md, "The resource file";
                         cluster.wire.resources), unless resource_file puts it elsewhere
    provision.json       the provisioner's last look (clusterscale.py; cluster.wire.provision)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cluster.runtime import fsutil

#: The queue file names of earlier releases (``queue``, ``queue.1``, ``queue.2``), matched
#: against the name of today's (``queue.lst``, ``queue.1.lst``, ``queue.2.lst``).
_QUEUE_NAME = re.compile(r"queue((?:\.[0-9]+)?)\.lst")


#: How long a temporary file below runs/ must have been left unmodified before the clean-up
#: may remove it [seconds]: nodes upload into runs/ from other machines over a shared file
#: system, and the pid in a remote writer's temp name means nothing on the master
#: (see fsutil.remove_dead_temps).
REMOTE_TEMP_AGE = 3600.0
#: The folder of a run's source (an export, or a snapshot of a user's files; a user run's
#: archive keeps its snapshot there too): never cleaned.
SOURCE_DIR = "source"


def _folders(parent: Path) -> list[Path]:
    """The folders in ``parent`` (not links), sorted; none when it is not there."""
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.is_symlink())


def _clean_run_folder(run: Path, min_age: float) -> list[Path]:
    """The dead temporary files of a run's folder (in ``runs/`` or ``archive/``) removed:
    the folder and every subfolder but its ``source/``, which holds a user's own files."""
    if not run.is_dir():
        return []
    removed = fsutil.remove_dead_temps(run, min_age=min_age)
    for sub in sorted(run.iterdir()):
        if sub.is_dir() and not sub.is_symlink() and sub.name != SOURCE_DIR:
            removed += fsutil.remove_dead_temps(sub, recursive=True, min_age=min_age)
    return removed


def suffixed(name: str, priority: int) -> str:
    """``name`` with the priority suffix of seed 000 (none for priority 0)."""
    if priority == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}.{priority}.{ext}" if dot else f"{name}.{priority}"


@dataclass(frozen=True)
class Home:
    """The paths of one master home."""

    root: Path

    def per_priority(self, name: str, priority: int) -> Path:
        return self.root / suffixed(name, priority)

    def queue(self, priority: int) -> Path:
        """``queue.lst``, ``queue.1.lst``, ``queue.2.lst`` (seed 000)."""
        return self.per_priority("queue.lst", priority)

    def legacy_queue(self, priority: int) -> Path:
        """The queue's name in earlier releases (``queue``, ``queue.1``, ``queue.2``)."""
        return self.per_priority("queue", priority)

    def queue_lock(self, priority: int) -> Path:
        """``queue.lck``, ``queue.1.lck``, ``queue.2.lck`` (ARTIFEX §2.1's name)."""
        return self.per_priority("queue.lck", priority)

    def job_start(self, priority: int) -> Path:
        return self.per_priority("job.start", priority)

    def jobs(self, priority: int) -> Path:
        return self.per_priority("jobs", priority)

    def results(self, priority: int) -> Path:
        return self.per_priority("results", priority)

    def pid_file(self, priority: int) -> Path:
        return self.per_priority("clustermaster.pid", priority)

    def status(self, priority: int) -> Path:
        return self.per_priority("status", priority)

    def live(self, priority: int) -> Path:
        """``live[.p].json``: the running run's live status (cluster.master.state.livestatus)."""
        return self.per_priority("live.json", priority)

    def lane_claim(self, lane: int) -> Path:
        """``lanes/<lane>.claim``: the queue line a lane's master chose and is setting up
        (cluster.master.run.nextrun), until the run has ended."""
        return self.root / "lanes" / f"{lane}.claim"

    def node_down(self, name: str) -> Path:
        """``nodes/<name>.down``: the node is disabled (given no work) while this exists."""
        return self.nodes / f"{name}.down"

    def stop_request(self, run_id: str) -> Path:
        """``runs/<id>/stop``: an admin's request that the master stop run ``run_id``."""
        return self.run_dir(run_id) / "stop"

    def run_order(self, run_id: str) -> Path:
        """``runs/<id>/order``: the ``order=`` an admin gave run ``run_id`` while it ran."""
        return self.run_dir(run_id) / "order"

    @property
    def admin_log(self) -> Path:
        """``log/admin.log``: one line per change an admin made to a run's order."""
        return self.log_dir / "admin.log"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs / run_id

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def culprits(self) -> Path:
        """The culprit searches' records, ``culprits/<run id>.toml`` (docs/results.md,
        "Finding the culprit commit")."""
        return self.root / "culprits"

    @property
    def run_names(self) -> Path:
        """``names/``: per run name (``name=``), the latest ended run of that name."""
        return self.root / "names"

    @property
    def result_cache(self) -> Path:
        """``result-cache/``: the results of the last complete runs by job key."""
        return self.root / "result-cache"

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def users(self) -> Path:
        return self.root / "users"

    def user_dir(self, user: str) -> Path:
        """``users/<user>``: a user's pushed trees."""
        return self.users / user

    def user_tree(self, user: str, tree: str) -> Path:
        """``users/<user>/<tree>``: where clusterpush mirrors a user's tree."""
        return self.users / user / tree

    def user_tree_lock(self, user: str, tree: str) -> Path:
        """``users/<user>/.<tree>.lock`` (a tree name never starts with a dot)."""
        return self.users / user / f".{tree}.lock"

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    @property
    def groups(self) -> Path:
        """``groups/``: one file per node group, ``groups/<name>``, listing node names one a
        line (docs/runoptions.md, section 4; :mod:`cluster.master.files.groups`)."""
        return self.root / "groups"

    def group(self, name: str) -> Path:
        """``groups/<name>``: the nodes of group ``name``."""
        return self.groups / name

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def provision_status(self) -> Path:
        """``provision.json``: the provisioner's last look (cluster.wire.provision), written
        by clusterscale.py, read by the console."""
        return self.root / "provision.json"

    #: Names in the home that the master's pieces share (see the layout above).
    NODE_CODE = "node-code"

    @property
    def node_code(self) -> Path:
        """``node-code/``: the node side of the package as the master publishes it, with its
        ``MANIFEST`` (nodes fetch it when the manifest changed)."""
        return self.root / self.NODE_CODE

    @property
    def node_code_lock(self) -> Path:
        """``node-code.lock``: held while the supervisor publishes ``node-code/``
        (:mod:`cluster.master.files.codelock`)."""
        return self.root / "node-code.lock"

    def audit_log(self, run_id: str) -> Path:
        """``runs/<id>/audit.log`` while the run is served; archived as
        ``archive/<id>/audit.log``."""
        return self.run_dir(run_id) / "audit.log"

    def clean_temps(self, run_id: str | None = None) -> list[Path]:
        """Remove the temporary files killed processes left in this home; return them.

        Without ``run_id`` (the supervisor's start): the home's own files, ``tables/``,
        ``nodes/`` and ``repos/`` (not below: the bare clones are git's), and all of
        ``runs/`` and ``archive/``.  With ``run_id`` (a clustermaster that starts or takes
        over that run): the home's own files, ``tables/``, ``runs/<run_id>/`` and
        ``archive/<run_id>/`` only, so the archive is not walked at every run.  Below
        ``runs/`` a file must also be :data:`REMOTE_TEMP_AGE` old (uploads from other
        machines), and a run's ``source/`` is left alone, in ``runs/`` and in ``archive/``
        (a user run's kept snapshot): it holds a user's own files, hard-linked, and one of
        them may be named like a temporary file (and a whole tree for each archived run
        would make the walk long).  ``users/`` is
        never cleaned: the next push's mirror (rsync --delete) removes what a killed push
        left, and the trees there are the users' files.
        """
        flat = [self.root, self.tables]
        if run_id is None:
            flat += [self.nodes, self.root / "repos"]
            runs, archived = _folders(self.runs), _folders(self.archive)
            flat.append(self.archive)
        else:
            runs, archived = [self.run_dir(run_id)], [self.archive / run_id]
        removed = [path for folder in flat for path in fsutil.remove_dead_temps(folder)]
        for run in runs:
            removed += _clean_run_folder(run, REMOTE_TEMP_AGE)
        for run in archived:  # a user run's kept snapshot is a user's files (reprokeep)
            removed += _clean_run_folder(run, 0.0)
        return removed

    def create(self) -> None:
        """Make the directories of a home (idempotent)."""
        for d in (self.root, self.runs, self.archive, self.tables, self.users, self.nodes,
                  self.log_dir):
            d.mkdir(parents=True, exist_ok=True)


def legacy_queue_name(name: str) -> str | None:
    """The earlier release's name of the queue file called ``name`` today, or None.

    ``queue.lst`` -> ``queue``, ``queue.2.lst`` -> ``queue.2``; any other name -> None.
    """
    match = _QUEUE_NAME.fullmatch(name)
    return None if match is None else "queue" + match.group(1)
