"""Self-test of ``scripts/lightning_suite.py``, the runner of Lightning's own toggle tests under the shim.

Lightning's test suite is not on PyPI (the sdists and wheels of ``lightning`` / ``pytorch-lightning``
ship no ``tests/``), so CI, which reaches package registries only, cannot run it: a developer runs
``python scripts/lightning_suite.py <lightning checkout>`` (see that script's docstring). What CI can
check is that the runner itself works and would catch a regression: here it runs on a miniature
"Lightning checkout" (a git repository laid out like Lightning's, tagged with the installed version)
whose tests use the real ``lightning.pytorch`` Trainer, and must

* stage the tests with ``git archive`` from the tag of the installed version,
* run them without and with the shim, and prove the shim was (and was not) active,
* count the toggleshim ``Toggle`` objects each test made (a toggle test that made none = shim bypassed),
* lift the GPU gate of the ported toggle test and run it on CPU in its own pytest process,
* report a test failing only with the shim as a failure (exit 1) and one failing in both modes as an
  environment note.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lightning_suite.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lightning_suite", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lightning_suite", module)
    spec.loader.exec_module(module)
    return module


suite = _load_script()

CONFTEST = """
import lightning.pytorch  # as Lightning's conftest does: the flavour is imported before the shim
"""

TOGGLE_TESTS = """
import contextlib
import sys

import torch
from torch import nn

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel


class TwoOptimizers(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.other = nn.Linear(32, 2)
        self.other.bias.requires_grad = False

    def training_step(self, batch, batch_idx):
        opt1, opt2 = self.optimizers()
        self.toggle_optimizer(opt1)
        assert self.layer.weight.requires_grad and not self.other.weight.requires_grad
        loss = self.step(batch)
        opt1.zero_grad()
        self.manual_backward(loss)
        opt1.step()
        self.untoggle_optimizer(opt1)
        assert self.other.weight.requires_grad and not self.other.bias.requires_grad
        toggled = getattr(self, "toggled_optimizer", None)  # Lightning >= 2.5.1
        if toggled is None:
            self.toggle_optimizer(opt2)
        with toggled(opt2) if toggled is not None else contextlib.nullcontext():
            assert not self.layer.weight.requires_grad and self.other.weight.requires_grad
            loss = self.other(batch).sum()
            opt2.zero_grad()
            self.manual_backward(loss)
            opt2.step()
        if toggled is None:
            self.untoggle_optimizer(opt2)
        assert self.layer.weight.requires_grad

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.SGD(self.other.parameters(), lr=0.1)


def test_toggle_untoggle_two_optimizers(tmp_path):
    model = TwoOptimizers()
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(model)
    assert trainer.global_step == 6
    assert not model._param_requires_grad_state


def test_fails_only_with_the_shim():
    assert "toggleshim" not in sys.modules


def test_fails_in_both_modes():
    raise AssertionError("stands for a test whose dependency (e.g. tensorboard) is missing")
"""

GPU_GATED = """
import pytest
import torch

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel


class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        self.toggle_optimizer(opt)
        self.manual_backward(self.step(batch))
        opt.step()
        opt.zero_grad()
        self.untoggle_optimizer(opt)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="stands for RunIf(min_cuda_gpus=2, standalone=True)")
