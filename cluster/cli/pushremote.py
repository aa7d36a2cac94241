"""The master's side of ``clusterpush.py --master``: what runs on the master over ssh.

Not a command for people.  ``clusterpush.py --master`` (:mod:`cluster.triggers.remotepush`)
ships the developer's own copy of the package to the master as one zip file (run as
``python3 FILE.pyz``, whose ``__main__`` calls :func:`main`) and runs it there:

``receive --home H --line LINE --token T [--modes FILE] -- --server ...``
    as rsync's ``--rsync-path``: :func:`cluster.triggers.pushreceive.receive_push` stages the
    transfer in ``users/<user>/.<tree>.incoming.<T>`` (rsync's server, the rest of the
    arguments, receives there) and queues nothing.  Its stdout belongs to rsync's
    protocol, so the outcome is one line on stderr: :data:`MARKER` and a JSON object,
    ``{"staged": ...}`` or ``{"error": ..., "aborted": true|false}``.  ``--modes`` names a
    file (uploaded beside the zip, removed here once read) of the developer's file modes
    (:func:`cluster.triggers.pushreceive.read_modes`).
``commit --home H --line LINE --token T``
    sent by the client only after its transfer ended well:
    :func:`cluster.triggers.pushreceive.commit_push` puts the staged tree in place and writes the
    dropping holding LINE; prints :data:`MARKER` and ``{"target": ..., "note": ...}`` (or
    ``{"error": ..., "aborted": ...}``) on stdout.
``abort --home H --user U``
    :func:`cluster.triggers.pushreceive.abort_pushes` (the user's pushes in flight and droppings
    not yet queued), then :func:`cluster.master.files.abort.request_abort`; prints :data:`MARKER`
    and ``{"stopped": N, "removed": N, "running": ID-or-null}`` (or ``{"error": ...}``) on
    stdout.

``previous --home H --user U --sweep FILE``
    :func:`cluster.triggers.sweeppush.previous_sweep_run`: the run a ``--resume`` push of
    the sweep file named FILE resumes; prints :data:`MARKER` and ``{"run": ID}`` (or
    ``{"error": ...}``) on stdout.  Writes nothing.

``wait --home H --line LINE --after EPOCH --timeout S [--progress]``
    :func:`cluster.cli.pushsteps.wait_step`: ``progress: ...`` lines on stdout while the
    run queued as LINE (started at or after EPOCH, the commit's ``time``) is not archived,
    then :data:`MARKER` and ``{"run": ID, "status": N, "ended": ...}`` or
    ``{"timeout": true}``.
``report --home H --user U --run ID [--kind report|junit|json]``, ``fetch ...``
    the run's report or CI file, or its fetchable files as a tar stream, as bytes on
    stdout (:mod:`cluster.cli.pushsteps`); a refusal is one ``master: ...`` line on stderr.
``stop --home H --user U --run ID [--reason R]``, ``rerun --home H --user U --run ID``
    stop the user's running run; queue the user's finished run again; :data:`MARKER` and
    the outcome (or ``{"error": ..., "refused": true|false}``).

The restricted user gate (:mod:`cluster.cli.usergate`) parses a request with
:func:`parser` and runs it with :func:`execute`, with the home and the user its own.

Exit status 0 when done, 2 when refused (the JSON says why).  Relative paths are relative
to the working directory the remote shell starts in: the ssh account's home.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from cluster.cli import pushsteps
from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files.abort import request_abort
from cluster.runspec import RunSpec
from cluster.triggers.pushreceive import (
    PushAborted,
    abort_pushes,
    commit_push,
    read_modes,
    receive_push,
)
from cluster.triggers.sweeppush import previous_sweep_run

#: What starts the one line that carries a remote step's outcome back to the client.
MARKER = "clusterpush-remote: "


def _report(stream: str, outcome: dict[str, object]) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(MARKER + json.dumps(outcome, sort_keys=True) + "\n")
    out.flush()


def _take_modes(path: str) -> dict[str, int]:
    """Read the modes list at ``path`` (never through a symlink) and remove it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ClusterError(f"modes list {path}: {exc.strerror or exc}; expected the file "
                           "clusterpush uploaded") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass  # the client removes it too
    return read_modes(data)


