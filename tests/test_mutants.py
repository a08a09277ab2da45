"""The planted bugs of ``toggleshim.testing.mutants`` are keyed to functions and matched on the syntax
tree: each plants one change in one function, and none depends on comments, formatting or the rest of
``_toggle.py`` (a refactor elsewhere in the module leaves them applying)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from toggleshim import _toggle
from toggleshim.testing import mutants

SOURCE = Path(_toggle.__file__).read_text()


def _function_code(tree: ast.Module, qualname: str) -> str:
    return ast.dump(mutants._function(tree, qualname), include_attributes=False)


def _functions(tree: ast.Module) -> list[str]:
    """Every function of the module, innermost ones as they are: their code, in order."""
    return [ast.dump(n, include_attributes=False) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


BEFORE = _functions(ast.parse(SOURCE))


@pytest.mark.parametrize("name", sorted(mutants.SHIM))
def test_each_mutant_changes_its_function_and_nothing_else(name: str) -> None:
    edit = mutants.SHIM[name]
    after = mutants.mutated_source_tree(name)
    assert _function_code(ast.parse(SOURCE), edit.function) != _function_code(after, edit.function)
    changed = [i for i, (a, b) in enumerate(zip(BEFORE, _functions(after))) if a != b]
    assert len(changed) == 1  # its function alone (a class's methods are functions of their own)
    compile(after, "<mutant>", "exec")  # it is a module Python runs


def test_mutants_survive_comments_formatting_and_moves() -> None:
    """The same source without any comment, with blank lines added and the functions in reverse order:
    every mutant still plants in exactly one place."""
    stripped = "\n".join(re.sub(r"\s+#(?![^\"']*[\"'][^\"']*$).*$", "", line) for line in SOURCE.splitlines())
    tree = ast.parse(stripped)
    tree.body = [*[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))],
                 *reversed([n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))])]
    reformatted = ast.parse(ast.unparse(tree).replace("\n    def ", "\n\n\n    def "))
    for name, edit in mutants.SHIM.items():
        copy = ast.parse(ast.unparse(reformatted))
        assert mutants._planted(copy, edit) == 1, name


def test_a_mutant_whose_code_is_gone_says_so() -> None:
    edit = mutants.Edit("Toggle._exit", "optimizer.step()", "pass")
    tree = ast.parse(SOURCE.replace("optimizer.step()", "optimizer.step(closure=None)"))
    assert mutants._planted(tree, edit) == 0
    with pytest.raises(ValueError, match=r"no function Toggle\._nowhere"):
        mutants._planted(ast.parse(SOURCE), mutants.Edit("Toggle._nowhere", "pass", "pass"))
