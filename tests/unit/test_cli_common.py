"""Unit tests of cluster.cli.common: the logging every command sets up."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.cli import common


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers, root.level = handlers, level


def test_quiet_keeps_info_off_stderr_but_in_the_log_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--quiet: stderr gets warnings and errors only; the log file gets everything."""
    log_file = tmp_path / "log" / "x.log"
    common.setup_logging(log_file, quiet=True)
    logger = logging.getLogger("cluster.test")
    logger.info("routine message")
    logger.warning("a problem")
    err = capsys.readouterr().err
    assert "a problem" in err and "routine message" not in err
    text = log_file.read_text()
    assert "routine message" in text and "a problem" in text


def test_without_quiet_info_goes_to_stderr_and_verbose_adds_debug(
        capsys: pytest.CaptureFixture[str]) -> None:
    common.setup_logging()
    logger = logging.getLogger("cluster.test")
    logger.info("routine message")
    logger.debug("detail")
    err = capsys.readouterr().err
    assert "routine message" in err and "detail" not in err
    common.setup_logging(verbose=True)
    logger.debug("detail")
    assert "detail" in capsys.readouterr().err


def test_quiet_option_parses_both_spellings() -> None:
    parser = argparse.ArgumentParser()
    common.add_quiet_option(parser)
    assert parser.parse_args(["-q"]).quiet and parser.parse_args(["--quiet"]).quiet
    assert not parser.parse_args([]).quiet


def test_sweep_arguments_parse_a_file_and_a_flag() -> None:
    """--sweep FILE is a Path (None without it); --resume a flag; the help says both."""
    parser = argparse.ArgumentParser()
    common.add_sweep_arguments(parser, sweep_help="run this sweep",
                               previous_run="the previous run here")
    args = parser.parse_args(["--sweep", "s/sweep.txt", "--resume"])
    assert args.sweep == Path("s/sweep.txt") and args.resume is True
    args = parser.parse_args([])
    assert args.sweep is None and args.resume is False
    text = " ".join(parser.format_help().split())
    assert "run this sweep" in text
    assert "with --sweep: run only the tasks without a valid result in the previous run here" \
        in text


def test_localcluster_and_clusterpush_keep_their_sweep_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands declare --sweep/--resume through add_sweep_arguments, each with its
    own words for the file and the run resumed."""
    from cluster.cli import clusterpush, localcluster
    for main, words in ((localcluster.main, "in this home"),
                        (clusterpush.main, "your previous run of the same sweep")):
        with pytest.raises(SystemExit):
            main(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--sweep FILE" in text and "--resume" in text and words in text