def parser() -> argparse.ArgumentParser:
    """The remote steps' command line (the user gate parses requests with it too)."""
    p = argparse.ArgumentParser(prog="pushremote", add_help=False)
    sub = p.add_subparsers(dest="step", required=True)

    def step(name: str, *, user: bool = False) -> argparse.ArgumentParser:
        q = sub.add_parser(name, add_help=False)
        q.add_argument("--home")
        if user:
            q.add_argument("--user")
        return q

    receive = step("receive")
    receive.add_argument("--line", required=True)
    receive.add_argument("--modes")
    receive.add_argument("--rsync", default="rsync")
    receive.add_argument("--token", required=True)
    commit = step("commit")
    commit.add_argument("--line", required=True)
    commit.add_argument("--token", required=True)
    step("abort", user=True)
    step("previous", user=True).add_argument("--sweep", required=True)
    wait = step("wait")
    wait.add_argument("--line", required=True)
    wait.add_argument("--after", type=float, required=True)
    wait.add_argument("--timeout", type=float, required=True)
    wait.add_argument("--progress", action="store_true")
    for name in ("report", "fetch", "stop", "rerun"):
        q = step(name, user=True)
        q.add_argument("--run", required=True)
        if name == "report":
            q.add_argument("--kind", default="report", choices=pushsteps.KINDS)
        if name == "stop":
            q.add_argument("--reason", default="")
    return p


def execute(opts: argparse.Namespace, server: list[str], *, user: str | None,
            who: str, config: Path | None = None) -> int:
    """Run the parsed step ``opts`` in the master home ``opts.home``; ``user`` is whose runs
    a run-naming step may touch (None: any, an administrator's), ``who`` names the caller
    in a stop's report.  Prints the outcome; returns the exit status."""
    stream = "stderr" if opts.step == "receive" else "stdout"
    try:
        home = Home(Path(opts.home))
        if not home.root.is_dir():
            raise ClusterError(f"master home {opts.home} is not a directory on the master; "
                               "expected the clustermaster's home (--master host:HOME)")
        if opts.step == "receive":
            spec = RunSpec.parse(opts.line, source="clusterpush --master")
            modes = _take_modes(opts.modes) if opts.modes else None
            staged = receive_push(home, spec, server, token=opts.token, modes=modes,
                                  rsync=opts.rsync)
            _report(stream, {"staged": str(staged)})
        elif opts.step == "commit":
            spec = RunSpec.parse(opts.line, source="clusterpush --master")
            pushed = commit_push(home, spec, opts.token)
            _report(stream, {"target": str(pushed.target), "note": pushed.note,
                             "time": time.time()})
        elif opts.step == "previous":
            _report(stream, {"run": previous_sweep_run(home, opts.user, opts.sweep)})
        elif opts.step == "abort":
            stopped = abort_pushes(home, opts.user)
            outcome = request_abort(home, opts.user)
            _report(stream, {"stopped": stopped, "removed": outcome.removed,
                             "running": outcome.running})
        elif opts.step == "wait":
            _report(stream, pushsteps.wait_step(home, opts.line, opts.after, opts.timeout,
                                                sys.stdout, progress=opts.progress,
                                                config=config))
        elif opts.step == "report":
            data = pushsteps.report_bytes(home, opts.run, opts.kind, user)
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        elif opts.step == "fetch":
            pushsteps.fetch_tar(home, opts.run, user, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        elif opts.step == "stop":
            _report(stream, pushsteps.stop_step(home, opts.run, user, who, opts.reason))
        else:
            _report(stream, pushsteps.rerun_step(home, opts.run, user))
    except (ClusterError, ValueError, OSError) as exc:
        if opts.step in ("report", "fetch"):
            print(f"master: {exc}", file=sys.stderr)
        else:
            _report(stream, {"error": str(exc), "aborted": isinstance(exc, PushAborted),
                             "refused": isinstance(exc, pushsteps.NotYours)})
        return EXIT_USAGE
    return EXIT_OK


def split_server(args: list[str]) -> tuple[list[str], list[str]]:
    """The step's words and, after ``--``, rsync's server arguments."""
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1:]
    return args, []


def main(argv: list[str] | None = None) -> int:
    """Run one remote step (see the module docstring); returns the exit status."""
    args, server = split_server(list(sys.argv[1:] if argv is None else argv))
    opts = parser().parse_args(args)
    if opts.home is None:
        print("pushremote: --home is required", file=sys.stderr)
        return EXIT_USAGE
    # Warnings (a lock waited for, a symlink refused) reach the developer's terminal: the
    # remote stderr is theirs.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="master: %(levelname)s: %(message)s")
    user = getattr(opts, "user", None)
    if hasattr(opts, "user") and user is None:
        print(f"pushremote: {opts.step} needs --user", file=sys.stderr)
        return EXIT_USAGE
    return execute(opts, server, user=user, who=f"{user or 'a developer'} (clusterpush)")
