"""No text in the repository points at an issue tracker that lives outside it.

A reference to an issue by its number means nothing to a reader of the tree: the tracker
is not part of the repository.  Code, docs and tests name the doc section that describes the
thing instead (e.g. docs/results.md, "Results reused"); history lives in git.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: What counts as a reference to an outside issue: the word, singular or plural, any case,
#: then a number, with or without a ``#`` (this file spells its examples apart, so that it
#: passes its own check).
ISSUE_REF = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)

#: The trees whose every text file is read, and the single files read besides.
TREES = ("cluster", "bench", "etc", "docs")
FILES = ("README.md", "pyproject.toml")


def _texts() -> Iterator[Path]:
    """Every text file the check reads: the trees above (bytecode caches left out), the
    single files, and the tests' Python sources."""
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield path
    for name in FILES:
        if (REPO / name).is_file():
            yield REPO / name
    yield from sorted((REPO / "tests").rglob("*.py"))


def _references(path: Path) -> list[str]:
    """``file:line: text`` for every line of ``path`` holding an issue reference; a file
    that is not UTF-8 text holds none."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    return [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), start=1)
            if ISSUE_REF.search(line)]


def test_no_text_refers_to_an_outside_issue() -> None:
    found = [ref for path in _texts() for ref in _references(path)]
    assert found == [], "name the doc section instead of the issue:\n" + "\n".join(found)


def test_the_pattern_catches_the_forms_in_use() -> None:
    word = "issue"
    for text in (f"{word} 26", f"({word.title()} 26, item 3)", f"{word}s 21 and 25",
                 f"{word} #7", f"Before {word}\n21"):
        assert ISSUE_REF.search(text), text
    for text in ("tissue 3", "the issue", "issue-free", "#26"):
        assert not ISSUE_REF.search(text), text
