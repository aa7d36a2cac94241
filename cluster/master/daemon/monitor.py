"""The heartbeat listener: port of monitorPort.pl (seed 000).

Seed 000: monitorPort "does the usual 'if I am not the only one, then exit' dance", then
listens; for each connection it receives the machine name, a file suffix and some file
contents, and answers whether a job waits.  "The remote nodes use this to send a heartbeat
(and status) to the server, and to be informed when they have a new job to begin."

The wire format is :mod:`cluster.wire.heartbeat` (one connection per heartbeat: ``node``,
``status``, ``caps`` headers and ``OK``; the answer lists the waiting runs, then ``END``).
This module is the master's side: the server.  The heartbeat records in the home are
:mod:`cluster.master.files.nodefiles`, the runs an answer offers
:mod:`cluster.master.daemon.offers`.

Deviations from the seed, and why:

* port ``monitor_port`` (default 9010), not 9001, which is priority 1's clustermaster port;
* the "file suffix + contents" pair of the Perl became the named ``status``/``caps`` headers,
  the only two files the seed says a node sends this way;
* the answer lists the waiting runs instead of a bare 1/0, so a node knows which priority to
  join; ``heartbeat.py`` still turns it into the seed's exit code (non-zero = a job waits).

* a disabled node (``nodes/<name>.down``, clusteradmin's ``node disable``; the Perl's
  ``$m.down``) is answered with no run, held or not, so its clusterpull starts no run.py;
  its heartbeat is still recorded (it is not down, only disabled);
* the answer may be held (long-poll): a heartbeat with ``wait <seconds>`` is
  recorded at once and answered as soon as a run waits that it does not ``skip``, or when
  the wait ends, so an idle node learns of a new run within :data:`HOLD_POLL` seconds
  instead of at its next heartbeat.

The server is one thread over non-blocking sockets (like the master's
:class:`~cluster.master.serve.server.NodeServer`), not a thread per connection: a silent or held
client costs a socket and a small buffer, so hundreds of silent sockets cannot crowd out
honest heartbeats (64 of them once made the thread-capped monitor refuse 29 of 32).
Its bounds: :data:`DEADLINE` to deliver a request, ``MAX_LINE``/``MAX_LINES`` of
:mod:`cluster.wire.heartbeat` per request, :data:`MAX_BUFFERED` bytes of unfinished requests
over all connections, and as many connections as the open-file limit allows (at most
:data:`~cluster.runtime.peers.MAX_CONNECTIONS`), of which one host may hold a quarter
(:func:`~cluster.runtime.peers.per_peer_limit`; about 11,000 sockets of one stranger
once got 16 of 35 honest heartbeats answered "busy").  Refusals are logged through a
:class:`~cluster.runtime.peers.RefusalLog`: a few lines per host in full, then one summary
line per burst, at most a few lines a second in all (a stranger looping
connections once wrote 34,150 lines in 25 s).

Signed heartbeats (docs/protocol.md, "Signed messages"): each node signs with the heartbeat
key derived from its own key, ``node-keys/<name>.key`` (:mod:`cluster.master.files.keycache`), so
no node can heartbeat in another's name.  A heartbeat is verified before anything in it is
parsed or recorded: an unsigned, wrongly signed or replayed one, or one from a name the
master holds no key for, is answered ``ERROR <reason>`` (unsigned), logged once naming the
peer and the node it claimed, and nothing is written in ``nodes/``.  The replay guard is
saved in ``heartbeat.nonces`` (at most every :data:`GUARD_SAVE_INTERVAL` seconds when it
changed, and when the monitor stops) and loaded at start: a heartbeat recorded before a
restart is still refused.  Every
answer to a verified heartbeat ends with the ``sig`` line of its request's nonce
(:mod:`cluster.wire.signing`).

The single-instance "dance" is an ``fcntl.flock`` on ``home/monitor_port.lock``
(:func:`acquire_lock`); :func:`run` is the whole daemon.  A port already taken by another
program ends it at once with :data:`cluster.defaults.EXIT_PORT_TAKEN` and a message naming
the address.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
from collections.abc import Callable
from pathlib import Path

from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.errors import AlreadyRunning, ClusterError, ProtocolError
from cluster.home import Home
from cluster.lanes import ALL_LANES
from cluster.master.daemon.offers import (
    RunCounts,
    fair_order,
    for_node,
    jobs_for,
    waiting_jobs,
    waiting_runs,
)
from cluster.master.files import groups, guardfile, keycache
from cluster.master.files.keycache import heartbeat_keys
from cluster.master.files.nodefiles import forget_node, is_disabled, record_heartbeat
from cluster.master.model.placement import offered
from cluster.runtime import fsutil, service
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.listener import FramedConnection, FramedListener
from cluster.runtime.peers import connection_limit
from cluster.runtime.singleton import SingleInstance
from cluster.wire import signing
from cluster.wire.heartbeat import (
    MAX_LINE,
    MAX_LINES,
    MAX_WAIT,
    Heartbeat,
    format_error,
    format_reply,
    framer,
    parse_heartbeat,
)

log = logging.getLogger("cluster.monitor")

#: A client must deliver its whole request within this many seconds (and, later, read its
#: reply within as many).
DEADLINE = 5.0
#: Bytes of unfinished requests all connections may hold together.  An honest heartbeat is
#: well under 1 KiB; one request is bounded by MAX_LINE x MAX_LINES (about 70 KB).
MAX_BUFFERED = 16 * 1024 * 1024
#: How often held heartbeats look for a new run [seconds]: three stat() calls of the
#: job.start files, whatever the number of held connections (see MonitorServer._poll_jobs).
#: Half of it is, on average, between a run's start and its nodes hearing of it; sixty
#: stat() calls a second cost nothing beside that.
HOLD_POLL = 0.05
#: The longest the daemon loop waits before looking at its stop flag [seconds] when it
#: has no wakeup fd (:attr:`cluster.runtime.service.StopFlag.wakeup_fd`, which ends the
#: wait at the signal itself): the select is not interrupted by a signal (PEP 475), and
#: while heartbeats are held the loop wakes this often anyway (HOLD_POLL).
STOP_SLICE = 0.1
#: The selector data of the wakeup fd (wake_on), told apart from connections (a _Conn) and
#: the listener (None).
_WAKE = object()

#: After an ERROR reply, input still discarded (bytes, seconds) so the reply is not lost to
#: a TCP reset.  Also what a held client may send before it is dropped.
DRAIN_BYTES = 65536
DRAIN_SECONDS = 0.5


LOCK_NAME = "monitor_port.lock"
#: The monitor's replay guard, saved in the home for the monitor after it, and
#: how often at most it is written while heartbeats come in [seconds].
GUARD_FILE = "heartbeat.nonces"
GUARD_SAVE_INTERVAL = 2.0


# ----------------------------------------------------------------------------------------------
# Single instance

def acquire_lock(home: Home, program: str = "monitor_port") -> SingleInstance:
    """Take ``home/monitor_port.lock`` without waiting; AlreadyRunning if another holds it."""
    lock = SingleInstance(home.root / LOCK_NAME, program)
    lock.acquire()
    return lock


# ----------------------------------------------------------------------------------------------
# The server

_READ_SIZE = 65536
#: Connections accepted (and, when their request is there, served) per listener event.
_ACCEPT_BATCH = 256

# A connection's states, in the order it goes through them.
_READING = "reading"    # collecting the request
_HELD = "held"          # recorded; the answer waits for a run or the end of the wait
_WRITING = "writing"    # the answer is being sent
_DRAINING = "draining"  # after ERROR: half-closed, input discarded so the ERROR is not reset


class _Conn(FramedConnection):
    __slots__ = ("state", "then_drain", "skip", "node", "discarded", "nonce", "key", "lanes")

    def __init__(self, server: MonitorServer, sock: socket.socket, peer: str, host: str,
                 now: float) -> None:
        # The deadline is the current state's: it moves on with the state.
        super().__init__(sock, peer, host, now + server.deadline,
                         framer(server.max_line, server.max_lines))
        self.state = _READING
        self.then_drain = False  # an ERROR answer: half-close and drain after sending it
        self.skip: frozenset[str] = frozenset()
        self.node = ""
        self.discarded = 0  # bytes read and thrown away while held or draining
        self.nonce = ""  # of a verified request: its answer is signed for it
        self.key = b""  # the heartbeat key of the node it claims to be
        self.lanes = False  # the node said ``lanes yes``: it may be told of user lanes


class MonitorServer(FramedListener[_Conn]):
    """The heartbeat listener: one thread, non-blocking sockets, one request per connection.

    Callers drive it with :meth:`serve_once` in their own loop, or with
    :meth:`serve_forever` in a thread and :meth:`shutdown` from another; then
    :meth:`server_close`.  :attr:`server_address` is where it listens.

    Every connection has :data:`DEADLINE` (``deadline``) to deliver its request; a held one
    is answered when its wait (cut to ``max_wait``) ends.  At most ``max_connections`` are
    open (default: what the open-file limit allows, see
    :func:`~cluster.runtime.peers.connection_limit`), at most ``max_per_peer`` of one host
    (default: :func:`~cluster.runtime.peers.per_peer_limit`); more are answered ``ERROR
    monitor busy`` at once.  Unfinished requests hold at most ``max_buffered`` bytes together; a
    connection whose data would pass that is answered ``ERROR`` and logged once.  Accepting,
    the caps, the deadlines, closing, stopping and reading within the bounds are
    :class:`~cluster.runtime.listener.FramedListener`'s.
    """

    name = "monitor"
    accept_batch = _ACCEPT_BATCH
    read_size = _READ_SIZE
    connection = _Conn
    buffered_bound = "monitor busy: open connections would hold more than {limit} bytes"

    def __init__(self, home: Home, address: tuple[str, int] = ("127.0.0.1", 0), *,
                 deadline: float = DEADLINE, max_line: int = MAX_LINE,
                 max_lines: int = MAX_LINES, max_connections: int | None = None,
                 max_per_peer: int | None = None, max_buffered: int = MAX_BUFFERED,
                 max_wait: float = MAX_WAIT,
                 hold_poll: float = HOLD_POLL, clock: Clock | None = None) -> None:
        self.home = home
        clock = clock or SystemClock()
        #: The heartbeat keys of the nodes (from their own keys), and the nonces seen (as
        #: saved by the monitor before this one).
        self.keys = heartbeat_keys(home.root, clock.monotonic)
        self.guard = signing.ReplayGuard()
        self.guard_path = home.root / GUARD_FILE
        self.guard_saved = clock.monotonic()
        self.guard_changed = False
        guardfile.load(self.guard_path, self.guard)
        self.deadline = deadline
        self.max_line = max_line
        self.max_lines = max_lines
        self.max_wait = max_wait
        self.hold_poll = hold_poll
        self.held: set[_Conn] = set()
        #: How many nodes each run has, by the nodes' last heartbeats (the order in which
        #: idle nodes are offered priority 0's runs).
        self.nodes_in = RunCounts()
        self.served = 0
        self._next_poll = 0.0
        self._job_files: tuple[tuple[int, int, int] | None, ...] | None = None
        # Last, so that nothing above can fail with the port bound.  create_server sets
        # SO_REUSEADDR: a restart does not wait out TIME_WAIT, while a port another program
        # listens on still fails with EADDRINUSE.
        super().__init__(address, log, max_buffered=max_buffered, backlog=1024,
                         max_connections=(connection_limit() if max_connections is None
                                          else max_connections),
                         max_per_peer=max_per_peer,
                         busy_reply=format_error("monitor busy, try again"), clock=clock)

    # -- driving it ----------------------------------------------------------------------------
    def wake_on(self, fd: int) -> None:
        """Also end a :meth:`serve_once` wait when ``fd`` turns readable: a stop flag's
        wakeup fd, drained here (:func:`cluster.runtime.service.drain`), so that the loop
        looks at its stop flag at once."""
        self.selector.register(fd, selectors.EVENT_READ, _WAKE)

    def serve_once(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for activity, deal with all of it, then with the
        deadlines that passed and (while heartbeats are held) with new runs."""
        now = self.clock.monotonic()
        wait = timeout
        if self._deadlines:
            wait = min(wait, self._deadlines[0][0] - now)
        if self.held:
            wait = min(wait, self._next_poll - now)
        for key, events in self.selector.select(max(0.0, wait)):
            if key.data is None:
                self._accept()
                continue
            if key.data is _WAKE:
                service.drain(key.fd)
                continue
            conn: _Conn = key.data
            if conn.closed:
                continue
            if conn.state == _WRITING:
                if events & selectors.EVENT_WRITE:
                    self._write(conn)
            elif events & selectors.EVENT_READ:
                self._read(conn)
        now = self.clock.monotonic()
        if self.held and now >= self._next_poll:
            self._next_poll = now + self.hold_poll
            self._poll_jobs()
        self._expire(now)
        self.refusals.tick(now)
        if self.guard_changed and now - self.guard_saved >= GUARD_SAVE_INTERVAL:
            self.save_guard()

    def save_guard(self) -> None:
        """Write the replay guard to ``heartbeat.nonces`` (atomically), for the monitor
        that starts after this one."""
        self.guard_saved = self.clock.monotonic()
        self.guard_changed = False
        try:
            guardfile.save(self.guard_path, self.guard)
        except OSError as exc:  # a full disk: the next save tries again
            self.guard_changed = True
            log.warning("cannot save the replay guard to %s: %s", self.guard_path, exc)

    def server_close(self) -> None:
        """Close every connection and the listener.  Held heartbeats get their answer if it
        can be sent without waiting, so their nodes need not wait out a timeout."""
        if self.held:
            jobs = fair_order(waiting_jobs(self.home), self.nodes_in)
            for conn in list(self.held):
                reply = format_reply([] if is_disabled(self.home, conn.node)
                                     else for_node(jobs, conn.lanes))
                try:
                    conn.sock.send(signing.sign_reply(reply, conn.key, conn.nonce))
                except OSError:
                    pass  # the node will time out and try again
        super().server_close()
        if self.guard_changed:
            self.save_guard()

    # -- connections ---------------------------------------------------------------------------
    def _peer_reply(self, host: str) -> bytes:
        return format_error("monitor busy: too many connections from your host, try again")

    def _ended_early(self, conn: _Conn) -> None:
        self._error(conn, "connection closed before the OK line")

    def _over_bound(self, conn: _Conn, bound: str) -> None:
        self._error(conn, bound)

    def _bad_request(self, conn: _Conn, problem: str) -> None:
        self._error(conn, problem)

    def _request(self, conn: _Conn, request: bytes) -> None:
        """Verify the heartbeat, then record and answer it (:meth:`_heartbeat`)."""
        claimed = signing.header_value(request, b"node")
        try:
            key, nonce = keycache.verify(self.keys, claimed, request)
        except keycache.KeyRefused as exc:
            self._refuse(conn, claimed, exc.reason, logged=exc.logged)
            return
        conn.nonce = nonce  # from here on every answer is signed
        conn.key = key
        try:
            hb = parse_heartbeat(request, self.max_line, self.max_lines)
        except ProtocolError as exc:
            self._error(conn, str(exc))
            return
        if hb.node != claimed or not self.guard.accept(hb.node, nonce):
            conn.nonce = ""
            self._refuse(conn, hb.node, f"{signing.REPLAYED} {nonce}" if hb.node == claimed
                         else "more than one node name in a heartbeat")
            return
        self.guard_changed = True
        self._heartbeat(conn, hb)

    def _read_after(self, conn: _Conn, chunk: bytes) -> None:
        """Input while held (a node sends nothing more) or draining: thrown away, bounded.
        An empty chunk means the peer closed: a held node went away, or the drain is done."""
        if not chunk:
            if conn.state == _HELD:
                log.debug("node %s (peer %s): went away while held", conn.node, conn.peer)
            self._close(conn)
            return
        conn.discarded += len(chunk)
        if conn.discarded > DRAIN_BYTES:
            if conn.state == _HELD:
                self.refusals.note(conn.host, "node %s (peer %s): sent %d bytes after its "
                                   "request; dropped", conn.node, conn.peer, conn.discarded)
            self._close(conn)

    def _heartbeat(self, conn: _Conn, hb: Heartbeat) -> None:
        """Record ``hb`` now; answer now, or hold the answer (long-poll).  A goodbye
        removes the node's files instead (it leaves the lists at once)."""
        if hb.bye:
            try:
                forget_node(self.home, hb.node)
            except OSError as exc:
                log.warning("node %s: cannot remove its files on its goodbye: %s", hb.node, exc)
            log.info("node %s (peer %s) said goodbye: it leaves the node lists", hb.node,
                     conn.peer)
            self._reply(conn, format_reply([]))
            return
        try:
            record_heartbeat(self.home, hb)
            self.nodes_in.note(hb.node, hb.status)
            jobs = for_node(fair_order(jobs_for(self.home, hb.node), self.nodes_in), hb.lanes)
        except OSError as exc:
            log.error("node %s (peer %s): cannot record heartbeat in %s: %s",
                      hb.node, conn.peer, self.home.nodes, exc)
            self._reply(conn, format_error(f"master cannot record the heartbeat: {exc}"))
            return
        self.served += 1
        wait = min(hb.wait or 0.0, self.max_wait)
        if wait > 0 and not _news(jobs, hb.skip):
            conn.state = _HELD
            conn.node = hb.node
            conn.skip = hb.skip
            conn.lanes = hb.lanes
            conn.deadline = self.clock.monotonic() + wait
            self._push_deadline(conn)
            self.held.add(conn)
            # Watch for the node going away (EOF); and look again at the next poll, so a
            # run that appeared since waiting_jobs() read the files is not missed.
            self._watch(conn, selectors.EVENT_READ)
            self._job_files = None
            log.debug("node %s (peer %s): heartbeat held up to %g s", hb.node, conn.peer, wait)
            return
        log.debug("node %s (peer %s): heartbeat, %d job(s) waiting", hb.node, conn.peer,
                  len(jobs))
        self._reply(conn, format_reply(jobs))

    def _poll_jobs(self) -> None:
        """Answer the held heartbeats that a run not in their ``skip`` now waits for.

        Polling rather than inotify: it works on any file system (the home may be NFS, where
        inotify sees no remote changes) and costs three stat() calls per poll whatever the
        number of held connections; the files are read only when one of them changed
        (job.start is written atomically, so a change is a new inode or mtime)."""
        files = tuple(_file_id(self.home.job_start(lane)) for lane in ALL_LANES)
        if files == self._job_files:
            return
        self._job_files = files
        runs = waiting_runs(self.home)
        # A disabled node's heartbeat is held to its end and answered with no run; a node
        # is told only of the runs it may take (their groups read once per change).
        if any(where.restricted for _, _, where in runs):
            known = groups.all_groups(self.home)
            placements = {job_id: where for _, job_id, where in runs}
            plain = [(p, job_id) for p, job_id, _ in runs]

            def jobs_of(node: str) -> list[tuple[int, str]]:
                return fair_order(offered(plain, node, placements, known), self.nodes_in)
        else:
            every = fair_order([(p, job_id) for p, job_id, _ in runs], self.nodes_in)

            def jobs_of(node: str) -> list[tuple[int, str]]:
                return every
        for conn in list(self.held):
            jobs = for_node(jobs_of(conn.node), conn.lanes)
            if not _news(jobs, conn.skip) or is_disabled(self.home, conn.node):
                continue
            log.debug("node %s (peer %s): held heartbeat answered, a run waits", conn.node,
                      conn.peer)
            self._reply(conn, format_reply(jobs))

    # -- answers -------------------------------------------------------------------------------
    def _error(self, conn: _Conn, problem: str) -> None:
        """Refuse the request: one log line naming the peer, ``ERROR <problem>``, drain."""
        self._release(conn)
        self.refusals.note(conn.host, "peer %s: bad heartbeat: %s", conn.peer, problem)
        self.rejected += 1
        self._reply(conn, format_error(problem), then_drain=True)

    def _refuse(self, conn: _Conn, node: str, reason: str, logged: str = "") -> None:
        """A heartbeat not signed with its node's key (or replayed): one log line naming
        the peer and the node it claimed (and ``logged`` instead of ``reason`` when the log
        may say more than the peer is told), ``ERROR <reason>`` unsigned, nothing recorded."""
        self.refusals.note(conn.host, "peer %s (claims node %s): heartbeat refused: %s",
                           conn.peer, node or "-", logged or reason)
        self.rejected += 1
        self._reply(conn, format_error(reason), then_drain=True)

    def _reply(self, conn: _Conn, data: bytes, then_drain: bool = False) -> None:
        if conn.nonce:
            data = signing.sign_reply(data, conn.key, conn.nonce)
        self.held.discard(conn)
        conn.state = _WRITING
        conn.out = data
        conn.sent = 0
        conn.then_drain = then_drain
        conn.deadline = self.clock.monotonic() + self.deadline
        self._write(conn)
        if not conn.closed and conn.state == _WRITING:
            self._push_deadline(conn)
            self._watch(conn, selectors.EVENT_WRITE)

    def _write(self, conn: _Conn) -> None:
        if not self._send(conn):
            return
        if not conn.then_drain:
            self._close(conn)
            return
        # Closing a socket with unread input makes the kernel send RST, which can destroy
        # the ERROR line before the client reads it.  Half-close, then discard what the
        # client still sends -- bounded in bytes and time, so this cannot be abused.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = _DRAINING
        conn.out = b""
        conn.deadline = self.clock.monotonic() + DRAIN_SECONDS
        self._push_deadline(conn)
        self._watch(conn, selectors.EVENT_READ)

    def _expired(self, conn: _Conn) -> None:
        if conn.state == _READING:
            self._error(conn, f"no complete request within {self.deadline:g} s")
        elif conn.state == _HELD:
            self._reply(conn, format_reply(jobs_for(self.home, conn.node)))
        elif conn.state == _WRITING:
            self.refusals.note(conn.host, "peer %s: did not read its reply within %g s",
                               conn.peer, self.deadline)
            self._close(conn)
        else:
            self._close(conn)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _close(self, conn: _Conn) -> None:
        self.held.discard(conn)
        super()._close(conn)


