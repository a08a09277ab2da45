#!/usr/bin/env python
"""How many lines the runtime has, by kind: what ``import toggleshim`` runs in a user's process.

    python scripts/runtime_lines.py                 # the working tree
    python scripts/runtime_lines.py cf3d0f2 HEAD    # commits, and the working tree last

The runtime is the package's top-level modules without the CLI (``__main__.py``) and ``migrate``
(``_migrate*``); ``testing/`` is a subpackage and not counted. Each line is one kind: a docstring's
(the spans of module, class and function docstrings), a comment (``#`` first), blank, or code.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("total", "code", "docstrings", "comments", "blank")


def _runtime(name: str) -> bool:
    return name.endswith(".py") and name != "__main__.py" and not name.startswith("_migrate")


def count(source: str) -> dict[str, int]:
    """Lines of ``source`` by kind."""
    lines = source.splitlines()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and ast.get_docstring(node) is not None:
            first = node.body[0]
            doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    comments = sum(1 for n, line in enumerate(lines, 1) if n not in doc and line.strip().startswith("#"))
    blank = sum(1 for n, line in enumerate(lines, 1) if n not in doc and not line.strip())
    return {"total": len(lines), "code": len(lines) - len(doc) - comments - blank, "docstrings": len(doc),
            "comments": comments, "blank": blank}


def _sources(commit: str | None) -> list[str]:
    if commit is None:
        return [p.read_text() for p in sorted((ROOT / "toggleshim").glob("*.py")) if _runtime(p.name)]
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, "toggleshim/"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    return [subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout for name in names if _runtime(Path(name).name)]


def main(argv: list[str]) -> int:
    print("| | " + " | ".join(KINDS) + " |")
    print("|---|" + "---:|" * len(KINDS))
    for commit in [*argv, None]:
        totals = dict.fromkeys(KINDS, 0)
        for source in _sources(commit):
            for kind, n in count(source).items():
                totals[kind] += n
        print(f"| {commit or 'working tree'} | " + " | ".join(f"{totals[k]:,}" for k in KINDS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
