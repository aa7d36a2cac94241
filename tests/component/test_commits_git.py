"""Commit runs against real git: polling, the installed hooks, the ledger, export_commit."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cluster.cli import commits as commits_cli
from cluster.config import Config
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers.git import export as git_export
from cluster.triggers.git import hook as git_hook
from cluster.triggers.git import info as git_info
from cluster.triggers.git import ledger as git_ledger
from cluster.triggers.git import poll as git_poll
from cluster.triggers.git.errors import CommitError
from tests.helpers import REPO

ALL = "gs,pdfwrite,ps2write"


@pytest.fixture(autouse=True)
def git_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits need an author; no system or user git config may change what git does."""
    for key in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(key, "Tess Ter")
    for key in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(key, "tess@example.org")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    empty = tmp_path / "gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))


@pytest.fixture(autouse=True)
def restore_logging():
    """commits.main sets up logging as a CLI does; later tests must not log through it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def commit(work: Path, message: str, files: dict[str, str | None]) -> str:
    """Write (or with None delete) ``files`` in the work tree, commit, return the sha."""
    for name, text in files.items():
        path = work / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(work, "add", "-A")
    git(work, "commit", "-q", "--allow-empty", "-m", message)
    return git(work, "rev-parse", "HEAD")


def new_repo(path: Path, first: dict[str, str | None] | None = None) -> Path:
    git(path.parent, "init", "-q", "-b", "master", path.name)
    commit(path, "initial", first or {"base/gs.c": "1\n", "doc/readme.md": "hi\n"})
    return path


def setup(tmp_path: Path, **changes: object) -> tuple[Home, Config, QueueFile]:
    home = Home(tmp_path / "home")
    home.create()
    cfg = Config(home=home.root).with_changes(**changes)
    return home, cfg, QueueFile.for_priority(home, 1)


def lines(queue: QueueFile) -> list[str]:
    return [spec.line() for spec in queue.read()]


def ledger(home: Home, tree: str) -> list[str]:
    path = git_ledger.repo_files(home, tree).ledger
    return path.read_text().splitlines() if path.exists() else []


def write_config(tmp_path: Path, home: Home, repositories: str) -> Path:
    conf = tmp_path / "master.conf"
    conf.write_text(f"[master]\nhome = {home.root}\nrepositories = {repositories}\n")
    return conf


# ----------------------------------------------------------------------------------------------
# Polling

def test_first_poll_queues_only_the_tip(tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up")
    commit(up, "second", {"base/gs.c": "2\n"})
    tip = commit(up, "third", {"base/gs.c": "3\n"})
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    added = git_poll.poll(home, cfg, queue)
    assert [s.line() for s in added] == [f"git {tip} {ALL} tree=ghostpdl"]
    assert git_ledger.repo_files(home, "ghostpdl").seen.read_text() == tip + "\n"
    assert git_ledger.repo_files(home, "ghostpdl").clone.is_dir()
    assert git_poll.poll(home, cfg, queue) == []  # nothing new
    assert lines(queue) == [f"git {tip} {ALL} tree=ghostpdl"]



def test_the_poll_command_queues_what_the_discoverer_would(tmp_path: Path, capsys) -> None:
    """`python3 -m cluster.commits poll` is phase 1's commit poll, from the command line."""
    up = new_repo(tmp_path / "up")
    tip = commit(up, "second", {"base/gs.c": "2\n"})
    home, _cfg, queue = setup(tmp_path)
    conf = write_config(tmp_path, home, f"ghostpdl={up}")
    assert commits_cli.main(["poll", "--config", str(conf)]) == 0
    assert capsys.readouterr().out == f"queued: git {tip} {ALL} tree=ghostpdl\n"
    assert lines(queue) == [f"git {tip} {ALL} tree=ghostpdl"]