def _news(jobs: list[tuple[int, str]], skip: frozenset[str]) -> bool:
    """Whether a run waits that the node does not skip."""
    return any(job_id not in skip for _, job_id in jobs)


def _file_id(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


# ----------------------------------------------------------------------------------------------
# The daemon

#: What the monitor does on its port, and what to do when the port is taken.
DOING = "listen for heartbeats"
REMEDY = "set monitor_port to a free port"


def port_taken_message(address: tuple[str, int]) -> str:
    """What :func:`run` logs when another program holds the port (localcluster quotes it)."""
    return service.port_taken_message(DOING, address, REMEDY)


def run(home: Home, address: tuple[str, int], should_stop: Callable[[], bool],
        poll: float = 0.5, clock: Clock | None = None,
        on_ready: Callable[[MonitorServer], None] | None = None, *,
        max_buffered: int = MAX_BUFFERED, wakeup_fd: int | None = None) -> int:
    """Be the one monitor of ``home``: lock, listen on ``address``, serve until
    ``should_stop()`` is true (checked at least every ``poll`` seconds, and at least every
    :data:`STOP_SLICE`; pass a ``StopFlag``'s ``is_set``), and at once when ``wakeup_fd``
    (that StopFlag's, :mod:`cluster.runtime.service`) turns readable.  ``on_ready`` is
    called once the server listens (tests use it to learn the port).

    Returns the exit code at once, never retrying: 0 after a stop or when another instance
    holds the lock (seed 000's dance); :data:`cluster.defaults.EXIT_PORT_TAKEN` when
    another program holds the port (logged as :func:`port_taken_message`); 2 when the
    address cannot be used for another reason (logged with the system's error).
    """
    clock = clock or SystemClock()
    home.create()
    try:
        lock = acquire_lock(home)
    except AlreadyRunning as exc:
        # Seed 000: "if I am not the only one, then exit" -- quietly, cron will try again.
        log.info("%s; exiting", exc)
        return EXIT_OK
    with lock:
        # Status files a killed monitor was writing (nothing else writes in nodes/).
        # (And the replay guard's, in the home itself.)
        for left in [*fsutil.remove_dead_temps(home.nodes),
                     *fsutil.remove_dead_temps(home.root)]:
            log.info("removed %s, left by a killed process", left)
        try:
            server = service.listen_or_exit(
                lambda: MonitorServer(home, address, clock=clock, max_buffered=max_buffered),
                address, DOING, REMEDY, log)
        except ClusterError as exc:
            log.error("%s", exc)
            return EXIT_USAGE
        if isinstance(server, int):
            return server
        host, port = server.server_address[:2]
        log.info("listening on %s:%s for heartbeats, home %s", host, port, home.root)
        try:
            if wakeup_fd is not None:
                server.wake_on(wakeup_fd)
            if on_ready is not None:
                on_ready(server)
            while not should_stop():
                server.serve_once(min(poll, STOP_SLICE))
        finally:
            server.server_close()
            log.info("stopped")
    return EXIT_OK
