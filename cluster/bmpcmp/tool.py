"""bmpcmp: difference images between two renderings of a test (ARTIFEX.md §5.7, §6.4).

A bmpcmp job (:func:`cluster.jobgen.bmpcmp_jobs`) renders one test with the baseline build
and with the candidate build to raw PNM files, then runs this module::

    python3 -m cluster.bmpcmp BASE.pnm CAND.pnm OUT_ROOT

which compares the pages pairwise and, for each page that differs (at most
:data:`MAX_IMAGES` per test), writes one *image set*::

    OUT_ROOT.<NNNNN>.base.png   the baseline's pixels of the region that changed
    OUT_ROOT.<NNNNN>.cand.png   the candidate's pixels of the same region
    OUT_ROOT.<NNNNN>.diff.png   the same region: unchanged pixels faded grey, changed ones red
    OUT_ROOT.<NNNNN>.meta       ``KEY=value`` lines, see :class:`PageDiff.meta_text`

``NNNNN`` counts from 00000 (bmpcmp's "base number 0").  The ``.meta`` file is written last,
so a set whose ``.meta`` exists is complete; like checkSize.pl, which dropped sets by
deleting their ``.meta``, the master's page (:func:`write_html`) shows only sets with one.
The region is the bounding box of the changed pixels plus :data:`MARGIN` pixels of context
(clipped to the page), so the files stay small when a change is small.

On stdout the CLI prints one summary line per set written (its file stem and figures), or
``identical``; the job md5sums that text, so the test's md5 says which pages changed where.
Exit status 0 (identical or images written), 2 for unreadable or malformed input (the
message names the file and what was expected), 1 when the output cannot be written.

Input: raw PNM as gs's pbmraw/pgmraw/ppmraw/pkmraw/pnmraw devices and ``mutool draw -F
pbm|pgm|ppm`` write it: P4, P5 or P6 pages, several pages concatenated in one file (gs with
an output file name without ``%d``, or a stream), ``#`` comments in headers, maxval 1..255
(scaled to 255) or 65535 (high byte kept).  PAM (P7) and plain (P1..P3) PNM are refused.

The master puts the sets on one page with :func:`write_html`; :func:`read_png` and
:func:`changed_pixels` read an image back (checks, tests).

Differences from Artifex's bmpcmp.c: exact comparison only (no ``-w`` window or ``-t``
threshold), one region per page rather than tiles, PNG only (no BMP).  Pure stdlib: rows
are compared as bytes, and the pixels of rows that differ are worked on as big integers and
``bytes.translate`` tables, never one Python operation per pixel.
"""

from __future__ import annotations

import html
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

#: At most this many image sets per test (bmpcmp's "0 100" arguments in build.pl).
MAX_IMAGES = 100
#: Pixels of unchanged context around the changed region in each image.
MARGIN = 32
#: The kinds of file in an image set, in the order they are written (.meta last).
SET_SUFFIXES = ("base.png", "cand.png", "diff.png", "meta")
#: ``<root>.<NNNNN>.<kind>``: the name of a file of an image set.
SET_FILE = re.compile(r"(?P<stem>(?P<test>.+)\.(?P<number>\d{5}))\."
                      r"(?P<kind>base\.png|cand\.png|diff\.png|meta)")
#: Note files the node writes when its upload limit dropped image sets (``DROPPED`` or
#: ``DROPPED.<node>``): ``#`` lines say why, the other lines name the files not uploaded.
DROPPED_NOTE = "DROPPED"

_WHITE = 255
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class PnmError(ValueError):
    """Input that is not the raw PNM this module reads; the message names file and cause."""


# ----------------------------------------------------------------------------------------------
# Images

@dataclass(frozen=True)
class Image:
    """A page: ``channels`` 1 (grey) or 3 (RGB), 8 bits per sample, rows top to bottom."""

    width: int
    height: int
    channels: int
    data: bytes

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, not {self.channels}")
        if len(self.data) != self.width * self.height * self.channels:
            raise ValueError(f"{self.width}x{self.height}x{self.channels} image needs "
                             f"{self.width * self.height * self.channels} bytes, "
                             f"got {len(self.data)}")

    @property
    def stride(self) -> int:
        return self.width * self.channels

    def row(self, y: int) -> bytes:
        """Row ``y`` as bytes (``stride`` of them)."""
        start = y * self.stride
        return self.data[start:start + self.stride]

    def to_rgb(self) -> Image:
        """This image with three channels (a grey value repeated)."""
        if self.channels == 3:
            return self
        return Image(self.width, self.height, 3, _grey_to_rgb(self.data))

    @classmethod
    def blank(cls, width: int, height: int, channels: int = 3) -> Image:
        """A white image."""
        return cls(width, height, channels, bytes([_WHITE]) * (width * height * channels))


def _grey_to_rgb(grey: bytes) -> bytes:
    out = bytearray(len(grey) * 3)
    out[0::3] = grey
    out[1::3] = grey
    out[2::3] = grey
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# PNM

#: One packed P4 byte -> eight grey bytes (PBM: bit 1 is black).
_UNPACK_BITS = [bytes(0 if (v >> (7 - i)) & 1 else _WHITE for i in range(8)) for v in range(256)]
_PNM_KINDS = {b"P4": 1, b"P5": 1, b"P6": 3}  # magic -> channels of the Image made


def _header_token(fh: BinaryIO, name: str, what: str, page: int) -> tuple[bytes, int]:
    """The next whitespace-separated header token, skipping ``#`` comments.

    Returns the token and the one byte that ended it (which must be whitespace).
    """
    token = b""
    while True:
        c = fh.read(1)
        if not c:
            raise PnmError(f"{name}: page {page}: the file ends inside the PNM header "
                           f"(expected {what})")
        if c == b"#" and not token:
            while c not in (b"\n", b"\r", b""):
                c = fh.read(1)
            continue
        if c.isspace():
            if token:
                return token, c[0]
            continue
        token += c
        if len(token) > 10:
            raise PnmError(f"{name}: page {page}: expected {what} in the PNM header, "
                           f"found {token!r}...")


def _header_int(fh: BinaryIO, name: str, what: str, page: int, limit: int) -> int:
    token, _ = _header_token(fh, name, what, page)
    if not token.isdigit() or not 1 <= int(token) <= limit:
        raise PnmError(f"{name}: page {page}: expected {what} (1..{limit}) in the PNM "
                       f"header, found {token.decode('latin-1')!r}")
    return int(token)


def iter_pnm(fh: BinaryIO, name: str = "<stream>") -> Iterator[Image]:
    """The pages of a raw PNM stream, read one at a time (so memory holds one page).

    ``name`` is used in error messages.  Raises :class:`PnmError` on a bad header, a
    truncated page, or trailing bytes that are not whitespace; an empty stream has no pages.
    """
    page = 0
    while True:
        first = fh.read(1)
        while first and first.isspace():  # writers may end a page with a newline
            first = fh.read(1)
        if not first:
            return
        page += 1
        magic = first + fh.read(1)
        if magic not in _PNM_KINDS:
            raise PnmError(f"{name}: page {page}: expected a raw PNM header (P4, P5 or P6, "
                           f"as the pbmraw/pgmraw/ppmraw devices write), found "
                           f"{magic!r}")
        # One token at a time: the byte after the last header number is the single
        # whitespace that separates header and data, and must not be consumed twice.
        width = _header_int(fh, name, "the page width", page, 1 << 20)
        height = _header_int(fh, name, "the page height", page, 1 << 20)
        maxval = 1 if magic == b"P4" else _header_int(fh, name, "the maxval", page, 65535)
        if magic == b"P4":
            row_bytes = (width + 7) // 8
        else:
            row_bytes = width * _PNM_KINDS[magic] * (2 if maxval > 255 else 1)
        size = row_bytes * height
        data = fh.read(size)
        if len(data) != size:
            raise PnmError(f"{name}: page {page}: expected {size} bytes of {width}x{height} "
                           f"{magic.decode()} raster data, found only {len(data)}")
        yield _decode(magic, width, height, maxval, row_bytes, data, name, page)


