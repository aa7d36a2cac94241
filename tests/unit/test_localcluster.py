"""LocalCluster: extra environment variables for one node's processes; the port rules; the ssh
transport's node settings; the wrap hook; stop() and PID files it does not own."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from cluster.config import Config
from cluster.errors import LocalClusterError
from cluster.localcluster import LocalCluster
from cluster.localports import cluster_ports
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import proc as runtime_proc
from cluster.runtime.clock import FakeClock
from cluster.runtime.ports import free_port
from tests.helpers import wait_for


class FakePopen:
    """Records how LocalCluster would start a process, starts nothing."""

    calls: list[tuple[list[str], dict[str, Any]]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        FakePopen.calls.append((argv, kwargs))
        self.pid = 4242


def spawned(script: str, name: str = "") -> dict[str, Any]:
    for argv, kwargs in FakePopen.calls:
        if argv[1].endswith(script) and (not name or f"node_name={name}" in argv):
            return kwargs
    raise AssertionError(f"{script} {name} was not started")


def _cluster(home: Path, nodes: int) -> LocalCluster:
    """A LocalCluster on free ports with a minimal cluster.conf (start() checks the ports)."""
    cluster = LocalCluster(home, nodes=nodes, overrides={"base_port": str(free_port(5)),
                                                         "monitor_port": str(free_port()),
                                                         "status_port": str(free_port())})
    cluster.home.create()
    cluster.conf_path.write_text("[master]\nhome = .\n", encoding="utf-8")
    return cluster


def test_node_env_reaches_only_that_node(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    cluster = _cluster(tmp_path / "home", 2)
    cluster.start({"node2": {"CLUSTER_SLOWDOWN": "5"}})
    assert len(FakePopen.calls) == 5  # monitor, supervisor, status, node1, node2
    env = spawned("clusterpull.py", "node2")["env"]
    assert env["CLUSTER_SLOWDOWN"] == "5" and env["PATH"] == os.environ["PATH"]
    # Everything else inherits the environment unchanged, but for the parent watch's
    # variable (each is watched, and watches what it starts: cluster.runtime.proc).
    inherited = {**os.environ, runtime_proc.PARENT_WATCH_ENV: "1"}
    assert spawned("clusterpull.py", "node1")["env"] == inherited
    assert spawned("monitor_port.py")["env"] == inherited
    assert spawned("run_clustermaster.py")["env"] == inherited
    assert env[runtime_proc.PARENT_WATCH_ENV] == "1"
    assert all(kwargs["preexec_fn"] is not None for _, kwargs in FakePopen.calls)


def test_start_node_takes_env_and_overrides(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("CLUSTER_SLOWDOWN", "1")
    cluster = _cluster(tmp_path / "home", 0)
    proc = cluster.start_node("node9", env={"CLUSTER_SLOWDOWN": "3"})
    assert cluster.node_procs["node9"] is proc
    assert spawned("clusterpull.py", "node9")["env"]["CLUSTER_SLOWDOWN"] == "3"
    cluster.start_node("node10")
    assert spawned("clusterpull.py", "node10")["env"] == {
        **os.environ, runtime_proc.PARENT_WATCH_ENV: "1"}


def test_cluster_ports_names_each_role() -> None:
    ports = cluster_ports(Config(base_port=9100, monitor_port=9110))
    assert sorted(ports) == [9100, 9101, 9102, 9103, 9104, 9110]
    assert "priority 2" in ports[9102] and "monitor" in ports[9110]
    assert "priority 0 (lane 4)" in ports[9104]
    assert sorted(cluster_ports(Config(base_port=9100, monitor_port=9110, user_lanes=1))) == [
        9100, 9101, 9102, 9110]


def test_a_port_shared_by_two_roles_is_refused() -> None:
    with pytest.raises(LocalClusterError, match=r"port 9101 is both the clustermaster of "
                                                r"priority 1.*and the monitor"):
        cluster_ports(Config(base_port=9100, monitor_port=9101))


class OfferedPorts:
    """Stands in for the socket module's sockets: bind to port 0 gets the next port of
    ``offers`` (as the kernel picks one), bind to a named port always succeeds."""

    def __init__(self, offers: list[int]) -> None:
        self.offers = offers

    def socket(self) -> OfferedPorts._Socket:
        return self._Socket(self)

    class _Socket:
        def __init__(self, owner: OfferedPorts) -> None:
            self.owner, self.port = owner, 0

        def bind(self, address: tuple[str, int]) -> None:
            self.port = address[1] or self.owner.offers.pop(0)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

        def close(self) -> None:
            pass

        def __enter__(self) -> OfferedPorts._Socket:
            return self

        def __exit__(self, *exc: object) -> None:
            pass


def test_free_port_never_hands_out_a_port_twice_even_when_the_kernel_offers_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The CI failure this guards: free_port(5) gave base_port 47373, and a later
    # free_port() for the status page was offered 47375 (base_port + 2, free since
    # nothing had bound it yet), so localcluster refused the configuration.
    from cluster.runtime import ports

    monkeypatch.delenv(ports.PORTS_ENV, raising=False)  # the kernel's offers

    offers = OfferedPorts([47373, 47375, 47374, 47390, 47373, 47391])
    monkeypatch.setattr(ports, "socket", offers)
    monkeypatch.setattr(ports, "_HANDED_OUT", ports.deque(maxlen=4096))
    assert free_port(5) == 47373
    assert free_port() == 47390  # 47375 and 47374 are in the range handed out first
    assert free_port() == 47391  # and 47373 is its base
    assert offers.offers == []


def test_free_port_in_a_range_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CLUSTER_FREE_PORTS (each parallel test worker has one), ports come from that
    range only, still free and never handed out twice; a malformed range is refused."""
    from cluster.runtime import ports

    monkeypatch.setenv(ports.PORTS_ENV, "21000-21040")
    bases = [free_port(5) for _ in range(5)]
    picked = [p for b in bases for p in range(b, b + 3)]
    assert all(21000 <= p < 21040 for p in picked) and len(set(picked)) == 15
    for bad in ("21000", "9-80", "30000-20000", "a-b"):
        monkeypatch.setenv(ports.PORTS_ENV, bad)
        with pytest.raises(ValueError, match="CLUSTER_FREE_PORTS"):
            free_port()


