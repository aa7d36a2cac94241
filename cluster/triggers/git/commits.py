"""Commit runs (priority 1): new git commits become queue lines, and a commit's tree is exported.

The master keeps a bare clone of each configured repository (``repositories``, entries
``tree=url``).  Two paths find new commits of the branch ``git_branch``:

* :func:`poll`, the priority-1 discoverer (``cluster.discovery.DISCOVERERS[1]``), run in
  phase 1 of every clustermaster1 invocation: fetch, list the commits since the tip it
  processed last, oldest first;
* the hook ``etc/git-hook`` (post-receive or post-commit, installed with ``install-hook``),
  which calls :func:`enqueue_commits` with the commits just pushed or made.

Either way each commit is decided once, under a lock, against an append-only ledger: a
commit whose message holds ``CLUSTER_UNTESTED`` is skipped, so is one whose changed paths
need no product (``path_products``, see :func:`products_for`); any other is queued as::

    git <40-hex sha> <products> tree=<tree>

Whichever path sees a commit first queues it; it is never queued again, not even after its
run has finished and left the queue (ARTIFEX.md §7; the Perl polled svn and queued only the
newest revision, see docs/deviations.md "Commit runs").

Files in the master home, per tree::

    repos/<tree>.git          bare clone of the url (``git clone --bare``, later ``git fetch``)
    repos/<tree>.seen         the branch tip the last poll processed (40 hex and a newline)
    repos/<tree>.queued       ledger: ``<sha> <decision>`` per decided commit, append-only
    repos/<tree>.lock         flock held while the ledger and the queue are checked and appended
    repos/<tree>.fetch.lock   flock held while the bare clone is cloned or fetched, and by a poll

The master builds a commit run from :func:`export_commit` (exactly the tree of the commit)
and heads its report with :func:`commit_info`.

Every git command is an argv list run without a shell, with a timeout, with the
repository-selecting ``GIT_*`` variables of a calling hook removed; shas and tree names are
validated before they reach git or a path.

Command line (``python3 -m cluster.commits``)::

    hook          --config C --tree T [--git-dir D] [--kind post-receive|post-commit]
    poll          --config C                      (what phase 1 does, for all repositories)
    export        --config C --tree T --sha S --dest DIR
    install-hook  --repo R --tree T --config C [--kind post-receive|post-commit] [--force]

Exit status: 0 done, 1 git or the home failed (message on stderr), 2 bad usage or config.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.defaults import REPO_ROOT
from cluster.errors import ClusterError, ConfigError, QueueLineError
from cluster.home import Home
from cluster.queue import ALONE, PRODUCTS, TREE, QueueFile, RunSpec

log = logging.getLogger("cluster.commits")

#: The queue commit runs go to.
COMMIT_PRIORITY = 1
#: A commit whose message contains this is never tested (the Artifex convention).
UNTESTED_MARK = "CLUSTER_UNTESTED"
#: Products a ``path_products`` entry may name; the alone ones follow from the tree's name.
MAP_PRODUCTS = tuple(p for p in PRODUCTS if p not in ALONE)
HOOK_KINDS = ("post-receive", "post-commit")
#: The top of the source tree: the hook template and the package the hook imports.
REPO = REPO_ROOT
HOOK_TEMPLATE = REPO / "etc" / "git-hook"
#: Marks a hook file as ours, so install-hook may replace it.
HOOK_MARKER = "# regression-cluster git hook"

# Timeouts [seconds].  A clone of ghostpdl over a slow link takes minutes; local reads
# take milliseconds, but a wedged NFS home must still not hang a clustermaster forever.
CLONE_TIMEOUT = 3600.0
FETCH_TIMEOUT = 900.0
EXPORT_TIMEOUT = 1800.0
READ_TIMEOUT = 120.0

FULL_SHA = re.compile(r"[0-9a-f]{40}")
#: What a caller may name a commit by: an abbreviated or full sha, nothing git could
#: read as an option, a range or a revision expression.
SHA_ARG = re.compile(r"[0-9a-fA-F]{7,40}")
ZERO_SHA = "0" * 40
BRANCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
#: Names of files and directories of the master home (cluster.home).  The master makes the
#: last commit run's tree its clean tree ``<home>/<tree>``, so a tree may not be called so.
RESERVED_TREES = ("archive", "auto", "log", "nodes", "repos", "runs", "tables", "tests",
                  "users")
RESERVED_STEMS = ("queue", "job", "jobs", "results", "clustermaster", "status", "emails",
                  "md5sum", "run_clustermaster", "monitor_port")

# Variables git sets for a hook that select a repository, index or object store
# (`git rev-parse --local-env-vars`, plus the receive-pack ones).  Inherited, they would
# point our commands at the hook's repository instead of the one named by --git-dir.
_LOCAL_GIT_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT", "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE", "GIT_GRAFT_FILE", "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE", "GIT_PREFIX", "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR", "GIT_QUARANTINE_PATH", "GIT_NAMESPACE")
# -c settings for every command: no fsmonitor daemon or signature check from someone's
# config runs on our behalf, and line endings are never converted on export.
_SAFE_CONFIG = ("-c", "core.fsmonitor=false", "-c", "log.showSignature=false",
                "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false")

_REPOSITORIES_FORM = ("'<tree>=<url>' with tree a plain name (letters, digits, '.', '_' or "
                      "'-') and url anything git clones (a local path must be absolute)")
_PATH_PRODUCTS_FORM = ("'[<tree>:]<path prefix>=<products>' with products a comma list of "
                       f"{', '.join(MAP_PRODUCTS)} or empty (the path needs no test)")


class CommitError(ClusterError):
    """A commit run could not be queued, exported or described."""

    def __init__(self, tree: str, sha: str, problem: str) -> None:
        super().__init__(tree, sha, problem)
        self.tree = tree
        self.sha = sha
        self.problem = problem

    def __str__(self) -> str:
        what = f"tree {self.tree!r}" + (f" commit {self.sha}" if self.sha else "")
        return f"{what}: {self.problem}"


# ----------------------------------------------------------------------------------------------
# Configuration grammar (config.validate calls these, so a bad entry fails at load)

@dataclass(frozen=True)
class PathRule:
    """One ``path_products`` entry: paths starting with ``prefix`` need ``products``.

    ``tree`` None means every tree.
    """

    tree: str | None
    prefix: str
    products: tuple[str, ...]


def _bad_text(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def _reserved(tree: str) -> bool:
    return tree in RESERVED_TREES or any(tree == s or tree.startswith(s + ".")
                                         for s in RESERVED_STEMS)


def check_tree(tree: str) -> str:
    """``tree`` if it is a plain name a commit run may use; ConfigError otherwise."""
    if not TREE.fullmatch(tree) or _reserved(tree):
        raise ConfigError("tree", tree, "a plain name (letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit) that is not a file of the "
                          "master home (" + ", ".join(RESERVED_TREES + RESERVED_STEMS) + ")")
    return tree


def _is_local_path(url: str) -> bool:
    """Whether git reads ``url`` as a local path (not ``scheme://`` nor scp-like ``host:path``)."""
    if "://" in url:
        return False
    colon, slash = url.find(":"), url.find("/")
    return colon < 0 or 0 <= slash < colon


def parse_repositories(entries: Iterable[str]) -> dict[str, str]:
    """``repositories`` as ``{tree: url}`` in configuration order.

    Raises ConfigError naming the entry and the expected form for a malformed entry, a
    reserved tree name, a relative local path or a tree given twice.
    """
    out: dict[str, str] = {}
    for entry in entries:
        tree, eq, url = entry.partition("=")
        if not eq or not url or not TREE.fullmatch(tree) or _bad_text(url):
            raise ConfigError("repositories", entry, _REPOSITORIES_FORM)
        if _reserved(tree):
            raise ConfigError("repositories", entry, f"a tree name other than {tree!r}, which "
                              "is a file or directory of the master home")
        if url.startswith("-"):
            raise ConfigError("repositories", entry, "a url not starting with '-' (git would "
                              "read it as an option)")
        if _is_local_path(url) and not os.path.isabs(url):
            raise ConfigError("repositories", entry, "an absolute local path or a url "
                              "(the master runs from any directory)")
        if tree in out:
            raise ConfigError("repositories", entry, f"each tree once; {tree!r} is also "
                              f"{tree}={out[tree]}")
        out[tree] = url
    return out


def check_branch(name: str) -> str:
    """``name`` if it is a plain branch name; ConfigError naming ``git_branch`` otherwise."""
    if (not BRANCH.fullmatch(name) or ".." in name or "//" in name or "/." in name
            or name.endswith(("/", ".", ".lock"))):
        raise ConfigError("git_branch", name, "a branch name such as master (letters, "
                          "digits, '.', '_', '-' and '/', no '..')")
    return name


def parse_path_products(entries: Iterable[str]) -> tuple[PathRule, ...]:
    """``path_products`` as rules; ConfigError naming the entry and the expected form.

    An entry is ``[<tree>:]<prefix>=<products>``.  The text before the first ``=`` is split
    at its first ``:``; a leading ``:`` (empty tree) means every tree, which is how an
    unqualified prefix containing ``:`` is written.  Products may not be mupdf or shell:
    those are tested alone, and a tree named so tests only that product.
    """
    rules: list[PathRule] = []
    keys: set[tuple[str | None, str]] = set()
    for entry in entries:
        where, eq, products = entry.partition("=")
        if not eq:
            raise ConfigError("path_products", entry, _PATH_PRODUCTS_FORM)
        tree: str | None = None
        qualifier, colon, prefix = where.partition(":")
        if colon:
            if qualifier and not TREE.fullmatch(qualifier):
                raise ConfigError("path_products", entry, "a tree qualifier that is a plain "
                                  "name; " + _PATH_PRODUCTS_FORM)
            tree = qualifier or None
        else:
            prefix = where
        if prefix.startswith("/") or _bad_text(prefix):
            raise ConfigError("path_products", entry, "a prefix relative to the top of the "
                              "repository (no leading '/'); " + _PATH_PRODUCTS_FORM)
        names = products.split(",") if products else []
        for name in names:
            if name not in MAP_PRODUCTS:
                why = (f"{name!r} follows from the tree's name and is tested alone"
                       if name in ALONE else f"unknown product {name!r}")
                raise ConfigError("path_products", entry, f"{_PATH_PRODUCTS_FORM} ({why})")
        if len(set(names)) != len(names):
            raise ConfigError("path_products", entry, "each product once; "
                              + _PATH_PRODUCTS_FORM)
        if (tree, prefix) in keys:
            raise ConfigError("path_products", entry, "each [tree:]prefix once")
        keys.add((tree, prefix))
        rules.append(PathRule(tree, prefix, tuple(p for p in PRODUCTS if p in names)))
    return tuple(rules)


def products_for(tree: str, paths: Iterable[str], rules: Sequence[PathRule]) -> tuple[str, ...]:
    """The products a commit of ``tree`` changing ``paths`` must test (canonical order).

    For each path the applicable rule (unqualified, or qualified with ``tree``) with the
    longest prefix the path starts with decides; at equal prefix the tree-qualified one
    wins.  A path no rule matches needs no test.  The result is the union over the paths,
    empty when no path needs a test; for a tree named like an alone product (mupdf, shell)
    a non-empty result is just that product.
    """
    applicable = [r for r in rules if r.tree is None or r.tree == tree]
    wanted: set[str] = set()
    for path in paths:
        best: PathRule | None = None
        for rule in applicable:
            if path.startswith(rule.prefix) and (
                    best is None or (len(rule.prefix), rule.tree is not None)
                    > (len(best.prefix), best.tree is not None)):
                best = rule
        if best is not None:
            wanted.update(best.products)
    if wanted and tree in ALONE:
        return (tree,)
    return tuple(p for p in PRODUCTS if p in wanted)


# ----------------------------------------------------------------------------------------------
# Running git

class _GitFailed(Exception):
    """A git command failed; the message holds its exit status and stderr."""


def _git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LOCAL_GIT_ENV and not k.startswith(("GIT_CONFIG_KEY_",
                                                            "GIT_CONFIG_VALUE_"))}
    # Never wait for a password on a terminal nobody watches; English messages in the logs.
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    env["LC_ALL"] = "C"
    env.update(extra or {})
    return env


