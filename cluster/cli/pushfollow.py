"""clusterpush's steps after a push: ``--wait`` over ``--master``, ``--fetch``, ``--stop``,
``--rerun`` (docs/operating.md, "Waiting for a run from CI" and "The user gate").

The remote forms send the steps of :mod:`cluster.cli.pushsteps` over ssh
(:mod:`cluster.triggers.remotefollow`); the local forms call them on the master home this
machine sees.  Both print the same lines.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from cluster.cli import progname, pushsteps
from cluster.console import archivefiles
from cluster.console.progress import TerminalLine
from cluster.defaults import EXIT_OK, EXIT_RUN_FAILED
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.runtime.ssh import SshTarget
from cluster.triggers.remotefollow import remote_bytes, remote_fetch, remote_outcome, remote_wait
from cluster.triggers.remotepush import RemotePushed

PROG = progname.prog("clusterpush.py")


def wait_remote(target: SshTarget, home: str, spec: RunSpec, pushed: RemotePushed,
                args: argparse.Namespace, ssh: dict[str, Any]) -> int:
    """``--wait`` with ``--master``: as the local --wait, the run followed on the master."""
    line = TerminalLine(sys.stdout)
    after = pushed.committed if pushed.committed is not None else time.time()
    try:
        outcome = remote_wait(target, home, spec.line(), after, args.wait_timeout,
                              on_progress=line.show if line.enabled else None, **ssh)
    finally:
        line.clear()
    if outcome.get("timeout"):
        print(f"{PROG}: the run {spec.line()!r} did not end within --wait-timeout "
              f"{args.wait_timeout:g} s; it goes on (clusterpush abort stops it)",
              file=sys.stderr)
        return EXIT_RUN_FAILED
    run = str(outcome["run"])
    report = remote_bytes(target, home, spec.ref, run, "report", **ssh)
    sys.stdout.write(report.decode("utf-8", "replace"))
    print(f"{target.where()}:{home}/archive/{run}", flush=True)
    for wanted, kind in ((args.junit, "junit"), (args.json, "json")):
        if wanted is None:
            continue
        try:
            wanted.write_bytes(remote_bytes(target, home, spec.ref, run, kind, **ssh))
        except ClusterError as exc:
            print(f"{PROG}: {exc}: {wanted} not written", file=sys.stderr)
    status = int(outcome.get("status", EXIT_RUN_FAILED))  # type: ignore[call-overload]
    if status == EXIT_RUN_FAILED:
        print(f"{PROG}: the run did not complete: {outcome.get('ended')} (report: "
              f"{target.where()}:{home}/archive/{run}/report.txt)", file=sys.stderr)
    return status


def fetch_local(home: Home, run: str, dest: Path) -> list[str]:
    """``--fetch RUN`` from a master home this machine sees: the files copied."""
    names = []
    files = archivefiles.fetchable(home, run)
    for rel, path in files:
        target = dest / run / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        names.append(f"{run}/{rel}")
    for name, data in pushsteps.ci_members(home.archive / run, {rel for rel, _ in files}):
        (dest / run).mkdir(parents=True, exist_ok=True)
        (dest / run / name).write_bytes(data)
        names.append(f"{run}/{name}")
    return names


def fetch(args: argparse.Namespace, home: Home | None, target: SshTarget | None,
          remote_home: str, ssh: dict[str, Any]) -> int:
    dest = args.dest or Path.cwd()
    if target is None:
        assert home is not None
        names = fetch_local(home, args.fetch, dest)
    else:
        names = remote_fetch(target, remote_home, args.user, args.fetch, dest, **ssh)
    print(f"fetched {len(names)} file(s) of run {args.fetch} into {dest / args.fetch}")
    return EXIT_OK


def stop_or_rerun(args: argparse.Namespace, home: Home | None, target: SshTarget | None,
                  remote_home: str, ssh: dict[str, Any]) -> int:
    """``--stop RUN`` / ``--rerun RUN``: the user's running run stopped, or the user's
    finished run queued again (with the tree as last pushed)."""
    step, run = ("stop", args.stop) if args.stop else ("rerun", args.rerun)
    if target is None:
        assert home is not None
        who = f"{args.user} (clusterpush)"
        outcome = (pushsteps.stop_step(home, run, args.user, who, args.reason)
                   if step == "stop" else pushsteps.rerun_step(home, run, args.user))
    else:
        words = [step, f"--user={args.user}", f"--run={run}"]
        if step == "stop" and args.reason:
            words.append(f"--reason={args.reason}")
        outcome = remote_outcome(target, remote_home, words, **ssh)
    if step == "stop":
        print(outcome.get("message") or f"stop: {outcome}")
    else:
        print(f"queueing: {outcome.get('line')}")
        if outcome.get("note"):
            print(outcome["note"])
    return EXIT_OK
