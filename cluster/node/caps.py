"""What a node is: the capability string of sendCaps.pl (seed 000, ARTIFEX.md §2.3).

Seed 000: sendCaps "detects things like what OS is running, what version of gcc is in use,
what wordsize etc, and reports these 'capabilities' back to the central cluster master.  This
enables the clustermaster to decide what jobs can be safely sent to this machine."  The Perl
original's output format is not public (ARTIFEX.md §2.3 calls the ``$m.caps`` contents
unknown), so ours is one line of ``key=value`` words, values without spaces::

    os=Linux arch=x86_64 bits=64 cc=gcc-12.2.0 cpus=2 ram_mb=23975 tools=gs,md5sum,mutool

It travels in the ``caps`` header of every node request (seed 001) and of heartbeats; the
master judges it with :func:`suitable`.

Usage::

    line = detect().format()
    ok, why = suitable(line, needs_tools=("gs", "md5sum"), min_ram_mb=1024)
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("cluster.caps")

#: Tools a node may be asked to use; detect() reports those found on PATH.
TOOLS = ("gs", "mutool", "md5sum", "make", "git", "rsync", "gcc", "cc")

#: Value for a field that could not be determined (compiler missing, no tools found).
NONE = "none"

#: Longest wait for ``cc --version``; a hung compiler wrapper must not hang clusterpull.
COMPILER_TIMEOUT = 10.0

_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


@dataclass(frozen=True)
class Caps:
    """The capabilities of one node.  ``format()`` gives the wire line."""

    os: str
    arch: str
    bits: int
    compiler: str  # "gcc-12.2.0", "clang-15.0.0" or "none"
    cpus: int
    ram_mb: int
    tools: tuple[str, ...]  # names from TOOLS found on PATH, sorted

    def format(self) -> str:
        """One line of ``key=value`` words; every value is free of whitespace and ``=``."""
        words = {
            "os": self.os,
            "arch": self.arch,
            "bits": str(self.bits),
            "cc": self.compiler,
            "cpus": str(self.cpus),
            "ram_mb": str(self.ram_mb),
            "tools": ",".join(self.tools) or NONE,
        }
        return " ".join(f"{key}={_clean(value)}" for key, value in words.items())


def _clean(value: str) -> str:
    # A space or '=' inside a value would split or confuse the word on the master's side.
    cleaned = re.sub(r"[\s=]+", "_", value.strip())
    return cleaned or "unknown"


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
            proc = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                  timeout=COMPILER_TIMEOUT, check=False,
                                  env={**os.environ, "LC_ALL": "C"})
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s --version failed: %s", command, exc)
            continue
        parsed = parse_compiler_banner(proc.stdout, command)
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


def parse_caps(text: str) -> dict[str, str]:
    """The ``key=value`` words of a caps line.  Words without ``=`` or with an empty key are
    ignored (the line comes from a node and may be old, new or damaged)."""
    out: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key:
            out[key] = value
    return out


def caps_tools(caps: dict[str, str]) -> set[str]:
    """The tool names of parsed caps ("none" or absent -> empty)."""
    raw = caps.get("tools", "")
    return {t for t in raw.split(",") if t and t != NONE}


def suitable(caps_text: str, needs_tools: Iterable[str] = (),
             min_ram_mb: int = 0) -> tuple[bool, str]:
    """Whether a node with ``caps_text`` can run jobs needing ``needs_tools`` and
    ``min_ram_mb`` MiB of RAM.

    Returns ``(True, "")`` or ``(False, reason)``, the reason naming everything missing,
    e.g. ``"missing tools: gs, mutool; ram_mb 512 is below 1024"``.
    """
    caps = parse_caps(caps_text)
    problems: list[str] = []
    have = caps_tools(caps)
    missing = sorted(set(needs_tools) - have)
    if missing:
        problems.append("missing tools: " + ", ".join(missing))
    if min_ram_mb > 0:
        raw = caps.get("ram_mb")
        try:
            ram = int(raw) if raw is not None else None
        except ValueError:
            ram = None
        if ram is None:
            problems.append(f"caps carry no valid ram_mb (got {raw!r}), need {min_ram_mb}")
        elif ram < min_ram_mb:
            problems.append(f"ram_mb {ram} is below {min_ram_mb}")
    return (not problems, "; ".join(problems))
