"""What a program loads and runs on this node: the files its output can depend on besides
the tree it was built from (docs/results.md, "A job's key").

:meth:`Resolver.load_set` follows a program the way the node would run it:

* an **ELF** program: its shared libraries as the dynamic loader resolves them here, now,
  with the environment the jobs run with (``LD_LIBRARY_PATH``, ``LD_PRELOAD``, the
  loader's cache): the loader named by the program's ``PT_INTERP`` is run in trace mode
  (``LD_TRACE_LOADED_OBJECTS=1``, what ``ldd`` does; the program itself is not run), and
  every library it lists, the loader included, is a file of the set; a library it does
  not find is a part ``missing:<name>`` (so its later appearance changes the key).  A
  static program (no ``PT_INTERP``) loads nothing.
* a **script** (``#!``; a text file without one runs under ``/bin/sh``): its interpreter,
  and every word of it (comments aside) that names a file: an absolute path of a regular
  file (any: a data file it reads counts too), or a bare command word that the jobs'
  ``PATH`` resolves to an executable.  Each executable found is followed in turn (a
  script to :data:`MAX_DEPTH` levels), so a wrapper's key covers the installed program it
  calls and that program's libraries.  Relative paths and words built at run time
  (``$var``, ``$(...)``) are not followed: what cannot be found by looking belongs in the
  node's ``reuse_environment``.

Every file is named by the path it was reached by (``/bin/sh``, not ``dash``) and valued by
its content's sha256 through the node's :class:`cluster.node.hashcache.HashCache`, which
also keeps each file's *note* (ELF and its loader, or a script's words): a second look at
unchanged files opens none of them; only the loader's trace runs again.

Bounds: :data:`MAX_FILES` files per program (beyond: a part ``truncated``), the first
:data:`cluster.node.hashcache.HEAD` bytes of a script scanned, :data:`MAX_WORDS` words
each, :data:`LOADER_TIMEOUT` per trace.  A program whose loader cannot be run (a foreign
binary, a missing loader, a trace that fails) raises :class:`LoadSetError`: it gets no key
rather than a key that misses its libraries.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Mapping
from pathlib import Path

from cluster.node.hashcache import HashCache

#: How deep scripts naming scripts are followed.
MAX_DEPTH = 4
#: The most files one program's set holds (its libraries and what its scripts name).
MAX_FILES = 2000
#: The most words one script contributes.
MAX_WORDS = 4096
#: Longest wait for a loader's trace [s].
LOADER_TIMEOUT = 30.0
#: ELF program header type of the interpreter's path.
_PT_INTERP = 3
#: Most program headers read (a bound against a corrupt header).
_MAX_PHNUM = 4096
#: A bare command word worth looking up on PATH.
_COMMAND = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+-]{0,127}")
#: What separates a script's words: blanks, quotes, shell operators, assignments, colons
#: (PATH lists).
_SEPARATORS = re.compile(r"[\s'\"`;|&()<>=:,{}]+")
#: The loader's trace lines: ``name => /path (0x...)``, ``name => not found``, ``/path (0x...)``.
_ARROW = re.compile(r"^\s*(\S+)\s+=>\s+(.*?)\s*(?:\(0x[0-9a-fA-F]+\))?\s*$")
_DIRECT = re.compile(r"^\s*(/\S+)\s+\(0x[0-9a-fA-F]+\)\s*$")

#: Note kinds (:func:`describe`).
ELF, SCRIPT, DATA = "elf", "script", "data"


class LoadSetError(Exception):
    """A program's libraries cannot be known on this node (names the program and why)."""


def describe(head: bytes) -> str:
    """The note of a file from its first bytes: ``elf <interpreter>`` (``elf`` alone for
    a static one), ``script <interpreter>`` then one word per line, or ``data``."""
    if head[:4] == b"\x7fELF":
        interp = elf_interpreter(head)
        return f"{ELF} {interp}" if interp else ELF
    if not head or b"\0" in head:
        return DATA
    text = head.decode("utf-8", errors="surrogateescape")
    interp = "/bin/sh"
    first, _, rest = text.partition("\n")
    if first.startswith("#!"):
        words = first[2:].split()
        if words:
            interp = words[0]
        lines = [" ".join(words[1:])] + rest.splitlines()
    else:
        lines = text.splitlines()
    seen: dict[str, None] = {}
    for line in lines:
        if line.lstrip().startswith("#"):
            continue
        for word in _SEPARATORS.split(line):
            if word and "\n" not in word and (word.startswith("/") or _COMMAND.fullmatch(word)):
                seen.setdefault(word, None)
        if len(seen) >= MAX_WORDS:
            break
    return "\n".join([f"{SCRIPT} {interp}", *list(seen)[:MAX_WORDS]])


