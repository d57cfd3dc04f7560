"""What a source file imports, read from its syntax tree: for the tests that keep the layers apart."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path) -> set[str]:
    """The modules `path` imports anywhere in its source (functions and `if TYPE_CHECKING:`
    blocks included: an import moved there to dodge a rule is still one). `from a import b`
    counts as both "a" and "a.b", since b may be a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found
