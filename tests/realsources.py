"""The real products' sources for the real-product tests: Debian's source packages of
Ghostscript (the whole ghostpdl tree) and MuPDF, which ``etc/fetch-sources`` (the README's
set-up, and ``.ci/run``) downloads into a cache outside the checkout.

The cache is ``$CLUSTER_SOURCES``, else ``$XDG_CACHE_HOME/regression-cluster/sources``, else
``~/.cache/regression-cluster/sources`` -- the same rule as the script's.  A test that
needs a package that is not there fails under CI (``CI=true``) and is skipped elsewhere,
saying how to fetch it.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

#: Debian's builds of the products, for the build commands of the real-product tests.
#: Debian's MuPDF source keeps no third-party libraries and no font files, only the C dumps
#: of the 14 base fonts (``generated/``): MuPDF's Makefile is told to use the system's
#: libraries, to compile those dumps (no objcopy) and to leave the other fonts out.
MUPDF_DEBIAN_BUILD = (
    "make -j__slots__ build=release USE_SYSTEM_LIBS=yes USE_SYSTEM_LCMS2=yes "
    "USE_SYSTEM_MUJS=yes HAVE_X11=no HAVE_GLUT=no HAVE_CURL=no HAVE_OBJCOPY=no "
    "XCFLAGS='-DFZ_ENABLE_ICC=0 -DTOFU -DTOFU_CJK -DTOFU_SIL' "
    "FONT_BIN=\"$(cd generated && ls resources/fonts/urw/*.cff.c | sed 's/[.]c$//')\" "
    "tools")


def cache_dir() -> Path:
    """Where ``etc/fetch-sources`` puts the source packages."""
    explicit = os.environ.get("CLUSTER_SOURCES")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "regression-cluster" / "sources"


def orig_tarball(package: str) -> Path:
    """The upstream tarball (``<package>_<version>.orig.tar.*``) of Debian source package
    ``package`` in :func:`cache_dir`; the newest by name when there are several.  Fails the
    test under CI, skips it elsewhere, when there is none."""
    found = sorted(cache_dir().glob(f"{package}_*.orig.tar.*"))
    if not found:
        message = (f"Debian's source package {package} is not in {cache_dir()} "
                   "(run etc/fetch-sources)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found[-1]


def unpack(package: str, dest: Path) -> Path:
    """Unpack ``package``'s upstream tarball into ``dest`` (created); return the tree's top
    folder (the tarball's single top-level folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(orig_tarball(package)) as archive:
        archive.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    assert len(tops) == 1, f"{package}'s tarball has {len(tops)} top folders: {tops}"
    return tops[0]
