"""Which files of the archive the status page serves, and how a URL path finds one safely.

The page links a finished run's report, its ``.tab`` and its bmpcmp page; a URL
``/archive/<id>/<file>`` asks for one of them.  :func:`resolve` turns the part after
``/archive/`` into a path of the master home, or raises :class:`ArchiveRefused` with the
HTTP status to answer and a message naming what was refused and what was expected.

Contract of :func:`resolve`:

* the run id is a job id of the node protocol (1-64 letters, digits, ``.``, ``_``, ``:`` and
  ``-``, starting with a letter or a digit: ``20261123120000-p0-ab12``), one path component
  that is never ``.`` or ``..``;
* only :data:`SERVED` files are served: ``report.txt``, ``<id>.tab``, the CI files
  ``junit.xml`` and ``result.json`` (rendered when asked from the run's CI facts and its
  table by :func:`ci_file`, :mod:`cluster.report.cifiles`), and anything below
  :data:`FOLDERS`: ``bmpcmp/`` (the bmpcmp page, ``bmpcmp/index.html``, and its images)
  and a sweep's ``results/`` and ``collected/``; anything else of the archive (node logs,
  the audit trail, run.info) is a 404 (:func:`is_served`);
* every component of the rest is checked before the file system is touched: not empty, not
  ``.`` or ``..``, not starting with a dot, no backslash, no NUL or other control
  character (400);
* the file's real path (symlinks resolved) must lie inside the run's own archive folder,
  whose real path must lie inside the home's ``archive/``: a symlink pointing out of it is
  a 404 as if the file did not exist, and so is anything that is not a regular file.

:func:`content_type` gives the Content-Type of a served file from its name.
:func:`fetchable` lists the same files of one run, for ``clusterpush --fetch``
(:mod:`cluster.cli.pushremote`): what the status page serves is what a developer brings home.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO

from cluster.defaults import BMPCMP_DIR
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.report import cifiles, ciresult
from cluster.wire.protocol import JOB_ID

#: A run id in a URL: the node protocol's job id, one harmless path component.
RUN_ID = JOB_ID
#: The longest part after ``/archive/`` looked at [characters].
MAX_PATH = 1024
#: Characters a component of a served path may not hold: the separators of other systems
#: and the control characters (no file the cluster writes has them).
_BAD_CHARS = re.compile(r"[\\\x00-\x1f\x7f]")
#: What :func:`resolve` serves, for the messages: the report, the table, the bmpcmp page.
SERVED = ("report.txt, <id>.tab, junit.xml, result.json, the bmpcmp/ page and its images, "
          "and a sweep's results/ and collected/")
#: The folders of a run's archive served whole (the bmpcmp page, a sweep's results).
FOLDERS = (BMPCMP_DIR, "results", "collected")
#: Most files :func:`fetchable` lists of one run (a bound on its walk).
MAX_FETCH_FILES = 200_000

#: Content types by file name suffix; anything else is served as bytes.
CONTENT_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".tab": "text/plain; charset=utf-8",
    ".log": "text/plain; charset=utf-8",
    ".meta": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".xml": "application/xml",
    ".json": "application/json",
    ".png": "image/png",
    ".gif": "image/gif",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".pnm": "image/x-portable-anymap",
    ".ppm": "image/x-portable-pixmap",
    ".pgm": "image/x-portable-graymap",
    ".pbm": "image/x-portable-bitmap",
}
OCTETS = "application/octet-stream"


class ArchiveRefused(ClusterError):
    """A request for an archive file that is not answered with the file: ``status`` is the
    HTTP status to answer (400 a malformed path, 404 nothing served there)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is a well-formed run id, else ArchiveRefused(400) saying so."""
    if RUN_ID.fullmatch(run_id) is None:
        shown = run_id if len(run_id) <= 80 else run_id[:77] + "..."
        raise ArchiveRefused(400, f"run id {shown!r}: expected 1-64 letters, digits, '.', "
                                  f"'_', ':' and '-', starting with a letter or digit (a run "
                                  f"id such as 20261123120000-p0-ab12)")
    return run_id


def _check_component(part: str, whole: str) -> None:
    if part in ("", ".", "..") or part.startswith(".") or _BAD_CHARS.search(part):
        raise ArchiveRefused(400, f"archive path {whole!r}: component {part!r} is not a "
                                  f"plain file or folder name (no empty, '.', '..' or "
                                  f"dot-names, no backslashes or control characters)")


def is_served(run_id: str, parts: list[str]) -> bool:
    """Whether the file ``parts`` (its path's components below the run's folder) of run
    ``run_id`` is one the archive gives out (see the module docstring)."""
    return (parts == ["report.txt"] or parts == [f"{run_id}.tab"]
            or parts in ([ciresult.JUNIT_NAME], [ciresult.JSON_NAME])
            or (parts[0] in FOLDERS and len(parts) > 1))


def fetchable(home: Home, run_id: str) -> list[tuple[str, Path]]:
    """The files of archived run ``run_id`` that :func:`resolve` would serve, as (path
    relative to the run's folder, POSIX; the file): regular files only, never through a
    symlink (a link is left out, whatever it points to), no dot-names.  ArchiveRefused
    (404) when the run has no archive folder."""
    check_run_id(run_id)
    folder = home.archive / run_id
    if folder.is_symlink() or not folder.is_dir() or home.archive.is_symlink():
        raise ArchiveRefused(404, f"run {run_id} has no archive folder (is it finished?)")
    found: list[tuple[str, Path]] = []
    stack: list[tuple[list[str], Path]] = [([], folder)]
    while stack:  # bounded: links are never followed, and MAX_FETCH_FILES
        parts, where = stack.pop()
        try:
            entries = sorted(os.scandir(where), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            here = [*parts, entry.name]
            if entry.name.startswith(".") or _BAD_CHARS.search(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                if parts or entry.name in FOLDERS:  # below the top: only FOLDERS
                    stack.append((here, Path(entry.path)))
            elif entry.is_file(follow_symlinks=False) and is_served(run_id, here):
                found.append(("/".join(here), Path(entry.path)))
                if len(found) > MAX_FETCH_FILES:
                    raise ArchiveRefused(400, f"run {run_id} has more than "
                                              f"{MAX_FETCH_FILES} files to fetch")
    return sorted(found)


def resolve(home: Home, rest: str) -> Path:
    """The file of the home's archive that ``rest`` (``<id>/<file>``, already
    percent-decoded) names, checked as the module docstring says; ArchiveRefused if not."""
    if len(rest) > MAX_PATH:
        raise ArchiveRefused(400, f"archive path of {len(rest)} characters: expected at "
                                  f"most {MAX_PATH}")
    run_id, _, file_part = rest.partition("/")
    check_run_id(run_id)
    if not file_part:
        raise ArchiveRefused(404, f"archive/{rest}: expected /archive/<run id>/<file> (the "
                                  f"status page serves a finished run's {SERVED})")
    parts = file_part.split("/")
    for part in parts:
        _check_component(part, rest)
    if not is_served(run_id, parts):
        raise ArchiveRefused(404, f"archive/{rest}: not served (the status page serves a "
                                  f"finished run's {SERVED})")
    missing = ArchiveRefused(404, f"archive/{rest}: no such file (is run {run_id} finished "
                                  f"and archived?)")
    try:
        archive = Path(os.path.realpath(home.archive, strict=True))
        folder = Path(os.path.realpath(home.archive / run_id, strict=True))
        target = Path(os.path.realpath(folder.joinpath(*parts), strict=True))
    except OSError:
        raise missing from None
    # realpath resolved every symlink: what is left must still be inside the run's folder,
    # and that folder inside the archive (a run folder that is a symlink out is refused).
    if folder.parent != archive or not target.is_relative_to(folder) or not target.is_file():
        raise missing
    return target


def run_folder(home: Home, run_id: str) -> Path:
    """The real path of the archive folder of the run ``run_id`` (checked as
    :func:`resolve` checks it); ArchiveRefused(404) when there is none."""
    check_run_id(run_id)
    try:
        archive = Path(os.path.realpath(home.archive, strict=True))
        folder = Path(os.path.realpath(home.archive / run_id, strict=True))
    except OSError:
        folder = archive = Path("/")
    if folder.parent != archive or not folder.is_dir():
        raise ArchiveRefused(404, f"archive/{run_id}: no such run (is run {run_id} finished "
                                  f"and archived?)")
    return folder


def ci_file(home: Home, rest: str) -> tuple[BinaryIO, int, str] | None:
    """When ``rest`` is ``<id>/junit.xml`` or ``<id>/result.json``: that CI file of the run
    rendered (:func:`cluster.report.cifiles.render`) into a temporary file, open at its
    start, with its size and name; None for any other path.  ArchiveRefused(404) when the
    run has no CI files."""
    run_id, _, name = rest.partition("/")
    kind = next((k for k, n in cifiles.KINDS.items() if n == name), None)
    if kind is None:
        return None
    folder = run_folder(home, run_id)
    out = tempfile.TemporaryFile()  # noqa: SIM115 -- handed to the caller, which closes it
    try:
        for chunk in cifiles.render(folder, kind):
            out.write(chunk.encode("utf-8"))
    except (cifiles.NoCiFacts, ValueError, OSError) as exc:
        out.close()
        raise ArchiveRefused(404, f"archive/{rest}: no CI file ({exc})") from None
    size = out.tell()
    out.seek(0)
    return out, size, name


def content_type(path: Path) -> str:
    """The Content-Type of an archive file, from its suffix (bytes when unknown)."""
    return CONTENT_TYPES.get(path.suffix.lower(), OCTETS)
