"""Probing what this node is, for its capability line (port of sendCaps.pl's detection).

The line's format and how the master judges it are :mod:`cluster.wire.caps`; this module
only looks at the machine: OS, architecture, word size, C compiler (``cc --version``, run
through :mod:`cluster.runtime.proc` with a timeout), CPUs, RAM and the tools on PATH.

Usage::

    line = detect().format()
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import sys

from cluster.runtime import proc
from cluster.wire.caps import NONE, Caps

log = logging.getLogger("cluster.caps")

#: Tools a node may be asked to use; detect() reports those found on PATH.
TOOLS = ("gs", "mutool", "md5sum", "make", "git", "rsync", "gcc", "cc")

#: Longest wait for ``cc --version``; a hung compiler wrapper must not hang clusterpull.
COMPILER_TIMEOUT = 10.0

_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


def detect() -> Caps:
    """The capabilities of this machine.  Never raises: what cannot be found is "unknown",
    "none" or 0 (RAM), and the reason is logged."""
    system = platform.system() or "unknown"
    arch = platform.machine() or "unknown"
    bits = 64 if sys.maxsize > 2**32 else 32
    cpus = os.cpu_count() or 1
    ram_mb = 0
    try:
        import psutil

        ram_mb = int(psutil.virtual_memory().total // (1024 * 1024))
    except Exception:  # psutil missing or unsupported platform: report 0, don't fail the node
        log.exception("cannot read the RAM size; reporting ram_mb=0")
    tools = tuple(sorted(t for t in TOOLS if shutil.which(t)))
    return Caps(system, arch, bits, compiler_version(), cpus, ram_mb, tools)


def compiler_version() -> str:
    """``<name>-<version>`` of the C compiler (``cc`` first, then ``gcc``), or "none"."""
    for command in ("cc", "gcc"):
        exe = shutil.which(command)
        if not exe:
            continue
        try:
            done = proc.run([exe, "--version"], timeout=COMPILER_TIMEOUT,
                            env={**os.environ, "LC_ALL": "C"}).check(f"{command} --version",
                                                                       COMPILER_TIMEOUT)
        except proc.ProcessError as exc:  # cannot start, failed or timed out
            log.warning("%s", exc)
            continue
        parsed = parse_compiler_banner(done.text(), command)
        if parsed != NONE:
            return parsed
    return NONE


def parse_compiler_banner(text: str, command: str = "cc") -> str:
    """``<name>-<version>`` from the output of ``<command> --version``, or "none".

    The name is "clang" or "gcc" when the banner says so, else ``command``; the version is
    the first dotted number of the first line (``cc (Debian 12.2.0-14) 12.2.0`` ->
    ``gcc-12.2.0``, ``Apple clang version 15.0.0 (clang-1500.1)`` -> ``clang-15.0.0``).
    """
    lines = text.splitlines()
    if not lines:
        return NONE
    first = lines[0]
    match = _VERSION.search(first)
    if not match:
        return NONE
    lower = text.lower()
    if "clang" in first.lower():
        name = "clang"
    elif "gcc" in first.lower() or "free software foundation" in lower:
        # Debian's cc banner reads "cc (Debian 12.2.0-14) 12.2.0": gcc shows in the copyright.
        name = "gcc"
    else:
        name = command
    return f"{name}-{match.group(0)}"