def _run_git(git_dir: Path | None, args: Sequence[str], timeout: float,
             cwd: Path | None = None, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[bytes]:
    """Run git (argv, no shell) and return what it did; _GitFailed if it could not finish."""
    git = shutil.which("git")
    if git is None:
        raise _GitFailed("git is not installed (not on PATH)")
    argv = [git, *_SAFE_CONFIG]
    if git_dir is not None:
        # Absolute: some commands run with cwd elsewhere (the export directory).
        argv.append(f"--git-dir={Path(git_dir).absolute()}")
    argv += args
    try:
        # Own session: on timeout the whole group goes (ssh, git-remote-https hold our pipes).
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=cwd, env=_git_env(env),
                                start_new_session=True)
    except OSError as exc:
        raise _GitFailed(f"cannot run git: {exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)
        raise _GitFailed(f"git {_command(args)} timed out after {timeout:g} s") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _command(args: Sequence[str]) -> str:
    """The git subcommand in ``args`` (for messages), skipping global options."""
    return next((a for a in args if not a.startswith("-")), "")


def _git(git_dir: Path | None, args: Sequence[str], timeout: float = READ_TIMEOUT,
         cwd: Path | None = None, env: dict[str, str] | None = None) -> bytes:
    """Run git and return its stdout; _GitFailed with its stderr if it exits non-zero."""
    done = _run_git(git_dir, args, timeout, cwd, env)
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace").strip()
        raise _GitFailed(f"git {_command(args)} exit status {done.returncode}: "
                         f"{stderr or '(no message)'}")
    return done.stdout


def _resolve(git_dir: Path, rev: str, timeout: float = READ_TIMEOUT) -> str | None:
    """The full sha of commit ``rev`` in ``git_dir``, or None if there is none (or ambiguous).

    ``rev`` must already be validated (a sha, or ``refs/heads/<checked branch>``).
    """
    done = _run_git(git_dir, ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], timeout)
    sha = done.stdout.decode("ascii", "replace").strip()
    return sha if done.returncode == 0 and FULL_SHA.fullmatch(sha) else None


