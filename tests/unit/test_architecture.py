"""docs/architecture.md stays true to the tree, and command lines stay in cli/."""

from __future__ import annotations

import ast
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
        if _parses_arguments(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def _parses_arguments(tree: ast.AST) -> bool:
    """Whether the module's own code imports argparse or reads ``sys.argv`` (a script it
    sends to another machine as a string literal does not count)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            return True
        if (isinstance(node, ast.Attribute) and node.attr == "argv"
                and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            return True
    return False


def test_the_argument_check_sees_code_not_strings() -> None:
    assert _parses_arguments(ast.parse("import sys\nx = sys.argv[1]\n"))
    assert _parses_arguments(ast.parse("from argparse import ArgumentParser\n"))
    assert not _parses_arguments(ast.parse("SCRIPT = 'import sys; a = sys.argv[1]'\n"))
