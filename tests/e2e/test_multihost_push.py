"""clusterpush from a developer's machine: a third namespace that cannot see the master home.

The developer has an account on the master (her own key, authorised in the master's sshd)
and the master's host key in her known_hosts; ``clusterpush.py --master`` mirrors her tree
with rsync over ssh and writes the dropping over ssh.  The run it queues is reported as
a local push's is: against the baseline, and against her previous push.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.helpers import REPO, command
from tests.multihost import (
    RUN_TIMEOUT,
    MakeMultiHost,
    MultiHost,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
)

pytestmark = pytest.mark.e2e


def table_of(archive: Path) -> dict[str, str]:
    return {n: r.md5 for n, r in read_tab(archive / f"{archive.name}.tab").items()}


def section(text: str, title: str) -> list[str]:
    """The test names listed under the first ``title`` line (up to the blank line)."""
    body = text.split(title + "\n", 1)[1].split("\n\n", 1)[0]
    return sorted(line.split()[0] for line in body.splitlines())


def shown(names: list[str]) -> list[str]:
    return sorted(n.replace("__", "/") for n in names)


def developer(mh: MultiHost, root: Path) -> tuple[Path, Path]:
    """The developer's own key (authorised on the master) and known_hosts, in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@dev",
                    "-f", str(key)], check=True, timeout=60)
    mh.sshd.authorize(key.with_suffix(".pub"))
    known = root / "known_hosts"
    known.write_text(mh.sshd.known_hosts.read_text())
    return key, known


def remote_push(mh: MultiHost, key: Path, known: Path, tree: Path, *words: str) -> str:
    """clusterpush --master (the PATH command) from the "dev" namespace (master home
    hidden), in ``tree``."""
    argv = [*command("clusterpush"), "--master",
            f"{mh.sshd.user}@{mh.sshd.address}:{mh.home_dir}", "--ssh-key", str(key),
            "--known-hosts", str(known), "--master-python", sys.executable,
            "--user", "alice", *words]
    done = mh.topo.hosts["dev"].run(argv, timeout=180, hide=[mh.master_root], cwd=tree)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.decode()


def test_clusterpush_from_a_third_machine_queues_a_run_reported_against_baseline_and_push(
        make_multihost: MakeMultiHost, tmp_path: Path) -> None:
    mh = make_multihost(roles=("node1", "dev"), gs_configs="ppmraw.72.0")
    cluster = mh.cluster
    write_demo_tree(mh.home_dir / "ghostpdl", "gs", [])  # the master's clean tree
    jobdef = mh.home_dir / "auto" / "nightly" / "plain" / "jobdef.txt"
    jobdef.parent.mkdir(parents=True)
    jobdef.write_text("gs\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--config",
                           str(cluster.conf_path), "nightly"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    mh.start_master()
    mh.start_node("node1")
    baseline = table_of(cluster.wait_for_run(RunSpec.parse("auto nightly-plain gs"), set(),
                                             RUN_TIMEOUT, priority=2))
    assert len(baseline) == 15
    key, known = developer(mh, tmp_path / "dev")

    def push(options: list[str]) -> Path:
        tree = write_demo_tree(tmp_path / "dev" / "ghostpdl", "gs", options)
        subprocess.run(["make"], cwd=tree, check=True, capture_output=True, timeout=120)
        before = cluster.archives()
        printed = remote_push(mh, key, known, tree, "gs")
        queued = [line for line in printed.splitlines() if line.startswith("queueing: ")]
        assert len(queued) == 1, printed
        spec = RunSpec.parse(queued[0].removeprefix("queueing: "))
        assert "changed file(s)" in printed  # what rsync moved, said by clusterpush
        assert spec.ref == "alice"
        pushed = mh.home_dir / "users" / "alice" / "ghostpdl"
        assert (pushed / "options").read_text() == "".join(o + "\n" for o in options)
        assert not (pushed / "bin").exists()  # build outputs do not travel
        return cluster.wait_for_run(spec, before, RUN_TIMEOUT)

    first = push(["-dTextAlphaBits=4"])
    text1 = (first / "report.txt").read_text()
    after1 = table_of(first)
    changed1 = sorted(n for n in after1 if after1[n] != baseline[n])
    assert changed1 and len(changed1) < 15
    assert section(text1, f"Differences in {len(changed1)} of 15 non-pdfwrite/ps2write "
                          "test(s):") == shown(changed1)
    assert "No previous clusterpush to compare with" in text1
    assert "+-dTextAlphaBits=4" in text1.split("Source differences from trunk", 1)[1]

    second = push(["-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"])
    text2 = (second / "report.txt").read_text()
    after2 = table_of(second)
    vs_base = sorted(n for n in after2 if after2[n] != baseline[n])
    vs_push = sorted(n for n in after2 if after2[n] != after1[n])
    assert vs_push and vs_push != vs_base
    against_base, against_push = text2.split("Differences from previous clusterpush:", 1)
    assert section(against_base, f"Differences in {len(vs_base)} of 15 "
                                 "non-pdfwrite/ps2write test(s):") == shown(vs_base)
    assert section(against_push, f"Differences in {len(vs_push)} of 15 "
                                 "non-pdfwrite/ps2write test(s):") == shown(vs_push)
    # The developer's session came over ssh with her own key, from her own address.
    assert "Accepted publickey for root from 10.231.2.2" in mh.sshd.log_path.read_text()
