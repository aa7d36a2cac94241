"""run.py's engine (NodeRun) with the ssh transport against a real sshd on loopback: a
whole run (job.start, BUILD fetches by rsync, jobs, log uploads by SFTP) over one reused
connection, and a master whose sshd goes away mid-run reported as failure 1, not -1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE, NODE_EXIT_FAILED
from cluster.node.noderun import NodeRun
from cluster.node.sshtransport import SshTransport
from cluster.runtime import ssh
from cluster.runtime.sshd import PrivateSshd
from cluster.wire import protocol
from cluster.wire.protocol import Request
from tests.component.test_node_run import (
    RUN,
    ScriptedMaster,
    make_node_home,
    script_once,
    write_start,
)


def _node(home: Path, tmp_path: Path, port: int, server: PrivateSshd,
          retries: int = 3) -> tuple[NodeRun, SshTransport]:
    cfg = Config(base_port=port, node_name="n1", work_dir=tmp_path / "work", slots=2,
                 poll_interval=0.2, report_interval=0.05, connect_retry_delay=0.1,
                 connect_retries=retries, io_timeout=20)
    target = ssh.SshTarget(server.address, server.port, server.user, str(server.client_key),
                           server.known_hosts)
    transport = SshTransport(target, str(home), connect_retries=retries,
                             connect_retry_delay=0.1, io_timeout=20)
    return NodeRun(cfg, transport, 0, "tools=md5sum"), transport


def test_a_run_over_ssh(tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    """BUILD fetches the corpus and the source by rsync, the jobs run, the build log and
    the job logs reach the master home through SFTP; one ssh connection serves it all."""
    home = make_node_home(tmp_path)
    write_start(home)
    inner = script_once("echo one", "echo two")
    uploaded = {"asked": False}

    def script(req: Request, seen: list[Request]) -> bytes:
        reply = inner(req, seen)
        if b"run complete" in reply and not uploaded["asked"]:
            uploaded["asked"] = True  # every result is in: the logs, then the end
            return protocol.format_reply(protocol.Reply(protocol.UPLOAD))
        return reply
    master = ScriptedMaster(script)
    port = serve(master)
    with PrivateSshd(tmp_path / "sshd") as server:
        run, transport = _node(home, tmp_path, port, server)
        try:
            assert run.run() == NODE_EXIT_DONE
        finally:
            transport.close()
    assert sum(len(r.results) for r in master.seen) == 2
    assert all(r.failure == 0 for r in master.seen)
    assert transport.connects == 1
    assert transport.last_fetch_stats is not None
    work = tmp_path / "work"
    assert (work / "tests" / "t" / "f.ps").read_text() == "showpage\n"
    assert (work / "src" / "src" / "Makefile").is_file()
    logs = home / "runs" / RUN / "logs"
    assert "building src" in (logs / "n1.build.log").read_text()
    assert (logs / "n1.log").is_file()
    assert not [p for p in logs.iterdir() if p.name.endswith(".tmp")]


def test_a_master_gone_mid_run_is_failure_1(tmp_path: Path,
                                             serve: Callable[[ScriptedMaster], int]) -> None:
    """The master's sshd stops after job.start was read: the BUILD's fetch cannot reach it,
    and the node reports failure 1 (network) naming the master, never -1."""
    home = make_node_home(tmp_path)
    write_start(home)
    server = PrivateSshd(tmp_path / "sshd").start()
    inner = script_once("true")

    def script(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            server.stop()  # before the node hears BUILD: its fetch finds no master
        return inner(req, seen)
    master = ScriptedMaster(script)
    port = serve(master)
    run, transport = _node(home, tmp_path, port, server)
    try:
        assert run.run() == NODE_EXIT_FAILED
    finally:
        server.stop()
        transport.close()
    failing = [r for r in master.seen if r.failure]
    assert failing, [r.status for r in master.seen]
    assert failing[0].failure == protocol.FAILURE_NETWORK == 1
    reason = failing[0].failure_reason
    assert reason.startswith("fetch failed: fetch tests: "), reason
    assert f"127.0.0.1:{server.port}" in reason
