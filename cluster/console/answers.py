"""What the status page answers: its routes, the cached answers and the request handler.

The status page's server (:mod:`cluster.console.httpd`) reads each request head and writes
each answer; the answer itself is made here, in one of its worker threads:

* :class:`RequestHandler` (the standard library's request handler, on a request already
  read) routes GET and HEAD of ``/``, ``/api/status``, ``/api/nodes``, ``/api/runs/<id>``
  and ``/archive/<id>/<file>``; every error is JSON (:func:`error_answer`), every answer
  carries the safe headers (``nosniff``, a Content-Security-Policy allowing nothing from
  another origin, ``no-store`` on the API);
* :class:`StatusModel` makes the API's answers, cached (:class:`TtlCache`): the snapshot
  refreshed in the background at most every :data:`CACHE_SECONDS`, a run's detail on
  demand; JSON answers are also kept gzipped (:func:`json_answer`);
* :func:`plain_error` is a whole error answer made without a handler, for the server's
  own refusals.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar
from urllib.parse import unquote

from cluster.config import Config
from cluster.console import archivefiles
from cluster.console.archivefiles import ArchiveRefused
from cluster.errors import ClusterError
from cluster.home import Home

# The server's logger: the answers' lines read as the status page's, as they always have.
log = logging.getLogger("cluster.console.httpd")

#: How long a made snapshot (node list, run detail) is served again [seconds].
CACHE_SECONDS = 0.5
#: Answers at least this long are also kept gzipped [bytes]; and how hard to compress.
GZIP_MIN = 1024
GZIP_LEVEL = 5
#: How many run details are kept at once.
MAX_CACHED_RUNS = 16
#: The longest request line read [bytes].
MAX_REQUEST_LINE = 8192
#: The page and the API's policy: our own origin only, the page's inline script and style.
PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")
#: Archive files (the bmpcmp page has inline style and images, no script).
ARCHIVE_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
                  "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
JSON_TYPE = "application/json"
#: The routes, for the 404 of an unknown path.
ROUTES = "/, /api/status, /api/nodes, /api/runs/<id> or /archive/<id>/<file>"


# ----------------------------------------------------------------------------------------------
# The cache

@dataclass(frozen=True)
class Answer:
    """One HTTP answer, made once and served to every client asking within its lifetime;
    ``gzipped`` is the body compressed, for clients that accept gzip (None: send as is)."""

    status: int
    body: bytes
    content_type: str = JSON_TYPE
    gzipped: bytes | None = None


def json_answer(value: Any, status_code: int = 200, compress: bool = False) -> Answer:
    """``value`` as a JSON answer; ``compress`` also keeps it gzipped when that pays."""
    body = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    packed = gzip.compress(body, GZIP_LEVEL) if compress and len(body) >= GZIP_MIN else None
    return Answer(status_code, body, JSON_TYPE, packed)


def error_answer(status_code: int, message: str) -> Answer:
    return json_answer({"error": message, "status": status_code}, status_code)


V = TypeVar("V")


@dataclass
class _Entry(Generic[V]):
    made: float
    value: V


class TtlCache(Generic[V]):
    """Values by key, each made at most once per ``ttl`` seconds of ``clock``.

    Concurrent :meth:`get` calls for one key wait for the one making it (one home read for
    many clients); calls for other keys do not wait.  With ``background=True`` a value
    that is stale but younger than ``max_stale`` is returned at once while one thread
    makes the next (under steady polling no client waits for a refresh); an older one,
    as after a quiet spell, is made again before the answer, so no page ever shows a
    state older than ``max_stale`` (default: four ``ttl``).  At most ``max_entries`` keys
    are kept (the oldest made is dropped first).  An exception of ``make`` reaches its
    caller (in the background: it is logged) and is not cached.
    """

    def __init__(self, ttl: float = CACHE_SECONDS, max_entries: int = MAX_CACHED_RUNS + 2,
                 clock: Callable[[], float] = time.monotonic,
                 max_stale: float | None = None) -> None:
        self.ttl = ttl
        self.max_stale = 4 * ttl if max_stale is None else max_stale
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry[V]] = {}
        self._making: dict[str, threading.Lock] = {}
        self._refreshing: set[str] = set()
        self.made = 0  # how many values were made (the tests count home reads with it)

    def _fresh(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is not None and self._clock() - entry.made < self.ttl:
            return entry.value
        return None

    def _store(self, key: str, value: V) -> None:
        with self._lock:
            self.made += 1
            self._entries[key] = _Entry(self._clock(), value)
            while len(self._entries) > self.max_entries:
                oldest = min(self._entries, key=lambda k: self._entries[k].made)
                del self._entries[oldest]

    def get(self, key: str, make: Callable[[], V], *, background: bool = False) -> V:
        with self._lock:
            value = self._fresh(key)
            if value is not None:
                return value
            stale = self._entries.get(key)
            if background and stale is not None \
                    and self._clock() - stale.made < self.max_stale:
                if key not in self._refreshing:
                    self._refreshing.add(key)
                    threading.Thread(target=self._refresh, args=(key, make), daemon=True,
                                     name=f"refresh {key}").start()
                return stale.value
            making = self._making.setdefault(key, threading.Lock())
        with making:
            with self._lock:
                value = self._fresh(key)  # made while we waited
                if value is not None:
                    return value
            try:
                value = make()
            finally:
                with self._lock:
                    self._making.pop(key, None)
            self._store(key, value)
            return value

    def _refresh(self, key: str, make: Callable[[], V]) -> None:
        try:
            value = make()
        except Exception:  # noqa: BLE001 -- a daemon thread: log, keep the stale value
            log.exception("could not refresh %s", key)
            return
        finally:
            with self._lock:
                self._refreshing.discard(key)
        self._store(key, value)


# ----------------------------------------------------------------------------------------------
# What is served

Snapshot = Callable[[Home, Config], dict[str, Any]]
RunDetail = Callable[[Home, str], dict[str, Any]]


@dataclass(frozen=True)
class _Views:
    """The answers made from one snapshot."""

    status: Answer
    nodes: Answer


class StatusModel:
    """The answers of the API routes, cached (see :class:`TtlCache`): the snapshot's two
    views are refreshed in the background (a client never waits for a home read but the
    first), a run's detail on demand.

    ``snapshot`` and ``run_detail`` default to cluster.console.status's; a test may pass
    others.  That module and the page's are loaded at the first request that needs them,
    not at the start: clusterstatus.py starts beside the run's first clustermaster and
    nodes (localcluster.py), and nobody may look before the run ends.
    """

    def __init__(self, home: Home, cfg: Config, *, ttl: float = CACHE_SECONDS,
                 snapshot: Snapshot | None = None,
                 run_detail: RunDetail | None = None) -> None:
        self.home = home
        self.cfg = cfg
        self.views: TtlCache[_Views] = TtlCache(ttl, max_entries=1)
        self.details: TtlCache[Answer] = TtlCache(ttl, max_entries=MAX_CACHED_RUNS)
        self._snapshot_fn = snapshot
        self._run_detail_fn = run_detail
        self._page: Answer | None = None

    @property
    def page(self) -> Answer:
        """The status page's HTML, rendered at its first request."""
        if self._page is None:
            from cluster.console import page  # here: see the class docstring

            self._page = Answer(200, page.render().encode("utf-8"),
                                "text/html; charset=utf-8")
        return self._page

    def _snapshot(self, home: Home, cfg: Config) -> dict[str, Any]:
        if self._snapshot_fn is None:
            from cluster.console import status  # here: see the class docstring

            self._snapshot_fn = status.snapshot
        return self._snapshot_fn(home, cfg)

    def _run_detail(self, home: Home, run_id: str) -> dict[str, Any]:
        if self._run_detail_fn is None:
            from cluster.console import status  # here: see the class docstring

            self._run_detail_fn = status.run_detail
        return self._run_detail_fn(home, run_id)

    def _make_views(self) -> _Views:
        try:
            snap = self._snapshot(self.home, self.cfg)
            nodes = {"version": snap.get("version", 1), "now": snap.get("now"),
                     "nodes": snap.get("nodes", [])}
            return _Views(json_answer(snap, compress=True), json_answer(nodes, compress=True))
        except Exception as exc:  # noqa: BLE001 -- logged with its traceback, answered 500
            # A file being rewritten, a bug: one bad read must not take the page down.
            log.exception("could not make the status snapshot")
            error = error_answer(500, f"could not make the status snapshot: "
                                      f"{type(exc).__name__}: {exc}")
            return _Views(error, error)

    def status(self) -> Answer:
        return self.views.get("snapshot", self._make_views, background=True).status

    def nodes(self) -> Answer:
        return self.views.get("snapshot", self._make_views, background=True).nodes

    def run(self, run_id: str) -> Answer:
        try:
            archivefiles.check_run_id(run_id)
        except ArchiveRefused as exc:
            return error_answer(exc.status, exc.message)

        def make() -> Answer:
            try:
                return json_answer(self._run_detail(self.home, run_id), compress=True)
            except ClusterError as exc:  # an unknown run: the message names it
                return error_answer(404, str(exc))
        return self.details.get(run_id, lambda: self._guarded(f"the detail of run {run_id}",
                                                              make))

    @staticmethod
    def _guarded(what: str, make: Callable[[], Answer]) -> Answer:
        """``make()``, or a 500 naming ``what`` when reading the home failed unexpectedly
        (a file being rewritten, a bug): one bad read must not take the page down."""
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 -- logged with its traceback, answered 500
            log.exception("could not make %s", what)
            return error_answer(500, f"could not make {what}: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------------------------
# The answers: the standard library's request handler, on a request already read

class RequestHandler(BaseHTTPRequestHandler):
    """One request (HTTP/1.0), GET and HEAD of the routes above, made in a worker thread.

    It never touches the socket: the loop (:class:`cluster.console.httpd.StatusServer`)
    read the whole request head before (``request`` is its bytes), and writes the answer
    after: what the handler wrote to ``wfile``, then :attr:`file_body` (an archive file,
    sent with sendfile).
    """

    server: Any  # the StatusServer (which is no socketserver.BaseServer)
    request: bytes
    raw_requestline: bytes
    server_version = "clusterstatus/1"
    sys_version = ""
    # Errors for garbage (or HTTP/0.9) still get a status line and headers.
    default_request_version = "HTTP/1.0"

    def setup(self) -> None:
        self.rfile = io.BytesIO(self.request)
        self.out = io.BytesIO()
        self.wfile = self.out
        #: An archive file to send after the head, and its size (owned by the caller).
        self.file_body: tuple[BinaryIO, int] | None = None

    def finish(self) -> None:
        """Nothing: the caller takes the answer out of ``wfile``."""

    # -- the methods
    def do_GET(self) -> None:  # noqa: N802 -- the name http.server looks up
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)

    def _not_allowed(self) -> None:
        self._send(error_answer(405, f"method {self.command} is not allowed: the status "
                                     f"service answers GET and HEAD only"),
                   extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = \
        _not_allowed

    def parse_request(self) -> bool:
        if len(self.raw_requestline) > MAX_REQUEST_LINE:
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", "GET"
            self.send_error(414, f"request line of {len(self.raw_requestline)} bytes: "
                                 f"expected at most {MAX_REQUEST_LINE}")
            return False
        return super().parse_request()

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """The standard library's errors (a bad request line, an unknown method), as JSON."""
        text = message or self.responses.get(code, ("error",))[0]
        if explain:
            text = f"{text}: {explain}"
        self.close_connection = True
        self._send(error_answer(code, text), head=self.command == "HEAD")

    # -- routing
    def _answer(self, head: bool) -> None:
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        model = self.server.model
        if path in ("/", "/index.html"):
            self._send(model.page, head)
        elif path == "/api/status":
            self._send(model.status(), head)
        elif path == "/api/nodes":
            self._send(model.nodes(), head)
        elif path.startswith(("/api/runs/", "/archive/")):
            prefix = "/api/runs/" if path.startswith("/api/runs/") else "/archive/"
            try:
                rest = unquote(path[len(prefix):], errors="strict")
            except UnicodeDecodeError:
                self._send(error_answer(400, f"path {path[:80]!r}: its %-escapes are not "
                                             f"UTF-8"), head)
                return
            if prefix == "/archive/":
                self._archive(rest, head)
            else:
                self._send(model.run(rest), head)
        else:
            shown = path if len(path) <= 80 else path[:77] + "..."
            self._send(error_answer(404, f"no page {shown!r}: expected {ROUTES}"), head)

    def _archive(self, rest: str, head: bool) -> None:
        try:
            rendered = archivefiles.ci_file(self.server.model.home, rest)
            if rendered is not None:  # a CI file, rendered from the run's facts
                fh, size, name = rendered
                self._file(fh, size, archivefiles.content_type(Path(name)), head)
                return
            target = archivefiles.resolve(self.server.model.home, rest)
            fh = open(target, "rb")  # noqa: SIM115 -- closed here, or by the loop once sent
        except ArchiveRefused as exc:
            self._send(error_answer(exc.status, exc.message), head)
            return
        except OSError as exc:  # removed or unreadable between the checks and here
            self._send(error_answer(404, f"archive/{rest}: cannot be read "
                                         f"({exc.strerror or exc})"), head)
            return
        self._file(fh, os.fstat(fh.fileno()).st_size, archivefiles.content_type(target), head)

    def _file(self, fh: BinaryIO, size: int, content_type: str, head: bool) -> None:
        """Answer 200 with the ``size`` bytes of the open file ``fh`` (closed here for a
        HEAD or an empty file, else by the loop once sent)."""
        self.send_response(200)
        self._headers(content_type, size, ARCHIVE_POLICY, no_store=False)
        if head or size == 0:
            fh.close()
        else:
            self.file_body = (fh, size)

    # -- writing
    def _headers(self, content_type: str, length: int, policy: str, no_store: bool,
                 extra: dict[str, str] | None = None) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", policy)
        self.send_header("Referrer-Policy", "no-referrer")
        if no_store:
            self.send_header("Cache-Control", "no-store")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def _accepts_gzip(self) -> bool:
        headers = getattr(self, "headers", None)  # none yet when the request line was bad
        offered = headers.get("Accept-Encoding", "") if headers is not None else ""
        for item in offered.split(","):
            coding, _, params = item.partition(";")
            if coding.strip().lower() == "gzip":
                return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
        return False

    def _send(self, answer: Answer, head: bool = False,
              extra: dict[str, str] | None = None) -> None:
        body, more = answer.body, dict(extra or {})
        if answer.gzipped is not None:
            more["Vary"] = "Accept-Encoding"
            if self._accepts_gzip():
                body = answer.gzipped
                more["Content-Encoding"] = "gzip"
        self.send_response(answer.status)
        self._headers(answer.content_type, len(body), PAGE_POLICY, no_store=True, extra=more)
        if not head:
            self.wfile.write(body)

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base's name
        # Every page polls every 2 s: requests are logged only when debugging.
        log.debug("%s %s", self.address_string(), format % args)


def plain_error(status_code: int, message: str) -> bytes:
    """A whole HTTP/1.0 error answer, made without a handler (the loop's own refusals)."""
    answer = error_answer(status_code, message)
    reason = BaseHTTPRequestHandler.responses.get(status_code, ("Error",))[0]
    return (f"HTTP/1.0 {status_code} {reason}\r\nContent-Type: {JSON_TYPE}\r\n"
            f"Content-Length: {len(answer.body)}\r\nX-Content-Type-Options: nosniff\r\n"
            f"Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode() + answer.body
