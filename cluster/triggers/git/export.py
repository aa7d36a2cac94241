"""A commit's tree as a plain directory: what the master builds a commit run from."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from cluster.config import Config
from cluster.home import Home
from cluster.runtime import fsutil
from cluster.triggers.git.clone import configured_url, ensure_commit
from cluster.triggers.git.errors import CommitError, check_sha
from cluster.triggers.git.gitcmd import EXPORT_TIMEOUT, GitFailed, git
from cluster.triggers.git.ledger import repo_files

log = logging.getLogger("cluster.commits")

#: Permission bits of an exported tree's top (mkdtemp makes it 0700; nodes and other
#: users read it).
EXPORT_MODE = 0o755


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
    sha = check_sha(tree, sha)
    url = configured_url(cfg, tree)
    full = ensure_commit(files, tree, url, sha)
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
        git(files.clone, [*work, "read-tree", full], EXPORT_TIMEOUT, cwd=tmp, env=env)
        git(files.clone, [*work, "checkout-index", "--all", "--force"], EXPORT_TIMEOUT,
            cwd=tmp, env=env)
        os.chmod(tmp, EXPORT_MODE)
        fsutil.swap_dir(tmp, dest)
    except (GitFailed, OSError) as exc:
        raise CommitError(tree, sha, f"cannot export to {dest}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            index.unlink()
    log.info("tree %s: exported commit %s to %s", tree, full[:12], dest)


