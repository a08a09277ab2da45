"""The gate on code identity (issue 13, points 1 and 2): fingerprints, a release with identical toggle
code patched silently whatever its version, and on unverified toggle code the fallback block, which is
that Lightning's own manual sequence, bitwise (stand-in and real ``Trainer.fit``), with a clear error
for nesting. Fresh-process runs at the end: what a user upgrading Lightning meets."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _fake_release import COSMETIC, FORCE_TRAINABLE, fake_release, method_copy, original
from _fixtures import DISABLE, assert_a_block_toggles, pl, state, three_heads
from hypothesis import given, settings

import toggleshim
from toggleshim import _ours, _patch
from toggleshim._fingerprint import fingerprint_function
from toggleshim._known import KNOWN
from toggleshim.testing import FLAT_EXAMPLES, ManualDriver, ShimDriver, build_world, compare_runs, run_program, worlds
from toggleshim.testing.harness import run_in_trainer

TESTS = Path(__file__).parent


def _flavour_obj(flavour: str) -> Any:
    (found,) = [f for f in _patch._flavours() if f.name == flavour]
    return found


# fingerprints


def test_installed_lightning_toggle_code_is_known(flavour: str) -> None:
    # Fails when the installed Lightning (e.g. its main branch, in the canary) changed toggling.
    pair = tuple(fingerprint_function(original(flavour, n)) for n in ("toggle_optimizer", "untoggle_optimizer"))
    assert pair in KNOWN, f"{flavour}: toggle code {pair} is not among the verified ones; see scripts/fingerprints.py"
    assert _patch._mode(_flavour_obj(flavour)) == "shim"


def test_fingerprint_ignores_docstring_comments_decorator_not_a_token(flavour: str) -> None:
    toggle = original(flavour, "toggle_optimizer")
    same = method_copy(toggle, COSMETIC, decorate=DISABLE)
    assert getattr(same, "_torchdynamo_disable", False)  # really marked, as Lightning's main branch does
    changed = method_copy(toggle, (FORCE_TRAINABLE,))
    assert fingerprint_function(toggle) is not None
    assert fingerprint_function(same.__wrapped__) == fingerprint_function(toggle)
    assert fingerprint_function(changed) != fingerprint_function(toggle)
    renamed = method_copy(toggle, (("param_requires_grad_state[param] = param.requires_grad",
                                    "param_requires_grad_state[param] = param.requires_grad  # same"),))
    assert fingerprint_function(renamed) == fingerprint_function(toggle)


def test_fingerprint_without_source_is_unknown() -> None:
    namespace: dict[str, Any] = {}
    exec("def toggle_optimizer(self, optimizer):\n    pass\n", namespace)  # no file: like a .pyc-only install
    assert fingerprint_function(namespace["toggle_optimizer"]) is None


# the gate: identical code, any version


@pytest.mark.parametrize("version", ["2.7.0", "3.0.0", "1.9.5"])
def test_identical_toggle_code_is_patched_silently_whatever_the_version(flavour: str, version: str) -> None:
    with fake_release(flavour, version) as messages:
        assert messages == []
        assert _patch._mode(_flavour_obj(flavour)) == "shim" and toggleshim.is_installed()
        module = three_heads(flavour)
        with module.toggle_optimizer(module.opts[1]):
            assert not module.a.weight.requires_grad and module.b.weight.requires_grad
        assert all(state(module).values())


def test_unverified_code_gives_one_warning_naming_the_version(flavour: str) -> None:
    dist = "lightning" if flavour == "lightning.pytorch" else "pytorch-lightning"
    with fake_release(flavour, changed=True) as messages:
        assert len(messages) == 1, messages
        (msg,) = messages
        # the way forward: each choice with its exact command
        last = max((r.split()[1] for rs in KNOWN.values() for r in rs if r.split()[0] == dist),
                   key=lambda v: tuple(map(int, re.findall(r"\d+", v))))
        for words in (f"{dist} 2.7.0", flavour, "toggle_optimizer code differs", "Lightning's own sequence",
                      f'pin the last release toggleshim verified (`pip install "{dist}=={last}"`)',
                      "upgrade toggleshim", "(`pip install --upgrade toggleshim`)",
                      "certify this Lightning for your project", "(`python -m toggleshim certify`)"):
            assert words in msg, (words, msg)
        cls = pl(flavour).LightningModule
        assert _patch._mode(_flavour_obj(flavour)) == "fallback" and not toggleshim.is_installed()
        assert vars(cls)["untoggle_optimizer"] is original(flavour, "untoggle_optimizer")  # stays Lightning's
        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            toggleshim.install()  # idempotent: no second warning, the same fallback
        assert not [w for w in again if issubclass(w.category, toggleshim.ToggleshimWarning)]


@pytest.mark.parametrize(
    ("source", "why"),
    [
        # compiled without a file: the source is unavailable, as in a .pyc-only install
        ("def toggle_optimizer(self, optimizer):\n    return ORIGINAL(self, optimizer)\n", "source of its toggle code"),
        # a new optional parameter (and a file, so that it is fingerprinted): Lightning's own, unverified
        (None, "toggle_optimizer code differs"),
    ],
)
def test_lightnings_own_method_unverified_or_unreadable_gets_the_fallback(
    flavour: str, source: str | None, why: str
) -> None:
    cls = pl(flavour).LightningModule
    real = original(flavour, "toggle_optimizer")
    if source is None:
        fn = method_copy(real, ((") -> None:", ", extra: int = 1) -> None:"),))
    else:
        namespace: dict[str, Any] = {"ORIGINAL": real}
        exec(source, namespace)
        fn = namespace["toggle_optimizer"]
        fn.__qualname__, fn.__module__ = real.__qualname__, real.__module__
    toggleshim.uninstall()
    try:
        cls.toggle_optimizer = fn
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        (msg,) = [str(w.message) for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
        assert why in msg and _patch._mode(_flavour_obj(flavour)) == "fallback"
        assert_a_block_toggles(flavour)
    finally:
        toggleshim.uninstall()
        cls.toggle_optimizer = real
        toggleshim.install()


# the fallback: that Lightning's own behaviour


def test_fallback_statement_is_that_lightnings_own_toggle(flavour: str) -> None:
    with fake_release(flavour, changed=True):
        module, ref = three_heads(flavour, frozen=True), three_heads(flavour, frozen=True)
        changed = original(flavour, "toggle_optimizer")
        assert changed is not None and _patch._SENTINEL not in vars(changed)
        module.toggle_optimizer(module.opts[0])
        changed(ref, ref.opts[0])
        assert state(module) == state(ref) and module.a.bias.requires_grad  # the change: forced trainable
        module.untoggle_optimizer(module.opts[0])
        original(flavour, "untoggle_optimizer")(ref, ref.opts[0])
        assert state(module) == state(ref)


def _manual_of_this_release(flavour: str) -> ManualDriver:
    return ManualDriver(original(flavour, "toggle_optimizer"), original(flavour, "untoggle_optimizer"))


@settings(max_examples=15)
@given(worlds(nesting=False))
def test_fallback_block_is_that_codes_manual_sequence_bitwise(flavour: str, spec: Any) -> None:
    with fake_release(flavour, changed=True):
        fallback = run_program(build_world(spec, flavour), spec.program, ShimDriver(), check_model=False)
        manual = run_program(build_world(spec, flavour), spec.program, _manual_of_this_release(flavour),
                             check_model=False)
        compare_runs(fallback, manual)


def test_fallback_really_runs_the_changed_code(flavour: str) -> None:
    # Not vacuous: on some hand-picked world the changed release differs from Lightning 2.6's toggle,
    # and the fallback block follows the changed one.
    differs = 0
    for spec in FLAT_EXAMPLES:
        with fake_release(flavour, changed=True):
            fallback = run_program(build_world(spec, flavour), spec.program, ShimDriver(), check_model=False)
        real = run_program(build_world(spec, flavour), spec.program, ManualDriver.for_flavour(flavour),
                           check_model=False)
        try:
            compare_runs(fallback, real)
        except AssertionError:
            differs += 1
    assert differs > 0


def test_fallback_block_in_a_real_trainer_is_that_codes_manual_sequence(flavour: str) -> None:
    spec = next(s for s in FLAT_EXAMPLES if s.frozen)  # a user-frozen parameter: where the change shows
    with fake_release(flavour, changed=True):
        fallback, world = run_in_trainer(spec, ShimDriver(), flavour, check_model=False, batches=2)
        manual, _ = run_in_trainer(spec, _manual_of_this_release(flavour), flavour, check_model=False, batches=2)
        compare_runs(fallback, manual, world)
    real, _ = run_in_trainer(spec, ManualDriver.for_flavour(flavour), flavour, check_model=False, batches=2)
    with pytest.raises(AssertionError):
        compare_runs(fallback, real, world)


def test_fallback_block_zero_grads_steps_and_untoggles(flavour: str) -> None:
    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        opt = module.opts[0]
        (module.a.weight * 2).sum().backward()
        before = module.a.weight.detach().clone()
        with module.toggle_optimizer(opt) as got:
            assert got is opt and module.a.weight.grad is None  # zero_grad (set_to_none)
            assert not module.b.weight.requires_grad
            (module.a.weight ** 2).sum().backward()
        assert not torch.equal(module.a.weight, before)  # stepped
        assert all(state(module).values())  # untoggled
        err = ValueError("boom")
        before = module.a.weight.detach().clone()
        with pytest.raises(ValueError) as info, module.toggle_optimizer(opt):
            (module.a.weight ** 2).sum().backward()
            raise err
        assert info.value is err and torch.equal(module.a.weight, before)  # same object; no step
        assert all(state(module).values())
        with module.toggle_optimizer(opt, zero_grad=False, step=False):  # usable again
            pass


def test_fallback_block_refuses_a_step_inside_it(flavour: str) -> None:
    """The fallback block is the same block class as the shim's: a ``step()`` of its optimizer inside
    a block that steps on exit is refused at the exit (no second step), after Lightning's own
    untoggle; with ``step=False`` the body's own step is the only one."""
    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        opt = module.opts[0]
        steps: list[int] = []
        sgd_step = opt.step  # counted on the instance: torch 2.0/2.1's first torch.compile strips step hooks

        def counted(*args: Any, **kwargs: Any) -> Any:
            steps.append(1)
            return sgd_step(*args, **kwargs)

        opt.step = counted
        block = module.toggle_optimizer(opt)
        assert repr(block).startswith("<toggleshim fallback toggle toggled on")
        with pytest.raises(RuntimeError, match="would step twice"), block:
            (module.a.weight ** 2).sum().backward()
            opt.step()
        assert steps == [1] and all(state(module).values())  # one step; untoggled
        with module.toggle_optimizer(opt, step=False):
            (module.a.weight ** 2).sum().backward()
            opt.step()
        assert steps == [1, 1] and all(state(module).values())


