"""``python3 -m cluster.commits``: queue commits from a git hook, poll, export, install the hook.

Commit runs (priority 1) are described in :mod:`cluster.triggers.git`.  Commands::

    hook          --config C --tree T [--git-dir D] [--kind post-receive|post-commit]
    poll          --config C                      (what phase 1 does, for all repositories)
    export        --config C --tree T --sha S --dest DIR
    install-hook  --repo R --tree T --config C [--kind post-receive|post-commit] [--force]

``hook`` reads git's ``<old> <new> <ref>`` lines on stdin (post-receive) or takes HEAD
(post-commit) and queues the new commits of ``git_branch`` that need a test; ``poll``
fetches every configured repository and does the same; ``export`` writes the tree of a
commit into a directory; ``install-hook`` writes etc/git-hook into a repository.  Installed
git hooks call this through the ``cluster.commits`` entry module, so that name keeps working.

Exit status: 0 done, 1 git or the home failed (message on stderr), 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cluster import datatypes
from cluster.cli import common
from cluster.defaults import COMMIT_PRIORITY, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.triggers.git import hook, poll
from cluster.triggers.git.clone import configured_url
from cluster.triggers.git.export import export_commit
from cluster.triggers.git.gitcmd import GitFailed

log = logging.getLogger("cluster.commits")

PROG = "python3 -m cluster.commits"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    hook_p = sub.add_parser("hook", help="queue the commits a git hook was told about")
    common.add_config_options(hook_p)
    hook_p.add_argument("--tree", required=True)
    hook_p.add_argument("--git-dir", type=Path,
                        help="the repository (default: $GIT_DIR or cwd)")
    hook_p.add_argument("--kind", choices=hook.HOOK_KINDS,
                        help="default: post-receive if <old> <new> <ref> lines come on stdin")
    poll_p = sub.add_parser("poll", help="fetch every repository and queue new commits")
    common.add_config_options(poll_p)
    export = sub.add_parser("export", help="export the tree of a commit into a directory")
    common.add_config_options(export)
    export.add_argument("--tree", required=True)
    export.add_argument("--sha", required=True)
    export.add_argument("--dest", type=Path, required=True)
    install = sub.add_parser("install-hook", help="install etc/git-hook into a repository")
    install.add_argument("--repo", type=Path, required=True)
    install.add_argument("--tree", required=True)
    install.add_argument("--config", type=Path, required=True)
    install.add_argument("--kind", choices=hook.HOOK_KINDS,
                         help="default: post-receive for a bare repository, else post-commit")
    install.add_argument("--force", action="store_true", help="replace a hook that is not ours")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    what = f"{PROG} {args.command}"
    try:
        if args.command == "install-hook":
            cfg = common.load_config(argparse.Namespace(config=args.config, home=None, set=[]))
        else:
            cfg = common.load_config(args)
        if getattr(args, "tree", None) is not None:
            datatypes.check_tree(args.tree)
    except ClusterError as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    common.setup_logging()
    errors = common.ErrorCounter()
    log.addHandler(errors)
    home = Home(cfg.home)
    try:
        if args.command == "install-hook":
            configured_url(cfg, args.tree)  # a hook for a tree the master cannot fetch is useless
            path = hook.install_hook(args.repo, args.tree, args.config, args.kind, args.force)
            print(f"installed {path}")
            return EXIT_OK
        if args.command == "export":
            export_commit(home, cfg, args.tree, args.sha, args.dest)
            print(f"exported {args.tree} {args.sha} to {args.dest.absolute()}")
            return EXIT_OK
        if args.command == "poll":
            specs = poll.poll(home, cfg, QueueFile.for_priority(home, COMMIT_PRIORITY))
        else:
            git_dir = hook.hook_git_dir(args.git_dir)
            kind = args.kind
            lines: list[str] = []
            if kind != "post-commit" and not sys.stdin.isatty():
                lines = sys.stdin.read().splitlines()
            kind = kind or ("post-receive" if any(line.strip() for line in lines)
                            else "post-commit")
            shas = hook.hook_commits(git_dir, cfg.git_branch, kind, lines, args.tree)
            specs = poll.enqueue_commits(home, cfg, args.tree, shas, git_dir)
    except (ClusterError, GitFailed, OSError) as exc:
        # OSError: typically a hook run as a user who may not write the master home.
        print(f"{what}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        log.removeHandler(errors)
    for spec in specs:
        print(f"queued: {spec.line()}")
    return EXIT_FAILED if errors.count else EXIT_OK
