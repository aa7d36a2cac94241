"""End to end: enqueue_auto.py and clusterpull.py --install-cron/--remove-cron on the REAL
crontab of the user running the tests (``crontab -l`` must show the entries).

The ``user_crontab`` fixture saves the crontab as it was and puts it back afterwards, and
every entry the tests install is tagged with a temporary directory, so the tests never
touch other entries, including the cluster's own entries for a real home on this machine.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.cron import TAG_PREFIX
from tests.helpers import REPO, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("crontab")]  # one worker: crontabs

UNRELATED = "17 5 * * * echo unrelated-entry-of-someone-else # not ours"
#: Lines of someone else's that a naive rewrite (python-crontab's CronTab.write) would drop or
#: change: a variable with blanks around '=', odd spacing, a variable after the last job.
OTHERS = ["MAILTO = nobody@example.invalid", "# someone's note", UNRELATED,
          "0 0 * * 7   echo  sunday   # keep my spacing", "LATE_VARIABLE=1"]


def crontab_l() -> str:
    """The user's crontab as ``crontab -l`` prints it ("" if there is none)."""
    done = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        assert "no crontab" in done.stderr, f"crontab -l failed: {done.stderr}"
        return ""
    return done.stdout


def set_crontab(text: str) -> None:
    subprocess.run(["crontab", "-"], input=text, text=True, check=True, timeout=30)


@pytest.fixture
def user_crontab() -> Iterator[str]:
    """Save the real crontab, add an unrelated entry, restore the original afterwards."""
    if shutil.which("crontab") is None:
        pytest.fail("the crontab program is missing: apt-get install cron")
    done = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 and "no crontab" not in done.stderr:
        pytest.fail(f"crontab -l failed: {done.stderr}")
    saved = done.stdout if done.returncode == 0 else None
    set_crontab((saved or "") + "".join(line + "\n" for line in OTHERS))
    try:
        yield saved or ""
    finally:
        if saved is None:
            subprocess.run(["crontab", "-r"], capture_output=True, timeout=30)
        else:
            set_crontab(saved)


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / name), *args], capture_output=True,
                          text=True, timeout=60)


def ours(tag: str) -> list[str]:
    """Lines of ``crontab -l`` carrying exactly the tag ``tag``."""
    return [line for line in crontab_l().splitlines()
            if line.endswith(f"# {TAG_PREFIX}{tag}")]


def command_of(line: str) -> str:
    """The shell command of a crontab line: after the five time fields, before our comment."""
    return line[:line.rindex(f" # {TAG_PREFIX}")].split(None, 5)[5]


def master_home(tmp_path: Path) -> Path:
    home = tmp_path / "master home"  # a blank in the path: the command must quote it
    for schedule, name, text in (("nightly", "x", "gs lowres\n"), ("weekly", "y", "gs\n")):
        jobdef = home / "auto" / schedule / name / "jobdef.txt"
        jobdef.parent.mkdir(parents=True)
        jobdef.write_text(text)
    return home


def test_install_cron_writes_two_entries_idempotently(user_crontab: str,
                                                      tmp_path: Path) -> None:
    home = master_home(tmp_path)
    first = script("enqueue_auto.py", "--home", str(home), "--install-cron")
    assert first.returncode == 0, first.stderr
    after_one = crontab_l()
    nightly = ours(f"enqueue_auto-nightly:{home}")
    weekly = ours(f"enqueue_auto-weekly:{home}")
    assert len(nightly) == 1 and nightly[0].startswith("0 1 * * * cd ")
    assert len(weekly) == 1 and weekly[0].startswith("0 3 * * 6 cd ")
    assert command_of(nightly[0]).endswith(" nightly")
    assert command_of(weekly[0]).endswith(" weekly")
    assert not (home / "queue.2.lst").exists(), "--install-cron must not queue anything"

    again = script("enqueue_auto.py", "--home", str(home), "--install-cron")
    assert again.returncode == 0, again.stderr
    assert crontab_l() == after_one
    assert after_one.startswith(user_crontab + "".join(line + "\n" for line in OTHERS))

    # A duplicate and a copy commented out by hand are folded back into one live entry.
    set_crontab(after_one + nightly[0] + "\n# " + weekly[0] + "\n")
    third = script("enqueue_auto.py", "--home", str(home), "--install-cron")
    assert third.returncode == 0, third.stderr
    assert crontab_l() == after_one


