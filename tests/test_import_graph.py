"""The package's modules import each other without a cycle (imports inside functions included), and
none is longer than a maintainer can hold in their head."""

from __future__ import annotations

import ast
from pathlib import Path

import toggleshim

PACKAGE = Path(toggleshim.__file__).parent


def _graph() -> dict[str, set[str]]:
    """Module name -> the package modules it imports, at any level of its code."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("toggleshim"):
                edges.add(node.module)
                edges.update(f"{node.module}.{a.name}" for a in node.names)  # `from toggleshim import _x`
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("toggleshim"))
    return {name: {e for e in edges if e in graph or any(e == g for g in graph)} for name, edges in graph.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt == node or node.startswith(nxt + "."):
                continue  # a package's __init__ (re-exporting its modules): every module is imported through it
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if state.get(nxt) is None:
                found = visit(nxt, [*path, node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node != "toggleshim" and state.get(node) is None:
            found = visit(node, [])
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    assert {"toggleshim._toggle", "toggleshim._block", "toggleshim._writes", "toggleshim._ours",
            "toggleshim._patch"} <= set(graph)
    assert "toggleshim._toggle" in graph["toggleshim._block"]  # the graph sees imports at all
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_a_flavour_is_named_once_in_the_package() -> None:
    """Every Lightning flavour's names (import name, distribution, Fabric package, re-exports, module
    paths) are written in ``toggleshim/_flavours.py`` alone: no other file of the package (the pytest
    plugin included) holds one as a string, so a third flavour is one line there."""
    from toggleshim._flavours import FLAVOURS

    names = {n for f in FLAVOURS for n in (f.name, f.distribution, f.fabric, *f.reexports, f.top,
                                            f.core_module, f.optimizer_module)}
    found = []
    for path in [*sorted(PACKAGE.rglob("*.py")), PACKAGE.parent / "toggleshim_pytest.py"]:
        if path.name == "_flavours.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hits = {n for n in names if n == node.value or node.value.startswith(n + ".")}
                found += [f"{path.name}:{node.lineno}: {node.value!r}" for _ in hits]
    assert found == []


# sizes: a module a maintainer can hold in their head

MAX_LINES = 800


def test_no_package_module_is_over_800_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 30 and any(n > MAX_LINES // 2 for n in sizes.values())  # it read the package
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
