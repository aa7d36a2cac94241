"""clusterpush --master: a push from a developer's machine over a real OpenSSH and rsync.

A real private sshd (Debian's /usr/sbin/sshd) on 127.0.0.1 plays the master; the master home
and the developer's tree are temporary directories.  The push is compared with a local push
of the same tree (the same files land, the dropping, the lock free afterwards), and the
failures (bad --master, unreachable, refused key, unknown or changed host key, a symlink in
the home) must fail before anything is written on the master.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.cli import clusterpush
from cluster.errors import ClusterError, SshError
from cluster.home import Home
from cluster.master.files import abort
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import pathlock
from cluster.runtime.ssh import SshTarget
from cluster.runtime.sshd import PrivateSshd
from cluster.triggers.droppings import DROPPING
from cluster.triggers.push import snapshot_push, submit_push
from cluster.triggers.remotepush import (
    RemotePushed,
    parse_master,
    remote_abort,
    remote_push,
)
from cluster.wire.jobstart import JobStart
from tests.helpers import free_port, wait_for

SPEC = RunSpec.parse("user alice gs lowres", source="test")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def target_of(sshd: PrivateSshd, **changes: object) -> SshTarget:
    fields: dict[str, object] = {"host": sshd.address, "port": sshd.port, "user": sshd.user,
                                 "key": str(sshd.client_key), "known_hosts": sshd.known_hosts}
    fields.update(changes)
    return SshTarget(**fields)  # type: ignore[arg-type]


def cache_of(sshd: PrivateSshd) -> str:
    """The shipped code's place on the "master": inside the test's directory, not in the
    home of the user running the tests."""
    return str(sshd.root / "cache")


def make_home(tmp_path: Path, name: str = "home") -> Home:
    home = Home(tmp_path / name)
    home.create()
    return home


def make_tree(root: Path) -> Path:
    """A developer tree with files to send, files to leave out and an executable script."""
    files = {
        "Makefile": "all:\n",
        "src/a.c": "int a;\n",
        "src/sub/b.h": "#define B\n",
        "doc/bin": "a file named bin is sent\n",
        "-x name with spaces": "odd\n",
        "bin/gs": "stale build: never sent\n",
        ".git/HEAD": "ref: refs/heads/master\n",
        "out.png": "rendered: never sent\n",
        DROPPING: "user mallory gs\n",  # a dropping in the tree never reaches the master
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "configure").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(root / "configure", 0o755)
    os.symlink("src/a.c", root / "inside-link")
    os.symlink("/etc/passwd", root / "outside-link")
    return root


def listing(top: Path) -> dict[str, tuple[str, int]]:
    """Every regular file below ``top``: relative path -> (content, permission bits)."""
    found: dict[str, tuple[str, int]] = {}
    for dirpath, _dirs, names in os.walk(top):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(top).as_posix()
            found[rel] = (path.read_text(errors="replace"), stat.S_IMODE(path.lstat().st_mode))
    return found


def push(sshd: PrivateSshd, home: Home, tree: Path, spec: RunSpec = SPEC,
         **kw: object) -> RemotePushed:
    return remote_push(target_of(sshd), str(home.root), tree, spec, cache=cache_of(sshd),
                       **kw)  # type: ignore[arg-type]


def cli(sshd: PrivateSshd, master: str, tree: Path, *words: str, **changes: str) -> list[str]:
    opts = {"--ssh-port": str(sshd.port), "--ssh-key": str(sshd.client_key),
            "--known-hosts": str(sshd.known_hosts), "--master-cache": cache_of(sshd),
            "--user": "alice", "--tree": str(tree), **changes}
    return ["--master", master, *[x for pair in opts.items() for x in pair], *words]


# ----------------------------------------------------------------------------------------------
# What lands on the master

def test_remote_push_lands_exactly_as_a_local_push(sshd: PrivateSshd, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    remote_home, local_home = make_home(tmp_path, "remote"), make_home(tmp_path, "local")
    pushed = push(sshd, remote_home, tree)
    local = submit_push(local_home, tree, SPEC, method="rsync")
    target = remote_home.user_tree("alice", "ghostpdl")
    assert Path(pushed.target) == target
    assert pushed.note is None and local.note is None
    got, want = listing(target), listing(local.target)
    assert got == want
    assert got[DROPPING] == (SPEC.line() + "\n", got[DROPPING][1])
    assert got["configure"][1] == 0o755
    assert "bin/gs" not in got and "out.png" not in got and ".git/HEAD" not in got
    assert "outside-link" not in got and got["inside-link"][0] == "int a;\n"
    # The tree's lock is free again (the remote process held it and is gone).
    with pathlock.locked(remote_home.user_tree_lock("alice", "ghostpdl"), timeout=5):
        pass
    # The CLI says the same.
    rc = clusterpush.main(cli(sshd, f"{sshd.user}@{sshd.address}:{remote_home.root}", tree,
                              "gs", "lowres"))
    assert rc == 0


def test_remote_push_second_push_moves_only_the_changed_file(sshd: PrivateSshd,
                                                             tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    for i in range(50):
        (tree / "src" / f"f{i}.c").write_text(f"int f{i};\n" * 100)
    home = make_home(tmp_path)
    first = push(sshd, home, tree)
    assert first.files is not None and first.files >= 55
    (tree / "src" / "f7.c").write_text("int changed;\n")
    second = push(sshd, home, tree)
    assert second.files == 1, second.stats
    assert second.size == len("int changed;\n")
    assert (home.user_tree("alice", "ghostpdl") / "src/f7.c").read_text() == "int changed;\n"
    # The earlier dropping had not been taken yet: this push replaces it, and says so.
    assert second.note is not None and "replaces your previous push" in second.note
    (tree / "src" / "f8.c").unlink()
    third = push(sshd, home, tree)
    assert third.files == 0
    assert not (home.user_tree("alice", "ghostpdl") / "src/f8.c").exists()


def test_remote_push_keeps_a_runs_snapshot_when_only_a_mode_changes(
        sshd: PrivateSshd, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    push(sshd, home, tree)
    snap = tmp_path / "snapshot"
    snapshot_push(home, "alice", "ghostpdl", snap)
    assert os.stat(snap / "Makefile").st_nlink == 2  # hard-linked to the pushed tree
    before = stat.S_IMODE(os.stat(snap / "Makefile").st_mode)
    assert before != 0o700
    os.chmod(tree / "Makefile", 0o700)  # same content, new mode
    push(sshd, home, tree)
    assert stat.S_IMODE(os.stat(home.user_tree("alice", "ghostpdl") / "Makefile").st_mode) \
        == 0o700
    assert stat.S_IMODE(os.stat(snap / "Makefile").st_mode) == before


def receiving(home: Home) -> bool:
    """Whether a master-side receive for ``home`` runs (its command line names the home)."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "receive" in cmd and f"--home={home.root}" in cmd:
            return True
    return False