def _decode(magic: bytes, width: int, height: int, maxval: int, row_bytes: int, data: bytes,
            name: str, page: int) -> Image:
    channels = _PNM_KINDS[magic]
    if magic == b"P4":
        unpack = _UNPACK_BITS.__getitem__
        rows = [b"".join(map(unpack, data[y * row_bytes:(y + 1) * row_bytes]))[:width]
                for y in range(height)]
        return Image(width, height, 1, b"".join(rows))
    if maxval > 255:
        if maxval != 65535:
            raise PnmError(f"{name}: page {page}: expected maxval 1..255 or 65535, "
                           f"found {maxval}")
        data = data[0::2]  # big-endian 16-bit samples: the high byte is the 8-bit value
    elif maxval != 255:
        data = data.translate(bytes(min(v * 255 // maxval, 255) for v in range(256)))
    return Image(width, height, channels, data)


def read_pnm(path: Path) -> list[Image]:
    """Every page of the PNM file ``path`` (PnmError or OSError when it cannot be read)."""
    with open(path, "rb") as fh:
        return list(iter_pnm(fh, str(path)))


def write_pnm(path: Path, pages: list[Image]) -> None:
    """Write ``pages`` as concatenated P5/P6 pages (used by tests and for debugging)."""
    with open(path, "wb") as fh:
        for img in pages:
            magic = b"P5" if img.channels == 1 else b"P6"
            fh.write(magic + f"\n{img.width} {img.height}\n255\n".encode() + img.data)


# ----------------------------------------------------------------------------------------------
# PNG

def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + \
        struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bytes(img: Image) -> bytes:
    """``img`` as a PNG file: 8-bit RGB (grey images are expanded), no interlace."""
    rgb = img.to_rgb()
    ihdr = struct.pack(">IIBBBBB", rgb.width, rgb.height, 8, 2, 0, 0, 0)
    comp = zlib.compressobj(6)
    parts = []
    stride = rgb.stride
    for y in range(rgb.height):
        # Filter type 0 (None) per row: the faded difference images are mostly flat, which
        # deflate handles well without per-byte filtering arithmetic in Python.
        parts.append(comp.compress(b"\x00" + rgb.data[y * stride:(y + 1) * stride]))
    parts.append(comp.flush())
    return (_PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"".join(parts))
            + _chunk(b"IEND", b""))


def write_png(path: Path, img: Image) -> None:
    """Write ``img`` to ``path`` as a PNG (see :func:`png_bytes`)."""
    Path(path).write_bytes(png_bytes(img))


#: PNG colour type -> samples per pixel, for the 8-bit non-palette types read_png takes.
_PNG_SAMPLES = {0: 1, 2: 3, 4: 2, 6: 4}


def read_png(path: Path) -> Image:
    """Read an 8-bit, non-interlaced grey/RGB(A) PNG such as :func:`write_png` writes.

    For looking at the images afterwards (the master, tests); alpha is dropped.  Checks
    the signature and every chunk's CRC; ValueError names the file and the problem.
    """
    data = Path(path).read_bytes()
    if data[:8] != _PNG_SIGNATURE:
        raise ValueError(f"{path}: not a PNG file (bad signature)")
    pos, idat, header = 8, [], None
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length] or b"\0" * 4)
        if crc != zlib.crc32(kind + body) & 0xFFFFFFFF:
            raise ValueError(f"{path}: bad CRC in chunk {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in _PNG_SAMPLES or interlace:
        raise ValueError(f"{path}: only 8-bit non-interlaced grey/RGB(A) PNG is read")
    bpp = _PNG_SAMPLES[colour]
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        ftype, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if ftype:
            _unfilter(ftype, row, prev, bpp)
        rows.append(bytes(row))
        prev = row
    pixels = b"".join(rows)
    if colour == 4:
        pixels = pixels[0::2]
    elif colour == 6:
        rgb = bytearray(width * height * 3)
        rgb[0::3], rgb[1::3], rgb[2::3] = pixels[0::4], pixels[1::4], pixels[2::4]
        pixels = bytes(rgb)
    return Image(width, height, 1 if colour in (0, 4) else 3, pixels)


def _unfilter(ftype: int, row: bytearray, prev: bytearray, bpp: int) -> None:
    """Undo PNG filter ``ftype`` on ``row`` in place (slow path: write_png uses none)."""
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if ftype == 1:
            pred = a
        elif ftype == 2:
            pred = b
        elif ftype == 3:
            pred = (a + b) // 2
        elif ftype == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        else:
            raise ValueError(f"unknown PNG filter type {ftype}")
        row[i] = (row[i] + pred) & 255


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
        return bytes([_WHITE]) * (width * 3)
    row = img.row(y)
    if img.channels == 1:
        row = _grey_to_rgb(row)
    if img.width < width:
        row += bytes([_WHITE]) * ((width - img.width) * 3)
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
        mask = masks.get(y)
        diff_rows.append(_diff_row(brow, None if mask is None else mask[cx0:cx1], cw))
    return PageDiff(
        x=x0, y=y0, w=x1 - x0 + 1, h=y1 - y0 + 1, count=count,
        page_width=width, page_height=height,
        crop_x=cx0, crop_y=cy0, crop_w=cw, crop_h=chh,
        base=Image(cw, chh, 3, b"".join(base_rows)),
        cand=Image(cw, chh, 3, b"".join(cand_rows)),
        diff=Image(cw, chh, 3, b"".join(diff_rows)),
        note=note, page=page)


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
    meta.write_text(diff.meta_text(), encoding="utf-8")  # last: the set is complete
    files.append(meta)
    return ImageSet(number, stem, tuple(files), diff)


# ----------------------------------------------------------------------------------------------
# The HTML page

def parse_meta(text: str) -> dict[str, str]:
    """``KEY=value`` lines of a ``.meta`` file as a dict (other lines ignored)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _dropped(images_dir: Path) -> tuple[list[str], list[str]]:
    """(reasons, file names) from the DROPPED notes the nodes uploaded."""
    reasons: list[str] = []
    names: list[str] = []
    for path in sorted(images_dir.iterdir()):
        if not (path.name == DROPPED_NOTE or path.name.startswith(DROPPED_NOTE + ".")):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("#"):
                reasons.append(line.lstrip("# "))
            elif line:
                names.append(line)
    return reasons, names


_STYLE = """\
body { font-family: sans-serif; margin: 1em; }
.set { margin-bottom: 2em; }
.images { display: flex; flex-wrap: wrap; gap: 8px; align-items: flex-start; }
figure { margin: 0; }
figcaption { font-size: small; color: #444; }
img { border: 1px solid #888; image-rendering: pixelated; max-width: 100%; }
.note { color: #a00; }
table.figures td { padding: 0 0.6em 0 0; font-size: small; }
"""


def write_html(images_dir: Path, out: Path, title: str) -> int:
    """Write one HTML page showing every complete image set in ``images_dir``.

    Sets are found by their ``.meta`` files (a set without one is not shown), grouped by
    test id and ordered by test id and set number.  Each set shows the baseline, candidate
    and difference images side by side with the test id, the page and the ``.meta``
    figures.  Links are relative to ``out``'s directory; every name and value is escaped
    (test ids come from file names).  ``DROPPED`` notes (image sets a node did not upload
    because of its size limit) are summarised at the top.  Returns the number of sets shown.
    """
    images_dir = Path(images_dir)
    out = Path(out)
    rel = os.path.relpath(images_dir.resolve(), out.parent.resolve())
    prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"

    def href(name: str) -> str:
        return html.escape(prefix + quote(name), quote=True)

    sets: dict[str, list[tuple[int, str, dict[str, str]]]] = {}
    for path in images_dir.iterdir() if images_dir.is_dir() else ():
        m = SET_FILE.fullmatch(path.name)
        if m is None or m.group("kind") != "meta":
            continue
        try:
            meta = parse_meta(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        sets.setdefault(m.group("test"), []).append((int(m.group("number")), m.group("stem"),
                                                     meta))
    esc = html.escape
    body: list[str] = []
    reasons, dropped = _dropped(images_dir) if images_dir.is_dir() else ([], [])
    if dropped:
        dropped_sets = sorted({m.group("stem") for name in dropped
                               if (m := SET_FILE.fullmatch(name)) is not None})
        body.append('<div class="note"><p>')
        body.append(f"{len(dropped_sets)} image set(s) ({len(dropped)} file(s)) are not "
                    "shown: a node's difference images passed its upload size limit, and "
                    "later images were dropped.")
        for reason in dict.fromkeys(reasons):
            body.append(f"<br>{esc(reason)}")
        body.append("</p><details><summary>dropped files</summary><ul>")
        body.extend(f"<li>{esc(name)}</li>" for name in dropped)
        body.append("</ul></details></div>")
    shown = 0
    for test in sorted(sets):
        body.append(f'<h2 id="{esc(quote(test), quote=True)}">{esc(test)}</h2>')
        for _number, stem, meta in sorted(sets[test], key=lambda s: s[0]):
            shown += 1
            figures = "".join(f"<td>{esc(k)}={esc(v)}</td>" for k, v in meta.items()
                              if k != "NOTE")
            body.append('<div class="set">')
            body.append(f"<p>page {esc(meta.get('PAGE', '?'))}, {esc(meta.get('COUNT', '?'))} "
                        f"changed pixel(s) &mdash; {esc(stem)}</p>")
            body.append(f'<table class="figures"><tr>{figures}</tr></table>')
            if meta.get("NOTE"):
                body.append(f'<p class="note">{esc(meta["NOTE"])}</p>')
            body.append('<div class="images">')
            for suffix, caption in (("base.png", "baseline"), ("cand.png", "candidate"),
                                    ("diff.png", "difference")):
                name = f"{stem}.{suffix}"
                if (images_dir / name).is_file():
                    img = (f'<a href="{href(name)}"><img src="{href(name)}" '
                           f'alt="{esc(caption)}"></a>')
                else:
                    img = "<p>(missing)</p>"
                body.append(f"<figure>{img}<figcaption>{esc(caption)}</figcaption></figure>")
            body.append("</div></div>")
    if not shown:
        body.append("<p>No difference images.</p>")
    page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title>\n<style>\n{_STYLE}</style></head>\n<body>\n"
            f"<h1>{esc(title)}</h1>\n<p>{shown} image set(s) in {len(sets)} test(s): "
            "baseline, candidate, and their difference (changed pixels in red).</p>\n"
            + "\n".join(body) + "\n</body></html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return shown


# ----------------------------------------------------------------------------------------------
# CLI
