"""``toggleshim migrate`` across the files of a run: overrides of ``toggle_optimizer`` /
``untoggle_optimizer`` in any file (classes resolved through the imports of the run), the form each
span takes (``with self.toggle_optimizer(X)`` or ``with toggleshim.toggle(self, X)``), the assumption
it states about classes outside the run, and an override's own ``super().toggle_optimizer(...)``
(never a finding).

The rewrite is checked on the command's output (in this process: each subprocess imports torch); two
projects are trained in real ``Trainer.fit`` runs, as written and as migrated, each in a fresh
subprocess, and compared bitwise.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _migrate_world import assert_same_world

import toggleshim
from toggleshim import _migrate
from toggleshim._flavours import by_name

# Only a guard against a hang: one train.py took over 300 s in a matrix cell at the lowest CPU priority.
_HANG = 1200

BASE = '''\
"""A two-optimizer module with statement toggles."""
import torch
from torch import nn
import lightning.pytorch as pl


class Base(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        gen = torch.Generator().manual_seed(0)
        self.encoder = nn.Linear(3, 3)
        self.g, self.d = nn.Linear(3, 1), nn.Linear(3, 1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        self.seen = []

    def configure_optimizers(self):
        return [torch.optim.SGD([*self.encoder.parameters(), *self.g.parameters()], lr=0.1, momentum=0.9),
                torch.optim.Adam([*self.encoder.parameters(), *self.d.parameters()], lr=0.01)]

    def train_dataloader(self):
        gen = torch.Generator().manual_seed(1)
        data = torch.randn(4, 3, generator=gen)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        g_opt, d_opt = self.optimizers()
        self.toggle_optimizer(g_opt)
        g_opt.zero_grad()
        self.manual_backward(self.g(self.encoder(x)).square().sum())
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.seen.append([p.requires_grad for p in self.parameters()])
        self.toggle_optimizer(d_opt)
        loss = self.d(self.encoder(x)).square().sum()
        d_opt.zero_grad()
        self.manual_backward(loss)
        d_opt.step()
        self.untoggle_optimizer(d_opt)
        self.seen.append([p.requires_grad for p in self.parameters()])
'''

# A subclass in a sibling file that re-freezes the encoder after every untoggle (fine-tuning).
REFREEZE = '''\
"""Fine-tuning: the encoder stays frozen."""
from .models import Base


class Sub(Base):
    def untoggle_optimizer(self, optimizer):
        super().untoggle_optimizer(optimizer)
        self.encoder.requires_grad_(False)
'''

# A subclass in a sibling file whose toggle_optimizer calls super() and returns None.
NONE_TOGGLE = '''\
"""Freezes the discriminator's bias at every toggle; returns nothing, as Lightning's does."""
from .models import Base


class Sub(Base):
    def toggle_optimizer(self, optimizer):
        super().toggle_optimizer(optimizer)
        self.d.bias.requires_grad_(False)
'''

# The base's own override (calls super, returns None), appended to BASE's class
OWN_TOGGLE = "\n    def toggle_optimizer(self, optimizer):\n        super().toggle_optimizer(optimizer)\n"
# The two blocks of BASE, written plainly
PLAIN = ["with self.toggle_optimizer(g_opt):", "with self.toggle_optimizer(d_opt, zero_grad=False):"]

# -- the rewrite, on the command's output --------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _diff(root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          *args: str) -> tuple[int, str, str]:
    """``toggleshim migrate [args] pkg`` in ``root`` (this process); (exit code, stdout, stderr)."""
    monkeypatch.chdir(root)
    code = _migrate.main([*args, "pkg"])
    out = capsys.readouterr()
    return code, out.out, out.err


def _with_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and "with " in line]


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    return _tree(tmp_path, {"pkg/__init__.py": "", "pkg/models.py": BASE})


def test_migrate_untoggle_override_in_a_sibling_file_keeps_the_plain_block(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The block exits through the module's own untoggle_optimizer: the override makes it no less exact."""
    _tree(pkg, {"pkg/refreeze.py": REFREEZE})
    code, out, err = _diff(pkg, monkeypatch, capsys)
    assert code == 0 and "not migrated" not in err
    assert _with_lines(out) == PLAIN
    assert "+import toggleshim  # noqa: F401" in out