def test_new_commits_are_queued_oldest_first_with_their_products(tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",),
                             path_products=("doc/=", "pcl/=gs", f"={ALL}"))
    base = git_poll.poll(home, cfg, queue)[0]
    queue.remove(base)
    a = commit(up, "pcl fix", {"pcl/pcl.c": "x\n"})
    b = commit(up, "core fix", {"base/gs.c": "2\n", "doc/readme.md": "more\n"})
    added = git_poll.poll(home, cfg, queue)
    assert [s.line() for s in added] == [f"git {a} gs tree=ghostpdl",
                                        f"git {b} {ALL} tree=ghostpdl"]
    assert lines(queue) == [s.line() for s in added]
    # Its run finished and left the queue: neither the poller nor the hook queues it again.
    queue.remove(added[0])
    git(up, "branch", "-f", "other", a)
    assert git_poll.poll(home, cfg, queue) == []
    assert git_poll.enqueue_commits(home, cfg, "ghostpdl", [a], up / ".git") == []
    assert lines(queue) == [f"git {b} {ALL} tree=ghostpdl"]
    assert ledger(home, "ghostpdl")[-2:] == [f"{a} queued", f"{b} queued"]


def test_a_cluster_untested_commit_is_not_queued(tmp_path: Path, caplog) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    git_poll.poll(home, cfg, queue)
    skip = commit(up, "Tidy up.\n\nCLUSTER_UNTESTED", {"base/gs.c": "2\n"})
    keep = commit(up, "Real change", {"base/gs.c": "3\n"})
    with caplog.at_level(logging.INFO, logger="cluster.commits"):
        added = git_poll.poll(home, cfg, queue)
    assert [s.ref for s in added] == [keep]
    assert f"{skip} untested" in ledger(home, "ghostpdl")
    assert f"commit {skip[:12]} not tested: its message says CLUSTER_UNTESTED" in caplog.text
    # Recorded, so the hook does not reconsider it either.
    assert git_poll.enqueue_commits(home, cfg, "ghostpdl", [skip], up / ".git") == []


def test_a_doc_only_change_is_skipped(tmp_path: Path, caplog) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    git_poll.poll(home, cfg, queue)
    docs = commit(up, "Document it", {"doc/readme.md": "new\n", "examples/x.ps": "%!\n"})
    with caplog.at_level(logging.INFO, logger="cluster.commits"):
        assert git_poll.poll(home, cfg, queue) == []
    assert f"{docs} no-products" in ledger(home, "ghostpdl")
    assert "2 changed path(s) need no product" in caplog.text
    assert git_ledger.repo_files(home, "ghostpdl").seen.read_text() == docs + "\n"


def test_an_unreachable_repository_is_logged_and_the_others_still_poll(tmp_path: Path,
                                                                       caplog) -> None:
    up = new_repo(tmp_path / "mupdf", {"source/fitz.c": "1\n"})
    missing = tmp_path / "nowhere" / "ghostpdl.git"
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={missing}", f"mupdf={up}"))
    with caplog.at_level(logging.ERROR, logger="cluster.commits"):
        added = git_poll.poll(home, cfg, queue)
    tip = git(up, "rev-parse", "HEAD")
    assert [s.line() for s in added] == [f"git {tip} mupdf tree=mupdf"]
    assert "tree 'ghostpdl'" in caplog.text and str(missing) in caplog.text
    assert "does not exist" in caplog.text  # git's own message
    assert not git_ledger.repo_files(home, "ghostpdl").clone.exists()


def test_a_repository_that_fails_to_fetch_later_keeps_its_place(tmp_path: Path, caplog) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    git_poll.poll(home, cfg, queue)
    seen = git_ledger.repo_files(home, "ghostpdl").seen.read_text()
    moved = tmp_path / "moved"
    up.rename(moved)
    with caplog.at_level(logging.ERROR, logger="cluster.commits"):
        assert git_poll.poll(home, cfg, queue) == []
    assert "cannot fetch" in caplog.text and str(up) in caplog.text
    assert git_ledger.repo_files(home, "ghostpdl").seen.read_text() == seen
    moved.rename(up)
    new = commit(up, "after the outage", {"base/gs.c": "2\n"})
    assert [s.ref for s in git_poll.poll(home, cfg, queue)] == [new]