def elf_interpreter(head: bytes) -> str:
    """The ``PT_INTERP`` path of the ELF file whose first bytes are ``head``; "" for a
    static program.  LoadSetError for a header that does not parse within ``head``."""
    try:
        cls, data = head[4], head[5]
        end = "<" if data == 1 else ">"
        if cls == 2:
            (phoff,) = struct.unpack_from(end + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
        else:
            (phoff,) = struct.unpack_from(end + "I", head, 28)
            phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
        for i in range(min(phnum, _MAX_PHNUM)):
            at = phoff + i * phentsize
            (p_type,) = struct.unpack_from(end + "I", head, at)
            if p_type != _PT_INTERP:
                continue
            if cls == 2:
                (offset,) = struct.unpack_from(end + "Q", head, at + 8)
                (size,) = struct.unpack_from(end + "Q", head, at + 32)
            else:
                (offset,) = struct.unpack_from(end + "I", head, at + 4)
                (size,) = struct.unpack_from(end + "I", head, at + 16)
            if offset + size > len(head):
                raise LoadSetError("its ELF interpreter's path lies beyond the bytes read")
            return head[offset:offset + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
    except (struct.error, IndexError):
        raise LoadSetError("its ELF header does not parse") from None
    return ""


class Resolver:
    """Follows programs to the files they load and run (module docstring), through
    ``cache`` (file hashes and notes) and with ``env`` (the jobs' environment: its
    ``PATH`` for bare words, the loader's variables for the trace).  Traces and sets are
    remembered for the resolver's life: make one per computation."""

    def __init__(self, cache: HashCache, env: Mapping[str, str]) -> None:
        self.cache = cache
        self.env = dict(env)
        self.path_var = self.env.get("PATH", os.defpath)
        self._libraries: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def load_set(self, program: Path) -> dict[str, str]:
        """The parts of what ``program`` loads and runs, itself included: absolute path ->
        content sha256, ``missing:<library>`` -> ``not found``, and ``truncated`` -> ``yes``
        when :data:`MAX_FILES` cut the walk.  OSError when ``program`` cannot be read;
        LoadSetError when its libraries (or those of an executable it runs) cannot be
        known."""
        parts: dict[str, str] = {}
        self._follow(str(program), parts, MAX_DEPTH, program)
        return parts

    def _add(self, path: str, parts: dict[str, str], note: bool) -> tuple[bool, str]:
        """Hash ``path`` into ``parts``: (whether there was room for it, its note when
        ``note`` else "")."""
        if len(parts) >= MAX_FILES:
            parts["truncated"] = "yes"
            return False, ""
        entry = self.cache.lookup(path, describe if note else None)
        parts[path] = entry.sha256
        return True, entry.note or ""

    def _follow(self, path: str, parts: dict[str, str], depth: int, top: Path) -> None:
        if path in parts:
            return
        room, note = self._add(path, parts, note=True)
        if not room:
            return
        kind, _, rest = note.partition(" ")
        if kind == ELF:
            interp = rest
            if interp:
                self._libraries_of(path, interp, parts, top)
        elif kind == SCRIPT and depth > 0:
            interp, _, words = rest.partition("\n")
            self._follow_word(interp, parts, depth - 1, top, must_run=True)
            for word in words.split("\n") if words else ():
                self._follow_word(word, parts, depth - 1, top)

    def _follow_word(self, word: str, parts: dict[str, str], depth: int, top: Path,
                     must_run: bool = False) -> None:
        """A script's word: an absolute path of a regular file (followed when executable),
        or a bare command the PATH resolves.  ``must_run``: the script's interpreter, which
        LoadSetError names when it does not exist."""
        if word.startswith("/"):
            target: str | None = word if os.path.isfile(word) else None
        else:
            target = shutil.which(word, path=self.path_var)
            if target is not None and not os.path.isabs(target):
                target = None  # a relative PATH entry: where the job runs, not known here
        if target is None:
            if must_run:
                raise LoadSetError(f"{top}: its interpreter {word} is not a file")
            return
        if os.access(target, os.X_OK):
            self._follow(target, parts, depth, top)
        elif target not in parts:
            self._add(target, parts, note=False)

    def _libraries_of(self, path: str, interp: str, parts: dict[str, str], top: Path) -> None:
        found, missing = self._trace(path, interp, top)
        for name in missing:
            parts[f"missing:{name}"] = "not found"
        for lib in found:
            if lib not in parts and not self._add(lib, parts, note=False)[0]:
                return

    def _trace(self, path: str, interp: str,
               top: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The libraries ``interp`` (the loader) resolves for ``path``: (paths found,
        names not found)."""
        known = self._libraries.get((path, interp))
        if known is not None:
            return known
        if not os.path.isfile(interp):
            raise LoadSetError(f"{top}: {path}'s loader {interp} is not a file")
        env = dict(self.env, LD_TRACE_LOADED_OBJECTS="1")
        try:
            done = subprocess.run([interp, path], env=env, capture_output=True,
                                  timeout=LOADER_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LoadSetError(f"{top}: the loader {interp} cannot list {path}'s "
                               f"libraries: {exc}") from None
        text = done.stdout.decode("utf-8", errors="surrogateescape")
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", errors="replace").strip()[:300]
            raise LoadSetError(f"{top}: the loader {interp} failed to list {path}'s "
                               f"libraries (exit {done.returncode}: {why})")
        found: list[str] = []
        missing: list[str] = []
        for line in text.splitlines():
            arrow = _ARROW.match(line)
            if arrow:
                name, where = arrow.groups()
                if where == "not found":
                    missing.append(name)
                elif where.startswith("/"):
                    found.append(where)
                continue
            direct = _DIRECT.match(line)
            if direct:
                found.append(direct.group(1))
        result = (tuple(found), tuple(missing))
        self._libraries[(path, interp)] = result
        return result
