"""``python3 -m cluster.commits``: queue commits from a git hook, poll, export, install the hook.

The command line of :mod:`cluster.triggers.git.commits` (its docstring is the usage).  Installed
git hooks call it through the ``cluster.commits`` entry module, so that name keeps working.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cluster.cli import common
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.triggers.git import commits

log = logging.getLogger("cluster.commits")


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0 done, 1 failed, 2 usage or config)."""
    prog = "python3 -m cluster.commits"
    parser = argparse.ArgumentParser(prog=prog, description=commits.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    hook = sub.add_parser("hook", help="queue the commits a git hook was told about")
    common.add_config_options(hook)
    hook.add_argument("--tree", required=True)
    hook.add_argument("--git-dir", type=Path, help="the repository (default: $GIT_DIR or cwd)")
    hook.add_argument("--kind", choices=commits.HOOK_KINDS,
                      help="default: post-receive if <old> <new> <ref> lines come on stdin")
    poll_p = sub.add_parser("commits.poll", help="fetch every repository and queue new commits")
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
    install.add_argument("--kind", choices=commits.HOOK_KINDS,
                         help="default: post-receive for a bare repository, else post-commit")
    install.add_argument("--force", action="store_true", help="replace a hook that is not ours")
    args = parser.parse_args(argv)
    what = f"{prog} {args.command}"

    try:
        if args.command == "install-hook":
            cfg = common.load_config(argparse.Namespace(config=args.config, home=None, set=[]))
        else:
            cfg = common.load_config(args)
        if getattr(args, "tree", None) is not None:
            commits.check_tree(args.tree)
    except ClusterError as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 2
    common.setup_logging()
    errors = common.ErrorCounter()
    log.addHandler(errors)
    home = Home(cfg.home)
    try:
        if args.command == "install-hook":
            commits._url_of(cfg, args.tree)  # a hook for a tree the master cannot fetch is useless
            path = commits.install_hook(args.repo, args.tree, args.config, args.kind, args.force)
            print(f"installed {path}")
            return 0
        if args.command == "export":
            commits.export_commit(home, cfg, args.tree, args.sha, args.dest)
            print(f"exported {args.tree} {args.sha} to {args.dest.absolute()}")
            return 0
        if args.command == "commits.poll":
            specs = commits.poll(home, cfg, QueueFile.for_priority(home, commits.COMMIT_PRIORITY))
        else:
            git_dir = commits.hook_git_dir(args.git_dir)
            kind = args.kind
            lines: list[str] = []
            if kind != "post-commit" and not sys.stdin.isatty():
                lines = sys.stdin.read().splitlines()
            kind = kind or ("post-receive" if any(line.strip() for line in lines)
                            else "post-commit")
            shas = commits.hook_commits(git_dir, cfg.git_branch, kind, lines, args.tree)
            specs = commits.enqueue_commits(home, cfg, args.tree, shas, git_dir)
    except ClusterError as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 1
    except (commits._GitFailed, OSError) as exc:
        # OSError: typically a hook run as a user who may not write the master home.
        print(f"{what}: {exc}", file=sys.stderr)
        return 1
    finally:
        log.removeHandler(errors)
    for spec in specs:
        print(f"queued: {spec.line()}")
    return 1 if errors.count else 0
