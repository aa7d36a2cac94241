"""The capability line: what a node is, as it crosses the wire (seed 000, ARTIFEX.md §2.3).

Seed 000: sendCaps "detects things like what OS is running, what version of gcc is in use,
what wordsize etc, and reports these 'capabilities' back to the central cluster master.  This
enables the clustermaster to decide what jobs can be safely sent to this machine."  The Perl
original's output format is not public (ARTIFEX.md §2.3 calls the ``$m.caps`` contents
unknown), so ours is one line of ``key=value`` words, values without spaces::

    os=Linux arch=x86_64 bits=64 cc=gcc-12.2.0 cpus=2 ram_mb=23975 tools=gs,md5sum,mutool

It travels in the ``caps`` header of every node request (seed 001) and of heartbeats; the
master judges it with :func:`suitable`.  Probing the machine is the node's business
(:mod:`cluster.node.caps`).

Usage::

    ok, why = suitable(line, needs_tools=("gs", "md5sum"), min_ram_mb=1024)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Value for a field that could not be determined (compiler missing, no tools found).
NONE = "none"


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