def test_step_with_optimizer_closure_with_different_frequencies_ddp_with_toggle_model(tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, accelerator="gpu", devices=1, max_steps=2, limit_val_batches=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    assert trainer.accelerator.__class__.__name__ == "CPUAccelerator"  # the CPU port took effect
    trainer.fit(Model())
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _fake_lightning(root: Path, tags: list[str]) -> Path:
    files = {
        "pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["--strict-markers"]\n',
        "tests/tests_pytorch/__init__.py": "",
        "tests/tests_pytorch/conftest.py": CONFTEST,
        "tests/tests_pytorch/core/__init__.py": "",
        "tests/tests_pytorch/core/test_lightning_module.py": TOGGLE_TESTS,
        "tests/tests_pytorch/trainer/__init__.py": "",
        "tests/tests_pytorch/trainer/optimization/__init__.py": "",
        "tests/tests_pytorch/trainer/optimization/test_manual_optimization.py": GPU_GATED,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "fake lightning")
    for tag in tags:
        _git(root, "tag", tag)
    return root / ".git"


def test_choose_ref_prefers_exact_tag_then_newest_older_patch(tmp_path: Path) -> None:
    git_dir = _fake_lightning(tmp_path, ["2.6.4", "2.6.5", "2.7.0", "2.5.9", "nightly"])
    assert suite.choose_ref(git_dir, "2.6.5") == ("2.6.5", None)
    ref, warning = suite.choose_ref(git_dir, "2.6.6")
    assert ref == "2.6.5" and warning is not None and "2.6.6" in warning
    with pytest.raises(suite.StageError):
        suite.choose_ref(git_dir, "2.8.1")


def test_pytorch_lightning_conversion_rewrites_imports(tmp_path: Path) -> None:
    test = tmp_path / "tests" / "tests_pytorch" / "test_x.py"
    test.parent.mkdir(parents=True)
    test.write_text("import lightning.pytorch as pl\nfrom lightning.fabric.utilities import x\nlightning.pytorchx\n")
    assert suite.convert_to_pytorch_lightning(tmp_path) == 1
    assert (
        test.read_text()
        == "import pytorch_lightning as pl\nfrom lightning_fabric.utilities import x\nlightning.pytorchx\n"
    )


def _run(flavour: str, mode: str, outcomes: dict[str, str], toggles: dict[str, int] | None = None) -> object:
    run = suite.Run(flavour, mode, outcomes=outcomes)
    run.per_test_toggles.update(toggles or {})
    return run


def test_judge_verdicts() -> None:
    class Opts:
        strict = False
        no_cpu_port = True

    ok = {"a::test_toggle_x": "passed", "a::test_env": "failed", "a::test_other": "skipped"}
    base = _run("lightning", "baseline", dict(ok))
    shim = _run("lightning", "shim", dict(ok), {"a::test_toggle_x": 3})
    failures, notes = suite.judge({("lightning", "baseline"): base, ("lightning", "shim"): shim}, Opts)
    assert failures == [] and any("a::test_env" in n for n in notes)

    Opts.strict = True
    failures, _ = suite.judge({("lightning", "baseline"): base, ("lightning", "shim"): shim}, Opts)
    assert len(failures) == 1 and "a::test_env" in failures[0]
    Opts.strict = False

    bypassed = _run("lightning", "shim", dict(ok))  # toggle test passed, but no Toggle was made
    failures, _ = suite.judge({("lightning", "baseline"): base, ("lightning", "shim"): bypassed}, Opts)
    assert len(failures) == 1 and "bypassed" in failures[0]

    broken = _run("lightning", "shim", {**ok, "a::test_other": "error"}, {"a::test_toggle_x": 1})
    failures, _ = suite.judge({("lightning", "baseline"): base, ("lightning", "shim"): broken}, Opts)
    assert len(failures) == 1 and "only with the shim" in failures[0] and "a::test_other" in failures[0]

    lost = _run("lightning", "shim", {"a::test_toggle_x": "passed"}, {"a::test_toggle_x": 1})
    failures, _ = suite.judge({("lightning", "baseline"): base, ("lightning", "shim"): lost}, Opts)
    assert any("ran at baseline but not with the shim" in f for f in failures)


@pytest.mark.one_flavour_by_default
def test_runner_end_to_end_on_a_miniature_lightning(tmp_path: Path, flavour: str) -> None:
    """Stage from git, run baseline and shim, port the GPU-gated test to CPU, and judge (~30 s)."""
    name = "lightning" if flavour == "lightning.pytorch" else "pytorch_lightning"
    installed = metadata.version("lightning" if name == "lightning" else "pytorch-lightning")
    git_dir = _fake_lightning(tmp_path / "fake-lightning", [installed])
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(git_dir), "--workers", "0", "--timeout", "300", "--json", str(out),
         "--flavour", name],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert f"ref {installed} " in result["staged"]

    toggle = "tests/tests_pytorch/core/test_lightning_module.py::test_toggle_untoggle_two_optimizers"
    only_shim = "tests/tests_pytorch/core/test_lightning_module.py::test_fails_only_with_the_shim"
    both = "tests/tests_pytorch/core/test_lightning_module.py::test_fails_in_both_modes"
    gated = (
        "tests/tests_pytorch/trainer/optimization/test_manual_optimization.py::"
        "test_step_with_optimizer_closure_with_different_frequencies_ddp_with_toggle_model"
    )
    base, shim = result["runs"][f"{name}/baseline"], result["runs"][f"{name}/shim"]
    assert base["outcomes"] == {toggle: "passed", only_shim: "passed", both: "failed", gated: "passed"}
    assert shim["outcomes"] == {toggle: "passed", only_shim: "failed", both: "failed", gated: "passed"}
    assert base["toggles"] == 0 and base["problems"] == [] and shim["problems"] == []
    # 3 batches x (toggle_optimizer + toggled_optimizer) went through the shim; the ported test 2 steps.
    assert shim["per_test_toggles"][toggle] == 6
    assert shim["per_test_toggles"][gated] == 2
    assert gated in shim["cpu_ported"] and gated in base["cpu_ported"]
    assert result["failures"] == [f"[{name}/shim] fails only with the shim: {only_shim} (failed; baseline: passed)"]
    assert any(both in note for note in result["notes"])
    assert "FAILED checks:" in proc.stdout
