"""Running git for the commit triggers: one argv, no shell, a timeout, a clean environment.

Contract of :func:`run_git` (and of :func:`git` and :func:`resolve`, built on it):

* git runs through :func:`cluster.runtime.proc.run`: its own session, stdin from /dev/null,
  and on timeout its whole process tree (``ssh``, ``git-remote-https``) is killed;
* the repository-selecting ``GIT_*`` variables a calling hook inherited are removed, so a
  command reads the repository named by ``git_dir`` and no other; git never asks for a
  password on a terminal nobody watches, and speaks English (``LC_ALL=C``) in the logs;
* every command gets :data:`SAFE_CONFIG`: no fsmonitor daemon or signature check from
  someone's configuration runs on our behalf, and line endings are never converted;
* a failure to start, a timeout and (for :func:`git`) a non-zero exit raise
  :class:`GitFailed` whose message names the git subcommand and carries git's stderr.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from cluster.runtime import proc

# Timeouts [seconds].  A clone of ghostpdl over a slow link takes minutes; local reads
# take milliseconds, but a wedged NFS home must still not hang a clustermaster forever.
CLONE_TIMEOUT = 3600.0
FETCH_TIMEOUT = 900.0
EXPORT_TIMEOUT = 1800.0
READ_TIMEOUT = 120.0

FULL_SHA = re.compile(r"[0-9a-f]{40}")
#: What git writes for "no commit" in a post-receive line (a created or deleted branch).
ZERO_SHA = "0" * 40

# Variables git sets for a hook that select a repository, index or object store
# (`git rev-parse --local-env-vars`, plus the receive-pack ones).  Inherited, they would
# point our commands at the hook's repository instead of the one named by --git-dir.
_LOCAL_GIT_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT", "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE", "GIT_GRAFT_FILE", "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE", "GIT_PREFIX", "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR", "GIT_QUARANTINE_PATH", "GIT_NAMESPACE")
#: ``-c`` settings of every command (see the module docstring).
SAFE_CONFIG = ("-c", "core.fsmonitor=false", "-c", "log.showSignature=false",
               "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false")


class GitFailed(Exception):
    """A git command failed; the message holds the subcommand, its exit status and stderr."""


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the hook's repository selectors, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _LOCAL_GIT_ENV and not k.startswith(("GIT_CONFIG_KEY_",
                                                            "GIT_CONFIG_VALUE_"))}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    env["LC_ALL"] = "C"
    env.update(extra or {})
    return env


def _subcommand(args: Sequence[str]) -> str:
    """The git subcommand in ``args`` (for messages), skipping global options."""
    return next((a for a in args if not a.startswith("-")), "")


def run_git(git_dir: Path | None, args: Sequence[str], timeout: float,
            cwd: Path | None = None, env: Mapping[str, str] | None = None) -> proc.Result:
    """Run git and return what it did, whatever its exit status.

    GitFailed if git is not installed, cannot start or runs past ``timeout`` [seconds].
    """
    program = shutil.which("git")
    if program is None:
        raise GitFailed("git is not installed (not on PATH)")
    argv = [program, *SAFE_CONFIG]
    if git_dir is not None:
        # Absolute: some commands run with cwd elsewhere (the export directory).
        argv.append(f"--git-dir={Path(git_dir).absolute()}")
    argv += args
    try:
        done = proc.run(argv, timeout=timeout, cwd=cwd, env=git_env(env))
    except proc.ProcessError as exc:
        raise GitFailed(f"cannot run git: {exc}") from None
    if done.timed_out:
        raise GitFailed(f"git {_subcommand(args)} timed out after {timeout:g} s")
    return done


def git(git_dir: Path | None, args: Sequence[str], timeout: float = READ_TIMEOUT,
        cwd: Path | None = None, env: Mapping[str, str] | None = None) -> bytes:
    """Run git and return its stdout; GitFailed with its stderr if it exits non-zero."""
    done = run_git(git_dir, args, timeout, cwd, env)
    if done.returncode != 0:
        stderr = done.text("stderr").strip()
        raise GitFailed(f"git {_subcommand(args)} {proc.describe_status(done.returncode)}: "
                        f"{stderr or '(no message)'}")
    return done.stdout


def resolve(git_dir: Path, rev: str, timeout: float = READ_TIMEOUT) -> str | None:
    """The full sha of commit ``rev`` in ``git_dir``, or None if there is none (or ambiguous).

    ``rev`` must already be validated (a sha, or ``refs/heads/<checked branch>``).
    """
    done = run_git(git_dir, ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], timeout)
    sha = done.text().strip()
    return sha if done.returncode == 0 and FULL_SHA.fullmatch(sha) else None


def rev_list(git_dir: Path, old: str, new: str) -> list[str]:
    """The commits in ``old..new``, oldest first (topological order); GitFailed."""
    out = git(git_dir, ["rev-list", "--topo-order", "--reverse", f"{old}..{new}"])
    return out.decode("ascii", "replace").split()
