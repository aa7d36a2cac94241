#!/usr/bin/env python3
"""bench/real_build.py -- what a node's build of a real product costs: first, no-op,
incremental, and a second node's build from the shared compiler cache.

Usage: python3 bench/real_build.py [--package ghostscript|mupdf] [--slots 2]
                                   [--tree DIR --edit FILE:OLD:NEW] [--keep DIR]

The tree is Debian's source package (``etc/fetch-sources``' cache, unpacked) unless
``--tree`` names one.  It is built with the command a node runs for its kind
(cluster/node/buildcmd.py): for ghostpdl the config's ``build_ghostpdl`` (configure, then
``make -j<slots> gs``), for MuPDF the Debian build of the real-product tests
(tests/realsources.py MUPDF_DEBIAN_BUILD), with ``CC='ccache gcc'`` and a fresh ccache
folder, as a node with ``build_cache`` does.  Steps, one figure each:

  first_s    the tree's first build (configure included), the cache empty
  noop_s     the same build again, nothing changed
  rebuild_s  after the one-line change (--edit; by default the e2e tests' change: the
             pgmraw maxval in devices/gdevpbm.c, the grey PNM header in output-pnm.c)
  cached_s   a second copy of the changed tree, built from nothing with the same cache:
             a second node of the machine (``cache_hits`` and ``cache_misses`` from ccache)

Prints the machine, then one line:
  package=ghostscript slots=2 first_s=83.1 noop_s=2.0 rebuild_s=8.4 compiled=1
  cached_s=20.3 cache_hits=... cache_misses=... ok=yes
``compiled`` counts the tree's C files the rebuild compiled; ok=yes when every build
exited 0 and made its programs.  Exit status 0 when ok.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python3 bench/real_build.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import figures, start  # noqa: E402
from cluster.config import Config  # noqa: E402
from cluster.node import buildcmd  # noqa: E402
from tests.realsources import MUPDF_DEBIAN_BUILD, cache_dir, extract_all  # noqa: E402

#: The e2e tests' one-line changes (file, old text, new text).
EDITS = {
    "ghostscript": ("devices/gdevpbm.c", '"pgmraw", \'5\', 1, 1, 8, 255,',
                    '"pgmraw", \'5\', 1, 1, 8, 127,'),
    "mupdf": ("source/fitz/output-pnm.c", 'fz_write_printf(ctx, out, "P5\\n");',
              'fz_write_printf(ctx, out, "P5\\n# grey\\n");'),
}
#: A compile line of a C file of the tree, in either build system's output.
_COMPILED = re.compile(r"(?:\s-c\s(?:-o\s\S+\s)?\S+\.c\b|^\s+CC build/\S+\.o$)", re.M)


def unpack(package: str, dest: Path) -> Path:
    """Debian's upstream tarball of ``package`` unpacked into ``dest``; its top folder."""
    found = sorted(cache_dir().glob(f"{package}_*.orig.tar.*"))
    if not found:
        raise SystemExit(f"real_build: no {package} source in {cache_dir()} "
                         "(run etc/fetch-sources)")
    with tarfile.open(found[-1]) as archive:
        extract_all(archive, dest)
    return next(p for p in dest.iterdir() if p.is_dir())


def command_for(tree: Path, slots: int) -> tuple[str, str]:
    """(shell command, binaries folder) a node runs for ``tree``'s kind."""
    kind = buildcmd.tree_kind(tree)
    cfg = Config()
    command = {buildcmd.GHOSTPDL: cfg.build_ghostpdl.replace(buildcmd.TARGETS, "gs"),
               buildcmd.MUPDF: MUPDF_DEBIAN_BUILD}.get(kind, cfg.build_command)
    return command.replace(buildcmd.SLOTS, str(slots)), buildcmd.BIN_DIRS[kind]


def build(tree: Path, command: str, cache: Path, log: Path) -> tuple[float, int, bool]:
    """Run ``command`` in ``tree`` with ccache in ``cache``: (seconds, C files compiled,
    exit 0)."""
    env = {**os.environ, "CC": "ccache gcc", "CCACHE_DIR": str(cache)}
    began = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run(command, shell=True, cwd=tree, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=3600)
    seconds = time.monotonic() - began
    text = log.read_text(encoding="utf-8", errors="replace")
    return seconds, len(_COMPILED.findall(text)), done.returncode == 0


def cache_stats(cache: Path) -> dict[str, int]:
    """ccache's hit and miss counts of ``cache`` (0 when it cannot say)."""
    done = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True,
                          env={**os.environ, "CCACHE_DIR": str(cache)}, timeout=60)
    stats = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    hits = int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0))
    return {"hits": hits, "misses": int(stats.get("cache_miss", 0))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", choices=sorted(EDITS), default="ghostscript")
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tree", type=Path, help="build this tree instead of the package's")
    parser.add_argument("--edit", help="FILE:OLD:NEW, the one-line change (with --tree)")
    parser.add_argument("--keep", type=Path, help="work here and keep it")
    args = parser.parse_args(argv)
    work = start("real_build", ["ccache", "make", "gcc"], args.keep)
    if work is None:
        return 2
    if args.tree is not None:
        if not args.edit or args.edit.count(":") < 2:
            parser.error("--tree needs --edit FILE:OLD:NEW")
        rel, old, new = args.edit.split(":", 2)
        tree = work / "first" / args.tree.name
        shutil.copytree(args.tree, tree, symlinks=True)
    else:
        rel, old, new = EDITS[args.package]
        tree = unpack(args.package, work / "first")
    second = work / "second" / tree.name
    shutil.copytree(tree, second, symlinks=True)  # pristine: the second node's copy
    cache = work / "ccache"
    command, bin_dir = command_for(tree, args.slots)
    first_s, _, ok1 = build(tree, command, cache, work / "first.log")
    noop_s, _, ok2 = build(tree, command, cache, work / "noop.log")
    for copy in (tree, second):
        source = copy / rel
        text = source.read_text(encoding="latin-1")
        if text.count(old) != 1:
            raise SystemExit(f"real_build: {source} holds {text.count(old)} copies of {old!r}; "
                             "expected one")
        source.write_text(text.replace(old, new), encoding="latin-1")
    rebuild_s, compiled, ok3 = build(tree, command, cache, work / "rebuild.log")
    before = cache_stats(cache)
    cached_s, _, ok4 = build(second, command, cache, work / "cached.log")
    after = cache_stats(cache)
    made = all(any((t / bin_dir).iterdir()) for t in (tree, second) if (t / bin_dir).is_dir())
    ok = ok1 and ok2 and ok3 and ok4 and made
    print(figures({"package": args.tree.name if args.tree else args.package,
                   "slots": args.slots, "first_s": f"{first_s:.2f}", "noop_s": f"{noop_s:.2f}",
                   "rebuild_s": f"{rebuild_s:.2f}", "compiled": compiled,
                   "cached_s": f"{cached_s:.2f}",
                   "cache_hits": after["hits"] - before["hits"],
                   "cache_misses": after["misses"] - before["misses"],
                   "ok": "yes" if ok else "no"}), flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"# logs in {work}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
