"""The ssh transport is patient through a bad spell of the link, and bounded (docs/protocol.md,
"A blink of the link"): against a real sshd on loopback behind a proxy that, for a few
seconds, cuts every session every 0.3 s and slows what the server sends
(:meth:`tests.sshcut.CuttingProxy.blink`), so that no call lives from one cut to the next.

* a listing tried during the spell is tried again, after pauses of 0.2, 0.5, 1, 2, 5 s, on
  new connections until the spell is over: the plan is the whole tree (3 tries without
  a pause, as before, were all cut);
* a whole NodeRun whose sessions are cut so from its start takes part in its run: it
  builds, its results arrive, none failed (before: its BUILD's fetch failed, failure 1,
  and the master dropped it);
* a spell longer than ``ssh_retry_time``: the call gives up, as MasterUnreachable naming
  the setting, once that time is spent, not later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE
from cluster.errors import MasterUnreachable
from cluster.node.noderun import NodeRun
from cluster.node.sshtransport import SshTransport
from cluster.runtime.sshd import PrivateSshd
from tests.component.test_node_run import ScriptedMaster, script_once, write_start
from tests.component.test_ssh_blinks import _corpus, _target, _tree
from tests.sshcut import CuttingProxy

#: How long the bad spell lasts [seconds]: longer than 3 tries without a pause take, shorter
#: than the first four pauses (0.2 + 0.5 + 1 + 2 s) with the cut tries between them.
SPELL = 3.0


def test_a_listing_outlasts_a_bad_spell_of_the_link(tmp_path: Path) -> None:
    home = tmp_path / "home"
    digests = _corpus(home / "tests")
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, []) as proxy:
        transport = SshTransport(_target(server, proxy, tmp_path), str(home),
                                 connect_retries=10, connect_retry_delay=0.05, io_timeout=20)
        try:
            spell = proxy.blink(SPELL)
            plan = transport.plan("tests")
            ended = time.monotonic()
        finally:
            transport.close()
        blinked = len(proxy.blinked())
        tries = len(proxy.connections)
    assert plan.files == len(digests) and plan.skipped == [] and plan.excluded == []
    assert ended > spell.start + SPELL  # the listing that went through came after the spell
    # Sessions cut (at their login, or in the listing), and more connections than 3 tries
    # of old made.
    assert blinked >= 3 and tries > 3, (blinked, tries)


def test_a_node_run_takes_part_through_a_bad_spell_of_the_link(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    """run.py's engine whose ssh sessions are cut every 0.3 s, and slowed, for its first
    3 s (its reads of job.start and its key, its BUILD's listing and rsync): it builds, runs
    its jobs and every result arrives at the master, none failed; its corpus is exact."""
    home = tmp_path / "home"
    digests = _corpus(home / "tests")
    (home / "src").mkdir()
    (home / "src" / "Makefile").write_text("all:\n\tmkdir -p bin\n")
    write_start(home)
    master = ScriptedMaster(script_once("echo one", "echo two"))
    port = serve(master)
    cfg = Config(base_port=port, node_name="n1", work_dir=tmp_path / "work", slots=2,
                 poll_interval=0.2, report_interval=0.05, connect_retry_delay=0.05,
                 connect_retries=10, io_timeout=20)
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, []) as proxy:
        transport = SshTransport(_target(server, proxy, tmp_path), str(home),
                                 connect_retries=cfg.connect_retries,
                                 connect_retry_delay=cfg.connect_retry_delay, io_timeout=20)
        run = NodeRun(cfg, transport, 0, "tools=md5sum")
        try:
            proxy.blink(SPELL)
            assert run.run() == NODE_EXIT_DONE
        finally:
            transport.close()
        blinked = len(proxy.blinked())
    assert blinked >= 3, blinked
    assert all(r.failure == 0 for r in master.seen), [r.failure_reason for r in master.seen]
    names = [res.name for r in master.seen for res in r.results]
    assert sorted(names) == ["t0.ps.ppmraw.72.0", "t1.ps.ppmraw.72.0"]
    assert _tree(tmp_path / "work" / "tests") == digests


def test_a_spell_longer_than_ssh_retry_time_gives_up_within_it(tmp_path: Path) -> None:
    """ssh_retry_time 1.5 s, a spell of 20 s: the listing gives up as MasterUnreachable
    naming ssh_retry_time, once its tries have spent the 1.5 s (pauses 0.2 and 0.5 s, then
    1 s would pass it), long before the spell ends."""
    home = tmp_path / "home"
    _corpus(home / "tests")
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, []) as proxy:
        transport = SshTransport(_target(server, proxy, tmp_path), str(home),
                                 connect_retries=10, connect_retry_delay=0.05, io_timeout=20,
                                 retry_time=1.5)
        try:
            spell = proxy.blink(20.0)
            with pytest.raises(MasterUnreachable) as gave_up:
                transport.plan("tests")
            gave_up_at = time.monotonic()
        finally:
            transport.close()
    text = str(gave_up.value)
    assert "ssh_retry_time 1.5 s" in text, text  # whether a login or a call was cut last
    # A try under way when the time is spent ends at the next cut (0.3 s), or a login
    # cut's short connect retries; never the spell's 20 s.
    assert gave_up_at - spell.start < 10, gave_up_at - spell.start