def test_free_port_ranges_of_one_process_are_disjoint_on_real_sockets() -> None:
    taken: set[int] = set()
    for count in [3, 1, 1] * 30:
        base = free_port(count)
        ports = set(range(base, base + count))
        assert not ports & taken, (base, count)
        taken |= ports


def test_a_private_slurm_takes_its_ports_from_the_workers_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmctld's and slurmd's ports come from free_ports, so in the suite from the
    worker's own range, not from the kernel's ephemeral one (where another test's connect()
    may take a port between its pick and slurmctld's bind: a CI failure)."""
    from cluster.provision import slurmhost
    from cluster.runtime import ports

    monkeypatch.setenv(ports.PORTS_ENV, "22000-22040")
    picked = ports.free_ports(6)
    assert len(set(picked)) == 6 and all(22000 <= p < 22040 for p in picked)
    assert slurmhost.free_ports is ports.free_ports


class FakeSshd:
    """Stands in for a started PrivateSshd: the attributes the node settings are made of."""

    def __init__(self, root: Path) -> None:
        self.address, self.port = "127.0.0.1", 40022
        self.client_key, self.known_hosts = root / "client_key", root / "known_hosts"
        self.host_fingerprint = "SHA256:test"
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


def _setting(argv: list[str], key: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{key}=")]
    assert values, f"{key} not set in {argv}"
    return values[-1]  # the last --set wins


def test_transport_ssh_nodes_get_the_sshd_settings_and_stop_stops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    cluster = _cluster(tmp_path / "home", 2)
    cluster.transport = "ssh"
    sshd = FakeSshd(cluster.home_dir / "ssh")
    cluster.sshd = sshd  # type: ignore[assignment]  # started elsewhere: start() keeps it
    cluster.start()
    assert len(FakePopen.calls) == 5
    for name in ("node1", "node2"):
        argv = next(a for a, _ in FakePopen.calls if f"node_name={name}" in a)
        assert _setting(argv, "transport") == "ssh"
        assert _setting(argv, "master_home") == str(cluster.home_dir)  # absolute, for ssh
        assert _setting(argv, "ssh_port") == "40022"
        assert _setting(argv, "ssh_key") == str(sshd.client_key)
        assert _setting(argv, "ssh_known_hosts") == str(sshd.known_hosts)
        assert _setting(argv, "master_host") == "127.0.0.1"
        assert _setting(argv, "work_dir") == str(cluster.home_dir / "node-work" / name)
    monitor = next(a for a, _ in FakePopen.calls if a[1].endswith("monitor_port.py"))
    assert not any(a.startswith("transport=") for a in monitor)  # the master is unchanged
    cluster.procs.clear()  # nothing real was started
    cluster.stop(grace=0)
    assert sshd.stopped == 1 and cluster.sshd is None


def test_transport_local_is_the_default_and_sets_no_ssh_keys(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "home", 1)
    assert cluster.transport == "local"
    assert cluster.node_settings("node1") == {
        "node_name": "node1", "work_dir": str(cluster.home_dir / "node-work" / "node1")}


def test_transport_ssh_without_its_sshd_and_an_unknown_transport_are_refused(
        tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "home", transport="ssh")
    with pytest.raises(LocalClusterError, match="private sshd is not started"):
        cluster.node_settings("node1")
    with pytest.raises(LocalClusterError, match=r"transport 'scp': expected one of local, ssh"):
        LocalCluster(tmp_path / "home", transport="scp")


def test_wrap_rewrites_every_command_line_with_its_role(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    roles: list[str] = []

    def wrap(role: str, argv: list[str]) -> list[str]:
        roles.append(role)
        return ["ip", "netns", "exec", f"ns-{role}", *argv]

    cluster = _cluster(tmp_path / "home", 1)
    cluster.wrap = wrap
    cluster.start()
    assert roles == ["monitor", "supervisor", "status", "node1"]
    assert [a[:4] for a, _ in FakePopen.calls] == [
        ["ip", "netns", "exec", f"ns-{r}"] for r in roles]
    assert FakePopen.calls[0][0][5].endswith("monitor_port.py")


def test_stop_kills_a_pid_file_s_process_only_if_it_is_this_cluster_s(tmp_path: Path) -> None:
    """A PID file left behind may name a pid since given to another process: stop() must
    leave that process alone, and still kill a clustermaster of its own."""
    cluster = _cluster(tmp_path / "home", 0)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "--config", str(cluster.conf_path)])
    try:
        # A clustermaster writes its PID file once it runs.  Popen returns as soon as the
        # exec has begun, and for a moment after that /proc shows an empty command line:
        # wait until both have their own, as a clustermaster writing its file would.
        for child in (stranger, ours):
            wait_for(lambda c=child: psutil.Process(c.pid).cmdline() != [], 10,
                     f"process {child.pid}'s command line")
        cluster.home.pid_file(0).write_text(f"{stranger.pid}\n")
        cluster.home.pid_file(1).write_text(f"{ours.pid}\n")
        cluster.stop(grace=0)
        assert ours.wait(timeout=10) == -9
        assert stranger.poll() is None
    finally:
        for child in (stranger, ours):
            child.kill()
            child.wait(timeout=10)


class ArchivingClock(FakeClock):
    """Runs the master's end of a run at fake time ``at``: the archive folder with its
    report and run.info appears, then, ``dequeue_after`` later, the run leaves its queue,
    and ``end_after`` after that its working folder goes (the master's last end step)."""

    def __init__(self, cluster: LocalCluster, spec: RunSpec, at: float,
                 dequeue_after: float, end_after: float = 0.0) -> None:
        super().__init__()
        self.cluster, self.spec, self.at, self.dequeue_after = cluster, spec, at, dequeue_after
        self.end_after = end_after
        self.archived_at: float | None = None
        self.dequeued_at: float | None = None
        self.ended_at: float | None = None
        # The run's working folder, which the master removes as its last end step.
        cluster.home.run_dir("20261126120000-p0-abcd").mkdir(parents=True, exist_ok=True)

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        now = self.monotonic()
        start = self.cluster.home.job_start(0)
        if now >= self.at - 0.5 and start.exists():
            start.unlink()  # the master begins the run's end: nodes learn it is over
        if self.archived_at is None and now >= self.at:
            folder = self.cluster.home.archive / "20261126120000-p0-abcd"
            folder.mkdir(parents=True)
            (folder / "report.txt").write_text("report\n")
            (folder / "run.info").write_text(f"queue {self.spec.line()}\noutcome done\n")
            self.archived_at = now
        elif self.archived_at is not None and self.dequeued_at is None and \
                now >= self.archived_at + self.dequeue_after:
            queue = QueueFile(self.cluster.home.queue(0), self.cluster.home.queue_lock(0))
            queue.remove(self.spec)
            self.dequeued_at = now
        elif self.dequeued_at is not None and self.ended_at is None and \
                now >= self.dequeued_at + self.end_after:
            shutil.rmtree(self.cluster.home.run_dir("20261126120000-p0-abcd"))
            self.ended_at = now


def test_wait_for_run_sees_the_end_of_a_run_within_a_hundredth_of_a_second(
        tmp_path: Path) -> None:
    """localcluster.py's exit waits on these looks: each comes at most _END_LOOK after the
    last (the archive, then the queue), not 0.05 s."""
    cluster = _cluster(tmp_path / "home", 1)
    spec = RunSpec.parse("user local gs", source="test")
    QueueFile(cluster.home.queue(0), cluster.home.queue_lock(0)).append(spec)
    for dequeue_after in (0.0, 0.5):
        clock = ArchivingClock(cluster, spec, at=1.0, dequeue_after=dequeue_after)
        cluster.clock = clock
        folder = cluster.wait_for_run(spec, set(), timeout=60)
        assert folder.name == "20261126120000-p0-abcd"
        assert clock.archived_at is not None and clock.dequeued_at is not None
        assert clock.ended_at is not None
        assert clock.monotonic() - clock.ended_at <= 0.01 + 1e-9
        assert max(clock.sleeps) <= 0.01 + 1e-9
        shutil.rmtree(folder)
        QueueFile(cluster.home.queue(0), cluster.home.queue_lock(0)).append(spec)


def test_wait_for_run_returns_only_after_the_masters_last_end_step(tmp_path: Path) -> None:
    """The archive is there and the run dequeued, but the master still removes the run's
    working folder: localcluster.py's stop must not cut that short, so the wait returns
    only once the folder is gone."""
    cluster = _cluster(tmp_path / "home", 1)
    spec = RunSpec.parse("user local gs", source="test")
    QueueFile(cluster.home.queue(0), cluster.home.queue_lock(0)).append(spec)
    clock = ArchivingClock(cluster, spec, at=1.0, dequeue_after=0.0, end_after=0.3)
    cluster.clock = clock
    cluster.wait_for_run(spec, set(), timeout=60)
    assert clock.dequeued_at is not None and clock.ended_at is not None
    assert clock.ended_at - clock.dequeued_at >= 0.3 - 1e-9
    assert 0 <= clock.monotonic() - clock.ended_at <= 0.01 + 1e-9


def test_wait_for_run_looks_seldom_while_the_run_is_served(tmp_path: Path) -> None:
    """While the run's job.start is there the looks are _POLL apart (each takes CPU from
    the jobs); once the master has begun the run's end, _END_LOOK apart."""
    cluster = _cluster(tmp_path / "home", 1)
    spec = RunSpec.parse("user local gs", source="test")
    cluster.home.job_start(0).write_text("id 20261126120000-p0-abcd\n")
    clock = ArchivingClock(cluster, spec, at=3.0, dequeue_after=0.0)
    cluster.clock = clock
    cluster.wait_for_run(spec, set(), timeout=60)
    served = [s for s, t in zip(clock.sleeps, itertools.accumulate(clock.sleeps), strict=True)
              if t <= 2.5 - 1e-9]
    assert served and set(served) == {0.05}
    assert 0.01 in clock.sleeps[len(served):]
    assert clock.ended_at is not None and clock.monotonic() - clock.ended_at <= 0.01 + 1e-9


def test_wait_for_run_lists_the_archive_again_though_its_mtime_stayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run folder that came into the archive within the same tick of the file system's
    clock as the last listing (its mtime unchanged) is still seen, within _RELIST."""
    cluster = _cluster(tmp_path / "home", 1)
    spec = RunSpec.parse("user local gs", source="test")
    monkeypatch.setattr(cluster, "_archive_mtime", lambda: 12345)  # never moves
    clock = ArchivingClock(cluster, spec, at=1.0, dequeue_after=0.0)
    cluster.clock = clock
    folder = cluster.wait_for_run(spec, set(), timeout=60)
    assert folder.name == "20261126120000-p0-abcd"
    assert clock.archived_at is not None
    assert clock.monotonic() - clock.archived_at <= 1.0 + 1e-9


@pytest.mark.parametrize("argv, expected", [
    (["/usr/bin/python3", "/r/clustermaster.py", "--config", "c"], 0),
    (["/usr/bin/python3", "/r/clustermaster2.py", "--home", "h"], 2),
    (["python3", "/r/clustermaster.py", "--priority", "1"], 1),
    (["python3", "/r/clustermaster.py", "--home", "h", "--lane", "4"], 4),
    (["python3", "/r/run_clustermaster.py", "--kill-children"], None),
    (["python3", "/r/clusterpull.py", "--set", "node_name=clustermaster1.py"], None),
    ([], None),
])
def test_master_lane_names_the_supervisor_s_clustermasters(
        argv: list[str], expected: int | None) -> None:
    """Which of the supervisor's children are clustermasters, and of which lane: what
    wait_for_run and stop wait for (docs/architecture.md, "Stopping")."""
    from cluster.localprocs import master_lane

    assert master_lane(argv) == expected
