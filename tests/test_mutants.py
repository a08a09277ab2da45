"""The planted bugs of ``toggleshim.testing.mutants`` are keyed to functions of the core and matched on
the syntax tree: each plants one change in one function of its module, and none depends on comments,
formatting or the rest of the module (a refactor elsewhere in the core leaves them applying)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toggleshim.testing import mutants

SOURCES = {m: Path(importlib.import_module(f"toggleshim.{m}").__file__ or "").read_text() for m in mutants.CORE}


def _function_code(tree: ast.Module, qualname: str) -> str:
    return ast.dump(mutants._function(tree, qualname), include_attributes=False)


def _functions(tree: ast.Module) -> list[str]:
    """Every function of the module, in order: its own code (a function defined inside it counts as
    a function of its own, not as a change of the one around it)."""

    class Hollow(ast.NodeTransformer):
        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
            return ast.Name(node.name)

    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef):
            copy = ast.parse(ast.unparse(n)).body[0]
            assert isinstance(copy, ast.FunctionDef)
            copy.body = [Hollow().visit(stmt) for stmt in copy.body]
            found.append(ast.dump(copy, include_attributes=False))
    return found


BEFORE = {m: _functions(ast.parse(source)) for m, source in SOURCES.items()}


@pytest.mark.parametrize("name", sorted(mutants.SHIM))
def test_each_mutant_changes_its_function_and_nothing_else(name: str) -> None:
    edit = mutants.SHIM[name]
    assert edit.module in mutants.CORE
    after = mutants.mutated_source_tree(name)
    assert _function_code(ast.parse(SOURCES[edit.module]), edit.function) != _function_code(after, edit.function)
    changed = [i for i, (a, b) in enumerate(zip(BEFORE[edit.module], _functions(after))) if a != b]
    assert len(changed) == 1  # its function alone (a class's methods are functions of their own)
    compile(after, "<mutant>", "exec")  # it is a module Python runs


def test_mutants_survive_comments_formatting_and_moves() -> None:
    """The same sources without any comment, with blank lines added and the functions in reverse order:
    every mutant still plants in exactly one place."""
    for module, source in SOURCES.items():
        stripped = "\n".join(re.sub(r"\s+#(?![^\"']*[\"'][^\"']*$).*$", "", line) for line in source.splitlines())
        tree = ast.parse(stripped)
        tree.body = [*[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))],
                     *reversed([n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))])]
        reformatted = ast.parse(ast.unparse(tree).replace("\n    def ", "\n\n\n    def "))
        for name, edit in mutants.SHIM.items():
            if edit.module == module:
                copy = ast.parse(ast.unparse(reformatted))
                assert mutants._planted(copy, edit) == 1, name


def test_a_mutant_whose_code_is_gone_says_so() -> None:
    edit = mutants.Edit("Toggle._exit", "optimizer.step()", "pass")
    tree = ast.parse(SOURCES["_block"].replace("optimizer.step()", "optimizer.step(closure=None)"))
    assert mutants._planted(tree, edit) == 0
    with pytest.raises(ValueError, match=r"no function Toggle\._nowhere"):
        mutants._planted(ast.parse(SOURCES["_block"]), mutants.Edit("Toggle._nowhere", "pass", "pass"))


def test_a_planted_bug_reaches_every_entry_point_and_module() -> None:
    """Planted in one module of the core, the bug is what every entry point runs (the patched method,
    ``toggleshim.toggle``, ``toggleshim.Toggle``, the harness's names): in a fresh process, a bug of
    ``_toggle.py`` (imported by the module above it) and one of ``_block.py``; and the unaltered code."""
    code = textwrap.dedent(
        """
        import sys, torch
        from types import SimpleNamespace
        import lightning.pytorch as pl
        import toggleshim
        from toggleshim.testing import harness, mutants
        if sys.argv[1]:
            mutants.apply(sys.argv[1])

        def module():
            m = pl.LightningModule()
            m.a, m.b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
            opts = [torch.optim.SGD(m.a.parameters(), lr=1), torch.optim.SGD(m.b.parameters(), lr=1)]
            m._trainer = SimpleNamespace(optimizers=opts, strategy=SimpleNamespace())
            return m, opts

        results = []
        for entry in (lambda m, o: m.toggle_optimizer(o, zero_grad=False, step=False),
                      lambda m, o: toggleshim.toggle(m, o, zero_grad=False, step=False),
                      lambda m, o: toggleshim.Toggle(m, o, zero_grad=False, step=False),
                      lambda m, o: harness.Toggle(m, o, zero_grad=False, step=False)):
            m, opts = module()
            m.a.weight.grad = torch.ones_like(m.a.weight)
            with entry(m, opts[0]):
                pass
            # restored by the block's exit; not zeroed (zero_grad=False)
            results.append((m.b.weight.requires_grad, m.a.weight.grad is not None))
        print(results)
        """
    )
    expected = {"": (True, True), "flat exit restores nothing": (False, True),
                "zero_grad ignores the flag": (True, False)}
    for mutant, each in expected.items():
        run = subprocess.run([sys.executable, "-c", code, mutant], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == str([each] * 4), (mutant, run.stdout)
