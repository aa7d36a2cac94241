"""Comparing two renderings of a test page by page, and the image sets that show the changes.

A bmpcmp job (:func:`cluster.jobs.bmpcmp.bmpcmp_jobs`) renders one test with the baseline
build and with the candidate build to raw PNM files, then runs ``python3 -m cluster.bmpcmp
BASE.pnm CAND.pnm OUT_ROOT [MAX_IMAGES]``, that is :func:`compare_files`, which compares the
pages pairwise and, for each page that differs (at most :data:`MAX_IMAGES` per test), writes
one *image set*::

    OUT_ROOT.<NNNNN>.base.png   the baseline's pixels of the region that changed
    OUT_ROOT.<NNNNN>.cand.png   the candidate's pixels of the same region
    OUT_ROOT.<NNNNN>.diff.png   the same region: unchanged pixels faded grey, changed ones red
    OUT_ROOT.<NNNNN>.meta       ``KEY=value`` lines, see :meth:`PageDiff.meta_text`

``NNNNN`` counts from 00000 (bmpcmp's "base number 0").  The ``.meta`` file is written last,
so a set whose ``.meta`` exists is complete; like checkSize.pl, which dropped sets by
deleting their ``.meta``, the master's page (:func:`cluster.bmpcmp.html.write_html`) shows
only sets with one.  The region is the bounding box of the changed pixels plus
:data:`MARGIN` pixels of context (clipped to the page), so the files stay small when a
change is small.  :data:`SET_FILE` matches the name of every file of a set (the node's
upload and the page find sets by it).

The summary (:meth:`CompareResult.summary`) has one line per set written (its file stem
and figures), or ``identical``; the job md5sums that text, so the test's md5 says which
pages changed where.

Differences from Artifex's bmpcmp.c: exact comparison only (no ``-w`` window or ``-t``
threshold), one region per page rather than tiles, PNG only (no BMP).  Pure stdlib: rows
are compared as bytes, and the pixels of rows that differ are worked on as big integers and
``bytes.translate`` tables, never one Python operation per pixel.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cluster.bmpcmp.images import WHITE, Image, grey_to_rgb, iter_pnm, write_png
from cluster.runtime import fsutil

#: At most this many image sets per test (bmpcmp's "0 100" arguments in build.pl).
MAX_IMAGES = 100
#: Pixels of unchanged context around the changed region in each image.
MARGIN = 32
#: ``<root>.<NNNNN>.<kind>``: the name of a file of an image set.
SET_FILE = re.compile(r"(?P<stem>(?P<test>.+)\.(?P<number>\d{5}))\."
                      r"(?P<kind>base\.png|cand\.png|diff\.png|meta)")


# ----------------------------------------------------------------------------------------------
# Comparing pages

@dataclass(frozen=True)
class PageDiff:
    """How two renderings of one page differ.

    ``x, y, w, h`` is the bounding box of the changed pixels and ``count`` their number, in
    the coordinates of a ``page_width`` x ``page_height`` page (the larger of the two sizes
    when they differ; pixels present on only one page count as changed).  ``crop_*`` is the
    region the three images show: the bounding box plus a margin, clipped to the page.
    ``base``, ``cand`` and ``diff`` are RGB images of that region; where one page is smaller,
    its image is white outside it.  ``note`` says what else is odd (a size change, a page
    present on only one side), or is empty.
    """

    x: int
    y: int
    w: int
    h: int
    count: int
    page_width: int
    page_height: int
    crop_x: int
    crop_y: int
    crop_w: int
    crop_h: int
    base: Image = field(repr=False)
    cand: Image = field(repr=False)
    diff: Image = field(repr=False)
    note: str = ""
    page: int = 1

    def meta_text(self) -> str:
        """The ``.meta`` file: ``KEY=value`` lines.

        ``X Y W H`` the region shown by the images, ``PW PH`` the page size, ``PAGE`` the
        page number (from 1) -- the fields bmpcmp.c wrote (ARTIFEX.md §5.7) -- then
        ``BX BY BW BH`` the bounding box of the changed pixels, ``COUNT`` their number and,
        when there is one, ``NOTE``.
        """
        lines = [f"X={self.crop_x}", f"Y={self.crop_y}", f"W={self.crop_w}",
                 f"H={self.crop_h}", f"PW={self.page_width}", f"PH={self.page_height}",
                 f"PAGE={self.page}", f"BX={self.x}", f"BY={self.y}", f"BW={self.w}",
                 f"BH={self.h}", f"COUNT={self.count}"]
        if self.note:
            lines.append("NOTE=" + " ".join(self.note.split()))
        return "\n".join(lines) + "\n"


#: Byte -> 0 for 0, 1 otherwise (which bytes of an XOR differ).
_NONZERO = bytes([0] + [1] * 255)
#: 0/1 mask byte -> 0/255.
_MASK_FF = bytes([0, 255] + [0] * 254)
#: Luminance ~ R/4 + G/2 + B/4, computed lane-wise: the three quotients add up to at most
#: 63 + 127 + 63 = 253, so adding the rows as big integers never carries between bytes.
_QUARTER = bytes(v >> 2 for v in range(256))
_HALF = bytes(v >> 1 for v in range(256))
#: Unchanged pixels: their luminance faded towards white so the red changes stand out.
_FADE = bytes(255 - (255 - v) * 2 // 5 for v in range(256))


def _to_int(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _row_mask(ra: bytes, rb: bytes, channels: int, width: int) -> bytes:
    """One byte per pixel of two equal-length rows: 1 where the pixels differ, else 0."""
    nz = (_to_int(ra) ^ _to_int(rb)).to_bytes(len(ra), "big").translate(_NONZERO)
    if channels == 1:
        return nz
    return (_to_int(nz[0::3]) | _to_int(nz[1::3]) | _to_int(nz[2::3])).to_bytes(width, "big")


def _padded_row(img: Image, y: int, width: int) -> bytes:
    """Row ``y`` of ``img`` as RGB, white beyond the image, ``width`` pixels wide."""
    if y >= img.height:
        return bytes([WHITE]) * (width * 3)
    row = img.row(y)
    if img.channels == 1:
        row = grey_to_rgb(row)
    if img.width < width:
        row += bytes([WHITE]) * ((width - img.width) * 3)
    return row


def _luminance(rgb: bytes, width: int) -> bytes:
    total = (_to_int(rgb[0::3].translate(_QUARTER)) + _to_int(rgb[1::3].translate(_HALF))
             + _to_int(rgb[2::3].translate(_QUARTER)))
    return total.to_bytes(width, "big")


def _diff_row(base_rgb: bytes, mask: bytes | None, width: int) -> bytes:
    """A row of the difference image: faded grey of the baseline, changed pixels red."""
    faded = _luminance(base_rgb, width).translate(_FADE)
    out = bytearray(width * 3)
    if mask is None:
        out[0::3] = faded
        out[1::3] = faded
        out[2::3] = faded
        return bytes(out)
    m = _to_int(mask.translate(_MASK_FF))
    f = _to_int(faded)
    keep = f & ~m  # ~m of a non-negative int is -(m+1); & with f keeps f's bits where m is 0
    out[0::3] = (f | m).to_bytes(width, "big")
    out[1::3] = keep.to_bytes(width, "big")
    out[2::3] = out[1::3]
    return bytes(out)


def compare_pages(base: Image, cand: Image, margin: int = MARGIN, note: str = "",
                  page: int = 1) -> PageDiff | None:
    """How ``cand`` differs from ``base``; None when every pixel is the same.

    Pages of different sizes always differ (``note`` says so): they are compared on the
    larger size, pixels present on only one page counting as changed.  A grey page and an
    RGB page are compared as RGB.  Rows are compared as bytes first; only rows that differ
    are examined pixel by pixel.
    """
    if (base.width, base.height) != (cand.width, cand.height):
        size_note = (f"page size differs: baseline {base.width}x{base.height}, "
                     f"candidate {cand.width}x{cand.height}")
        note = f"{note}; {size_note}" if note else size_note
    if base.channels != cand.channels:
        base, cand = base.to_rgb(), cand.to_rgb()
    ch = base.channels
    width, height = max(base.width, cand.width), max(base.height, cand.height)
    common_w, common_h = min(base.width, cand.width), min(base.height, cand.height)
    outside = b"\x01" * (width - common_w)
    masks: dict[int, bytes] = {}
    count = 0
    x0, x1, y0, y1 = width, -1, height, -1
    for y in range(height):
        if y >= common_h:
            mask = b"\x01" * width
        else:
            ra, rb = base.row(y), cand.row(y)
            if base.width != cand.width:
                ra, rb = ra[:common_w * ch], rb[:common_w * ch]
            if ra == rb:
                if not outside:
                    continue
                mask = bytes(common_w) + outside
            else:
                mask = _row_mask(ra, rb, ch, common_w) + outside
        n = mask.count(1)
        if not n:
            continue
        masks[y] = mask
        count += n
        x0 = min(x0, mask.find(1))
        x1 = max(x1, mask.rfind(1))
        y0 = min(y0, y)
        y1 = y
    if not count:
        return None
    cx0, cy0 = max(0, x0 - margin), max(0, y0 - margin)
    cx1, cy1 = min(width, x1 + 1 + margin), min(height, y1 + 1 + margin)
    cw, chh = cx1 - cx0, cy1 - cy0
    base_rows, cand_rows, diff_rows = [], [], []
    for y in range(cy0, cy1):
        brow = _padded_row(base, y, width)[cx0 * 3:cx1 * 3]
        base_rows.append(brow)
        cand_rows.append(_padded_row(cand, y, width)[cx0 * 3:cx1 * 3])
        row_mask = masks.get(y)
        diff_rows.append(_diff_row(brow, None if row_mask is None else row_mask[cx0:cx1], cw))
    return PageDiff(
        x=x0, y=y0, w=x1 - x0 + 1, h=y1 - y0 + 1, count=count,
        page_width=width, page_height=height,
        crop_x=cx0, crop_y=cy0, crop_w=cw, crop_h=chh,
        base=Image(cw, chh, 3, b"".join(base_rows)),
        cand=Image(cw, chh, 3, b"".join(cand_rows)),
        diff=Image(cw, chh, 3, b"".join(diff_rows)),
        note=note, page=page)


def changed_pixels(diff: Image) -> int:
    """The number of changed (pure red) pixels in a difference image.

    Unchanged pixels are drawn grey (R = G = B), so they are never pure red.
    """
    rgb = diff.to_rgb().data
    red = bytes(rgb[0::3]).translate(bytes([0] * 255 + [1]))
    rest = (_to_int(rgb[1::3]) | _to_int(rgb[2::3])).to_bytes(diff.width * diff.height, "big")
    return (_to_int(red) & ~_to_int(rest.translate(_NONZERO))).to_bytes(
        diff.width * diff.height, "big").count(1)


# ----------------------------------------------------------------------------------------------
# Comparing files

@dataclass(frozen=True)
class ImageSet:
    """One image set written by :func:`compare_files`: its number, files and figures."""

    number: int
    stem: str
    files: tuple[Path, ...]
    diff: PageDiff

    def summary(self) -> str:
        """The line the CLI prints (and the job md5sums) for this set."""
        d = self.diff
        return (f"{self.stem} PAGE={d.page} X={d.x} Y={d.y} W={d.w} H={d.h} "
                f"PW={d.page_width} PH={d.page_height} COUNT={d.count}")


@dataclass
class CompareResult:
    """What :func:`compare_files` compared and wrote."""

    pages: int = 0
    sets: list[ImageSet] = field(default_factory=list)
    truncated: bool = False  # max_images was reached; later pages were not compared

    @property
    def written(self) -> list[Path]:
        return [p for s in self.sets for p in s.files]

    @property
    def identical(self) -> bool:
        return not self.sets

    def summary(self) -> str:
        """The CLI's stdout: a line per set (plus a truncation line), or ``identical``."""
        if not self.sets:
            return "identical\n"
        lines = [s.summary() for s in self.sets]
        if self.truncated:
            lines.append(f"truncated at {len(self.sets)} image sets; later pages not compared")
        return "\n".join(lines) + "\n"