def test_the_installed_commands_enqueue_the_auto_runs(user_crontab: str, tmp_path: Path) -> None:
    home = master_home(tmp_path)
    done = script("enqueue_auto.py", "--home", str(home), "--set", "nightly_schedule=30 2 * * *",
                  "--install-cron")
    assert done.returncode == 0, done.stderr
    [nightly] = ours(f"enqueue_auto-nightly:{home}")
    [weekly] = ours(f"enqueue_auto-weekly:{home}")
    assert nightly.startswith("30 2 * * * ")
    # Run the commands as cron would: sh -c, from the user's home, with cron's bare PATH.
    cron_env = {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "HOME": str(tmp_path),
                "LOGNAME": getpass.getuser()}
    for line in (nightly, weekly):
        assert " --quiet " in command_of(line)
        ran = subprocess.run(["sh", "-c", command_of(line)], cwd=tmp_path, env=cron_env,
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == ran.stderr == "", "cron would mail this output"
    queue = (home / "queue.2.lst").read_text().splitlines()
    assert queue == ["auto nightly-x gs lowres", "auto weekly-y gs"]


def test_the_installed_nightly_command_checks_and_queues_a_sweep(user_crontab: str,
                                                                 tmp_path: Path) -> None:
    """A nightly sweep (``sweep <folder>``, docs/sweeps.md section 8) queued by the crontab
    entry run as cron runs it; a broken sweep beside it is not queued and cron mails why."""
    home = master_home(tmp_path)
    team = tmp_path / "team sweep"  # a blank in the folder's path too
    team.mkdir()
    (team / "params.csv").write_text("a\n1\n2\n")
    (team / "sweep.toml").write_text("command = 'echo {a}'\ntable = 'params.csv'\n")
    for name, line in (("model", f"sweep '{team}/sweep.toml' relaxtimeout"),
                       ("broken", "sweep ../model/missing")):
        jobdef = home / "auto" / "nightly" / name / "jobdef.txt"
        jobdef.parent.mkdir(parents=True)
        jobdef.write_text(f"# a sweep\n{line}\n")
    done = script("enqueue_auto.py", "--home", str(home), "--install-cron")
    assert done.returncode == 0, done.stderr
    [nightly] = ours(f"enqueue_auto-nightly:{home}")
    cron_env = {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "HOME": str(tmp_path),
                "LOGNAME": getpass.getuser()}
    ran = subprocess.run(["sh", "-c", command_of(nightly)], cwd=tmp_path, env=cron_env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1  # the broken jobdef: cron mails its line
    assert ran.stdout == ""
    assert "nightly/broken/jobdef.txt" in ran.stderr
    assert "'../model/missing' is neither a folder nor a file" in ran.stderr
    queue = (home / "queue.2.lst").read_text().splitlines()
    assert queue == ["auto nightly-model sweep relaxtimeout sweep=sweep.toml",
                     "auto nightly-x gs lowres"]


def test_remove_cron_takes_out_only_our_entries(user_crontab: str, tmp_path: Path) -> None:
    home = master_home(tmp_path)
    other = tmp_path / "other-home"
    other.mkdir()
    for h in (home, other):
        done = script("enqueue_auto.py", "--home", str(h), "--install-cron")
        assert done.returncode == 0, done.stderr
    removed = script("enqueue_auto.py", "--home", str(home), "--remove-cron")
    assert removed.returncode == 0, removed.stderr
    assert "removed 2 crontab entries" in removed.stdout
    assert ours(f"enqueue_auto-nightly:{home}") == ours(f"enqueue_auto-weekly:{home}") == []
    # Another home's entries survive ...
    assert len(ours(f"enqueue_auto-nightly:{other}")) == 1
    removed = script("enqueue_auto.py", "--home", str(other), "--remove-cron")
    assert removed.returncode == 0, removed.stderr
    # ... and what was there before, ours or not, is back byte for byte.
    assert crontab_l() == user_crontab + "".join(line + "\n" for line in OTHERS)
    again = script("enqueue_auto.py", "--home", str(home), "--remove-cron")
    assert again.returncode == 0 and "removed 0 crontab entries" in again.stdout


def test_clusterpull_install_and_remove_cron(user_crontab: str, tmp_path: Path) -> None:
    work = tmp_path / "node-work"
    conf = tmp_path / "node.conf"
    # Nothing listens on the monitor port: the running node logs "heartbeat failed".
    conf.write_text(f"[node]\nwork_dir = {work}\nmaster_home = {tmp_path / 'home'}\n"
                    f"monitor_port = {free_port()}\nheartbeat_interval = 0.2\n")
    for _ in range(2):
        done = script("clusterpull.py", "--config", str(conf), "--install-cron")
        assert done.returncode == 0, done.stderr
    [line] = ours(f"clusterpull:{work}")
    assert line.startswith("*/10 * * * * cd ")
    assert f"clusterpull.py --config {conf}" in command_of(line)
    assert command_of(line).endswith(" --quiet")
    assert not work.exists(), "--install-cron must not start the node"
    # While a clusterpull runs, the installed command (as cron runs it) exits 0 and prints
    # nothing, so cron mails nothing every ten minutes; the node's log says why it left.
    first = subprocess.Popen([sys.executable, str(REPO / "clusterpull.py"), "--config",
                              str(conf)], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        log = work / "log" / "clusterpull.log"
        wait_for(lambda: log.exists() and "heartbeat failed" in log.read_text(), 30,
                 "the first clusterpull to run its loop")
        cron_env = {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "HOME": str(tmp_path),
                    "LOGNAME": getpass.getuser()}
        ran = subprocess.run(["sh", "-c", command_of(line)], cwd=tmp_path, env=cron_env,
                             capture_output=True, text=True, timeout=60)
        assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", "")
        assert "already running" in log.read_text()
    finally:
        first.terminate()
        first.wait(timeout=30)
    removed = script("clusterpull.py", "--config", str(conf), "--remove-cron")
    assert removed.returncode == 0, removed.stderr
    assert ours(f"clusterpull:{work}") == []
    assert crontab_l() == user_crontab + "".join(line + "\n" for line in OTHERS)


def test_a_bad_schedule_is_refused_naming_the_key(user_crontab: str, tmp_path: Path) -> None:
    before = crontab_l()
    done = script("clusterpull.py", "--set", f"work_dir={tmp_path / 'w'}",
                  "--set", "clusterpull_schedule=every ten minutes", "--install-cron")
    assert done.returncode == 2
    assert "clusterpull_schedule" in done.stderr and "cron schedule" in done.stderr
    assert crontab_l() == before