# ----------------------------------------------------------------------------------------------
# Hooks

def test_post_commit_hook_queues_the_commit_and_the_poll_does_not_again(tmp_path: Path) -> None:
    work = new_repo(tmp_path / "ghostpdl")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={work}",))
    conf = write_config(tmp_path, home, f"ghostpdl={work}")
    assert commits_cli.main(["install-hook", "--repo", str(work), "--tree", "ghostpdl",
                         "--config", str(conf)]) == 0
    hook = work / ".git" / "hooks" / "post-commit"
    assert os.access(hook, os.X_OK)
    base = git_poll.poll(home, cfg, queue)[0]
    queue.remove(base)
    # A real `git commit`, from another directory, with a PATH that has no project on it.
    (work / "base" / "gs.c").write_text("2\n")
    done = subprocess.run(["git", "-C", str(work), "commit", "-q", "-am", "Fix"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    sha = git(work, "rev-parse", "HEAD")
    assert f"queued: git {sha}" in done.stdout + done.stderr
    assert lines(queue) == [f"git {sha} {ALL} tree=ghostpdl"]
    assert git_poll.poll(home, cfg, queue) == []
    assert lines(queue) == [f"git {sha} {ALL} tree=ghostpdl"]
    # A commit on another branch is not for the cluster.
    git(work, "checkout", "-q", "-b", "topic")
    commit(work, "topic work", {"base/gs.c": "3\n"})
    assert lines(queue) == [f"git {sha} {ALL} tree=ghostpdl"]


def test_post_receive_hook_queues_pushed_commits_oldest_first(tmp_path: Path) -> None:
    seed = new_repo(tmp_path / "seed")
    up = tmp_path / "ghostpdl.git"
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(up))
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(up), str(work))
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    conf = write_config(tmp_path, home, f"ghostpdl={up}")
    assert commits_cli.main(["install-hook", "--repo", str(up), "--tree", "ghostpdl",
                         "--config", str(conf)]) == 0
    assert (up / "hooks" / "post-receive").exists()  # bare: post-receive by default
    queue.remove(git_poll.poll(home, cfg, queue)[0])
    a = commit(work, "one", {"pcl/a.c": "1\n"})
    b = commit(work, "two", {"doc/readme.md": "2\n"})
    c = commit(work, "three", {"base/gs.c": "3\n"})
    done = subprocess.run(["git", "push", "-q", "origin", "master"], cwd=work,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "remote: queued: git" in done.stderr
    # pcl/ sources test the pcl product (path_products' default), base/ the gs products.
    assert lines(queue) == [f"git {a} pcl tree=ghostpdl", f"git {c} {ALL} tree=ghostpdl"]
    assert [line.split()[0] for line in ledger(home, "ghostpdl")][-3:] == [a, b, c]
    assert git_poll.poll(home, cfg, queue) == []
    # Other branches, and deleting them, queue nothing.
    git(work, "checkout", "-q", "-b", "topic")
    commit(work, "topic", {"base/gs.c": "4\n"})
    git(work, "push", "-q", "origin", "topic")
    git(work, "push", "-q", "origin", "--delete", "topic")
    assert len(queue.read()) == 2


def test_concurrent_enqueuers_queue_a_commit_once(tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    queue.remove(git_poll.poll(home, cfg, queue)[0])
    sha = commit(up, "contended", {"base/gs.c": "2\n"})
    conf = write_config(tmp_path, home, f"ghostpdl={up}")
    # Four hook processes, eight threads and a poller at once.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "cluster.commits", "hook", "--config",
                               str(conf), "--tree", "ghostpdl", "--kind", "post-commit",
                               "--git-dir", str(up / ".git")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    barrier = threading.Barrier(9)
    results: list[list[RunSpec]] = []
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            barrier.wait()
            results.append(git_poll.enqueue_commits(home, cfg, "ghostpdl", [sha], up / ".git"))
        except BaseException as exc:  # noqa: BLE001 -- reported by the assert below
            errors.append(exc)

    def poll() -> None:
        barrier.wait()
        results.append(git_poll.poll(home, cfg, queue))

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    threads.append(threading.Thread(target=poll))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    outputs = [p.communicate(timeout=120) for p in procs]
    assert not errors and all(p.returncode == 0 for p in procs), outputs
    queued_by = sum(len(r) for r in results) + sum("queued: git" in out for out, _ in outputs)
    assert queued_by == 1
    assert lines(queue) == [f"git {sha} {ALL} tree=ghostpdl"]
    assert [line for line in ledger(home, "ghostpdl") if line.startswith(sha)] == \
        [f"{sha} queued"]


# ----------------------------------------------------------------------------------------------
# export_commit and commit_info

def listing_of_commit(repo: Path, sha: str) -> dict[str, tuple[str, bytes]]:
    """{path: (git mode, content or link target)} of every file of commit ``sha``."""
    out = {}
    for entry in git(repo, "ls-tree", "-r", "-z", sha).split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            mode, _, blob = meta.split()
            data = subprocess.run(["git", "cat-file", "blob", blob], cwd=repo,
                                  capture_output=True, check=True).stdout
            out[path] = (mode, data)
    return out


def listing_of_dir(root: Path) -> dict[str, tuple[str, bytes]]:
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("120000", os.readlink(path).encode())
        elif path.is_file():
            mode = "100755" if os.access(path, os.X_OK) else "100644"
            out[rel] = (mode, path.read_bytes())
    return out


def test_export_commit_gives_exactly_the_tree_of_that_commit(tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up", {"base/gs.c": "one\n", "gone.txt": "bye\n",
                                    "configure": "#!/bin/sh\n",
                                    ".gitattributes": "secret.txt export-ignore\n",
                                    "secret.txt": "still part of the tree\n"})
    os.chmod(up / "configure", 0o755)
    os.symlink("base/gs.c", up / "link")
    first = commit(up, "modes and links", {})
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    git_poll.poll(home, cfg, queue)  # the clone now knows `first`
    second = commit(up, "change", {"base/gs.c": "two\n", "gone.txt": None, "new.c": "n\n"})
    commit(up, "tip", {"base/gs.c": "three\n"})
    dest = tmp_path / "runs" / "r1" / "source" / "ghostpdl"
    git_export.export_commit(home, cfg, "ghostpdl", second, dest)  # not fetched yet
    assert listing_of_dir(dest) == listing_of_commit(up, second)
    assert (dest / "base" / "gs.c").read_text() == "two\n"  # not the tip
    # Exporting again replaces what is there, leftovers included; nothing is left beside it.
    (dest / "stale.o").write_text("x")
    git_export.export_commit(home, cfg, "ghostpdl", first[:10], dest)
    assert listing_of_dir(dest) == listing_of_commit(up, first)
    assert "secret.txt" in listing_of_dir(dest)  # export-ignore does not apply
    assert sorted(p.name for p in dest.parent.iterdir()) == ["ghostpdl"]


def test_export_clones_when_there_is_no_clone_and_fetches_a_commit_off_the_branches(
        tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, _ = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    dropped = commit(up, "force-pushed away", {"base/gs.c": "2\n"})
    git(up, "reset", "-q", "--hard", "HEAD~1")
    dest = tmp_path / "out"
    git_export.export_commit(home, cfg, "ghostpdl", dropped, dest)  # no clone yet, no branch
    assert (dest / "base" / "gs.c").read_text() == "2\n"
    with pytest.raises(CommitError, match="no such commit"):
        git_export.export_commit(home, cfg, "ghostpdl", "0123456789" * 4, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_commit_info_describes_the_commit(tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, _ = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    sha = commit(up, "Fix the widget.\n\nLonger story.", {"base/gs.c": "2\n", "pcl/p.c": "p\n",
                                                          "doc/readme.md": None})
    info = git_info.commit_info(home, cfg, "ghostpdl", sha[:12])
    assert info.sha == sha and info.author == "Tess Ter <tess@example.org>"
    assert info.subject == "Fix the widget." and info.message.endswith("Longer story.")
    assert info.changed_paths == ("base/gs.c", "doc/readme.md", "pcl/p.c")
    assert info.date[:4].isdigit() and "T" in info.date
    root = git(up, "rev-list", "--max-parents=0", "HEAD")
    assert git_info.commit_info(home, cfg, "ghostpdl", root).changed_paths == \
        ("base/gs.c", "doc/readme.md")


# ----------------------------------------------------------------------------------------------
# Hostile input

@pytest.mark.parametrize("sha", ["--upload-pack=touch pwned", "HEAD", "master", "abc..def",
                                 "1234567; rm -rf /", "12345", "0" * 41, ""])
def test_a_hostile_sha_is_refused(tmp_path: Path, sha: str) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, queue = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    for call in (lambda: git_export.export_commit(home, cfg, "ghostpdl", sha, tmp_path / "d"),
                 lambda: git_info.commit_info(home, cfg, "ghostpdl", sha),
                 lambda: git_poll.enqueue_commits(home, cfg, "ghostpdl", [sha], up / ".git")):
        with pytest.raises(CommitError, match="bad commit .*expected a sha of 7 to 40 hex"):
            call()
    assert queue.read() == [] and not (tmp_path / "d").exists()
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize("tree", ["../evil", "a/b", "-x", "", "queue", "runs", "job.1"])
def test_a_hostile_tree_is_refused(tmp_path: Path, tree: str, capsys) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, _ = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    sha = git(up, "rev-parse", "HEAD")
    with pytest.raises(CommitError, match="bad tree name"):
        git_export.export_commit(home, cfg, tree, sha, tmp_path / "d")
    with pytest.raises(CommitError, match="bad tree name"):
        git_poll.enqueue_commits(home, cfg, tree, [sha], up / ".git")
    conf = write_config(tmp_path, home, f"ghostpdl={up}")
    assert commits_cli.main(["hook", "--config", str(conf), f"--tree={tree}",
                         "--kind", "post-commit", "--git-dir", str(up / ".git")]) == 2
    assert "'tree'" in capsys.readouterr().err
    assert not (home.root / "repos").exists()


def test_an_unconfigured_tree_and_a_bad_push_line_are_refused(tmp_path: Path) -> None:
    up = new_repo(tmp_path / "up")
    home, cfg, _ = setup(tmp_path, repositories=(f"ghostpdl={up}",))
    sha = git(up, "rev-parse", "HEAD")
    with pytest.raises(CommitError, match="not a configured repository"):
        git_poll.enqueue_commits(home, cfg, "mupdf", [sha], up / ".git")
    with pytest.raises(CommitError, match="bad post-receive line"):
        git_hook.hook_commits(up / ".git", "master", "post-receive",
                             ["--upload-pack=x HEAD refs/heads/master"], "ghostpdl")
    assert git_hook.hook_commits(up / ".git", "master", "post-receive",
                                [f"{'0' * 40} {sha} refs/heads/master",
                                 f"{'0' * 40} {sha} refs/heads/other"]) == [sha]


def test_install_hook_leaves_a_foreign_hook_alone(tmp_path: Path, capsys) -> None:
    up = new_repo(tmp_path / "up")
    home, _, _ = setup(tmp_path)
    conf = write_config(tmp_path, home, f"ghostpdl={up}")
    theirs = up / ".git" / "hooks" / "post-commit"
    theirs.write_text("#!/bin/sh\necho mine\n")
    argv = ["install-hook", "--repo", str(up), "--tree", "ghostpdl", "--config", str(conf)]
    assert commits_cli.main(argv) == 1
    assert "is not ours" in capsys.readouterr().err
    assert theirs.read_text() == "#!/bin/sh\necho mine\n"
    assert commits_cli.main([*argv, "--force"]) == 0
    assert git_hook.HOOK_MARKER in theirs.read_text()
    assert commits_cli.main(argv) == 0  # ours now: reinstalling is fine
    assert commits_cli.main(["install-hook", "--repo", str(up), "--tree", "mupdf",
                         "--config", str(conf)]) == 1  # not a configured repository