def test_fallback_ctrl_c_at_the_first_line_of_the_exit_closes_the_block(flavour: str) -> None:
    """An interrupt at the very first line of the fallback block's ``__exit__``, where nothing can
    catch it: the exit guard closes the block when the ``with`` statement lets go of ``__exit__``,
    calling that Lightning's own ``untoggle_optimizer`` (there is no other untoggle), once; the module
    is not kept open (the next block is not refused as a nested one)."""
    from _hostile import AtFirstLine

    from toggleshim import _block

    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        opt = module.opts[0]
        calls: list[Any] = []
        lightning_untoggle = type(module).untoggle_optimizer

        def counting(self: Any, optimizer: Any) -> None:
            calls.append(optimizer)
            lightning_untoggle(self, optimizer)

        module.untoggle_optimizer = counting.__get__(module)
        at_exit = AtFirstLine(inspect.unwrap(_block.Toggle._exit).__code__)
        with at_exit as inter, pytest.raises(KeyboardInterrupt) as caught, module.toggle_optimizer(opt):
            assert not module.b.weight.requires_grad
        assert caught.value is inter.raised
        assert calls == [opt] and all(state(module).values())
        del module.untoggle_optimizer
        with module.toggle_optimizer(opt, zero_grad=False, step=False):  # no fallback block left open
            pass
        assert all(state(module).values())