# How a sibling file may name the base class (each resolved through the run's imports)
SPELLINGS = {
    "relative": ("from .models import Base", "Base"),
    "absolute": ("from pkg.models import Base", "Base"),
    "module attribute": ("from pkg import models", "models.Base"),
    "aliased module": ("import pkg.models as m", "m.Base"),
    "dotted module": ("import pkg.models", "pkg.models.Base"),
    "relative module": ("from . import models", "models.Base"),
    "re-exported by the package": ("from pkg import Base", "Base"),
    "generic": ("from .models import Base", "Base[int]"),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_migrate_toggle_override_returning_none_in_a_sibling_file_goes_through_toggleshim_toggle(
    pkg: Path, spelling: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    imp, base = SPELLINGS[spelling]
    (pkg / "pkg" / "__init__.py").write_text("from .models import Base\n")
    _tree(pkg, {"pkg/zz_sub.py": NONE_TOGGLE.replace("from .models import Base", imp).replace("(Base)", f"({base})")})
    code, out, err = _diff(pkg, monkeypatch, capsys)
    assert code == 0 and "not migrated" not in err
    assert _with_lines(out) == [
        "with toggleshim.toggle(self, g_opt):",
        "with toggleshim.toggle(self, d_opt, zero_grad=False):",
    ]
    assert "+import toggleshim\n" in out  # used by the block: no noqa, no comment
    assert "assumed" not in err  # nothing relies on classes outside the run


def test_migrate_toggle_override_in_a_mixin_of_a_subclass(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``class Sub(Mixin, Base)``: Sub's MRO puts the mixin's toggle_optimizer before Base's."""
    _tree(pkg, {
        "pkg/mixins.py": """\
            class Counting:
                def toggle_optimizer(self, optimizer):
                    self.toggles = getattr(self, "toggles", 0) + 1
                    super().toggle_optimizer(optimizer)
            """,
        "pkg/sub.py": """\
            from pkg.mixins import Counting
            from pkg.models import Base


            class Sub(Counting, Base):
                pass
            """,
    })
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out)[0] == "with toggleshim.toggle(self, g_opt):"


RETURNS = '''\
from .models import Base


class Sub(Base):
    def toggle_optimizer(self, optimizer{kw}):
        self.toggles = getattr(self, "toggles", 0) + 1
        return super().toggle_optimizer(optimizer{fwd})
'''


def test_migrate_toggle_override_returning_super_keeps_the_plain_block_when_the_flags_reach_it(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `(self, optimizer)`: the block without flags calls it with the optimizer alone; with flags it
    # would raise TypeError, so those go through toggleshim.toggle
    _tree(pkg, {"pkg/sub.py": RETURNS.format(kw="", fwd="")})
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out) == [
        "with self.toggle_optimizer(g_opt):",
        "with toggleshim.toggle(self, d_opt, zero_grad=False):",
    ]
    # `**kwargs` forwarded: the flags reach super()
    _tree(pkg, {"pkg/sub.py": RETURNS.format(kw=", **kwargs", fwd=", **kwargs")})
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out) == PLAIN


@pytest.mark.parametrize("body", [
    "result = super().toggle_optimizer(optimizer)\nself.n = 1\nreturn result",  # not visibly the toggle
    "if self.training:\n    return super().toggle_optimizer(optimizer)\nsuper().toggle_optimizer(optimizer)",
    "optimizer = self.other\nreturn super().toggle_optimizer(optimizer)",  # another optimizer
    "return super(Sub, self).toggle_optimizer(optimizer)",  # not the plain form the tool reads
])
def test_migrate_toggle_override_that_may_return_none_or_another_toggle(
    pkg: Path, body: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = "from .models import Base\n\n\nclass Sub(Base):\n    def toggle_optimizer(self, optimizer):\n"
    (pkg / "pkg" / "sub.py").write_text(src + textwrap.indent(body, " " * 8) + "\n")
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out)[0] == "with toggleshim.toggle(self, g_opt):"


def test_migrate_override_in_another_hierarchy_changes_nothing(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Precision: a class of the run named like the base but in another module, and an unrelated
    module overriding toggle_optimizer, are not the base's subclasses."""
    _tree(pkg, {
        "pkg/other.py": """\
            import lightning.pytorch as pl


            class Base(pl.LightningModule):
                def toggle_optimizer(self, optimizer):
                    super().toggle_optimizer(optimizer)


            class Unrelated(Base):
                pass
            """,
    })
    _, out, err = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out)[0] == "with self.toggle_optimizer(g_opt):"
    assert err.count("assumed:") == 1


def test_migrate_receiver_of_unknown_class_with_an_override_in_the_run(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model.toggle_optimizer(opt)`` outside a method: ``model`` may be of any class of the run."""
    _tree(pkg, {
        "pkg/sub.py": NONE_TOGGLE,
        "pkg/loop.py": """\
            def train(model, opt, loss):
                model.toggle_optimizer(opt)
                model.manual_backward(loss)
                model.untoggle_optimizer(opt)
            """,
    })
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert "with toggleshim.toggle(model, opt, zero_grad=False, step=False):" in _with_lines(out)


# Lightning's own files that define LightningModule and re-export it (in the flavour's package)
LIGHTNING_SOURCE = ("__init__.py", "core/__init__.py", "core/module.py")


def test_migrate_lightnings_own_module_in_the_run_never_forces_toggleshim_toggle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flavour: str
) -> None:
    """A run over a tree holding Lightning's own source (a vendored copy: the installed Lightning's
    files, byte for byte), whose ``LightningModule.toggle_optimizer`` returns None: user code keeps
    the plain blocks, through every way the class is reached: a base imported from the package, and a
    receiver of unknown class (any class of the run), issue 38."""
    dist = importlib.metadata.distribution(by_name(flavour).distribution)
    package = flavour.replace(".", "/")
    for name in LIGHTNING_SOURCE:
        target = tmp_path / "vendor" / package / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(str(dist.locate_file(f"{package}/{name}")), target)
    module = (tmp_path / "vendor" / package / "core" / "module.py").read_text()
    assert "def toggle_optimizer(self" in module and "class LightningModule(" in module
    _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/models.py": BASE.replace("import lightning.pytorch as pl", f"import {flavour} as pl"),
        "pkg/plain.py": BASE.replace("import lightning.pytorch as pl", f"from {flavour} import LightningModule")
        .replace("(pl.LightningModule)", "(LightningModule)").replace("class Base", "class Plain"),
        "pkg/loop.py": """\
            def train(model, opt, loss):
                model.toggle_optimizer(opt)
                model.manual_backward(loss)
                model.untoggle_optimizer(opt)
            """,
    })
    monkeypatch.chdir(tmp_path)
    assert _migrate.main(["pkg", "vendor"]) == 0
    out = capsys.readouterr().out
    assert "toggleshim.toggle(" not in out
    # loop.py, models.py, plain.py
    assert _with_lines(out) == ["with model.toggle_optimizer(opt, zero_grad=False, step=False):", *PLAIN, *PLAIN]


def test_migrate_assumption_names_bases_from_outside_the_run(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (pkg / "pkg" / "models.py").write_text(
        BASE.replace("import lightning.pytorch as pl", "from fancy.modules import FancyModule").replace(
            "(pl.LightningModule)", "(FancyModule)"
        )
    )
    code, out, err = _diff(pkg, monkeypatch, capsys, "--verbose")
    assert code == 0 and _with_lines(out)[0] == "with self.toggle_optimizer(g_opt):"
    [line] = [line for line in err.splitlines() if "assumed" in line]
    assert "fancy.modules.FancyModule" in line and "toggleshim.toggle(self, opt)" in line
    assert "lightning" not in line  # Lightning's own LightningModule overrides nothing
    _, _, short = _diff(pkg, monkeypatch, capsys)
    assert [line for line in short.splitlines() if "assumed" in line] == [ASSUMED]


# The assumption, as a run states it by default: one line, short (--verbose: in full)
ASSUMED = "toggleshim migrate: assumed: no toggle_optimizer outside these files returns None (--verbose: more)"


def test_migrate_assumption_is_one_short_line_a_run(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three files whose spans all become plain blocks: the assumption is said once a run, in one line
    of at most 100 characters (issue 38); ``--verbose`` says it in full, once, in its place."""
    _tree(pkg, {"pkg/more.py": BASE.replace("class Base", "class More"), "pkg/third.py": BASE.replace(
        "class Base", "class Third")})
    code, _, err = _diff(pkg, monkeypatch, capsys, "--write")
    assert code == 0 and err.count("migrated 2 spans") == 3, err
    lines = err.splitlines()
    assert [line for line in lines if "assumed" in line] == [ASSUMED] and len(ASSUMED) <= 100
    assert lines[-2:] == [ASSUMED, "toggleshim migrate: rewrote 3 of 4 files (6 spans)"]
    for name in ("models", "more", "third"):  # back to statements, to be migrated again
        (pkg / "pkg" / f"{name}.py").write_text(BASE.replace("class Base", f"class {name.title()}"))
    _, _, err = _diff(pkg, monkeypatch, capsys, "--verbose")
    [line] = [line for line in err.splitlines() if "assumed" in line]
    assert line.startswith("toggleshim migrate: assumed: no class outside these files overrides toggle_optimizer")
    assert 'docs/migrate.md, "Overrides"' in line and "toggleshim.toggle(self, opt)" in line


def test_migrate_unprocessable_file_counts_as_outside_the_run(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (pkg / "pkg" / "broken.py").write_text("class Sub(Base:\n")
    code, _, err = _diff(pkg, monkeypatch, capsys, "--verbose")
    assert code == 1
    [line] = [line for line in err.splitlines() if "assumed" in line]
    assert "a file that could not be processed" in line


def test_migrate_own_toggle_override_in_the_same_file() -> None:
    src = BASE + OWN_TOGGLE
    result = _migrate.migrate_source(src.encode())
    new = result.new.decode()
    assert "with toggleshim.toggle(self, g_opt):" in new
    assert "\nimport toggleshim\nimport torch\n" in new
    assert [s.reason for s in result.spans] == [None, None] and not result.other


def test_migrate_adds_import_toggleshim_beside_a_from_import(tmp_path: Path) -> None:
    """``from toggleshim import toggle`` binds no ``toggleshim``: the block needs ``import toggleshim``."""
    (tmp_path / "pyproject.toml").write_text("")  # the project root: toggleshim is third-party there
    src = "from toggleshim import toggle\n" + BASE + OWN_TOGGLE
    new = _migrate.migrate_source(src.encode(), str(tmp_path / "module.py")).new.decode()
    assert new.startswith("import toggleshim\nfrom toggleshim import toggle\n")


@pytest.mark.parametrize("shadow", ["toggleshim = 1", "from helpers import toggleshim", "import numpy as toggleshim"])
def test_migrate_refuses_when_the_file_shadows_toggleshim(shadow: str) -> None:
    src = BASE.replace('"""\nimport torch', f'"""\n{shadow}\nimport torch') + OWN_TOGGLE
    result = _migrate.migrate_source(src.encode())
    assert result.new == src.encode()
    assert all("needs `with toggleshim.toggle(...)`" in (s.reason or "") for s in result.spans)


OVERRIDE_ONLY = '''\
from lightning.pytorch import LightningModule


class Freezing(LightningModule):
    def toggle_optimizer(self, optimizer):
        super().toggle_optimizer(optimizer)  # the override's own toggle
        self.encoder.requires_grad_(False)


class Returning(LightningModule):
    def toggle_optimizer(self, optimizer, **kwargs):
        return super().toggle_optimizer(optimizer, **kwargs)
'''


def test_super_toggle_in_an_override_is_never_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _tree(tmp_path, {"pkg/module.py": OVERRIDE_ONLY})
    # as CI runs it: a fresh process
    proc = subprocess.run([sys.executable, "-m", "toggleshim", "migrate", "--check", "pkg"], cwd=tmp_path,
                          capture_output=True, text=True, env=_env(), timeout=_HANG)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
    assert "0 statement toggles not exception-safe in 1 file checked" in proc.stderr
    code, out, err = _diff(tmp_path, monkeypatch, capsys)
    assert code == 0 and out == "" and "not migrated" not in err


def test_super_toggle_outside_an_override_is_still_a_finding() -> None:
    src = "class M:\n    def step(self, opt):\n        super().toggle_optimizer(opt)\n        self.go()\n"
    result = _migrate.migrate_source(src.encode())
    assert [s.text for s in result.spans] == ["super().toggle_optimizer(opt)"]


# -- training: the migrated base, with a subclass in a sibling file, in a real Trainer.fit ------

TRAIN = '''\
"""Train pkg.<module>.Sub in a real Trainer.fit; save the world to the file named."""
import importlib
import sys

import torch
import lightning.pytorch as pl

name, out = sys.argv[1:]
torch.manual_seed(0)
module = importlib.import_module(name).Sub()
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(module)
torch.save({
    "params": [p.detach().clone() for p in module.parameters()],
    "grads": [None if p.grad is None else p.grad.clone() for p in module.parameters()],
    "requires_grad": [p.requires_grad for p in module.parameters()],
    "seen": module.seen,
    "optimizers": [o.state_dict() for o in trainer.optimizers],
    "global_step": trainer.global_step,
}, out)
'''


def _env() -> dict[str, str]:
    # the toggleshim these tests import (a worktree's, not the venv's editable install)
    root = str(Path(toggleshim.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": root}


def _train(root: Path, name: str) -> dict[str, object]:
    out = root / "world.pt"
    proc = subprocess.run([sys.executable, "train.py", name, str(out)], cwd=root, capture_output=True, text=True,
                          env=_env(), timeout=_HANG)
    assert proc.returncode == 0, proc.stderr[-3000:]
    world: dict[str, object] = torch.load(out, weights_only=False)
    return world


def _project(tmp_path: Path, sub: str, text: str) -> tuple[Path, Path]:
    """The project as written, and a copy migrated by ``toggleshim migrate --write`` (a subprocess)."""
    original = _tree(tmp_path / "original", {"pkg/__init__.py": "", "pkg/models.py": BASE, f"pkg/{sub}.py": text,
                                             "train.py": TRAIN})
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    proc = subprocess.run([sys.executable, "-m", "toggleshim", "migrate", "--write", "pkg"], cwd=migrated,
                          capture_output=True, text=True, env=_env(), timeout=_HANG)
    assert proc.returncode == 0 and "rewrote 1 of 3 files (2 spans)" in proc.stderr, proc.stderr
    return original, migrated


def test_migrated_base_trains_identically_with_an_untoggle_override_in_a_sibling_file(tmp_path: Path) -> None:
    original, migrated = _project(tmp_path, "refreeze", REFREEZE)
    assert "with self.toggle_optimizer(g_opt):" in (migrated / "pkg" / "models.py").read_text()
    before = _train(original, "pkg.refreeze")
    after = _train(migrated, "pkg.refreeze")
    assert before["global_step"] == 8
    assert before["seen"][0][:2] == [False, False]  # type: ignore[index]  # the override re-froze the encoder
    assert_same_world(before, after)


def test_migrated_base_trains_identically_with_a_toggle_override_returning_none(tmp_path: Path) -> None:
    original, migrated = _project(tmp_path, "frozen_bias", NONE_TOGGLE)
    text = (migrated / "pkg" / "models.py").read_text()
    assert "with toggleshim.toggle(self, g_opt):" in text
    before = _train(original, "pkg.frozen_bias")
    assert_same_world(before, _train(migrated, "pkg.frozen_bias"))
    # the plain block is what the override breaks: Python's NoneType error
    (migrated / "pkg" / "models.py").write_text(
        text.replace("toggleshim.toggle(self, g_opt)", "self.toggle_optimizer(g_opt)")
    )
    proc = subprocess.run([sys.executable, "train.py", "pkg.frozen_bias", str(tmp_path / "x.pt")], cwd=migrated,
                          capture_output=True, text=True, env=_env(), timeout=_HANG)
    assert proc.returncode != 0 and "does not support the context manager protocol" in proc.stderr


# -- --check: an override dropping the toggle a block uses (issue 37, point 4) --------------------

# BASE written with blocks, by hand (toggleshim's code, as migrate writes it)
BLOCKS = _migrate.migrate_source(BASE.encode()).new.decode()
# NONE_TOGGLE fixed as the finding says: the toggle super() made, kept and returned last (the flags of
# the blocks forwarded)
KEPT_TOGGLE = NONE_TOGGLE.replace(
    "    def toggle_optimizer(self, optimizer):\n        super().toggle_optimizer(optimizer)\n",
    "    def toggle_optimizer(self, optimizer, **kwargs):\n"
    "        toggle = super().toggle_optimizer(optimizer, **kwargs)\n",
) + "        return toggle\n"


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    """``toggleshim migrate --check pkg`` in ``root``, as CI runs it (a fresh process)."""
    return subprocess.run([sys.executable, "-m", "toggleshim", "migrate", "--check", "pkg"], cwd=root,
                          capture_output=True, text=True, env=_env(), timeout=_HANG)


def _dropped(path: str, line: int, name: str, block: str) -> str:
    return (
        f"{path}:{line}: `{name}.toggle_optimizer` calls `super().toggle_optimizer(...)` and drops its result: "
        f"`with self.toggle_optimizer(...)` at {block} gets None ('NoneType' object does not support the context "
        "manager protocol); return it (`return super().toggle_optimizer(optimizer, **kwargs)`, or keep it and "
        "return it last), or write the block as `with toggleshim.toggle(self, opt):`"
    )


def test_check_flags_a_subclass_in_another_file_dropping_the_toggle_and_the_fix_trains(tmp_path: Path) -> None:
    """A block ``with self.toggle_optimizer(g_opt):`` in Base, and in a sibling file a subclass whose
    override calls ``super()`` and returns nothing: ``--check`` names the override's line, the block,
    and the fix, exit 1; trained, that code fails with Python's NoneType error; fixed as the line says,
    ``--check`` passes and the module trains bitwise as the statement-style original."""
    assert "with self.toggle_optimizer(g_opt):" in BLOCKS
    block = 1 + BLOCKS.splitlines().index("        with self.toggle_optimizer(g_opt):")
    root = _tree(tmp_path / "flagged", {"pkg/__init__.py": "", "pkg/models.py": BLOCKS, "pkg/sub.py": NONE_TOGGLE,
                                        "train.py": TRAIN})
    proc = _check(root)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [_dropped("pkg/sub.py", 7, "Sub", f"pkg/models.py:{block}")]
    assert proc.stderr.endswith("0 statement toggles not exception-safe in 3 files checked; 1 override of "
                                "toggle_optimizer dropping a block's toggle\n"), proc.stderr
    failed = subprocess.run([sys.executable, "train.py", "pkg.sub", str(tmp_path / "x.pt")], cwd=root,
                            capture_output=True, text=True, env=_env(), timeout=_HANG)
    assert failed.returncode != 0 and "does not support the context manager protocol" in failed.stderr
    (root / "pkg" / "sub.py").write_text(KEPT_TOGGLE)
    proc = _check(root)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    original = _tree(tmp_path / "original", {"pkg/__init__.py": "", "pkg/models.py": BASE, "pkg/sub.py": NONE_TOGGLE,
                                             "train.py": TRAIN})
    assert_same_world(_train(original, "pkg.sub"), _train(root, "pkg.sub"))


@pytest.mark.parametrize("case", ["own override", "bare return", "return None", "mixin of a subclass"])
def test_check_flags_an_override_dropping_the_toggle(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """Every class whose toggle_optimizer the block may call: its own, a base, a subclass's mixin; a
    bare ``return`` and ``return None`` return nothing either."""
    models = pkg / "pkg" / "models.py"
    if case == "own override":
        models.write_text(BLOCKS + OWN_TOGGLE)
        where = ("pkg/models.py", 1 + (BLOCKS + OWN_TOGGLE).splitlines().index(OWN_TOGGLE.splitlines()[-1]), "Base")
    elif case == "mixin of a subclass":
        models.write_text(BLOCKS)
        _tree(pkg, {"pkg/mixin.py": """\
            class Counting:
                def toggle_optimizer(self, optimizer):
                    super().toggle_optimizer(optimizer)
                    self.count = getattr(self, "count", 0) + 1
            """, "pkg/sub.py": "from .mixin import Counting\nfrom .models import Base\n\n\nclass Sub(Counting, Base):\n"
                                "    pass\n"})
        where = ("pkg/mixin.py", 3, "Counting")
    else:
        models.write_text(BLOCKS)
        tail = "        return\n" if case == "bare return" else "        return None\n"
        _tree(pkg, {"pkg/sub.py": NONE_TOGGLE + tail})
        where = ("pkg/sub.py", 7, "Sub")
    block = 1 + models.read_text().splitlines().index("        with self.toggle_optimizer(g_opt):")
    code, out, _ = _diff(pkg, monkeypatch, capsys, "--check")
    assert code == 1 and out.splitlines() == [_dropped(*where, f"pkg/models.py:{block}")]


@pytest.mark.parametrize("case", ["returned", "kept and returned", "through toggleshim.toggle", "unrelated class",
                                  "no block"])
def test_check_passes_what_gets_its_toggle(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """No finding where the block gets the toggle: the override returns it (at once, or kept); the
    block is ``toggleshim.toggle(self, ...)`` (it takes the toggle an override's super() made); the
    dropping override is in a class the block's ``self`` cannot be; or no block uses it (statements)."""
    models = pkg / "pkg" / "models.py"
    models.write_text(BASE if case == "no block" else BLOCKS)
    sub = {
        "returned": NONE_TOGGLE.replace("        super().toggle_optimizer(optimizer)\n", "").replace(
            "        self.d.bias", "        self.d.bias.requires_grad_(False)\n        return super().toggle_optimizer("
            "optimizer)\n        self.d.bias"),
        "kept and returned": KEPT_TOGGLE,
        "unrelated class": NONE_TOGGLE.replace("from .models import Base", "class Base:\n    pass"),
    }.get(case, NONE_TOGGLE)
    if case == "through toggleshim.toggle":
        models.write_text(BLOCKS.replace("with self.toggle_optimizer(", "with toggleshim.toggle(self, "))
    _tree(pkg, {"pkg/sub.py": sub})
    code, out, err = _diff(pkg, monkeypatch, capsys, "--check")
    assert "drops its result" not in out and "dropping" not in err, out
    assert code == (1 if case == "no block" else 0), out  # BASE's statement toggles are findings of their own


def test_migrate_typing_override_decorator_keeps_the_receiver_class(
    pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``@override`` returns the method itself: ``self`` is still an instance of the class, so an
    override in an unrelated class of the run changes nothing; any other decorator may call the method
    with another object, and then every class of the run matters."""
    _tree(pkg, {"pkg/other.py": NONE_TOGGLE.replace("from .models import Base", "class Base:\n    pass")})
    models = pkg / "pkg" / "models.py"
    models.write_text(BASE.replace("    def training_step", "    @override\n    def training_step"))
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out) == PLAIN
    models.write_text(BASE.replace("    def training_step", "    @wrapped\n    def training_step"))
    _, out, _ = _diff(pkg, monkeypatch, capsys)
    assert _with_lines(out)[0] == "with toggleshim.toggle(self, g_opt):"
