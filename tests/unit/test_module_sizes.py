"""No module of cluster/ is over 600 lines without a reason in docs/architecture.md.

The section "Modules over 600 lines" at the end of docs/architecture.md holds a table
``| module | why it is long |`` with one row per such module (its path relative to
cluster/).  Both ways are checked, so the list stays true: a long module without a row
fails, and so does a row whose module is gone or no longer long.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cluster"
DOC = REPO / "docs" / "architecture.md"
LIMIT = 600
SECTION = "## Modules over 600 lines"


def _long_modules() -> dict[str, int]:
    """Each module of cluster/ over LIMIT lines: its path relative to cluster/ -> lines."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LIMIT:
            found[path.relative_to(PACKAGE).as_posix()] = lines
    return found


def _listed(text: str) -> dict[str, str]:
    """The rows of the section's table: module -> why it is long."""
    assert SECTION in text, f"docs/architecture.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|", line.strip())
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_every_long_module_has_a_reason_and_every_reason_a_long_module() -> None:
    long = _long_modules()
    rows = _listed(DOC.read_text(encoding="utf-8"))
    unlisted = [f"{m} ({n} lines)" for m, n in long.items() if m not in rows]
    stale = [m for m in rows if m not in long]
    without_reason = [m for m, why in rows.items() if not why]
    assert unlisted == [], (f"modules of cluster/ over {LIMIT} lines without a row in "
                            f"docs/architecture.md, {SECTION!r}: {unlisted}; split them, "
                            "or add a row saying why each is long")
    assert stale == [], (f"rows of {SECTION!r} whose module does not exist or is no longer "
                         f"over {LIMIT} lines: {stale}; remove them")
    assert without_reason == [], f"rows of {SECTION!r} without a reason: {without_reason}"


def test_the_table_reader_finds_rows_and_their_reasons() -> None:
    text = (f"# T\n\n{SECTION}\n\n| module | why it is long |\n|---|---|\n"
            "| `config.py` | one table |\n| `a/b.py` |  |\n\n## Next\n| `x.py` | no |\n")
    assert _listed(text) == {"config.py": "one table", "a/b.py": ""}