def test_remote_push_waits_for_the_trees_lock_on_the_master(sshd: PrivateSshd,
                                                           tmp_path: Path) -> None:
    """The master-side lock is the real one: while a run's snapshot (here: the test) holds
    it, nothing of the push lands; released, the push completes."""
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    (home.users / "alice").mkdir(parents=True)
    target = home.user_tree("alice", "ghostpdl")
    results: list[object] = []
    with pathlock.locked(home.user_tree_lock("alice", "ghostpdl")):
        # A short I/O timeout: rsync's must still outlast the wait for the lock.
        worker = threading.Thread(
            target=lambda: results.append(push(sshd, home, tree, io_timeout=1.0)))
        worker.start()
        # The master's side is running (it waits for the lock), and nothing has landed.
        wait_for(lambda: receiving(home), 120, "the master side of the push")
        time.sleep(2.0)
        assert not results
        assert not (target / DROPPING).exists()
        assert not (target / "Makefile").exists()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert isinstance(results[0], RemotePushed)
    assert (target / DROPPING).read_text() == SPEC.line() + "\n"


def test_remote_push_note_says_a_waiting_run_is_replaced(sshd: PrivateSshd,
                                                        tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    QueueFile(home.queue(0), home.queue_lock(0)).append(RunSpec.parse("user alice gs"))
    pushed = push(sshd, home, tree)
    assert pushed.note is not None and "replacing your waiting run 'user alice gs'" in pushed.note


# ----------------------------------------------------------------------------------------------
# abort

def test_remote_push_abort_writes_what_a_local_abort_writes(sshd: PrivateSshd,
                                                           tmp_path: Path) -> None:
    home = make_home(tmp_path)
    queue = QueueFile(home.queue(0), home.queue_lock(0))
    running, later, theirs = (RunSpec.parse("user alice gs"), RunSpec.parse("user alice mupdf"),
                              RunSpec.parse("user bob gs"))
    for spec in (running, theirs, later):
        queue.append(spec)
    home.job_start(0).write_text(JobStart(
        id="20261123-p0-abcd", priority=0, queue=running.line(), kind="user", ref="alice",
        products=running.products, tree=running.tree, source="users/alice/ghostpdl",
        build="make", tests="tests").format())
    aborted = remote_abort(target_of(sshd), str(home.root), "alice", cache=cache_of(sshd))
    assert (aborted.removed, aborted.running) == (1, "20261123-p0-abcd")
    assert queue.read() == [running, theirs]
    assert abort.requested(home, "20261123-p0-abcd")
    # The CLI, once more: nothing left to remove, the running run asked again.
    rc = clusterpush.main(cli(sshd, f"{sshd.address}:{home.root}", tmp_path, "abort"))
    assert rc == 0
    assert queue.read() == [running, theirs]


# ----------------------------------------------------------------------------------------------
# Refusals: clear message, non-zero exit, nothing written on the master

def untouched(home: Home) -> None:
    assert sorted(p.name for p in home.users.iterdir()) == []
    assert not home.queue(0).exists()


def test_remote_push_refuses_an_unknown_host_key_naming_its_fingerprint(
        sshd: PrivateSshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SshError) as err:
        remote_push(target_of(sshd, known_hosts=empty), str(home.root), tree, SPEC,
                    cache=cache_of(sshd))
    assert err.value.kind == "hostkey-unknown"
    assert sshd.host_fingerprint in str(err.value)
    rc = clusterpush.main(cli(sshd, f"{sshd.address}:{home.root}", tree,
                              **{"--known-hosts": str(empty)}))
    assert rc == 2
    message = capsys.readouterr().err
    assert sshd.host_fingerprint in message and f"{sshd.address}:{sshd.port}" in message
    untouched(home)


def test_remote_push_refuses_a_changed_host_key(sshd: PrivateSshd, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    # Another server's key recorded for this host and port: a man in the middle, as seen
    # from the client.
    other = PrivateSshd(tmp_path / "other")
    other._prepare()  # noqa: SLF001 - only its key is needed, not a running server
    forged = tmp_path / "known_hosts"
    forged.write_text(f"[{sshd.address}]:{sshd.port} {other.host_public}\n")
    rc = clusterpush.main(cli(sshd, f"{sshd.address}:{home.root}", tree,
                              **{"--known-hosts": str(forged)}))
    assert rc == 2
    message = capsys.readouterr().err
    assert sshd.host_fingerprint in message and other.host_fingerprint in message
    assert "does not match" in message
    untouched(home)


def test_remote_push_refused_key_and_unreachable_host(sshd: PrivateSshd, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    stranger = PrivateSshd(tmp_path / "stranger")
    stranger._prepare()  # noqa: SLF001 - its client key is not authorised on our sshd
    rc = clusterpush.main(cli(sshd, f"{sshd.address}:{home.root}", tree,
                              **{"--ssh-key": str(stranger.client_key)}))
    assert rc == 2
    assert "refused" in capsys.readouterr().err
    port = free_port()
    rc = clusterpush.main(cli(sshd, f"127.0.0.1:{home.root}", tree,
                              **{"--ssh-port": str(port)}))
    assert rc == 1
    message = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in message and "cannot reach" in message
    untouched(home)


@pytest.mark.parametrize("bad", ["", "-oProxyCommand=x", "host:", "user@", "a b",
                                 "al;ice@host", "::1:/home", "~bob/home"])
def test_remote_push_refuses_a_bad_master(bad: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    if bad == "host:":
        assert parse_master(bad).home == "cluster-home"  # an empty home is the default
        return
    with pytest.raises(ClusterError):
        parse_master(bad)
    rc = clusterpush.main([f"--master={bad}", "--user", "alice", "--tree", str(tmp_path)])
    assert rc == 2
    assert "--master" in capsys.readouterr().err


def test_remote_push_parse_master() -> None:
    assert parse_master("h") == parse_master("h:cluster-home")
    m = parse_master("bob@master.example.org:/srv/cluster")
    assert (m.user, m.host, m.home) == ("bob", "master.example.org", "/srv/cluster")
    assert parse_master("[::1]:~/ch").host == "::1"
    assert parse_master("h:~/ch").home == "ch"
    assert parse_master("h:~").home == "."


def test_remote_push_refuses_a_symlink_in_the_master_home(sshd: PrivateSshd,
                                                         tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me\n")
    os.symlink(elsewhere, home.users / "alice")
    with pytest.raises(ClusterError) as err:
        push(sshd, home, tree)
    assert "symlink" in str(err.value) and "nothing was queued" in str(err.value)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]
    # A symlinked tree directory, too.
    os.unlink(home.users / "alice")
    (home.users / "alice").mkdir()
    os.symlink(elsewhere, home.user_tree("alice", "ghostpdl"))
    with pytest.raises(ClusterError):
        push(sshd, home, tree)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]


def test_remote_push_refuses_a_missing_master_home(sshd: PrivateSshd, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    missing = tmp_path / "no-such-home"
    with pytest.raises(ClusterError) as err:
        remote_push(target_of(sshd), str(missing), tree, SPEC, cache=cache_of(sshd))
    assert "not a directory on the master" in str(err.value)
    assert not missing.exists()


def test_remote_push_ships_one_zip_per_version(sshd: PrivateSshd, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    home = make_home(tmp_path)
    push(sshd, home, tree)
    push(sshd, home, tree)
    cache = Path(cache_of(sshd))
    assert len(list(cache.glob("cluster-*.pyz"))) == 1
    assert not list(cache.glob("modes.*"))  # every modes list was removed


def test_remote_push_home_and_names_with_shell_characters(sshd: PrivateSshd,
                                                         tmp_path: Path) -> None:
    """Nothing the developer names is read by a shell on the master: a home path with
    blanks, quotes, ``$`` and ``;``, and file names starting with ``-``."""
    tree = make_tree(tmp_path / "tree")
    (tree / "--delete-after").write_text("a file, not an option\n")
    (tree / "$(touch pwned);'\"").write_text("a file, not a command\n")
    home = make_home(tmp_path, "-odd home $HOME;'q\"")
    rc = clusterpush.main(cli(sshd, f"{sshd.address}:{home.root}", tree))
    assert rc == 0
    got = listing(home.user_tree("alice", "ghostpdl"))
    assert got["--delete-after"][0] == "a file, not an option\n"
    assert got["$(touch pwned);'\""][0] == "a file, not a command\n"
    assert got[DROPPING][0] == "user alice gs\n"
    assert not list(tmp_path.rglob("pwned"))
