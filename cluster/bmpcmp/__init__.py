"""bmpcmp: difference images between two renderings of a test (ARTIFEX.md §5.7, §6.4).

A leaf tool package (it imports only the standard library and ``cluster.runtime``), in
three modules:

* :mod:`cluster.bmpcmp.images` -- :class:`Image`, raw PNM pages in, PNG files out and back;
* :mod:`cluster.bmpcmp.diff` -- page comparison and the image sets :func:`compare_files`
  writes (their naming, their summary line);
* :mod:`cluster.bmpcmp.html` -- the master's page of a run's image sets.

Job lines run ``python3 -m cluster.bmpcmp BASE.pnm CAND.pnm OUT_ROOT [MAX_IMAGES]`` (the
command line is :mod:`cluster.cli.bmpcmp`).  The public names of the three modules are
re-exported here, so callers write ``from cluster import bmpcmp`` and ``bmpcmp.write_html``.
"""

from cluster.bmpcmp.diff import (
    MARGIN,
    MAX_IMAGES,
    SET_FILE,
    CompareResult,
    ImageSet,
    PageDiff,
    changed_pixels,
    compare_files,
    compare_pages,
    remove_sets,
)
from cluster.bmpcmp.html import DROPPED_NOTE, parse_meta, write_html
from cluster.bmpcmp.images import (
    Image,
    PnmError,
    iter_pnm,
    png_bytes,
    read_png,
    read_pnm,
    write_png,
    write_pnm,
)

__all__ = [
    "DROPPED_NOTE", "MARGIN", "MAX_IMAGES", "SET_FILE", "CompareResult", "Image", "ImageSet",
    "PageDiff", "PnmError", "changed_pixels", "compare_files", "compare_pages", "iter_pnm",
    "parse_meta", "png_bytes", "read_png", "read_pnm", "remove_sets", "write_html",
    "write_png", "write_pnm",
]
