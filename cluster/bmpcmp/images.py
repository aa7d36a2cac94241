"""Images as bmpcmp handles them: pages read from raw PNM, written and read back as PNG.

:class:`Image` is one page, 8 bits per sample, grey or RGB.  :func:`iter_pnm` reads the
pages of a raw PNM stream one at a time, as gs's pbmraw/pgmraw/ppmraw/pkmraw/pnmraw devices
and ``mutool draw -F pbm|pgm|ppm`` write it: P4, P5 or P6 pages, several pages concatenated
in one file (gs with an output file name without ``%d``, or a stream), ``#`` comments in
headers, maxval 1..255 (scaled to 255) or 65535 (high byte kept).  PAM (P7) and plain
(P1..P3) PNM are refused with :class:`PnmError`.

:func:`write_png` writes 8-bit RGB PNGs; :func:`read_png` reads them back (checks, tests).
Pure stdlib.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cluster.runtime import fsutil

#: The sample value of white (pages are padded with it, PBM's 0 bits become it).
WHITE = 255
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
        return Image(self.width, self.height, 3, grey_to_rgb(self.data))

    @classmethod
    def blank(cls, width: int, height: int, channels: int = 3) -> Image:
        """A white image."""
        return cls(width, height, channels, bytes([WHITE]) * (width * height * channels))


def grey_to_rgb(grey: bytes) -> bytes:
    out = bytearray(len(grey) * 3)
    out[0::3] = grey
    out[1::3] = grey
    out[2::3] = grey
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# PNM

#: One packed P4 byte -> eight grey bytes (PBM: bit 1 is black).
_UNPACK_BITS = [bytes(0 if (v >> (7 - i)) & 1 else WHITE for i in range(8)) for v in range(256)]
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
    """Write ``img`` to ``path`` as a PNG (see :func:`png_bytes`), atomically.

    Not fsync'ed: an image set is as cheap to make again as the job that made it, and a
    run has hundreds of them.
    """
    fsutil.atomic_write(path, png_bytes(img), fsync=False)


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
