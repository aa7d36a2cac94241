"""What the command-line entry points share: config options, logging, crontab management."""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cluster import configfile, cron
from cluster.config import Config
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import AlreadyRunning, ClusterError, ConfigError
from cluster.home import Home
from cluster.runtime.singleton import SingleInstance, read_holder

LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


class ErrorCounter(logging.Handler):
    """Counts the ERROR records it sees: a command exits 1 if any problem was logged."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """--config FILE, --home DIR and repeatable --set key=value."""
    parser.add_argument("--config", type=Path, help="INI configuration file (see etc/)")
    parser.add_argument("--home", type=Path, help="master home (overrides the config)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one configuration key")


def load_config(args: argparse.Namespace) -> Config:
    """Build the frozen Config from parsed options (raises ConfigError)."""
    overrides = configfile.parse_overrides(args.set)
    if args.home is not None:
        overrides["home"] = str(args.home)
    return configfile.load(args.config, overrides)


def parse_with_config(parser: argparse.ArgumentParser, argv: list[str] | None, prog: str
                      ) -> tuple[argparse.Namespace, Config] | int:
    """``argv`` parsed by ``parser`` (which has :func:`add_config_options`) and the
    configuration it names, or the exit status a ``main`` returns at once: argparse's own
    for --help or a bad option (it printed why), EXIT_USAGE for a configuration that cannot
    be used (one line on stderr, ``prog: <what is wrong>``)."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return int(exc.code or 0)
    try:
        return args, load_config(args)
    except ClusterError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def config_argv(args: argparse.Namespace) -> list[str]:
    """The options to hand a child script so it sees the same configuration."""
    argv: list[str] = []
    if args.config is not None:
        argv += ["--config", str(args.config.resolve())]
    if getattr(args, "home", None) is not None:
        argv += ["--home", str(Path(args.home).resolve())]
    for pair in args.set:
        argv += ["--set", pair]
    return argv


def add_sweep_arguments(parser: argparse.ArgumentParser, *, sweep_help: str,
                        previous_run: str) -> None:
    """--sweep FILE and --resume, the same two options of every command that runs a sweep
    (localcluster, clusterpush): ``args.sweep`` is the sweep file's Path or None,
    ``args.resume`` a flag. ``sweep_help`` says what the command does with the file;
    ``previous_run`` names the run --resume continues, as the command knows it (e.g. "your
    previous run of the same sweep")."""
    parser.add_argument("--sweep", type=Path, metavar="FILE", help=sweep_help)
    parser.add_argument("--resume", action="store_true",
                        help="with --sweep: run only the tasks without a valid result in "
                        f"{previous_run}")


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """-q/--quiet, for the programs cron starts: cron mails whatever a job prints."""
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only warnings and errors (the log file keeps "
                             "everything): what a crontab line wants, since cron mails "
                             "any output")


class LogFileHandler(logging.FileHandler):
    """A log file that a full disk silences instead of filling stderr with a "Logging
    error" traceback per record: the record still reaches stderr through its own handler,
    and the file takes records again once there is room."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return
        super().handleError(record)


def setup_logging(log_file: Path | None = None, verbose: bool = False,
                  quiet: bool = False) -> None:
    """Log to stderr, and to ``log_file`` too when given.

    *verbose* logs DEBUG records as well; *quiet* keeps INFO and DEBUG records off stderr
    (they still go to ``log_file``), so a program started by cron prints only problems.
    """
    stream = logging.StreamHandler(sys.stderr)
    if quiet:
        stream.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stream]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(LogFileHandler(log_file, encoding="utf-8"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT,
                        handlers=handlers, force=True)


def manage_cron(prog: str, remove_only: bool, tags: Sequence[str],
                entries: Callable[[], list[cron.CronEntry]]) -> int:
    """What ``--install-cron`` / ``--remove-cron`` do for a script; returns its exit status.

    Prints what was installed or how many entries were removed; EXIT_OK done, EXIT_FAILED
    the crontab could not be read or written, EXIT_USAGE a schedule is not cron syntax.
    ``entries`` is only called when installing (it may raise ConfigError).
    """
    try:
        if remove_only:
            count = cron.remove(tags)
            print(f"removed {count} crontab entr{'y' if count == 1 else 'ies'}")
            return EXIT_OK
        try:
            wanted = entries()
        except ConfigError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for line in cron.install(wanted):
            print(f"installed: {line}")
        return EXIT_OK
    except ClusterError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def start_master_daemon(cfg: Config, prog: str, log_name: str, lock_name: str,
                        quiet: bool, logger: logging.Logger
                        ) -> tuple[Home, SingleInstance] | int:
    """What a single-instance daemon of the master home does first (run_clustermaster.py,
    clusterscale.py): make the home, log to ``log/<log_name>`` (unless logging is set up
    already: a test's main()), and take the home's lock ``lock_name``, saying on ``logger``
    when another instance holds it.  (the home, the held lock), or the exit status:
    EXIT_USAGE when the home cannot be made, EXIT_OK -- quietly, seed 000's "if it is it
    just exits" -- when another instance holds the lock."""
    home = Home(cfg.home)
    try:
        home.create()
    except OSError as exc:
        print(f"{prog}: cannot create master home {home.root}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    if not logging.getLogger().handlers:
        setup_logging(home.log_dir / log_name, quiet=quiet)
    lock_path = home.root / lock_name
    guard = SingleInstance(lock_path, prog)
    try:
        guard.acquire()
    except AlreadyRunning as exc:
        holder = read_holder(lock_path)
        logger.info("%s%s; exiting", exc, f", by pid {holder}" if holder else "")
        return EXIT_OK
    return home, guard