def test_fallback_failing_zero_grad_untoggles(flavour: str) -> None:
    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        opt = module.opts[0]
        err = RuntimeError("zero_grad failed")

        def fail(*args: Any, **kwargs: Any) -> None:
            raise err

        opt.zero_grad = fail
        ran = []
        with pytest.raises(RuntimeError) as info, module.toggle_optimizer(opt):
            ran.append(1)
        assert info.value is err and not ran and all(state(module).values())
        with module.toggle_optimizer(opt, zero_grad=False, step=False):  # no block left open
            pass


def test_fallback_failing_untoggle_never_replaces_the_body_exception(flavour: str) -> None:
    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        opt = module.opts[0]
        err = ValueError("the body's own")

        def failing_untoggle(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("untoggle failed")

        t2 = module.toggle_optimizer(opt, zero_grad=False, step=False)
        module.untoggle_optimizer = failing_untoggle  # the module's own untoggle, failing
        with pytest.raises(ValueError) as info, t2:
            raise err
        assert info.value is err  # not the untoggle's RuntimeError
        del module.untoggle_optimizer
        with pytest.raises(RuntimeError, match="untoggle failed"):  # on a clean exit, it propagates
            t3 = module.toggle_optimizer(opt, zero_grad=False, step=False)
            module.untoggle_optimizer = failing_untoggle
            with t3:
                pass


def test_fallback_nesting_is_a_clear_error_that_changes_nothing(flavour: str) -> None:
    dist = "lightning" if flavour == "lightning.pytorch" else "pytorch-lightning"
    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        with module.toggle_optimizer(module.opts[0]):
            (module.a.weight ** 2).sum().backward()
            grads = module.a.weight.grad.clone()
            inside, record = state(module), dict(module._param_requires_grad_state)
            with pytest.raises(RuntimeError) as info:
                module.toggle_optimizer(module.opts[1])
            assert state(module) == inside and module._param_requires_grad_state == record
            assert torch.equal(module.a.weight.grad, grads)
        assert all(state(module).values())
        msg = str(info.value)
        for words in ("toggleshim", f"{dist} 2.7.0", "not one toggleshim has verified",
                      "python -m toggleshim check", "pin the last release toggleshim verified",
                      "python -m toggleshim certify", "Nothing was changed"):
            assert words in msg, (words, msg)
        outer = module.toggle_optimizer(module.opts[1])  # made before the block, entered inside it
        with module.toggle_optimizer(module.opts[0], zero_grad=False, step=False), pytest.raises(RuntimeError):
            outer.__enter__()


def test_fallback_bad_flags_change_nothing(flavour: str) -> None:
    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        with pytest.raises(TypeError, match="zero_grad must be True or False"):
            module.toggle_optimizer(module.opts[0], zero_grad="yes")
        assert all(state(module).values()) and not module._param_requires_grad_state


def test_fallback_sync_grad_false_blocks_gradient_sync(flavour: str) -> None:
    events: list[str] = []

    class Sync:
        def __enter__(self) -> None:
            events.append("blocked")

        def __exit__(self, *exc: Any) -> None:
            events.append("resumed")

    with fake_release(flavour, changed=True):
        module = three_heads(flavour)
        module._trainer.strategy = SimpleNamespace(block_backward_sync=Sync)
        with module.toggle_optimizer(module.opts[0], sync_grad=False):
            events.append("body")
        assert events == ["blocked", "body", "resumed"]
        module._trainer.strategy = SimpleNamespace()  # no attribute: a failing strategy changes nothing

        class Broken:
            optimizers = module.opts

            @property
            def strategy(self) -> Any:
                raise RuntimeError("no strategy")

        module._trainer = Broken()
        with pytest.raises(RuntimeError, match="no strategy"):
            module.toggle_optimizer(module.opts[0], sync_grad=False)
        assert all(state(module).values())


def test_the_typed_entry_points_take_the_fallback(flavour: str) -> None:
    module = three_heads(flavour)
    assert repr(toggleshim.toggle(module, module.opts[0])).startswith("<toggleshim.Toggle toggled optimizer=")
    module.untoggle_optimizer(module.opts[0])
    with fake_release(flavour, changed=True):
        fallback = type(module).toggle_optimizer
        assert _ours.original_of(fallback) is not None and getattr(fallback, _ours.MODE) == "fallback"
        with fallback(module, module.opts[0]) as opt:
            assert opt is module.opts[0] and not module.b.weight.requires_grad
        for entry in (toggleshim.toggle, toggleshim.Toggle):  # both typed entry points take it
            t = entry(module, module.opts[0])
            assert isinstance(t, toggleshim.Toggle) and repr(t).startswith("<toggleshim fallback toggle"), entry
            with t:
                assert not module.b.weight.requires_grad
            assert module.b.weight.requires_grad


# someone else's replacement


def test_someone_elses_patch_warning_says_what_the_with_line_will_do(flavour: str) -> None:
    cls = pl(flavour).LightningModule
    toggleshim.uninstall()
    saved = vars(cls)["toggle_optimizer"]

    def toggle_optimizer(self: Any, optimizer: Any) -> None:  # another patcher's
        saved(self, optimizer)

    cls.toggle_optimizer = toggle_optimizer
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        (msg,) = [str(w.message) for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
        assert vars(cls)["toggle_optimizer"] is toggle_optimizer  # never wrapped, never clobbered
        assert "toggleshim left" in msg and "someone else" in msg and "'NoneType' object does not support" in msg
        assert "2.6" in msg or importlib.metadata.version("lightning") in msg
    finally:
        cls.toggle_optimizer = saved
        toggleshim.install()


# as users meet it: a fresh process, Lightning upgraded under their code

_USER_CODE = """
import warnings, sys
warnings.simplefilter("always")
from _fake_release import FORCE_TRAINABLE, method_copy, relabelled
from _fixtures import three_heads
import {flavour} as pl
with relabelled("2.7.0"):
    if {changed}:
        cls = pl.LightningModule
        cls.toggle_optimizer = method_copy(cls.toggle_optimizer, (FORCE_TRAINABLE,))
    import toggleshim
module = three_heads("{flavour}")
with module.toggle_optimizer(module.opts[0]):
    (module.a.weight ** 2).sum().backward()
print("block ok", all(p.requires_grad for p in module.parameters()))
with module.toggle_optimizer(module.opts[0]):
    with module.toggle_optimizer(module.opts[1]):
        pass
print("nested ok")
"""


@pytest.mark.one_flavour_by_default
@pytest.mark.parametrize("changed", [False, True])
def test_fresh_process_after_a_lightning_upgrade(flavour: str, changed: bool) -> None:
    code = textwrap.dedent(_USER_CODE).format(flavour=flavour, changed=changed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "block ok True" in proc.stdout, proc.stderr
    assert "NoneType" not in proc.stderr
    if changed:
        assert proc.returncode == 1 and "nested ok" not in proc.stdout
        assert proc.stderr.count("ToggleshimWarning") == 1, proc.stderr
        assert "RuntimeError: toggleshim: nested toggle_optimizer blocks are not available on" in proc.stderr
        # (the refusal's line names the release; torch 2.0 prints a ResourceWarning after it at exit)
        assert "2.7.0" in next(x for x in proc.stderr.splitlines() if x.startswith("RuntimeError: toggleshim"))
    else:
        assert proc.returncode == 0 and "nested ok" in proc.stdout
        assert "ToggleshimWarning" not in proc.stderr, proc.stderr
