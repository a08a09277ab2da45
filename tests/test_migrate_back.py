"""``toggleshim migrate --to-lightning``: toggleshim's blocks back into Lightning's own statements,
on source text (the rewrite, every refusal and its reason, the imports of toggleshim dropped or kept,
comments and formatting) and as users run it (fresh subprocesses: ``--diff``, ``--write``,
``--check``, usage errors).

Training equivalence, in a process that never imports toggleshim, is in
``tests/test_migrate_back_trainer.py``; the Hypothesis property in
``property_tests/test_migrate_property.py``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_migrate import GAN, GAN_MIGRATED, IMPORT_PLACES, SPAN, _project, run, step

from toggleshim._migrate import migrate_source, to_lightning_source

# GAN_MIGRATED (test_migrate.py) on its way back: the block as Lightning's statements, the import gone
GAN_BACK = '''\
"""A GAN."""
import torch  # a comment   with  odd spacing
from lightning.pytorch import LightningModule


class GAN(LightningModule):
    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()   # kept

        # discriminator
        self.toggle_optimizer(d_opt)  # freeze G
        try:
            d_opt.zero_grad()
            loss = self.d_loss(batch)   # odd   spacing
            self.manual_backward(loss)
            # update D
            d_opt.step()
        finally:
            self.untoggle_optimizer(d_opt)
        x = [1,
               2]  # untouched
        return x
'''


def back(src: str, path: str = "<string>") -> tuple[str, list[str]]:
    """(the file on its way back, the reasons of the blocks left and the other uses of toggleshim)."""
    result = to_lightning_source(textwrap.dedent(src).encode(), path)
    return result.new.decode(), [b.reason for b in result.blocks if b.reason is not None] + [w for _, w in result.other]


# -- the rewrite, exactly ------------------------------------------------------------------------


def test_back_gan_exact_output_comments_and_formatting_kept() -> None:
    assert back(GAN_MIGRATED) == (GAN_BACK, [])


_RECIPE = '''\
"""The README's accumulation recipe."""

import toggleshim  # noqa: F401
from lightning.pytorch import LightningModule


class M(LightningModule):
    def training_step(self, batch, batch_idx):
        n = 4  # micro-batches per optimizer step
        opt = self.optimizers()
        first, last = batch_idx % n == 0, (batch_idx + 1) % n == 0
        with self.toggle_optimizer(opt, zero_grad=first, step=last, sync_grad=last):
            self.manual_backward(self.compute_loss(batch) / n)
'''

_RECIPE_BACK = '''\
"""The README's accumulation recipe."""

import contextlib

from lightning.pytorch import LightningModule


class M(LightningModule):
    def training_step(self, batch, batch_idx):
        n = 4  # micro-batches per optimizer step
        opt = self.optimizers()
        first, last = batch_idx % n == 0, (batch_idx + 1) % n == 0
        self.toggle_optimizer(opt)
        try:
            with {no_sync}:
                if first:
                    opt.zero_grad()
                self.manual_backward(self.compute_loss(batch) / n)
                if last:
                    opt.step()
        finally:
            self.untoggle_optimizer(opt)
