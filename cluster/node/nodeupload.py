"""What a node sends back to the master's home beside its calls: the UPLOAD at the end of its
run, and the bundles of a sweep run's results.

* UPLOAD (in the background thread: :mod:`cluster.node.background`): the node's log and
  build log go to ``runs/<id>/logs/``, and the image sets bmpcmp jobs left in
  ``temp/bmpcmp/`` go to ``runs/<id>/bmpcmp/``: whole sets in name order until
  :data:`BMPCMP_UPLOAD_LIMIT` bytes; the sets after that are not sent and
  ``runs/<id>/bmpcmp/DROPPED.<node>`` lists their files.  As the job account
  (:mod:`cluster.node.jobuser`), every process of it is killed first.  A BUILD that failed
  uploads the logs too (seed 001: the failure logs are uploaded first).
* Sweep runs (job.start has ``max_result_bytes``): before a call carrying sweep results the
  node packs them into one bundle (:mod:`cluster.node.sweepresults`), puts it in
  ``runs/<id>/results/incoming/<node>.<instance>.<n>.tar`` and names it in the call's
  ``bundle`` header; a failed upload is a failed call (the results stay and go in a new
  bundle).  After the reply the sent results' files and the bundle are removed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.bmpcmp import DROPPED_NOTE, SET_FILE
from cluster.defaults import BMPCMP_DIR
from cluster.errors import ClusterError
from cluster.node import jobuser, sweepresults
from cluster.node.runcontext import RunContext
from cluster.records import JobResult
from cluster.runtime import fsutil

log = logging.getLogger("cluster.node")

#: Where a sweep run's result bundles go in the run's folder on the master.
BUNDLE_DIR = "results/incoming"
#: Bytes of bmpcmp images one node uploads per run (ARTIFEX.md §5.7: checkSize.pl, 10 MB).
BMPCMP_UPLOAD_LIMIT = 10_000_000


class NodeUpload:
    """The run's uploads through ``ctx``'s transport."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        #: A folder bundle moved to the master whose call failed: it goes again.
        self.outstanding: sweepresults.Bundle | None = None
        #: Whether result bundles go as folders (until the transport cannot move one).
        self.folder_bundles = True

    # ------------------------------------------------------------------ UPLOAD
    def run(self) -> None:
        """The UPLOAD (in the background thread); ClusterError when an upload fails."""
        self.ctx.node_log.flush()
        if self.ctx.account is not None:
            # Nothing of a job may change what is uploaded while it is read.
            jobuser.kill_leftovers(self.ctx.account)
        self.upload_bmpcmp()
        self.upload_logs(strict=True)

    def upload_bmpcmp(self) -> None:
        """Upload ``temp/bmpcmp/`` to ``runs/<id>/bmpcmp/`` within BMPCMP_UPLOAD_LIMIT.

        Whole image sets in name order, each set's ``.meta`` last (the master shows a set
        once its ``.meta`` is there).  Once a set would pass the limit, it and every later
        one stay behind and ``DROPPED.<node>`` (one file per node, so nodes never overwrite
        each other's note) lists their files.  Raises ClusterError when an upload fails.
        """
        groups = self._bmpcmp_sets()
        dest = f"runs/{self.ctx.start.id}/{BMPCMP_DIR}"
        total = 0
        dropped: list[Path] = []
        for stem in sorted(groups):
            files = sorted(groups[stem], key=lambda p: (p.name.endswith(".meta"), p.name))
            size = sum(p.stat().st_size for p in files)
            if dropped or total + size > BMPCMP_UPLOAD_LIMIT:
                dropped.extend(files)
                continue
            for path in files:
                self.ctx.transport.upload(path, f"{dest}/{path.name}")
            total += size
        if dropped:
            self._note_dropped(dropped, dest)

    def _bmpcmp_sets(self) -> dict[str, list[Path]]:
        """The files bmpcmp jobs left in ``temp/bmpcmp/``, by image set."""
        folder = self.ctx.temp / BMPCMP_DIR
        # A job made this folder and its files: a link to elsewhere is never followed (the
        # node may be root, and a job's link could point at the node's secrets).
        if folder.is_symlink() or not folder.is_dir():
            return {}
        groups: dict[str, list[Path]] = {}
        for path in sorted(folder.iterdir()):
            # A bmpcmp job killed mid-write leaves a temporary file: never uploaded.
            if (path.is_file() and not path.is_symlink()
                    and not fsutil.TEMP_NAME.fullmatch(path.name)):
                m = SET_FILE.fullmatch(path.name)
                groups.setdefault(m.group("stem") if m else path.name, []).append(path)
        return groups

    def _note_dropped(self, dropped: list[Path], dest: str) -> None:
        """``DROPPED.<node>`` listing the bmpcmp files past the limit, uploaded to ``dest``."""
        name = self.ctx.name
        note = self.ctx.run_dir / f"{DROPPED_NOTE}.{name}"
        note.write_text(
            f"# node {name}: bmpcmp images past {BMPCMP_UPLOAD_LIMIT} bytes were "
            f"not uploaded ({len(dropped)} file(s))\n"
            + "".join(p.name + "\n" for p in dropped), encoding="utf-8")
        self.ctx.transport.upload(note, f"{dest}/{note.name}")
        log.warning("node %s: %d bmpcmp file(s) past the %d-byte limit not uploaded",
                    name, len(dropped), BMPCMP_UPLOAD_LIMIT)

    def upload_logs(self, strict: bool = False) -> None:
        """The node's log and build log to ``runs/<id>/logs/``; a failed upload raises
        ClusterError when ``strict``, else it is logged."""
        for path in (self.ctx.node_log_path, self.ctx.build_log):
            if not path.exists():
                continue
            try:
                self.ctx.transport.upload(path, f"runs/{self.ctx.start.id}/logs/{path.name}")
            except ClusterError as exc:
                if strict:
                    raise
                log.error("node %s: could not upload %s: %s", self.ctx.name, path.name, exc)

    # ------------------------------------------------------------------ result bundles
    def batch(self, unsent: list[JobResult]) -> int:
        """How many of the ``unsent`` results the next call carries: all, except in a sweep
        run, where one bundle holds each task once and is bounded in bytes
        (:meth:`cluster.node.sweepresults.Outbox.batch`); the rest go with the next.  A
        folder bundle already on the master after a failed call goes again with exactly
        its tasks (the first unsent)."""
        if self.ctx.outbox is None:
            return len(unsent)
        if self.outstanding is not None:
            return len(self.outstanding.tasks)
        return self.ctx.outbox.batch([result.name for result in unsent])

    def upload_bundle(self, results: tuple[JobResult, ...]) -> sweepresults.Bundle:
        """Pack the sweep ``results`` of a call into a bundle and put it in
        ``runs/<id>/results/incoming/``: as a folder moved there when the transport can
        (the master home on this file system: nothing copied), else as a tar file uploaded
        (the transport renames it into place whole).  A folder bundle left there by a
        failed call is named again as it is.  ClusterError or OSError when that fails:
        the call fails, the results stay."""
        outbox = self.ctx.outbox
        assert outbox is not None
        if self.outstanding is not None:
            return self.outstanding
        names = [result.name for result in results]
        where = f"runs/{self.ctx.start.id}/{BUNDLE_DIR}"
        if self.folder_bundles:
            bundle = outbox.pack_folder(names)
            try:
                moved = self.ctx.transport.move_folder(bundle.path, f"{where}/{bundle.name}")
            except BaseException:
                outbox.unpack_folder(bundle)
                raise
            if moved:
                return bundle
            outbox.unpack_folder(bundle)
            self.folder_bundles = False  # another file system: tar files from now on
            log.info("node %s: the master home is not on this file system; result bundles "
                     "go as tar files", self.ctx.name)
        bundle = outbox.pack(names)
        try:
            self.ctx.transport.upload(bundle.path, f"{where}/{bundle.name}")
        except BaseException:
            outbox.discard(bundle)
            raise
        return bundle

    def bundle_unsent(self, bundle: sweepresults.Bundle | None) -> None:
        """The call carrying ``bundle`` failed: a tar file goes, its results stay unsent
        (the next call packs them into a new bundle); a folder bundle, already moved to
        the master, goes again with the next call."""
        if bundle is None or self.ctx.outbox is None:
            return
        if bundle.folder:
            self.outstanding = bundle
        else:
            self.ctx.outbox.discard(bundle)

    def bundle_sent(self, bundle: sweepresults.Bundle) -> None:
        """The master has the call carrying ``bundle``: its results' files go."""
        assert self.ctx.outbox is not None
        self.ctx.outbox.sent(bundle)
        self.outstanding = None