def remove_sets(out_root: Path) -> None:
    """Delete image sets an earlier run of the same job left at ``out_root``."""
    parent = out_root.parent
    if not parent.is_dir():
        return
    for entry in os.scandir(parent):
        m = SET_FILE.fullmatch(entry.name)
        if m and m.group("test") == out_root.name:
            os.unlink(entry.path)


def compare_files(base_path: Path, cand_path: Path, out_root: Path,
                  max_images: int = MAX_IMAGES, margin: int = MARGIN) -> CompareResult:
    """Compare two PNM files page by page; write an image set per differing page.

    Files are ``<out_root>.<NNNNN>.{base.png,cand.png,diff.png,meta}``, NNNNN from 00000,
    at most ``max_images`` sets; once that many are written, the remaining pages are not
    compared (``truncated``).  A page present in only one file is compared with a white
    page of its size and always counts as a difference.  Sets an earlier run left at
    ``out_root`` are removed first; ``out_root``'s directory is created.  Raises
    PnmError/OSError for unreadable input, OSError when the output cannot be written.
    """
    out_root = Path(out_root)
    out_root.parent.mkdir(parents=True, exist_ok=True)
    remove_sets(out_root)
    result = CompareResult()
    with open(base_path, "rb") as bf, open(cand_path, "rb") as cf:
        base_pages = iter_pnm(bf, str(base_path))
        cand_pages = iter_pnm(cf, str(cand_path))
        while True:
            if len(result.sets) >= max_images:
                # Any page left on either side would have been compared: say so.
                result.truncated = next(base_pages, None) is not None or \
                    next(cand_pages, None) is not None
                break
            base = next(base_pages, None)
            cand = next(cand_pages, None)
            if base is None and cand is None:
                break
            result.pages += 1
            note = ""
            if base is None:
                assert cand is not None
                base, note = Image.blank(cand.width, cand.height), "page only in the candidate"
            elif cand is None:
                cand, note = Image.blank(base.width, base.height), "page only in the baseline"
            diff = compare_pages(base, cand, margin, note, result.pages)
            if diff is None and note:
                # A blank extra page compares equal with white: still a difference.
                diff = _whole_page(base, cand, note, result.pages)
            if diff is not None:
                result.sets.append(_write_set(out_root, len(result.sets), diff))
    return result


def _whole_page(base: Image, cand: Image, note: str, page: int) -> PageDiff:
    w, h = base.width, base.height
    return PageDiff(x=0, y=0, w=w, h=h, count=w * h, page_width=w, page_height=h,
                    crop_x=0, crop_y=0, crop_w=w, crop_h=h, base=base.to_rgb(),
                    cand=cand.to_rgb(), diff=Image(w, h, 3, b"".join(
                        _diff_row(base.to_rgb().row(y), b"\x01" * w, w) for y in range(h))),
                    note=note, page=page)


def _write_set(out_root: Path, number: int, diff: PageDiff) -> ImageSet:
    stem = f"{out_root.name}.{number:05d}"
    files = []
    for suffix, img in (("base.png", diff.base), ("cand.png", diff.cand),
                        ("diff.png", diff.diff)):
        path = out_root.with_name(f"{stem}.{suffix}")
        write_png(path, img)
        files.append(path)
    meta = out_root.with_name(f"{stem}.meta")
    # Last: a set with a .meta is complete.  Not fsync'ed, as the images (see write_png).
    fsutil.atomic_write(meta, diff.meta_text(), fsync=False)
    files.append(meta)
    return ImageSet(number, stem, tuple(files), diff)

