"""Fingerprints of Lightning's toggle code: what the gate in ``_patch`` compares, not version numbers.

The sha256 of a canonical dump of a method's syntax tree without what cannot change what it does
(docstring, decorators such as ``torch.compiler.disable``, name, annotations, comments, formatting).
The dump is our own and leaves out every ``None`` or empty field, so the same source gives the same
fingerprint on Python 3.10 to 3.13 (``ast.dump`` changed in 3.13; 3.12 added ``type_params``).
Standard library only: ``scripts/fingerprints.py`` loads this file by path, without torch or Lightning.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from typing import Any

__all__ = ["fingerprint_function", "fingerprint_node", "methods_in_source"]


def _canon(node: object) -> str:
    """A dump of ``node`` the same on every Python 3.10+ (fields sorted, empty ones left out)."""
    if isinstance(node, ast.AST):
        parts = []
        for name in sorted(node._fields):
            value = getattr(node, name, None)
            if value is None or (isinstance(value, list) and not value):
                continue
            parts.append(f"{name}={_canon(value)}")
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canon(item) for item in node) + "]"
    return repr(node)


def _strip_annotations(args: ast.arguments) -> ast.arguments:
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
            arg.type_comment = None
    return args


def fingerprint_node(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The fingerprint of a parsed function: its parameters (names, kinds, defaults) and its body."""
    body = list(node.body)
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]  # the docstring
    kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    text = f"{kind} {_canon(_strip_annotations(node.args))}: {_canon(body)}"
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint_function(fn: Any) -> str | None:
    """The fingerprint of a live function; None without its source (``.pyc`` only, ``exec``) or when
    the source is not one function definition."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return fingerprint_node(tree.body[0])


def methods_in_source(source: str, cls: str, names: tuple[str, ...]) -> dict[str, str]:
    """Fingerprints of the methods ``names`` of top-level class ``cls`` in a module's source (read out of a
    wheel by ``scripts/fingerprints.py``); missing methods are left out."""
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in names:
                    found[item.name] = fingerprint_node(item)
    return found
