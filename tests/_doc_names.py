"""What a page of the docs names, resolved against the tree: package names by import and ``getattr``,
paths and tests by the files they name. Shared by tests/test_architecture.py and tests/test_docs.py.

A backticked span is read as

* a **path** (``_toggle.py``, ``testing/model.py``, ``scripts/fingerprints.py``, ``tests/test_x.py::test_y``,
  ``testing/``): it must exist, in the repository or in the package (``toggleshim/``); a test after
  ``::`` (``*`` a wildcard) must be defined in that file;
* a **dotted name** (``_toggle.toggle``, ``Toggle._exit``, ``harness._Runner.run``,
  ``toggleshim.testing.harness``): the package's when its first part is a package module
  (``_patch``, ``harness``, ``testing``, ``toggleshim``), a name defined at the top of a package module
  (``Toggle``, ``_Made``), or private (a leading ``_``); then it must resolve, by importing the module
  and ``getattr`` along the rest (an attribute a class sets on its instances counts; a call is read as
  its callee). Other dotted names (``self.opt``, ``torch.compile``, ``sys.meta_path``) are not the
  package's and are left alone;
* a **private name** (``_Plan``, ``_flags_of``): it must occur in the package's code.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import toggleshim

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(toggleshim.__file__).parent
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PRIVATE = re.compile(r"_\w*[A-Za-z]\w*")
CALL = re.compile(r"([A-Za-z_][\w.]*)\(.*\)")
# A path into this repository: under one of its folders, or a private module's file (`_toggle.py`); a
# user's file (`setup.py`, `src/gan.py`) is not one.
FOLDERS = ("tests", "property_tests", "examples", "docs", "scripts", "benchmarks", "constraints", ".ci", ".github",
           "toggleshim", "testing", "_migrate")
PATH = re.compile(rf"(?:(?:{'|'.join(map(re.escape, FOLDERS))})/[\w./*-]*|_\w+\.py)(?:::[\w*\[\]-]+)?")


def modules() -> dict[str, Path]:
    """Every module of the package: ``toggleshim.testing.harness`` -> its file."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def aliases(name: str, path: Path) -> set[str]:
    """How a page may name the module ``name``: its path (from the package or the repository), its
    dotted name with or without ``toggleshim.``, its last part (``specs``, ``_rules.py``); a package
    by its folder (``testing/``)."""
    rel = path.relative_to(PACKAGE).as_posix()
    short = name.removeprefix("toggleshim").lstrip(".")
    names = {rel, f"toggleshim/{rel}", name}
    if path.name == "__init__.py":
        folder = rel.removesuffix("__init__.py")
        names |= {folder, folder.rstrip("/"), f"toggleshim/{folder}"} if folder else {"toggleshim"}
    else:
        names |= {short, path.name, path.stem}
    return {n for n in names if n}


def _definitions() -> dict[str, list[str]]:
    """Top-level names of every package module -> the modules defining them."""
    defined: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            targets: list[str] = []
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                targets = [node.name]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            for target in targets:
                defined.setdefault(target, []).append(name)
    return defined


def _has(obj: Any, attr: str) -> bool:
    """``obj`` has ``attr``, or (a class) sets it on its instances: annotated, or ``self.attr = ...``."""
    if hasattr(obj, attr):
        return True
    if not isinstance(obj, type):
        return False
    for cls in obj.__mro__:
        if attr in getattr(cls, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(attr)}\s*(?::[^=]*)?=", source):
            return True
    return False


def _walk(obj: Any, rest: list[str]) -> bool:
    for attr in rest:
        if not _has(obj, attr):
            return False
        obj = getattr(obj, attr, None)
    return True


def resolve_dotted(text: str, mods: dict[str, Path], defined: dict[str, list[str]]) -> bool | None:
    """True or False for a dotted name of the package (it resolves or not); None: not the package's."""
    parts = text.split(".")
    for n in range(len(parts), 0, -1):  # the longest module prefix: `toggleshim.testing.harness._Runner`
        candidates = [m for m, p in mods.items() if ".".join(parts[:n]) in aliases(m, p) and "/" not in parts[0]]
        if candidates:
            return any(_walk(importlib.import_module(m), parts[n:]) for m in candidates)
    first, rest = parts[0], parts[1:]
    if first in defined:
        return any(_walk(getattr(importlib.import_module(m), first), rest) for m in defined[first])
    if first.startswith("_") and not first.startswith("__"):
        return False  # private, and defined nowhere in the package
    return None


def resolve_path(text: str) -> bool:
    path, _, test = text.partition("::")
    for base in (ROOT, PACKAGE):
        target = base / path
        if target.exists() and (path.endswith("/") or target.is_file()):
            if not test:
                return True
            if target.is_file() and any(fnmatch.fnmatchcase(name, test.split("[")[0])
                                        for name in re.findall(r"^\s*(?:async )?def (\w+)", target.read_text(),
                                                               re.MULTILINE)):
                return True
    return False


def problems(text: str) -> list[str]:
    """What a page names that does not exist, one line each."""
    mods, defined = modules(), _definitions()
    package_code = "\n".join(p.read_text() for p in mods.values())
    found = []
    for span in dict.fromkeys(SPAN.findall(text)):
        span = span.strip()
        call = CALL.fullmatch(span)
        span = call.group(1) if call else span  # `_toggle.toggle(module, optimizer, opts)`: the callee
        if PATH.fullmatch(span):
            if not resolve_path(span):
                found.append(f"`{span}`: no such file")
        elif DOTTED.fullmatch(span.removesuffix("()")):
            if resolve_dotted(span.removesuffix("()"), mods, defined) is False:
                found.append(f"`{span}`: no such name in the package")
        elif (PRIVATE.fullmatch(span.removesuffix("()")) and not span.startswith("__")
              and not re.search(rf"\b{re.escape(span.removesuffix('()'))}\b", package_code)):
            found.append(f"`{span}`: the package has no such name")
    return found


def named_modules(text: str) -> set[str]:
    """The package modules the page names."""
    spans = {s.strip().removesuffix("()") for s in SPAN.findall(text)}
    return {name for name, path in modules().items() if aliases(name, path) & spans}
