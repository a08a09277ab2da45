"""``toggleshim.testing.assert_trains_like_manual``: a user's own module fitted twice under a real
``Trainer`` (its blocks through toggleshim, and expanded into Lightning's manual sequence), compared
bitwise. It passes on toggleshim as it is, in both flavours, with flags, schedulers, nesting, the
module's own overrides and ``toggleshim.toggle``; it fails on planted bugs, naming the first
difference; bad input gets a clear error; global state is left as it was.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import _trains_modules as T
import numpy
import pytest
import torch
from _training_models import one_thread  # noqa: F401  (an autouse fixture)

import toggleshim
from toggleshim import Toggle
from toggleshim._ours import original_of
from toggleshim.testing import assert_trains_like_manual
from toggleshim.testing.trains import _tensor_difference

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2 * T.BATCHES  # two optimizers: two steps a batch


# -- toggleshim as it is: equal, bit for bit


@pytest.mark.parametrize("style", ["block", "typed"])
def test_the_gan_trains_like_manual(flavour: str, style: str) -> None:
    assert_trains_like_manual(T.gan(flavour, style), max_steps=STEPS)


def test_flags_and_schedulers_train_like_manual(flavour: str) -> None:
    """Two micro-batches a step (``zero_grad``, ``step``, ``sync_grad`` False on the first), LR schedulers
    stepped after the blocks: their state is compared too."""
    assert_trains_like_manual(T.gan(flavour, accumulate=2, schedulers=True), max_steps=T.BATCHES)


def test_nested_toggles_train_like_the_documented_nesting(flavour: str) -> None:
    """The manual fit expands nested toggles by the reference model: inside every nested toggle exactly
    the inner optimizer's parameters train, in the manual fit (made first) as with toggleshim. Lightning's
    own nesting would freeze them (``test_toggled_optimizer.py``)."""
    made: list[Any] = []
    assert_trains_like_manual(T.nested(flavour, made), max_steps=5 * T.BATCHES)
    manual, shim = made
    assert manual.inside == shim.inside == [True] * (3 * T.BATCHES)


@pytest.mark.parametrize(("toggle", "untoggle"), [("super", "log"), ("super", "refreeze"), (None, "own")],
                         ids=["counted", "fine-tuning", "an untoggle without super()"])
def test_overrides_are_the_modules_own_methods(flavour: str, toggle: str | None, untoggle: str) -> None:
    """Both fits call the class's overrides: its ``untoggle_optimizer`` once per block (counted where it
    counts), its ``toggle_optimizer`` too (which freezes the backbone's bias after ``super()``); what an
    untoggle leaves after ``super()``, or without it, is the same in both."""
    made: list[Any] = []
    assert_trains_like_manual(T.overrides(flavour, toggle, untoggle, made=made), max_steps=STEPS)
    manual, shim = made
    assert manual.untoggles == shim.untoggles == (0 if untoggle == "refreeze" else STEPS)
    assert not shim.backbone[0].bias.requires_grad


def test_toggleshim_toggle_over_an_overridden_toggle_optimizer_is_refused(flavour: str) -> None:
    """``toggleshim.toggle`` on such a class runs toggleshim's own block around the override: the manual
    fit cannot expand it, and says what to write."""
    with pytest.raises(ValueError, match=r"toggleshim.toggle\(self, opt\)` on a class that overrides"):
        assert_trains_like_manual(T.overrides(flavour, entry="toggle"), max_steps=STEPS)


@pytest.mark.one_flavour_by_default
def test_ddp_on_one_device_blocks_sync_in_both_fits(flavour: str) -> None:
    """``strategy="ddp…"`` on one CPU device: ``sync_grad=False`` enters the strategy's
    ``block_backward_sync()`` in both fits (DDP's sync flag, after each backward: off on the first
    micro-batch, on on the last); the process group DDP started is gone afterwards."""
    made: list[Any] = []
    assert_trains_like_manual(T.gan(flavour, accumulate=2, probe=True, made=made), max_steps=T.BATCHES,
                              strategy="ddp_find_unused_parameters_true")
    assert not torch.distributed.is_initialized()
    manual, shim = ([r["sync"] for r in m.records if "sync" in r] for m in made)
    assert manual == shim == [False, False, True, True] * (T.BATCHES // 2)


# -- planted bugs: the first difference, named


def _exit_without_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shim whose block never steps: its exit runs as after an exception in the body (no step,
    untoggle)."""
    original = Toggle._exit

    def exit_without_step(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
        return original(self, exc_type or RuntimeError, exc, tb)

    monkeypatch.setattr(Toggle, "_exit", exit_without_step)


def test_a_shim_that_skips_the_step_fails(flavour: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _exit_without_step(monkeypatch)
    with pytest.raises(AssertionError) as caught:
        assert_trains_like_manual(T.gan(flavour), max_steps=STEPS)
    said = r"after fit: parameter 'generator\.0\.weight' differs: max \|a-b\| = \S+ \(toggleshim vs manual\)"
    assert re.fullmatch(said, str(caught.value)), caught.value


def test_the_same_planted_bug_through_toggleshim_toggle_fails(flavour: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _exit_without_step(monkeypatch)
    with pytest.raises(AssertionError, match="after fit: parameter"):
        assert_trains_like_manual(T.gan(flavour, "typed"), max_steps=STEPS)


# Hand-planted bugs of the shim (toggleshim.testing.mutants), each in a fresh process: the module that
# shows it, and what assert_trains_like_manual names first.
PLANTED = {
    "no zero_grad on entry": ("gan", r"AssertionError: after fit: parameter 'generator\.0\.weight' differs"),
    "step ignores the step flag": ("accumulate", r"AssertionError: after fit: parameter 'generator\.0\.weight'"),
    "the block steps around the LightningOptimizer": (
        "gan", r"AssertionError: after fit: trainer\.global_step is 0 with toggleshim, 12 with manual"),
    "nested exit restores nothing": ("nested", r"AssertionError: after fit: "),
    "nesting is Lightning's (flat)": ("nested", r"AssertionError: after fit: "),
    "the exit bypasses an overridden untoggle_optimizer": ("overrides", r"AssertionError: after fit: "),
}

_PLANTED_RUN = """
import sys
from toggleshim.testing.mutants import apply
apply(sys.argv[1])
import _trains_modules as T
from toggleshim.testing import assert_trains_like_manual
kind, flavour = sys.argv[2], sys.argv[3]
make = T.gan(flavour, accumulate=2) if kind == "accumulate" else getattr(T, kind)(flavour)
try:
    assert_trains_like_manual(make, max_steps=12)
except Exception as e:
    print(f"{type(e).__name__}: {e}")
else:
    print("passed")
"""


@pytest.mark.one_flavour_by_default
@pytest.mark.parametrize("mutant", sorted(PLANTED))
def test_hand_planted_shim_bugs_fail(flavour: str, mutant: str) -> None:
    kind, expected = PLANTED[mutant]
    proc = subprocess.run([sys.executable, "-c", _PLANTED_RUN, mutant, kind, flavour], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(expected, proc.stdout), proc.stdout[-3000:]


def test_none_and_zero_gradients_differ() -> None:
    zeros = torch.zeros(3)
    assert _tensor_difference(None, zeros) == "is None with toggleshim, a tensor of zeros with manual"
    assert _tensor_difference(zeros, None) == "is a tensor of zeros with toggleshim, None with manual"
    assert _tensor_difference(zeros, -zeros) == "differs bitwise (equal values: signed zeros or NaN payloads)"
    assert _tensor_difference(zeros, zeros.clone()) is None and _tensor_difference(None, None) is None


# -- the toggleshim fit's own errors, and what it cannot compare


def test_an_error_of_the_toggleshim_fit_propagates_unchanged(flavour: str) -> None:
    """A body that steps its own optimizer in a ``step=True`` block: the manual sequence steps twice,
    toggleshim refuses at the exit; its ``RuntimeError`` is what the caller sees."""
    make = T.gan(flavour)

    def stepping() -> Any:
        module = make()
        backward = module.manual_backward

        def manual_backward(loss: Any, *args: Any, **kwargs: Any) -> None:
            backward(loss, *args, **kwargs)
            module.optimizers()[1].step()

        module.manual_backward = manual_backward
        return module

    with pytest.raises(RuntimeError, match=r"step\(\) ran inside `with self.toggle_optimizer\(opt\):`"):
        assert_trains_like_manual(stepping, max_steps=STEPS)


def test_a_fit_that_only_fails_without_toggleshim_is_a_difference(flavour: str) -> None:
    make = T.gan(flavour)

    def needy() -> Any:
        module = make()
        step = module.training_step

        def training_step(*args: Any) -> Any:
            if not toggleshim.is_installed():
                raise LookupError("toggleshim is not installed")
            return step(*args)

        module.training_step = training_step
        return module

    with pytest.raises(AssertionError, match=r"^the manual fit raised LookupError: toggleshim is not installed "
                                             r"\(the toggleshim fit did not\)$"):
        assert_trains_like_manual(needy, max_steps=STEPS)


def test_a_fit_that_never_toggles_checked_nothing_and_fails(flavour: str) -> None:
    make = T.gan(flavour)

    def plain() -> Any:
        module = make()
        module.training_step = lambda batch, batch_idx: None
        return module

    with pytest.raises(AssertionError, match="never called toggle_optimizer: nothing was compared"):
        assert_trains_like_manual(plain, max_steps=STEPS)


def test_bad_input_is_named(flavour: str) -> None:
    make = T.gan(flavour)
    with pytest.raises(ValueError, match=r"max_steps must be a positive int, got builtins\.int \(0\)"):
        assert_trains_like_manual(make, max_steps=0)
    with pytest.raises(TypeError, match="make must be a callable"):
        assert_trains_like_manual("GAN", max_steps=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"LightningModule, got torch\.nn\.modules\.linear\.Linear \(Linear\("):
        assert_trains_like_manual(lambda: torch.nn.Linear(1, 1), max_steps=1)

    module = make()
    with pytest.raises(ValueError, match="make\\(\\) returned the module it returned before"):
        assert_trains_like_manual(lambda: module, max_steps=STEPS)

    def automatic() -> Any:
        module = make()
        module.automatic_optimization = True
        return module

    with pytest.raises(ValueError, match="uses automatic optimization"):
        assert_trains_like_manual(automatic, max_steps=1)


# -- global state


def _global_state(flavour: str) -> dict[str, Any]:
    return {
        "random": random.getstate(), "torch": torch.get_rng_state().tolist(), "numpy": str(numpy.random.get_state()),
        "deterministic": torch.are_deterministic_algorithms_enabled(), "benchmark": torch.backends.cudnn.benchmark,
        "environment": dict(os.environ), "installed": toggleshim.is_installed(),
    }


@pytest.mark.parametrize("installed", [True, False])
def test_global_state_is_left_as_it_was(flavour: str, installed: bool) -> None:
    """Seeds, torch's determinism flags (``deterministic=True`` sets them for the fits), the
    environment and toggleshim's installed state; uninstalled, the methods are Lightning's very objects."""
    cls = T.M.flavour_module(flavour).LightningModule
    random.seed(7)
    torch.manual_seed(7)
    try:
        if not installed:
            toggleshim.uninstall()
        lightnings = {name: vars(cls)[name] for name in ("toggle_optimizer", "untoggle_optimizer")}
        before = _global_state(flavour)
        assert_trains_like_manual(T.gan(flavour), max_steps=STEPS)
        after = _global_state(flavour)
        now = {name: vars(cls)[name] for name in ("toggle_optimizer", "untoggle_optimizer")}
    finally:
        toggleshim.install()
    assert after == before
    assert before["installed"] is installed
    if not installed:
        assert all(now[name] is lightnings[name] for name in now)
    assert (original_of(now["toggle_optimizer"]) is None) is not installed