'''.replace("{no_sync}", "contextlib.nullcontext() if last else "
                        'getattr(self.trainer.strategy, "block_backward_sync", contextlib.nullcontext)()')


def test_back_the_readmes_accumulation_recipe_exact_output() -> None:
    """Issue 44: flags that are names become the statements' conditions, ``sync_grad`` a name the
    strategy's no-sync context where it is false (as the block enters it), ``import contextlib`` added
    in the standard library's place; ``import toggleshim`` goes."""
    assert back(_RECIPE) == (_RECIPE_BACK, [])


def test_back_second_run_changes_nothing() -> None:
    assert back(GAN_BACK) == (GAN_BACK, [])


def test_back_then_forward_leaves_the_statements_alone() -> None:
    """The way back writes exception-safe statements: ``toggleshim migrate`` leaves them alone (rule 1)."""
    result = migrate_source(GAN_BACK.encode())
    assert result.new.decode() == GAN_BACK
    assert [s.reason for s in result.spans] == ["already exception-safe (untoggled in the finally right after it)"]


BLOCK = "with self.toggle_optimizer(opt{flags}){target}:\n    loss.backward()\n"
# the flags as written -> the lines of the try the block is
FLAGS = {
    "": ["opt.zero_grad()", "loss.backward()", "opt.step()"],
    ", zero_grad=False": ["loss.backward()", "opt.step()"],
    ", step=False": ["opt.zero_grad()", "loss.backward()"],
    ", zero_grad=False, step=False": ["loss.backward()"],
    ", zero_grad=True, step=True, sync_grad=True": ["opt.zero_grad()", "loss.backward()", "opt.step()"],
}


@pytest.mark.parametrize("flags", list(FLAGS))
def test_back_flags_are_honoured_exactly(flags: str) -> None:
    new, reasons = back(step(BLOCK.format(flags=flags, target="")))
    assert not reasons
    lines = "".join(f"        {line}\n" for line in FLAGS[flags])
    tail = "    finally:\n        self.untoggle_optimizer(opt)\n"
    assert new.endswith(f"    self.toggle_optimizer(opt)\n    try:\n{lines}{tail}"), new


def test_back_as_target_binds_the_optimizer_after_zero_grad() -> None:
    """``as o`` is the optimizer itself, bound after the entry's ``zero_grad()`` (``Toggle.__enter__``)."""
    new, _ = back(step(BLOCK.format(flags="", target=" as o")))
    assert "    try:\n        opt.zero_grad()\n        o = opt\n        loss.backward()\n        opt.step()\n" in new


@pytest.mark.parametrize("form", ["toggleshim.toggle(self, opt{flags})", "toggle(self, opt{flags})",
                                  "tg(self, opt{flags})", "toggleshim.Toggle(self, opt{flags})"])
def test_back_toggleshim_toggle_forms(form: str) -> None:
    """``toggleshim.toggle(R, X)`` (and ``from toggleshim import toggle [as tg]``, ``Toggle``) calls
    ``R.toggle_optimizer(X)`` and runs the sequence around it: the same statements, whatever the
    module's class overrides; the import goes with the last use."""
    head = {"toggle(": "from toggleshim import toggle\n", "tg(": "from toggleshim import toggle as tg\n"}.get(
        form.split("self")[0], "import toggleshim\n")
    src = head + "\n\n" + step(f"with {form.format(flags=', step=False')}:\n    loss.backward()\n")
    new, reasons = back(src)
    assert not reasons and "toggleshim" not in new and "tg" not in new, new
    assert "self.toggle_optimizer(opt)\n    try:\n        opt.zero_grad()\n        loss.backward()\n    finally:" in new


def test_back_one_line_block_and_a_lone_pass() -> None:
    new, _ = back(step("with self.toggle_optimizer(opt): loss.backward()\nwith self.toggle_optimizer(opt):\n"
                       "    pass\n"))
    assert new.count("    try:\n        opt.zero_grad()\n") == 2 and "pass" not in new
    assert "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n" in new


def test_back_return_inside_a_block_that_does_not_step() -> None:
    """A return leaves the block cleanly: it untoggles (``step=False``: nothing else), as ``finally`` does."""
    new, reasons = back(step("with self.toggle_optimizer(opt, step=False):\n    if i:\n        return 1\n"
                             "    loss.backward()\n"))
    assert not reasons and "        if i:\n            return 1\n" in new


# -- refusals, one reason each -------------------------------------------------------------------

REFUSED: dict[str, tuple[str, str]] = {
    "nested in a block": (
        "with self.toggle_optimizer(a):\n    with self.toggle_optimizer(b):\n        pass",
        "a toggle_optimizer call (line 7) inside the block would nest",
    ),
    "inside a statement toggle": (
        "self.toggle_optimizer(a)\nwith self.toggle_optimizer(b):\n    pass\nself.untoggle_optimizer(a)",
        "it is inside the statement toggle at line 6: Lightning's statement toggles nest differently from blocks",
    ),
    "inside toggled_optimizer": (
        "with self.toggled_optimizer(a):\n    with self.toggle_optimizer(b):\n        pass",
        "it is inside the toggle block at line 6: Lightning's statement toggles nest differently from blocks",
    ),
    "a statement toggle inside": (
        "with self.toggle_optimizer(a):\n    self.toggle_optimizer(b)\n    self.untoggle_optimizer(b)",
        "a toggle_optimizer call (line 7) inside the block would nest",
    ),
    "two context managers": (
        "with self.toggle_optimizer(opt), torch.no_grad():\n    pass", "the `with` enters more than the toggle",
    ),
    "a flag given as 1": (
        "with self.toggle_optimizer(opt, step=1):\n    pass",
        "`step=1` is neither a literal True or False nor a name (the block reads it once, at the `with` line; the "
        "statements would read it again where they use it: bind it to a name before the block)",
    ),
    "a flag that is an expression": (
        "with self.toggle_optimizer(opt, zero_grad=batch_idx % 4 == 0):\n    pass",
        "`zero_grad=batch_idx % 4 == 0` is neither a literal True or False nor a name (the block reads it once, at "
        "the `with` line; the statements would read it again where they use it: bind it to a name before the block)",
    ),
    "a flag's name rebound inside": (
        "with self.toggle_optimizer(opt, step=last):\n    last = False",
        "`last` is rebound between the toggle and the untoggle",
    ),
    "an unknown keyword": ("with self.toggle_optimizer(opt, zero=False):\n    pass",
                           "`zero=` is not one of toggleshim's flags"),
    "*args": ("with self.toggle_optimizer(*opts):\n    pass",
              "the call is not given exactly the module and the optimizer (positionally) and flags"),
    "sync_grad where contextlib is not the module": (
        "contextlib = None\nwith self.toggle_optimizer(opt, sync_grad=False):\n    pass",
        "sync_grad: `contextlib` is assigned to here (the statements need the module)",
    ),
    "a call for the optimizer": (
        "with self.toggle_optimizer(self.optimizers()[0]):\n    pass",
        "`self.optimizers()[0]` is evaluated once by the block, at each use by the statements: it may not be the "
        "same object each time (allowed: a name, an attribute chain on a name, a subscript by an int literal)",
    ),
    "as a tuple": ("with self.toggle_optimizer(opt) as (a, b):\n    pass",
                   "`as (a, b)`: only a plain name is rewritten"),
    "as self": ("with self.toggle_optimizer(opt) as self:\n    pass",
                "`as self` rebinds a name the toggle's expressions start from"),
    "a return in a block that steps": (
        "with self.toggle_optimizer(opt):\n    if i:\n        return",
        "a return inside a block that steps on exit: the block steps when it is left that way, the statements "
        "would not",
    ),
    "a break in a block that steps": (
        "for x in xs:\n    with self.toggle_optimizer(opt):\n        break",
        "a break inside a block that steps on exit: the block steps when it is left that way, the statements "
        "would not",
    ),
    "a step in a block that steps": (
        "with self.toggle_optimizer(opt):\n    loss.backward()\n    if i:\n        opt.step()",
        "a `.step(...)` call (line 9) inside a block that steps on exit: the block refuses a second step (a "
        "RuntimeError at its exit), the statements would step twice",
    ),
    "the optimizer rebound": (
        "with self.toggle_optimizer(opt, step=False):\n    opt = other",
        "`opt` is rebound between the toggle and the untoggle",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_back_refuses_with_a_reason(case: str) -> None:
    body, reason = REFUSED[case]
    src = "import toggleshim\n\n\n" + step(body)
    new, reasons = back(src)
    assert reasons[0] == reason, reasons
    assert "import toggleshim\n" in new  # something still needs it: the import stays


def test_back_refuses_a_name_declared_global() -> None:
    src = "def swap():\n    global opt\n    opt = 1\n\n\n" + step("with self.toggle_optimizer(opt):\n    swap()")
    assert back(src)[1] == ["`opt` is declared global at line 2: a function called inside the block may rebind it"]


def test_back_refuses_a_shadowed_toggleshim() -> None:
    src = step("with toggleshim.toggle(self, opt):\n    pass").replace("opt = self", "toggleshim = x\n    opt = self")
    assert back(src)[1] == ["`toggleshim` may not be the package here: the file binds the name `toggleshim` to "
                            "something else than the package"]


# -- overrides of toggle_optimizer: the plain block uses what it returns --------------------------

OVERRIDE = "class M(LightningModule):\n    def toggle_optimizer(self, optimizer{kw}):\n        {body}\n\n"


@pytest.mark.parametrize(("kw", "body", "flags", "reason"), [
    ("", "return super().toggle_optimizer(optimizer)", "", None),
    ("", "return super().toggle_optimizer(optimizer)", ", step=False",
     "`M.toggle_optimizer` (<string>:1) is given the block's flags; the statement would call it with the optimizer "
     "alone"),
    (", **kw", "return super().toggle_optimizer(optimizer, **kw)", ", step=False",
     "`M.toggle_optimizer` (<string>:1) is given the block's flags; the statement would call it with the optimizer "
     "alone"),
    ("", "super().toggle_optimizer(optimizer)", "",
     "`M.toggle_optimizer` (<string>:1) may not return the toggle: the block as written fails there ('NoneType' "
     "object does not support the context manager protocol), the statements would not"),
])
def test_back_plain_block_over_an_override(kw: str, body: str, flags: str, reason: str | None) -> None:
    src = OVERRIDE.format(kw=kw, body=body) + textwrap.indent(step(f"with self.toggle_optimizer(opt{flags}):\n    "
                                                                    "pass"), "    ")
    _, reasons = back(src)
    assert reasons == ([] if reason is None else [reason])
    through = back(src.replace("with self.toggle_optimizer(", "with toggleshim.toggle(self, "))
    assert through[1] == [], through  # toggleshim.toggle calls the override with the optimizer alone: any override


# -- other uses of toggleshim, and its imports ---------------------------------------------------


def test_back_reports_what_else_needs_toggleshim_and_keeps_the_import() -> None:
    src = "import toggleshim\n\n\n" + step(
        "self.toggle_optimizer(opt, step=False)\nt = self.toggle_optimizer(opt)\ntoggleshim.install()\n"
        "block = toggleshim.toggle(self, opt)"
    )
    new, reasons = back(src)
    assert new == textwrap.dedent(src)
    assert reasons == [
        "`self.toggle_optimizer(opt, step=False)` is given toggleshim's flags",
        "the result of toggle_optimizer is used",
        "`toggleshim.install` is used",
        "`toggleshim.toggle(self, opt)` outside a `with` statement",
    ]


def test_back_override_returning_super_is_no_use_of_toggleshim() -> None:
    src = "class M:\n    def toggle_optimizer(self, optimizer):\n        return super().toggle_optimizer(optimizer)\n"
    assert back(src) == (src, [])


@pytest.mark.parametrize("case", list(IMPORT_PLACES))
def test_back_restores_the_imports_the_forward_direction_changed(tmp_path: Path, case: str) -> None:
    """Forward then back: the imports exactly as they were (the block's statements aside), wherever
    the forward direction put ``import toggleshim`` and its comment line."""
    before, _ = IMPORT_PLACES[case]
    path = _project(tmp_path) / "pkg" / "m.py"
    original = before + "\n\n" + SPAN
    there = migrate_source(original.encode(), str(path)).new
    assert b"import toggleshim" in there
    new = to_lightning_source(there, str(path)).new.decode()
    assert new.split("\n\n\ndef ")[0] == original.split("\n\n\ndef ")[0], new


def test_back_import_order_passes_ruff(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for n, (before, _) in enumerate(IMPORT_PLACES.values()):
        path = project / "pkg" / f"m{n}.py"
        path.write_bytes(migrate_source((before + "\n\n" + SPAN).encode(), str(path)).new)
        path.write_bytes(to_lightning_source(path.read_bytes(), str(path)).new)
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "I", "pkg"],
                       cwd=project, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [p for p in (project / "pkg").iterdir() if "toggleshim" in p.read_text()]


def test_back_drops_toggleshim_alone_from_an_import_line() -> None:
    src = "import os, toggleshim\nfrom toggleshim import toggle\n\n\n" + step("with toggle(self, opt):\n    x = os.sep")
    new, reasons = back(src)
    assert not reasons and new.startswith("import os\n\n\ndef training_step"), new


# -- the command, as users run it -----------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A package whose blocks are all rewritable; ``import toggleshim`` in a file without blocks too."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "gan.py").write_text(GAN_MIGRATED)
    (tmp_path / "pkg" / "__init__.py").write_text("import toggleshim  # noqa: F401\n")
    return tmp_path


def test_cli_to_lightning_diff_write_check(project: Path) -> None:
    r = run("--to-lightning", "--check", "pkg", cwd=project)
    assert r.returncode == 1
    assert r.stdout == (
        "pkg/__init__.py:1: imports toggleshim; `toggleshim migrate --to-lightning` drops it\n"
        "pkg/gan.py:3: imports toggleshim; `toggleshim migrate --to-lightning` drops it\n"
        "pkg/gan.py:13: `with self.toggle_optimizer(d_opt):` needs toggleshim; `toggleshim migrate --to-lightning` "
        "rewrites it\n"
    )
    assert r.stderr == "toggleshim migrate --to-lightning --check: 3 uses of toggleshim in 2 files checked\n"
    r = run("--to-lightning", "pkg", cwd=project)
    assert r.returncode == 0 and r.stdout.startswith("--- pkg/__init__.py\n+++ pkg/__init__.py\n"), r.stdout
    assert (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED  # --diff writes nothing
    r = run("--to-lightning", "--write", "pkg", cwd=project)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "pkg/__init__.py: dropped its import of toggleshim",
        "pkg/gan.py: rewrote 1 block into Lightning's statements; dropped its import of toggleshim",
        "toggleshim migrate: assumed: no toggle_optimizer outside these files is overridden (--verbose: more)",
        "toggleshim migrate --to-lightning: rewrote 2 of 2 files (1 block)",
    ]
    assert (project / "pkg" / "gan.py").read_text() == GAN_BACK
    assert (project / "pkg" / "__init__.py").read_text() == ""
    r = run("--to-lightning", "--check", "pkg", cwd=project)
    assert (r.returncode, r.stdout) == (0, ""), r.stdout
    r = run("--check", "pkg", cwd=project)  # and the forward check: the statements are exception-safe
    assert (r.returncode, r.stdout) == (0, ""), r.stdout


def test_cli_to_lightning_keeps_every_import_while_a_block_is_left(project: Path) -> None:
    """A block left as it is in one file needs the patch, which any ``import toggleshim`` installs:
    no import goes, and the line says why."""
    (project / "pkg" / "nested.py").write_text(
        "import toggleshim  # noqa: F401\n\n\n"
        + step("with self.toggle_optimizer(a):\n    with self.toggle_optimizer(b):\n        pass"))
    r = run("--to-lightning", "--write", "pkg", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "pkg/nested.py:6: not rewritten: a toggle_optimizer call (line 7) inside the block would nest" in r.stderr
    assert r.stderr.endswith("rewrote 1 of 3 files (1 block); 2 left as they are (see above), so every import of "
                             "toggleshim stays\n"), r.stderr
    assert "import toggleshim" in (project / "pkg" / "__init__.py").read_text()
    assert "import toggleshim" in (project / "pkg" / "gan.py").read_text()
    assert "self.toggle_optimizer(d_opt)  # freeze G\n        try:" in (project / "pkg" / "gan.py").read_text()


def test_cli_to_lightning_takes_no_assumption(project: Path) -> None:
    r = run("--to-lightning", "--assume", "torch2-defaults", "pkg", cwd=project)
    assert r.returncode == 2 and r.stdout == ""
    assert "error: --assume is for statement toggles into blocks; --to-lightning takes no assumption" in r.stderr
    assert (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED


def test_cli_to_lightning_round_trip_on_the_gan(tmp_path: Path) -> None:
    (tmp_path / "gan.py").write_text(GAN)
    assert run("--write", "gan.py", cwd=tmp_path).returncode == 0
    assert (tmp_path / "gan.py").read_text() == GAN_MIGRATED
    assert run("--to-lightning", "--write", "gan.py", cwd=tmp_path).returncode == 0
    assert (tmp_path / "gan.py").read_text() == GAN_BACK