def _check_sha(tree: str, sha: str) -> str:
    if not isinstance(sha, str) or not SHA_ARG.fullmatch(sha):
        raise CommitError(tree, "", f"bad commit {sha!r}; expected a sha of 7 to 40 hex digits")
    return sha.lower()


def _check_tree(tree: str) -> str:
    try:
        return check_tree(tree)
    except ConfigError as exc:
        raise CommitError(str(tree), "", f"bad tree name: expected {exc.expected}") from None


# ----------------------------------------------------------------------------------------------
# Reading a commit

@dataclass(frozen=True)
class CommitInfo:
    """What a report says about a commit.

    ``author`` is ``Name <email>``, ``date`` the author date in strict ISO 8601,
    ``subject`` the title, ``message`` the whole log message, ``changed_paths`` the paths
    it added, changed or removed relative to its first parent (every path of a root
    commit), in git's order.
    """

    sha: str
    author: str
    date: str
    subject: str
    message: str
    changed_paths: tuple[str, ...]


_LOG_FORMAT = "%H%x00%P%x00%an <%ae>%x00%aI%x00%s%x00%B"


def read_commit(git_dir: Path, sha: str, tree: str = "") -> CommitInfo:
    """The commit ``sha`` (7 to 40 hex) of the repository ``git_dir``; CommitError if absent."""
    sha = _check_sha(tree, sha)
    try:
        raw = _git(git_dir, ["log", "-1", "--no-color", f"--format={_LOG_FORMAT}", sha, "--"])
        full, parents, author, date, subject, message = (
            raw.decode("utf-8", "replace").split("\0", 5))
        first = parents.split()[:1]
        # A merge is what it brings to the first parent's line; --no-renames so a move
        # counts at both ends.
        diff = ["diff-tree", "-r", "-z", "--name-only", "--no-renames", "--no-ext-diff"]
        names = _git(git_dir, [*diff, first[0], full] if first
                     else [*diff, "--root", "--no-commit-id", full])
    except (_GitFailed, ValueError) as exc:
        raise CommitError(tree, sha, f"cannot read it in {git_dir}: {exc}") from None
    paths = tuple(p for p in names.decode("utf-8", "replace").split("\0") if p)
    return CommitInfo(sha=full.strip(), author=author, date=date, subject=subject,
                      message=message.rstrip("\n"), changed_paths=paths)


