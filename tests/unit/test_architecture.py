"""docs/architecture.md stays true to the tree, and command lines stay in cli/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cluster"
DOC = REPO / "docs" / "architecture.md"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def test_every_module_is_named_in_the_architecture_page() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [str(p.relative_to(PACKAGE)) for p in _modules()
               if f"`{p.name}`" not in text and f"/{p.name}`" not in text
               and f"`{p.stem}`" not in text]
    assert missing == [], f"docs/architecture.md does not name: {missing}"


def test_every_module_the_architecture_page_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`(?:[a-z_]+/)*([a-z_0-9]+\.py)", text))
    existing = {p.name for p in PACKAGE.rglob("*.py")} | {p.name for p in REPO.glob("*.py")}
    assert named - existing == set()


def test_no_module_outside_cli_parses_arguments() -> None:
    offenders = []
    for path in _modules():
        if path.parent.name == "cli":
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"^\s*(import argparse|from argparse )", text, re.M) or "sys.argv" in text:
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []
