"""What the runtime holds at module level: at most six mutable containers, each named in
docs/architecture.md with why it cannot be local (issue 35, point 4).

The runtime is the package without ``testing/``, the CLI (``__main__.py``) and ``migrate``. A
module-level container is a name bound at the top of a module to a dict, list or set (a literal,
a comprehension, ``dict()``/``list()``/``set()``) or to ``threading.local()``; one the package never
mutates (no item assignment, deletion or mutating method call on it anywhere in the runtime) is a
constant, not state."""

from __future__ import annotations

import ast
from pathlib import Path

import toggleshim

PACKAGE = Path(toggleshim.__file__).parent
RUNTIME = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__main__.py")
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
MUTATORS = {"append", "add", "pop", "popitem", "clear", "update", "setdefault", "discard", "remove", "insert",
            "extend", "__setitem__", "__delitem__"}


def _containers(tree: ast.Module) -> list[str]:
    found = []
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        value = getattr(node, "value", None)
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
            isinstance(value, ast.Call) and ast.unparse(value.func) in ("dict", "list", "set", "threading.local"))
        found += [t.id for t in targets if mutable and isinstance(t, ast.Name) and t.id != "__all__"]
    return found


def _mutated(name: str, trees: list[ast.Module]) -> bool:
    """``name`` is mutated somewhere: ``name[k] = v``, ``del name[k]``, ``name.append(...)``..., or an
    attribute of it set (``name.x = v``: a thread-local's)."""
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    if isinstance(t, (ast.Subscript, ast.Attribute)) and ast.unparse(t.value).split(".")[-1] == name:
                        return True
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and ast.unparse(node.func.value).split(".")[-1] in (name, "__dict__")
                    and name in ast.unparse(node.func.value)):
                return True
    return False


def test_at_most_six_module_level_containers_each_named_in_the_architecture() -> None:
    trees = {p.name: ast.parse(p.read_text()) for p in RUNTIME}
    state = [f"{p[:-3]}.{name}" for p, tree in trees.items() for name in _containers(tree)
             if _mutated(name, list(trees.values()))]
    assert 1 <= len(state) <= 6, state
    documented = ARCHITECTURE.read_text()
    assert [s for s in state if f"`{s}`" not in documented] == []


def test_the_count_sees_a_container_added() -> None:
    """The control: one more module-level set, mutated, is counted (a check that checks nothing fails)."""
    tree = ast.parse("import threading\n_SEEN = set()\n_local = threading.local()\n"
                     "def f(x):\n    _SEEN.add(x)\n    _local.x = x\n")
    assert _containers(tree) == ["_SEEN", "_local"]
    assert _mutated("_SEEN", [tree]) and _mutated("_local", [tree])
    assert not _mutated("_SEEN", [ast.parse("_SEEN = set()\nprint(len(_SEEN))\n")])