# ----------------------------------------------------------------------------------------------
# Files of a tree in the master home

@dataclass(frozen=True)
class RepoFiles:
    """Where the clone, the poll marker, the ledger and the locks of one tree live."""

    clone: Path
    seen: Path
    ledger: Path
    lock: Path
    fetch_lock: Path


def repo_files(home: Home, tree: str) -> RepoFiles:
    """The files of ``tree`` under ``<home>/repos``; CommitError for a bad tree name."""
    _check_tree(tree)
    base = home.root / "repos"
    return RepoFiles(clone=base / f"{tree}.git", seen=base / f"{tree}.seen",
                     ledger=base / f"{tree}.queued", lock=base / f"{tree}.lock",
                     fetch_lock=base / f"{tree}.fetch.lock")


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing, never written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # 0664: the hook may run as the git user, the poller as the master's; they share a group.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_ledger(path: Path) -> set[str]:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return set()
    return {words[0] for words in map(str.split, text.splitlines())
            if words and FULL_SHA.fullmatch(words[0])}


def _ledger_add(path: Path, sha: str, decision: str) -> None:
    """Append ``<sha> <decision>`` durably.  Caller holds the tree lock."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o664)
    try:
        line = f"{sha} {decision}\n".encode("ascii")
        size = os.fstat(fd).st_size
        # A line torn by a crash must not swallow the next one.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_seen(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    if not FULL_SHA.fullmatch(text):
        log.warning("%s holds %r, not a sha; treating the tree as never polled", path, text[:80])
        return None
    return text


def _write_seen(path: Path, sha: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(sha + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# The bare clone

def _clone(tree: str, url: str, files: RepoFiles) -> None:
    """Clone ``url`` bare into ``files.clone``.  Caller holds the fetch lock."""
    # Into a temp dir renamed into place: a clone cut short never looks like a clone.
    tmp = Path(tempfile.mkdtemp(prefix=f".{tree}.", suffix=".clone", dir=files.clone.parent))
    try:
        _git(None, ["clone", "--bare", "--quiet", "--", url, str(tmp)], CLONE_TIMEOUT)
        os.replace(tmp, files.clone)
    except _GitFailed as exc:
        raise CommitError(tree, "", f"cannot clone {url}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("tree %s: cloned %s into %s", tree, url, files.clone)


def _fetch(tree: str, url: str, files: RepoFiles) -> None:
    """Bring every branch of the clone up to ``url``.  Caller holds the fetch lock."""
    try:
        # From the configured url, not remote.origin: a changed url takes effect at once.
        _git(files.clone, ["fetch", "--quiet", "--prune", "--", url,
                           "+refs/heads/*:refs/heads/*"], FETCH_TIMEOUT)
    except _GitFailed as exc:
        raise CommitError(tree, "", f"cannot fetch {url}: {exc}") from None


def _update_clone(tree: str, url: str, files: RepoFiles) -> None:
    """Fetch the bare clone, or clone it when missing.  Caller holds the fetch lock."""
    files.clone.parent.mkdir(parents=True, exist_ok=True)
    if (files.clone / "HEAD").is_file():
        _fetch(tree, url, files)
        return
    if files.clone.exists() or files.clone.is_symlink():
        # Not a repository (left by hand or by a tool): it is only a cache of the url.
        log.warning("tree %s: %s is not a git repository; cloning afresh", tree, files.clone)
        aside = files.clone.with_name(f".{files.clone.name}.broken.{os.getpid()}")
        os.replace(files.clone, aside)
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink()
    _clone(tree, url, files)


def _url_of(cfg: Config, tree: str) -> str:
    try:
        repositories = parse_repositories(cfg.repositories)
    except ConfigError as exc:
        raise CommitError(tree, "", str(exc)) from None
    if tree not in repositories:
        known = ", ".join(repositories) or "none"
        raise CommitError(tree, "", f"not a configured repository (repositories: {known})")
    return repositories[tree]


def _ensure_commit(files: RepoFiles, tree: str, url: str, sha: str) -> str:
    """The full sha of ``sha`` in the bare clone, cloning or fetching when it is missing."""
    with _flocked(files.fetch_lock):
        if not (files.clone / "HEAD").is_file():
            _update_clone(tree, url, files)
        full = _resolve(files.clone, sha)
        if full is None:
            _fetch(tree, url, files)
            full = _resolve(files.clone, sha)
        if full is None and FULL_SHA.fullmatch(sha):
            # No longer on a branch (history rewritten after it was queued): servers that
            # allow it hand out a commit by its sha.  Kept under refs/cluster/ so gc keeps it.
            done = _run_git(files.clone, ["fetch", "--quiet", "--", url,
                                          f"{sha}:refs/cluster/{sha}"], FETCH_TIMEOUT)
            if done.returncode == 0:
                full = _resolve(files.clone, sha)
    if full is None:
        raise CommitError(tree, sha, f"no such commit in {url} (after fetching its branches)")
    return full


# ----------------------------------------------------------------------------------------------
# Deciding and queueing

def _decide(tree: str, info: CommitInfo, rules: Sequence[PathRule]) -> RunSpec | str:
    """The run of a commit, or the reason it is skipped."""
    if UNTESTED_MARK in info.message:
        return "untested"
    products = products_for(tree, info.changed_paths, rules)
    if not products:
        return "no-products"
    return RunSpec(kind="git", ref=info.sha, products=products, options=(f"tree={tree}",))


def _enqueue(home: Home, tree: str, shas: Sequence[str], git_dir: Path,
             rules: Sequence[PathRule], queue: QueueFile) -> list[RunSpec]:
    """Decide each full sha not in the ledger, oldest first; queue the ones to test.

    The ledger and the queue are checked and appended under the tree lock, so of two
    callers (the hook and the poller) exactly one decides a commit.  The queue line is
    written before the ledger line: a crash in between leaves the run queued, and the next
    caller finds it there (QueueFile.append refuses it) and completes the ledger.
    """
    files = repo_files(home, tree)
    added: list[RunSpec] = []
    with _flocked(files.lock):
        decided = _read_ledger(files.ledger)
        for sha in shas:
            if sha in decided:
                log.debug("tree %s: commit %s already decided", tree, sha)
                continue
            info = read_commit(git_dir, sha, tree)
            outcome = _decide(tree, info, rules)
            if isinstance(outcome, str):
                why = (f"its message says {UNTESTED_MARK}" if outcome == "untested" else
                       f"its {len(info.changed_paths)} changed path(s) need no product "
                       "(path_products)")
                log.info("tree %s: commit %s not tested: %s (%s)", tree, sha[:12], why,
                         info.subject[:72])
                decision = outcome
            else:
                if queue.append(outcome):
                    added.append(outcome)
                else:
                    log.info("tree %s: commit %s was already in %s", tree, sha[:12], queue.path)
                decision = "queued"
            _ledger_add(files.ledger, sha, decision)
            decided.add(sha)
    return added


def enqueue_commits(home: Home, cfg: Config, tree: str, shas: Sequence[str],
                    git_dir: Path) -> list[RunSpec]:
    """Queue the commits ``shas`` (oldest first) of ``tree``, reading them in ``git_dir``.

    What the hook calls: ``git_dir`` is the repository the hook runs in.  Same rules and
    ledger as :func:`poll`: a commit already decided by either is skipped.  Returns the runs
    added to the priority-1 queue.  CommitError for a bad or unconfigured tree, a sha that
    is not hex, or a commit ``git_dir`` does not have; nothing is queued then.
    """
    _check_tree(tree)
    _url_of(cfg, tree)  # only configured trees: the master must be able to fetch them
    try:
        rules = parse_path_products(cfg.path_products)
    except ConfigError as exc:
        raise CommitError(tree, "", str(exc)) from None
    checked = [_check_sha(tree, sha) for sha in shas]
    git_dir = Path(git_dir).absolute()
    full: list[str] = []
    for sha in checked:
        resolved = _resolve(git_dir, sha)
        if resolved is None:
            raise CommitError(tree, sha, f"no such commit in {git_dir}")
        full.append(resolved)
    if not full:
        return []
    queue = QueueFile.for_priority(home, COMMIT_PRIORITY)
    try:
        return _enqueue(home, tree, full, git_dir, rules, queue)
    except QueueLineError as exc:  # cannot happen for a full sha and checked products
        raise CommitError(tree, "", str(exc)) from None


def poll(home: Home, cfg: Config, queue: QueueFile) -> list[RunSpec]:
    """The priority-1 discoverer: fetch every repository and queue its new commits.

    For each configured repository: clone it if missing, fetch, and decide the commits of
    ``git_branch`` since the tip the previous poll processed (``repos/<tree>.seen``), oldest
    first (topological order); then record the new tip.  The first poll of a tree (no
    .seen) decides only the tip: it becomes the first baseline, and a repository's whole
    history is never queued.  If the recorded tip is gone (history rewritten) it is treated
    the same way.  A repository that cannot be cloned, fetched or read is logged with its
    tree, url and git's message, and left for the next poll; the others go on.  Returns the
    runs added to ``queue``.
    """
    if not cfg.repositories:
        return []
    try:
        repositories = parse_repositories(cfg.repositories)
        rules = parse_path_products(cfg.path_products)
        branch = check_branch(cfg.git_branch)
    except ConfigError as exc:
        log.error("commit polling is off: %s", exc)
        return []
    added: list[RunSpec] = []
    for tree, url in repositories.items():
        try:
            added += _poll_tree(home, tree, url, branch, rules, queue)
        except CommitError as exc:
            log.error("commit polling: %s", exc)
        except OSError as exc:
            log.error("commit polling: tree %r (%s): %s", tree, url, exc)
    return added


def _poll_tree(home: Home, tree: str, url: str, branch: str, rules: Sequence[PathRule],
               queue: QueueFile) -> list[RunSpec]:
    files = repo_files(home, tree)
    # The whole poll holds the fetch lock: two overlapping polls of one tree then agree on
    # .seen, and an export never sees a clone half cloned.
    with _flocked(files.fetch_lock):
        _update_clone(tree, url, files)
        tip = _resolve(files.clone, f"refs/heads/{branch}")
        if tip is None:
            raise CommitError(tree, "", f"no branch {branch!r} in {url}")
        seen = _read_seen(files.seen)
        if seen == tip:
            return []
        if seen is None:
            log.info("tree %s: first poll; only the tip %s is considered (the first "
                     "baseline), not the history before it", tree, tip[:12])
            shas = [tip]
        elif _resolve(files.clone, seen) is None:
            log.warning("tree %s: the last polled commit %s is gone from %s (history "
                        "rewritten?); only the tip %s is considered", tree, seen[:12], url,
                        tip[:12])
            shas = [tip]
        else:
            try:
                out = _git(files.clone, ["rev-list", "--topo-order", "--reverse",
                                         f"{seen}..{tip}"])
            except _GitFailed as exc:
                raise CommitError(tree, "", f"cannot list commits {seen}..{tip}: {exc}") \
                    from None
            shas = out.decode("ascii", "replace").split()
        added = _enqueue(home, tree, shas, files.clone, rules, queue)
        _write_seen(files.seen, tip)
    return added


# ----------------------------------------------------------------------------------------------
# What the master uses at run start and for the report

def export_commit(home: Home, cfg: Config, tree: str, sha: str, dest: Path) -> None:
    """Make ``dest`` hold exactly the tree of commit ``sha`` of ``tree`` (no .git).

    Files, executable bits and symlinks are as in the commit; ``export-ignore`` attributes
    are not applied (the tree is checked out, not archived) and line endings are only
    converted where the tree's own .gitattributes says so, as in a clone.  The bare clone
    is cloned if missing and fetched if it lacks the commit.  The export is written to a
    temporary directory beside ``dest`` and renamed into place, replacing what ``dest``
    held: ``dest`` is never seen half exported.  CommitError naming the tree, the sha and
    the problem otherwise (``dest`` is then unchanged).
    """
    files = repo_files(home, tree)
    sha = _check_sha(tree, sha)
    url = _url_of(cfg, tree)
    full = _ensure_commit(files, tree, url, sha)
    dest = Path(dest).absolute()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".export",
                                    dir=dest.parent))
    except OSError as exc:
        raise CommitError(tree, sha, f"cannot export to {dest}: {exc}") from None
    # A private index outside the export: the bare clone is shared with pollers and hooks.
    index = tmp.with_name(tmp.name + ".index")
    try:
        env = {"GIT_INDEX_FILE": str(index)}
        work = [f"--work-tree={tmp}"]
        _git(files.clone, [*work, "read-tree", full], EXPORT_TIMEOUT, cwd=tmp, env=env)
        _git(files.clone, [*work, "checkout-index", "--all", "--force"], EXPORT_TIMEOUT,
             cwd=tmp, env=env)
        os.chmod(tmp, 0o755)  # mkdtemp made it 0700; nodes and other users read it
        _replace_dir(tmp, dest)
    except (_GitFailed, OSError) as exc:
        raise CommitError(tree, sha, f"cannot export to {dest}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            index.unlink()
    log.info("tree %s: exported commit %s to %s", tree, full[:12], dest)


def _replace_dir(new: Path, dest: Path) -> None:
    """Rename ``new`` to ``dest``, moving an old ``dest`` aside first and removing it after."""
    if not dest.exists() and not dest.is_symlink():
        os.replace(new, dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
    os.replace(dest, old / "tree")
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def commit_info(home: Home, cfg: Config, tree: str, sha: str) -> CommitInfo:
    """Author, date, message and changed paths of commit ``sha`` of ``tree``.

    Read in the master's bare clone, fetched (or cloned) first if it lacks the commit.
    CommitError naming the tree, the sha and the problem.
    """
    files = repo_files(home, tree)
    sha = _check_sha(tree, sha)
    full = _ensure_commit(files, tree, _url_of(cfg, tree), sha)
    return read_commit(files.clone, full, tree)


# ----------------------------------------------------------------------------------------------
# The hook

def hook_commits(git_dir: Path, branch: str, kind: str, lines: Iterable[str] = (),
                 tree: str = "") -> list[str]:
    """The commits a hook of ``kind`` run in ``git_dir`` should queue, oldest first.

    post-receive: ``lines`` are git's ``<old> <new> <ref>`` lines; only ``refs/heads/<branch>``
    counts; a deleted branch gives nothing, a new one just its tip (like a first poll),
    an update every commit in ``old..new``.  post-commit: HEAD, if it is on ``branch``.
    CommitError (naming ``tree``) for a malformed line or a repository git cannot read.
    """
    ref = f"refs/heads/{check_branch(branch)}"
    shas: list[str] = []
    try:
        if kind == "post-commit":
            done = _run_git(git_dir, ["symbolic-ref", "--quiet", "HEAD"], READ_TIMEOUT)
            head = done.stdout.decode("utf-8", "replace").strip()
            if head != ref:
                log.info("HEAD is %s, not %s: nothing to queue", head or "detached", ref)
                return []
            full = _resolve(git_dir, "HEAD")
            return [full] if full else []
        if kind != "post-receive":
            raise ValueError(f"hook kind {kind!r}: expected one of {', '.join(HOOK_KINDS)}")
        for line in lines:
            words = line.split()
            if len(words) != 3 or words[2] != ref:
                continue
            old, new = words[0].lower(), words[1].lower()
            if not FULL_SHA.fullmatch(old) or not FULL_SHA.fullmatch(new):
                raise CommitError(tree, "", f"bad post-receive line {line.strip()!r}; "
                                  "expected '<old sha> <new sha> <ref>' with 40-hex shas")
            if new == ZERO_SHA:
                continue
            if old == ZERO_SHA:
                shas.append(new)
                continue
            out = _git(git_dir, ["rev-list", "--topo-order", "--reverse", f"{old}..{new}"])
            shas += out.decode("ascii", "replace").split()
    except _GitFailed as exc:
        raise CommitError(tree, "", f"cannot list the new commits in {git_dir}: {exc}") \
            from None
    return shas


def install_hook(repo: Path, tree: str, config: Path, kind: str | None = None,
                 force: bool = False) -> Path:
    """Write the hook into ``repo``'s hooks directory; return its path.

    ``kind`` defaults to post-receive for a bare repository, post-commit otherwise.  The
    hook names this interpreter, this source tree and ``config`` by absolute path, so it
    works from any directory with any PATH.  A hook file that is not ours is only replaced
    with ``force``.  CommitError when the repository, the tree or the file is wrong.
    """
    _check_tree(tree)
    repo = Path(repo).absolute()
    try:
        bare = _git(None, ["-C", str(repo), "rev-parse", "--is-bare-repository"]).strip()
        hooks_rel = _git(None, ["-C", str(repo), "rev-parse", "--git-path", "hooks"])
    except _GitFailed as exc:
        raise CommitError(tree, "", f"{repo} is not a git repository: {exc}") from None
    kind = kind or ("post-receive" if bare == b"true" else "post-commit")
    if kind not in HOOK_KINDS:
        raise CommitError(tree, "", f"hook kind {kind!r}: expected one of "
                          f"{', '.join(HOOK_KINDS)}")
    hooks = repo / os.fsdecode(hooks_rel.rstrip(b"\n"))
    target = hooks / kind
    if target.exists() and not force:
        current = target.read_text(encoding="utf-8", errors="replace")
        if HOOK_MARKER not in current:
            raise CommitError(tree, "", f"{target} exists and is not ours; move it away "
                              "or pass --force to replace it")
    settings = {"CLUSTER_PYTHON": str(Path(sys.executable).absolute()),
                "CLUSTER_PROJECT": str(REPO), "CLUSTER_CONFIG": str(Path(config).resolve()),
                "CLUSTER_TREE": tree, "CLUSTER_HOOK_KIND": kind}
    text = render_hook(HOOK_TEMPLATE.read_text(encoding="utf-8"), settings)
    hooks.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{kind}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def render_hook(template: str, settings: dict[str, str]) -> str:
    """The hook template with each ``NAME=...`` settings line set to its value, shell-quoted."""
    for name, value in settings.items():
        if "\n" in value or "\r" in value:
            raise CommitError(settings.get("CLUSTER_TREE", ""), "",
                              f"{name} {value!r} contains a line break")
        match = re.search(rf"^{name}=.*$", template, re.MULTILINE)
        if match is None:
            raise CommitError(settings.get("CLUSTER_TREE", ""), "",
                              f"{HOOK_TEMPLATE} has no {name}= line")
        line = f"{name}={shlex.quote(value)}"
        template = template[:match.start()] + line + template[match.end():]
    return template


# ----------------------------------------------------------------------------------------------
# Command line

def hook_git_dir(given: Path | None) -> Path:
    if given is not None:
        return given.absolute()
    # Called from a hook without --git-dir: git told us where we are.
    env_dir = os.environ.get("GIT_DIR")
    if env_dir:
        return Path(env_dir).absolute()
    out = _git(None, ["rev-parse", "--absolute-git-dir"], cwd=Path.cwd())
    return Path(os.fsdecode(out.rstrip(b"\n")))
