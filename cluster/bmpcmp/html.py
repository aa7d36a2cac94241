"""The master's page of a bmpcmp run: every complete image set, and what the nodes dropped.

:func:`write_html` puts the image sets (see :mod:`cluster.bmpcmp.diff`) found in one folder
on one HTML page; :func:`parse_meta` reads a set's ``.meta`` figures.  A node whose upload
limit stopped it from sending every set writes a note named :data:`DROPPED_NOTE` (or
``DROPPED.<node>``) next to the sets it did send; the page says what is missing.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from urllib.parse import quote

from cluster.bmpcmp.diff import SET_FILE
from cluster.runtime import fsutil

#: Note files the node writes when its upload limit dropped image sets (``DROPPED`` or
#: ``DROPPED.<node>``): ``#`` lines say why, the other lines name the files not uploaded.
DROPPED_NOTE = "DROPPED"


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
    fsutil.atomic_write(out, page)
    return shown
