"""``python3 -m cluster.bmpcmp BASE.pnm CAND.pnm OUT_ROOT [MAX_IMAGES]``: compare two renderings.

The command line of :mod:`cluster.bmpcmp`; bmpcmp job lines call it (see
:func:`cluster.jobs.bmpcmp.bmpcmp_command`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.bmpcmp import MAX_IMAGES, PnmError, compare_files
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE

USAGE = ("usage: python3 -m cluster.bmpcmp BASE.pnm CAND.pnm OUT_ROOT [MAX_IMAGES]\n"
         "Compare two raw PNM files page by page; write OUT_ROOT.<NNNNN>.{base,cand,diff}.png "
         "and .meta for each page that differs.")


def main(argv: list[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return EXIT_OK
    if len(args) not in (3, 4):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    max_images = MAX_IMAGES
    if len(args) == 4:
        if not args[3].isdigit():
            print(f"bmpcmp: MAX_IMAGES {args[3]!r}: expected a whole number", file=sys.stderr)
            return EXIT_USAGE
        max_images = int(args[3])
    base, cand, root = (Path(a) for a in args[:3])
    for path in (base, cand):
        if not path.is_file():
            print(f"bmpcmp: {path}: no such file (expected a raw PNM rendering)",
                  file=sys.stderr)
            return EXIT_USAGE
    try:
        result = compare_files(base, cand, root, max_images)
    except PnmError as exc:
        print(f"bmpcmp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"bmpcmp: {exc.filename or root}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(result.summary())
    print(f"bmpcmp: {result.pages} page(s) compared, {len(result.sets)} image set(s) written",
          file=sys.stderr)
    return EXIT_OK
