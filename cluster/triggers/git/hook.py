"""The git hook: which commits a hook run should queue, and installing the hook.

``etc/git-hook`` is a shell template; :func:`install_hook` fills in its settings lines
(interpreter, source tree, config, tree, kind) and writes it into a repository's hooks
directory, where git runs it as post-receive (a bare repository) or post-commit.  The
hook runs ``python3 -m cluster.commits hook``, which asks :func:`hook_commits` for the new
commits and queues them with :func:`cluster.triggers.git.poll.enqueue_commits`.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from cluster import datatypes
from cluster.defaults import REPO_ROOT
from cluster.runtime import fsutil
from cluster.triggers.git.errors import CommitError, check_tree
from cluster.triggers.git.gitcmd import (
    FULL_SHA,
    READ_TIMEOUT,
    ZERO_SHA,
    GitFailed,
    git,
    resolve,
    rev_list,
    run_git,
)

log = logging.getLogger("cluster.commits")

HOOK_KINDS = ("post-receive", "post-commit")
#: The hook template (the package the hook imports lives beside it, in REPO_ROOT).
HOOK_TEMPLATE = REPO_ROOT / "etc" / "git-hook"
#: Marks a hook file as ours, so install-hook may replace it.
HOOK_MARKER = "# regression-cluster git hook"
#: Permission bits of an installed hook: git runs it, any user may read it.
HOOK_MODE = 0o755


def hook_commits(git_dir: Path, branch: str, kind: str, lines: Iterable[str] = (),
                 tree: str = "") -> list[str]:
    """The commits a hook of ``kind`` run in ``git_dir`` should queue, oldest first.

    post-receive: ``lines`` are git's ``<old> <new> <ref>`` lines; only ``refs/heads/<branch>``
    counts; a deleted branch gives nothing, a new one just its tip (like a first poll),
    an update every commit in ``old..new``.  post-commit: HEAD, if it is on ``branch``.
    CommitError (naming ``tree``) for a malformed line or a repository git cannot read.
    """
    ref = f"refs/heads/{datatypes.check_branch(branch)}"
    shas: list[str] = []
    try:
        if kind == "post-commit":
            done = run_git(git_dir, ["symbolic-ref", "--quiet", "HEAD"], READ_TIMEOUT)
            head = done.text().strip()
            if head != ref:
                log.info("HEAD is %s, not %s: nothing to queue", head or "detached", ref)
                return []
            full = resolve(git_dir, "HEAD")
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
            shas += rev_list(git_dir, old, new)
    except GitFailed as exc:
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
    check_tree(tree)
    repo = Path(repo).absolute()
    try:
        bare = git(None, ["-C", str(repo), "rev-parse", "--is-bare-repository"]).strip()
        hooks_rel = git(None, ["-C", str(repo), "rev-parse", "--git-path", "hooks"])
    except GitFailed as exc:
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
                "CLUSTER_PROJECT": str(REPO_ROOT),
                "CLUSTER_CONFIG": str(Path(config).resolve()),
                "CLUSTER_TREE": tree, "CLUSTER_HOOK_KIND": kind}
    text = render_hook(HOOK_TEMPLATE.read_text(encoding="utf-8"), settings)
    hooks.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write(target, text, mode=HOOK_MODE)
    return target


def render_hook(template: str, settings: Mapping[str, str]) -> str:
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


def hook_git_dir(given: Path | None) -> Path:
    """The repository a hook runs in: ``given``, else ``$GIT_DIR``, else git's answer in cwd.

    GitFailed if none is given and the working directory is not in a repository.
    """
    if given is not None:
        return given.absolute()
    # Called from a hook without --git-dir: git told us where we are.
    env_dir = os.environ.get("GIT_DIR")
    if env_dir:
        return Path(env_dir).absolute()
    out = git(None, ["rev-parse", "--absolute-git-dir"], cwd=Path.cwd())
    return Path(os.fsdecode(out.rstrip(b"\n")))
