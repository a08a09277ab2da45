"""Example tests of the shim: activation, signature, statement use, the block, nesting, bad input,
torch.compile marking, refusal to patch blindly, and leaks. Stand-in trainers here; real
``Trainer.fit`` runs are in ``test_trainer_exact.py``."""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import pydoc
import re
import subprocess
import sys
import textwrap
import types
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from _fixtures import (
    DISABLE_MARKS_RECURSIVE,
    DISABLE_TAKES_RECURSIVE,
    assert_a_block_toggles,
    compile_refused,
    disable,
    pl,
    state,
    three_heads,
)

import toggleshim
from toggleshim import Toggle, ToggleshimWarning
from toggleshim.testing import installed_flavours
from toggleshim.testing.torchside import kept_out

ORIGINAL = {}  # the exact function objects Lightning ships, captured before any test patches
for _f in ("lightning.pytorch", "pytorch_lightning"):
    try:
        _cls = importlib.import_module(_f).LightningModule
    except ImportError:
        continue
    for _n in ("toggle_optimizer", "untoggle_optimizer"):
        _fn = vars(_cls)[_n]
        ORIGINAL[(_f, _n)] = getattr(_fn, "_toggleshim_original", _fn)


@pytest.fixture(autouse=True)
def _installed() -> Any:
    toggleshim.install()
    yield
    toggleshim.install()


def lightning_toggle(flavour: str, module: Any, opt: Any) -> None:
    ORIGINAL[(flavour, "toggle_optimizer")](module, opt)


def lightning_untoggle(flavour: str, module: Any, opt: Any) -> None:
    ORIGINAL[(flavour, "untoggle_optimizer")](module, opt)


# activation


def test_import_patches_every_flavour(flavour: str) -> None:
    cls = pl(flavour).LightningModule
    assert toggleshim.is_installed()
    assert vars(cls)["toggle_optimizer"] is not ORIGINAL[(flavour, "toggle_optimizer")]
    assert vars(cls)["toggle_optimizer"]._toggleshim_original is ORIGINAL[(flavour, "toggle_optimizer")]


def test_every_installed_flavour_is_patched_on_its_own_class() -> None:
    classes = [pl(f).LightningModule for f in installed_flavours()]
    assert classes, "no Lightning flavour installed"
    assert len({id(c) for c in classes}) == len(classes)  # lightning.pytorch and pytorch_lightning: distinct
    for cls in classes:
        assert hasattr(vars(cls)["toggle_optimizer"], "_toggleshim_original")
        assert hasattr(vars(cls)["untoggle_optimizer"], "_toggleshim_original")


def test_install_twice_is_a_noop(flavour: str) -> None:
    cls = pl(flavour).LightningModule
    before = vars(cls)["toggle_optimizer"]
    toggleshim.install()
    toggleshim.install()
    assert vars(cls)["toggle_optimizer"] is before


def test_uninstall_restores_the_exact_originals(flavour: str) -> None:
    cls = pl(flavour).LightningModule
    toggleshim.uninstall()
    assert not toggleshim.is_installed()
    for name in ("toggle_optimizer", "untoggle_optimizer"):
        assert vars(cls)[name] is ORIGINAL[(flavour, name)]
    toggleshim.uninstall()  # a second uninstall is a no-op
    assert vars(cls)["toggle_optimizer"] is ORIGINAL[(flavour, "toggle_optimizer")]


def test_a_method_of_ours_left_behind_is_patched_again(flavour: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone else's patch of ``untoggle_optimizer`` over ours (pytest's ``monkeypatch``), an
    ``uninstall()`` meanwhile (which leaves their method), and their patch undone: our old method is
    back alone. ``install()`` takes it for the original it points at: no warning, both methods
    patched afresh, and ``uninstall()`` puts Lightning's own back."""
    cls = pl(flavour).LightningModule
    ours = vars(cls)["untoggle_optimizer"]
    with monkeypatch.context() as patch:
        patch.setattr(cls, "untoggle_optimizer", lambda self, optimizer: ours(self, optimizer))
        toggleshim.uninstall()
    assert vars(cls)["untoggle_optimizer"] is ours
    assert vars(cls)["toggle_optimizer"] is ORIGINAL[(flavour, "toggle_optimizer")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        toggleshim.install()
    assert toggleshim.is_installed()
    for name in ("toggle_optimizer", "untoggle_optimizer"):
        assert vars(cls)[name]._toggleshim_original is ORIGINAL[(flavour, name)]
    m = three_heads(flavour)
    before = state(m)
    with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
        inside = state(m)
        m.toggle_optimizer(m.opts[1])
        m.untoggle_optimizer(m.opts[1])  # the nested statement toggle, closed by our untoggle
        assert state(m) == inside
    assert state(m) == before
    toggleshim.uninstall()
    assert all(vars(cls)[name] is ORIGINAL[(flavour, name)] for name in ("toggle_optimizer", "untoggle_optimizer"))
    toggleshim.install()


@pytest.mark.parametrize("name", ["toggle_optimizer", "untoggle_optimizer"])
def test_someone_elses_functools_wraps_patch_over_ours_is_theirs(flavour: str, name: str) -> None:
    """``functools.wraps`` copies ``__dict__``, toggleshim's marks included. Their patch over ours is
    still theirs: ``uninstall()`` leaves it (and puts Lightning's own back only under the other
    method), and ``install()`` leaves the flavour untouched, saying why."""
    cls = pl(flavour).LightningModule
    ours = vars(cls)[name]
    calls = []

    @functools.wraps(ours)
    def theirs(self: Any, optimizer: Any, **kwargs: Any) -> Any:
        calls.append(optimizer)
        return ours(self, optimizer, **kwargs)

    setattr(cls, name, theirs)
    try:
        assert theirs._toggleshim_original is ORIGINAL[(flavour, name)]  # the marks are copied
        assert toggleshim.is_installed() == (name == "untoggle_optimizer")  # is_installed() reads the toggle
        toggleshim.uninstall()
        assert vars(cls)[name] is theirs
        other = "untoggle_optimizer" if name == "toggle_optimizer" else "toggle_optimizer"
        assert vars(cls)[other] is ORIGINAL[(flavour, other)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        (msg,) = [str(w.message) for w in caught if issubclass(w.category, ToggleshimWarning)]
        assert f"{name} was already wrapped by someone else (over toggleshim." in msg and "untouched" in msg, msg
        assert vars(cls)[name] is theirs and vars(cls)[other] is ORIGINAL[(flavour, other)]
        m, ref = three_heads(flavour), three_heads(flavour)
        m.toggle_optimizer(m.opts[0])  # a statement through their patch: Lightning's toggle
        lightning_toggle(flavour, ref, ref.opts[0])
        assert state(m) == state(ref) != state(three_heads(flavour))
        m.untoggle_optimizer(m.opts[0])
        assert all(state(m).values()) and calls == [m.opts[0]]
    finally:
        setattr(cls, name, ORIGINAL[(flavour, name)])
        toggleshim.install()


def test_reload_never_stacks_and_uninstall_still_restores(flavour: str) -> None:
    cls = pl(flavour).LightningModule
    before = vars(cls)["toggle_optimizer"]
    importlib.reload(toggleshim)
    importlib.reload(toggleshim)
    assert vars(cls)["toggle_optimizer"] is before
    toggleshim.uninstall()
    assert vars(cls)["toggle_optimizer"] is ORIGINAL[(flavour, "toggle_optimizer")]


def test_lightning_imported_after_toggleshim_is_patched() -> None:
    import subprocess
    import sys

    flavours = installed_flavours()
    after = (
        "import sys, toggleshim\n"
        "assert not any(name.split('.')[0] in ('lightning', 'pytorch_lightning') for name in sys.modules)\n"
        f"import {', '.join(flavours)}\n"
        f"for cls in ({''.join(f + '.LightningModule, ' for f in flavours)}):\n"
        "    assert hasattr(vars(cls)['toggle_optimizer'], '_toggleshim_original'), cls\n"
        "assert toggleshim.is_installed()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", after], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    before = f"import {', '.join(flavours)}, toggleshim; assert toggleshim.is_installed()"
    subprocess.run([sys.executable, "-c", before], check=True)


@pytest.mark.one_flavour_by_default
def test_importing_toggleshim_keeps_the_users_lightning_logger(flavour: str) -> None:
    # Importing a flavour rebinds Lightning's shared rank-zero logger: the shim must never import one.
    import subprocess
    import sys

    code = (
        f"import {flavour}, toggleshim\n"
        "from lightning_utilities.core import rank_zero\n"
        "assert toggleshim.is_installed()\n"
        "print(rank_zero.log.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(flavour)


def test_subclass_with_its_own_toggle_optimizer_is_left_alone(flavour: str) -> None:
    base = pl(flavour).LightningModule

    class Custom(base):  # type: ignore[misc, valid-type]
        def toggle_optimizer(self, optimizer: Any) -> str:
            return "mine"

    toggleshim.uninstall()
    toggleshim.install()
    assert Custom().toggle_optimizer(None) == "mine"
    assert "toggle_optimizer" in vars(Custom)


# signature


def test_signature_and_help_show_the_new_parameters(flavour: str) -> None:
    fn = pl(flavour).LightningModule.toggle_optimizer
    params = inspect.signature(fn).parameters
    assert list(params) == ["self", "optimizer", "zero_grad", "step", "sync_grad"]
    assert all(params[name].default is True and params[name].kind is inspect.Parameter.KEYWORD_ONLY
               for name in ("zero_grad", "step", "sync_grad"))
    # the documented defaults, which the harness takes from the model, are the code's
    from toggleshim._block import FLAGS
    from toggleshim.testing.model import FLAG_DEFAULTS

    assert {name: default for name, (default, _) in FLAGS.items()} == FLAG_DEFAULTS
    assert {name: params[name].default for name in FLAGS} == FLAG_DEFAULTS
    text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
    assert "zero_grad: bool = True" in text and "step: bool = True" in text
    assert "with self.toggle_optimizer" in (fn.__doc__ or "")
    assert fn.__name__ == "toggle_optimizer" and fn.__qualname__ == "LightningModule.toggle_optimizer"


# statement use: exactly Lightning


@pytest.mark.parametrize("kw", [{}, {"frozen": True}, {"shared": True}, {"n_opt": 3, "shared": True}])
def test_statement_toggle_equals_lightning(flavour: str, kw: dict[str, Any]) -> None:
    shim, ref = three_heads(flavour, **kw), three_heads(flavour, **kw)
    for k in range(len(shim.opts)):
        result = shim.toggle_optimizer(shim.opts[k])
        lightning_toggle(flavour, ref, ref.opts[k])
        assert isinstance(result, Toggle)
        assert state(shim) == state(ref)
        names = {id(p): n for n, p in shim.named_parameters()}
        ref_names = {id(p): n for n, p in ref.named_parameters()}
        assert [(names[id(p)], v) for p, v in shim._param_requires_grad_state.items()] == [
            (ref_names[id(p)], v) for p, v in ref._param_requires_grad_state.items()
        ]
        shim.untoggle_optimizer(shim.opts[k])
        lightning_untoggle(flavour, ref, ref.opts[k])
        assert state(shim) == state(ref) and shim._param_requires_grad_state == {}


def test_toggled_optimizer_and_toggle_model_keep_working(flavour: str) -> None:
    module = three_heads(flavour)
    before = state(module)
    if hasattr(module, "toggled_optimizer"):  # Lightning >= 2.5.1
        with module.toggled_optimizer(module.opts[0]):
            assert not module.b.weight.requires_grad and module.a.weight.requires_grad
        assert state(module) == before
    lopt = pl(flavour).core.optimizer.LightningOptimizer(module.opts[1])
    lopt._strategy = type("S", (), {"lightning_module": module})()
    with lopt.toggle_model():
        assert module.b.weight.requires_grad and not module.a.weight.requires_grad
    assert state(module) == before


# the block


def test_block_yields_the_optimizer_and_toggles_at_call(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    toggle = module.toggle_optimizer(opt, zero_grad=False, step=False)
    assert not module.b.weight.requires_grad  # toggled at the call, before `with`
    with toggle as got:
        assert got is opt
    assert all(state(module).values())


def test_block_zero_grads_on_entry_and_steps_on_clean_exit(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    module.a.weight.grad = torch.ones(2, 2)
    before = module.a.weight.detach().clone()
    with module.toggle_optimizer(opt):
        assert module.a.weight.grad is None  # the optimizer's default: set_to_none
        module.a(torch.ones(1, 2)).sum().backward()
    assert not torch.equal(module.a.weight, before)
    assert all(state(module).values())


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyboardInterrupt(), SystemExit(3)])
def test_exception_in_block_no_step_untoggles_same_object(flavour: str, exc: BaseException) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    before = module.a.weight.detach().clone()
    with pytest.raises(type(exc)) as info, module.toggle_optimizer(opt):
        module.a(torch.ones(1, 2)).sum().backward()
        raise exc
    assert info.value is exc
    assert torch.equal(module.a.weight, before)  # no step
    assert all(state(module).values())
    with module.toggle_optimizer(opt):  # usable again after an exception
        module.a(torch.ones(1, 2)).sum().backward()
    assert not torch.equal(module.a.weight, before)


def test_failing_zero_grad_untoggles_and_skips_body(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    err = RuntimeError("zero_grad failed")

    def bad_zero_grad(*args: Any, **kwargs: Any) -> None:
        raise err

    opt.zero_grad = bad_zero_grad
    ran = []
    with pytest.raises(RuntimeError) as info, module.toggle_optimizer(opt):
        ran.append(1)
    assert info.value is err and not ran
    assert all(state(module).values()) and module._param_requires_grad_state == {}


def test_failing_step_still_untoggles(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[1]
    err = RuntimeError("step failed")

    def bad_step(*args: Any, **kwargs: Any) -> None:
        raise err

    opt.step = bad_step
    with pytest.raises(RuntimeError) as info, module.toggle_optimizer(opt):
        pass
    assert info.value is err
    assert all(state(module).values())


def test_step_false_and_zero_grad_false(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    module.a.weight.grad = torch.ones(2, 2)
    before = module.a.weight.detach().clone()
    with module.toggle_optimizer(opt, zero_grad=False, step=False):
        assert module.a.weight.grad is not None
    assert torch.equal(module.a.weight, before)


def test_reentering_a_toggle_is_an_error_that_changes_nothing(flavour: str) -> None:
    module = three_heads(flavour)
    toggle = module.toggle_optimizer(module.opts[0])
    with toggle:
        pass
    before = state(module)
    with pytest.raises(RuntimeError, match="single-use"), toggle:
        pass
    assert state(module) == before


def test_entering_a_toggle_after_its_untoggle_is_an_error(flavour: str) -> None:
    module = three_heads(flavour)
    toggle = module.toggle_optimizer(module.opts[0])
    module.untoggle_optimizer(module.opts[0])
    before = state(module)
    with pytest.raises(RuntimeError, match="undone or superseded"), toggle:
        pass
    assert state(module) == before


# exactness against the manual sequence (stand-in; real Trainer in test_trainer_exact.py)


def test_block_is_bitwise_the_manual_sequence(flavour: str) -> None:
    shim, ref = three_heads(flavour, frozen=True, shared=True), three_heads(flavour, frozen=True, shared=True)
    x = torch.ones(3, 2)
    for _ in range(3):
        for k, head in enumerate("ab"):
            with shim.toggle_optimizer(shim.opts[k]):
                getattr(shim, head)(x).square().sum().backward()
            lightning_toggle(flavour, ref, ref.opts[k])
            try:
                ref.opts[k].zero_grad()
                getattr(ref, head)(x).square().sum().backward()
                ref.opts[k].step()
            finally:
                lightning_untoggle(flavour, ref, ref.opts[k])
            assert state(shim) == state(ref)
            for (n, p), (_, q) in zip(shim.named_parameters(), ref.named_parameters()):
                assert torch.equal(p, q), n
                assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
            assert str(shim.opts[k].state_dict()) == str(ref.opts[k].state_dict())


def test_cached_plan_follows_parameter_changes(flavour: str) -> None:
    shim, ref = three_heads(flavour), three_heads(flavour)
    for m in (shim, ref):
        with torch.no_grad():  # equal values everywhere: a cache comparing tensors by value is fooled
            for p in m.parameters():
                p.fill_(1.0)
    with shim.toggle_optimizer(shim.opts[0], step=False):
        pass
    for m in (shim, ref):  # move a parameter between optimizers, in place
        moved = m.opts[1].param_groups[0]["params"].pop()
        m.opts[0].param_groups[0]["params"].append(moved)
    shim.toggle_optimizer(shim.opts[0])
    lightning_toggle(flavour, ref, ref.opts[0])
    assert state(shim) == state(ref)
    shim.untoggle_optimizer(shim.opts[0])
    stray = torch.optim.SGD([shim.a.weight], lr=0.1)  # not a trainer optimizer, but its params are
    with shim.toggle_optimizer(stray, step=False):
        pass
    stray.param_groups[0]["params"][0] = shim.c.weight  # held by no trainer optimizer
    with pytest.raises(ValueError, match=r"'c\.weight'"):
        shim.toggle_optimizer(stray)
    for size in (3, 4):  # re-created optimizers over fresh tensors of other shapes
        fresh = torch.nn.Parameter(torch.ones(size))
        shim._trainer.optimizers = [torch.optim.SGD([fresh], lr=0.1)]
        with shim.toggle_optimizer(shim._trainer.optimizers[0], step=False):
            assert fresh.requires_grad


LAYOUT_EDITS: dict[str, Any] = {
    # each edits a module's optimizers in place (same objects, same list objects where possible)
    "replace a parameter in place (same length)": lambda m: m.opts[0].param_groups[0]["params"].__setitem__(
        0, m.c.weight
    ),
    "swap two parameters inside a group": lambda m: m.opts[1].param_groups[0]["params"].reverse(),
    "add a parameter group": lambda m: m.opts[0].add_param_group({"params": [m.c.bias]}),
    "add a parameter group to the last optimizer": lambda m: m.opts[2].add_param_group({"params": [m.a.bias]}),
    "append a parameter to the last group": lambda m: m.opts[2].param_groups[-1]["params"].append(m.free),
    "remove the last parameter": lambda m: m.opts[2].param_groups[-1]["params"].pop(),
    "move a whole group to the previous optimizer": lambda m: m.opts[0].param_groups.append(
        m.opts[1].param_groups.pop()
    ),
    "move a group's boundary": lambda m: m.opts[1].param_groups[0]["params"].append(
        m.opts[2].param_groups[0]["params"].pop(0)
    ),
    "reorder trainer.optimizers in place": lambda m: m._trainer.optimizers.reverse(),
    "drop an optimizer from the trainer": lambda m: m._trainer.optimizers.pop(),
    "share a parameter between optimizers": lambda m: m.opts[1].param_groups[0]["params"].append(m.a.bias),
    "replace a group's params list": lambda m: m.opts[1].param_groups[0].__setitem__(
        "params", [m.b.bias, m.b.weight]
    ),
    "replace an optimizer by a new one over the same parameters": lambda m: m._trainer.optimizers.__setitem__(
        0, torch.optim.SGD(m.opts[0].param_groups[0]["params"], lr=0.1)
    ),
    "list an optimizer twice": lambda m: m._trainer.optimizers.append(m.opts[1]),
    "let two optimizers share one param_groups list": lambda m: setattr(
        m.opts[2], "param_groups", m.opts[1].param_groups
    ),
}


@pytest.mark.parametrize("edit", sorted(LAYOUT_EDITS))
@pytest.mark.parametrize("wrapped", [False, True], ids=["torch-optimizer", "LightningOptimizer"])
def test_cached_plan_follows_in_place_layout_edits(flavour: str, edit: str, wrapped: bool) -> None:
    """A plan cached before an in-place edit of the optimizers' layout is never reused after it."""
    shim, ref = three_heads(flavour, n_opt=3, frozen=True), three_heads(flavour, n_opt=3, frozen=True)
    for m in (shim, ref):
        with torch.no_grad():  # equal values everywhere: a cache comparing tensors by value is fooled
            for p in m.parameters():
                p.fill_(1.0)
    lightning_optimizer = pl(flavour).core.optimizer.LightningOptimizer
    mine = {id(m): tuple(m.opts) for m in (shim, ref)}  # m.opts is the trainer's list, edited below

    def opt(m: Any, k: int) -> Any:
        return lightning_optimizer(mine[id(m)][k]) if wrapped else mine[id(m)][k]

    def record(m: Any) -> dict[str, bool]:
        return {n: v for n, p in m.named_parameters() for q, v in m._param_requires_grad_state.items() if q is p}

    for k in range(3):  # cache a plan for every optimizer
        with shim.toggle_optimizer(opt(shim, k), step=False, zero_grad=False):
            pass
    for m in (shim, ref):
        LAYOUT_EDITS[edit](m)
    for k in range(3):
        shim_opt, ref_opt = opt(shim, k), opt(ref, k)
        try:
            lightning_toggle(flavour, ref, ref_opt)
        except KeyError:  # the edit left this optimizer with a parameter no trainer optimizer holds
            before = state(shim)
            with pytest.raises(ValueError, match=r"none of trainer\.optimizers holds"):
                shim.toggle_optimizer(shim_opt)
            assert state(shim) == before
            continue
        shim.toggle_optimizer(shim_opt)
        assert state(shim) == state(ref), (edit, k)
        assert record(shim) == record(ref), (edit, k)
        for o in (shim_opt, ref_opt):  # the user flips a toggled parameter meanwhile
            for first in [p for g in o.param_groups for p in g["params"]][:1]:
                first.requires_grad_(not first.requires_grad)
        shim.untoggle_optimizer(shim_opt)
        lightning_untoggle(flavour, ref, ref_opt)
        assert state(shim) == state(ref), (edit, k)
        with shim.toggle_optimizer(shim_opt, step=False, zero_grad=False):
            lightning_toggle(flavour, ref, ref_opt)
            assert state(shim) == state(ref), (edit, k)
            for o in (shim_opt, ref_opt):
                for last in [p for g in o.param_groups for p in g["params"]][-1:]:
                    last.requires_grad_(not last.requires_grad)
        lightning_untoggle(flavour, ref, ref_opt)
        assert state(shim) == state(ref), (edit, k)


RECORD_EDITS: dict[str, Any] = {  # (record, a parameter of optimizer 1, one of optimizer 2) -> None
    "unfreeze one": lambda r, p, q: r.__setitem__(p, True),
    "freeze one": lambda r, p, q: r.__setitem__(p, False),
    "delete one": lambda r, p, q: r.pop(p),
    "delete one, add another": lambda r, p, q: (r.pop(p), r.__setitem__(q, False)),
    "delete one and put it back": lambda r, p, q: r.__setitem__(p, r.pop(p)),
    "clear": lambda r, p, q: r.clear(),
}


@pytest.mark.parametrize("edit", sorted(RECORD_EDITS))
def test_block_exit_reads_the_record_as_lightning_untoggle_does(flavour: str, edit: str) -> None:
    """Lightning's untoggle restores what ``_param_requires_grad_state`` holds *at the untoggle*; a flat
    block's exit must honour in-place edits of that dict made inside the block, as a manual untoggle does."""
    shim, ref = three_heads(flavour, n_opt=3, frozen=True), three_heads(flavour, n_opt=3, frozen=True)
    for m in (shim, ref):
        m.b.weight.requires_grad_(False)  # a user-frozen parameter in the record: "unfreeze one" matters
    for k in (0, 0, 1):  # a cached plan first (its fast exit is the path under test)
        with shim.toggle_optimizer(shim.opts[k], step=False, zero_grad=False) as opt:
            lightning_toggle(flavour, ref, ref.opts[k])
            for m in (shim, ref):
                first = [p for g in m.opts[1 + k % 2].param_groups for p in g["params"]]
                last = [p for g in m.opts[2 - k % 2].param_groups for p in g["params"]]
                RECORD_EDITS[edit](m._param_requires_grad_state, first[0], last[-1])
            assert opt is shim.opts[k]
        lightning_untoggle(flavour, ref, ref.opts[k])
        assert state(shim) == state(ref), (edit, k)
        assert shim._param_requires_grad_state == {} == ref._param_requires_grad_state
        for m in (shim, ref):
            for p in m.parameters():
                p.requires_grad_(True)
            m.b.weight.requires_grad_(False)


class _RecordSubclass(dict):  # type: ignore[type-arg]
    """A record Lightning's untoggle reads through ``__contains__``/``__getitem__`` like any mapping."""

    def __getitem__(self, key: Any) -> Any:
        return not super().__getitem__(key)


@pytest.mark.parametrize(
    "value", [1, 1.0, torch.tensor(True)], ids=["int 1", "float 1.0", "tensor(True)"]
)
def test_block_exit_with_a_non_bool_record_value_fails_as_lightning_untoggle(flavour: str, value: Any) -> None:
    """A value equal to ``True`` but not a bool (``1 == True``): Lightning's untoggle raises "requires_grad
    must be a bool" at that parameter, after restoring the ones before it; so does the block's exit, and
    the exception is Lightning's own (the fast exit compares the record as a dict, then its values by
    identity)."""
    shim, ref = three_heads(flavour, n_opt=3, frozen=True), three_heads(flavour, n_opt=3, frozen=True)
    with shim.toggle_optimizer(shim.opts[0], step=False, zero_grad=False):
        pass  # a cached plan: its fast exit is the path under test
    lightning_toggle(flavour, ref, ref.opts[0])
    lightning_untoggle(flavour, ref, ref.opts[0])
    errors = []
    for m in (shim, ref):
        edited = [p for g in m.opts[2].param_groups for p in g["params"]][-1]

        def edit(m: Any = m, edited: Any = edited) -> None:
            assert m._param_requires_grad_state[edited] is True
            m._param_requires_grad_state[edited] = value

        with pytest.raises(RuntimeError, match="requires_grad must be a bool") as caught:
            if m is shim:
                with shim.toggle_optimizer(shim.opts[0], step=False, zero_grad=False):
                    edit()
            else:
                lightning_toggle(flavour, ref, ref.opts[0])
                edit()
                lightning_untoggle(flavour, ref, ref.opts[0])
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert state(shim) == state(ref)
    assert list(shim._param_requires_grad_state.values()) == list(ref._param_requires_grad_state.values())


def test_block_exit_reads_a_replaced_record_as_lightning_untoggle_does(flavour: str) -> None:
    """The record replaced inside the block by a dict subclass (its own ``__getitem__``), or by a plain
    dict with the same contents: the exit restores what Lightning's untoggle would, through it."""
    shim, ref = three_heads(flavour, n_opt=3, frozen=True), three_heads(flavour, n_opt=3, frozen=True)
    for kind in (_RecordSubclass, dict, _RecordSubclass):
        before = state(shim)
        with shim.toggle_optimizer(shim.opts[1], step=False, zero_grad=False):
            lightning_toggle(flavour, ref, ref.opts[1])
            for m in (shim, ref):
                m._param_requires_grad_state = kind(m._param_requires_grad_state)
        lightning_untoggle(flavour, ref, ref.opts[1])
        assert state(shim) == state(ref), kind
        assert shim._param_requires_grad_state == {} == ref._param_requires_grad_state
        # the subclass inverts what is restored through it (the test bites); a plain copy restores all
        assert (state(shim) != before) is (kind is _RecordSubclass), kind


def test_cached_plan_is_not_fooled_by_a_reused_id(flavour: str) -> None:
    """Fresh LightningOptimizer wrappers die after each toggle and CPython reuses their ids: a plan
    cached for a dead wrapper must not be taken for the new wrapper of another optimizer."""
    shim, ref = three_heads(flavour, n_opt=3, frozen=True), three_heads(flavour, n_opt=3, frozen=True)
    wrap = pl(flavour).core.optimizer.LightningOptimizer
    seen: dict[int, set[int]] = {}
    for k in [0, 1, 2, 1, 0, 2, 2, 0, 1] * 3:
        shim_opt = wrap(shim.opts[k])
        seen.setdefault(id(shim_opt), set()).add(k)
        with shim.toggle_optimizer(shim_opt, step=False, zero_grad=False):
            lightning_toggle(flavour, ref, ref.opts[k])
            assert state(shim) == state(ref), k
            for m in (shim, ref):  # flipped inside: the block's exit must restore the right ones
                m.opts[(k + 1) % 3].param_groups[0]["params"][0].requires_grad_(False)
                m.opts[k].param_groups[0]["params"][-1].requires_grad_(True)
        lightning_untoggle(flavour, ref, ref.opts[k])
        assert state(shim) == state(ref), k
        del shim_opt
    assert any(len(ks) > 1 for ks in seen.values()), "no id was reused: the test did not test anything"


# nesting


def test_nested_blocks_train_the_inner_optimizer_and_restore(flavour: str) -> None:
    module = three_heads(flavour, n_opt=3, frozen=True)
    user = state(module)
    a, b, c = module.opts
    with module.toggle_optimizer(a, step=False):
        inside_a = state(module)
        assert inside_a["a.weight"] and not inside_a["a.bias"] and not inside_a["b.weight"]
        with module.toggle_optimizer(b, step=False):
            assert module.b.weight.requires_grad and module.b.bias.requires_grad
            assert not module.a.weight.requires_grad and not module.c.weight.requires_grad
            with module.toggle_optimizer(c, step=False):
                assert module.c.weight.requires_grad and not module.b.weight.requires_grad
                with module.toggle_optimizer(a, step=False):
                    assert module.a.weight.requires_grad and not module.a.bias.requires_grad  # user froze it
            assert module.b.weight.requires_grad and not module.c.weight.requires_grad
        assert state(module) == inside_a
    assert state(module) == user
    assert module.free.requires_grad  # in no optimizer: never touched


def test_lightning_nested_toggle_freezes_forever_but_the_shim_does_not(flavour: str) -> None:
    ref, shim = three_heads(flavour), three_heads(flavour)
    lightning_toggle(flavour, ref, ref.opts[0])
    lightning_toggle(flavour, ref, ref.opts[1])
    lightning_untoggle(flavour, ref, ref.opts[1])
    lightning_untoggle(flavour, ref, ref.opts[0])
    assert not ref.b.weight.requires_grad  # Lightning's defect: b never trains again
    with shim.toggle_optimizer(shim.opts[0], step=False), shim.toggle_optimizer(shim.opts[1], step=False):
        assert shim.b.weight.requires_grad
    assert all(state(shim).values())


def test_statement_toggle_inside_a_block_nests_and_is_unwound(flavour: str) -> None:
    module = three_heads(flavour)
    a, b = module.opts
    with module.toggle_optimizer(a, step=False):
        module.toggle_optimizer(b)
        assert module.b.weight.requires_grad and not module.a.weight.requires_grad
        module.untoggle_optimizer(b)
        assert module.a.weight.requires_grad and not module.b.weight.requires_grad
        module.toggle_optimizer(b)  # left open: the block's exit unwinds it
    assert all(state(module).values())


def test_exception_through_nested_blocks(flavour: str) -> None:
    module = three_heads(flavour)
    err = ValueError("deep")
    with (
        pytest.raises(ValueError) as info,
        module.toggle_optimizer(module.opts[0]),
        module.toggle_optimizer(module.opts[1]),
    ):
        raise err
    assert info.value is err
    assert all(state(module).values())


# bad input: a clear error, nothing changed


def test_foreign_parameter_names_it_and_changes_nothing(flavour: str) -> None:
    module = three_heads(flavour, frozen=True)
    stray = torch.optim.SGD([module.c.weight], lr=0.1)  # c is in no optimizer of the trainer
    before = state(module)
    with pytest.raises(ValueError, match=r"'c\.weight'.*none of trainer\.optimizers"):
        module.toggle_optimizer(stray)
    assert state(module) == before
    outsider = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    with pytest.raises(ValueError, match=r"unnamed parameter of shape \(3,\)"):
        module.toggle_optimizer(outsider)
    assert state(module) == before


@pytest.mark.parametrize("bad", [None, torch.nn.Linear(1, 1), [], "adam"])
def test_non_optimizer_is_a_type_error_that_changes_nothing(flavour: str, bad: Any) -> None:
    module = three_heads(flavour)
    before = state(module)
    with pytest.raises(TypeError, match="expects an optimizer"):
        module.toggle_optimizer(bad)
    assert state(module) == before


def test_bad_flags_are_rejected(flavour: str) -> None:
    module = three_heads(flavour)
    before = state(module)
    with pytest.raises(TypeError, match="step must be True or False"):
        module.toggle_optimizer(module.opts[0], step="yes")
    assert state(module) == before


@pytest.mark.parametrize("entry", ["method", "toggle", "Toggle"])
def test_an_unknown_flag_or_a_positional_one_is_a_type_error_that_changes_nothing(flavour: str, entry: str) -> None:
    """A misspelt flag names itself and the block's flags; a positional argument after the optimizer
    (a flag, or Lightning 1.x's optimizer index) gets toggleshim's TypeError, raised in toggleshim's own
    frame (not in torch's compile wrapper): nothing changes either way."""
    module = three_heads(flavour)
    make = {"method": lambda *a, **k: module.toggle_optimizer(*a, **k),
            "toggle": lambda *a, **k: toggleshim.toggle(module, *a, **k),
            "Toggle": lambda *a, **k: toggleshim.Toggle(module, *a, **k)}[entry]
    before, record = state(module), module.__dict__.get("_param_requires_grad_state")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zerograd' \(the block's flags: "
                                        r"zero_grad, step, sync_grad\); nothing was changed"):
        make(module.opts[0], zerograd=False)
    for extra in (False, 0):
        with pytest.raises(TypeError, match=r"takes the optimizer as its only positional argument, got 1 more "
                           r"\(.*\): the block's flags are keywords \(zero_grad=, step=, sync_grad=\), and "
                           r"Lightning 2 has no optimizer index .*; nothing was changed") as info:
            make(module.opts[0], extra)
        raising = info.tb
        while raising.tb_next is not None:
            raising = raising.tb_next
        assert Path(raising.tb_frame.f_code.co_filename).is_relative_to(Path(toggleshim.__file__).parent)
    assert state(module) == before and module.__dict__.get("_param_requires_grad_state") is record


def test_failing_strategy_for_sync_grad_false_propagates_and_changes_nothing(flavour: str) -> None:
    """``sync_grad=False`` reads ``trainer.strategy``: if that fails, it fails before any change,
    for a first toggle (a new plan) and for a cached plan (the fast path) alike."""
    module = three_heads(flavour, frozen=True)
    err = RuntimeError("no strategy here")

    class Trainer:
        optimizers = module.opts

        @property
        def strategy(self) -> Any:
            raise err

    module._trainer = Trainer()
    before = state(module)
    for _ in range(2):  # the second toggle takes the cached plan
        with pytest.raises(RuntimeError) as info:
            module.toggle_optimizer(module.opts[0], sync_grad=False)
        assert info.value is err
        assert state(module) == before
        assert not module.__dict__.get("_param_requires_grad_state")
        with module.toggle_optimizer(module.opts[0], zero_grad=False, step=False):  # builds/uses the plan
            pass
        assert state(module) == before


def test_unattached_module_keeps_lightnings_message(flavour: str) -> None:
    module = pl(flavour).LightningModule()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(RuntimeError, match="is not attached to a `Trainer`"):
        module.toggle_optimizer(opt)


# torch.compile


def test_compile_marking_of_the_original_is_kept(flavour: str) -> None:
    cls = pl(flavour).LightningModule
    toggleshim.uninstall()
    originals = {n: vars(cls)[n] for n in ("toggle_optimizer", "untoggle_optimizer")}
    try:
        for name, fn in originals.items():  # what Lightning's newest source does
            setattr(cls, name, disable(fn))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            toggleshim.install()
        for name in originals:
            patched = vars(cls)[name]
            assert patched._torchdynamo_disable is True
            # (torch 2.0 and 2.1 write no recursive mark)
            assert getattr(patched, "_torchdynamo_disable_recursive", not DISABLE_MARKS_RECURSIVE) is True
            assert inspect.signature(patched).parameters.keys() >= {"self", "optimizer"}
        assert "zero_grad" in inspect.signature(cls.toggle_optimizer).parameters
        assert_a_block_toggles(flavour)
    finally:
        toggleshim.uninstall()
        for name, fn in originals.items():
            setattr(cls, name, fn)
        toggleshim.install()


@pytest.mark.parametrize("torch_has", ["no torch.compiler (torch 2.0)", "disable without reason (torch 2.1-2.7)"])
def test_install_works_on_the_compile_api_of_older_torches(
    flavour: str, torch_has: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.0 has ``torch._dynamo.disable`` only; torch 2.1 to 2.7's ``torch.compiler.disable`` takes
    no ``reason``. Either way the patch is made, marked, and runs eagerly under torch.compile."""
    calls: list[bool] = []
    dynamo_disable = torch._dynamo.disable

    def older_disable(fn: Any = None, recursive: bool = True, **torch_internal: Any) -> Any:
        if "reason" in torch_internal:  # what the older signature refuses
            raise TypeError("disable() got an unexpected keyword argument 'reason'")
        calls.append(recursive)
        return dynamo_disable(fn, **({"recursive": recursive} if DISABLE_TAKES_RECURSIVE else {}), **torch_internal)

    compiler = getattr(torch, "compiler", None)  # (the real torch 2.0 has none: then both cases are real)
    if torch_has.startswith("no torch.compiler"):  # torch's own code still finds the rest of it
        rest = {k: v for k, v in vars(compiler).items() if k != "disable"} if compiler is not None else {}
        monkeypatch.setattr(torch, "compiler", types.SimpleNamespace(**rest), raising=False)
        monkeypatch.setattr(torch._dynamo, "disable", older_disable)
    elif compiler is not None:
        monkeypatch.setattr(compiler, "disable", older_disable)
    else:
        monkeypatch.setattr(torch, "compiler", types.SimpleNamespace(disable=older_disable), raising=False)
    cls = pl(flavour).LightningModule
    originals = {n: ORIGINAL[(flavour, n)] for n in ("toggle_optimizer", "untoggle_optimizer")}
    toggleshim.uninstall()
    try:
        cls.toggle_optimizer = dynamo_disable(originals["toggle_optimizer"])  # marked, with no reason
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            toggleshim.install()
        assert vars(cls)["toggle_optimizer"]._torchdynamo_disable is True and calls
        assert toggleshim.is_installed()
        assert_a_block_toggles(flavour)
    finally:
        toggleshim.uninstall()
        for name, fn in originals.items():
            setattr(cls, name, fn)
        monkeypatch.undo()
        toggleshim.install()


def test_someone_elses_functools_wraps_patch_over_a_compile_marked_original_is_theirs(flavour: str) -> None:
    """Lightning's newest source marks its toggle with ``torch.compiler.disable``; a library's
    ``functools.wraps`` patch over that copies torch's marks too. It is someone else's patch: left in
    place with a warning, not unwrapped to Lightning's function and replaced."""
    cls = pl(flavour).LightningModule
    toggleshim.uninstall()
    marked = disable(ORIGINAL[(flavour, "toggle_optimizer")])

    @functools.wraps(marked)
    def theirs(self: Any, optimizer: Any) -> Any:
        return marked(self, optimizer)

    assert theirs._torchdynamo_disable and theirs._torchdynamo_orig_callable is ORIGINAL[(flavour, "toggle_optimizer")]
    try:
        cls.toggle_optimizer = theirs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        (msg,) = [str(w.message) for w in caught if issubclass(w.category, ToggleshimWarning)]
        assert "toggle_optimizer was already wrapped by someone else" in msg, msg
        assert vars(cls)["toggle_optimizer"] is theirs and not toggleshim.is_installed()
    finally:
        toggleshim.uninstall()
        cls.toggle_optimizer = ORIGINAL[(flavour, "toggle_optimizer")]
        toggleshim.install()


def test_block_inside_a_compiled_function(flavour: str) -> None:
    """The block in a function that torch.compile compiles trains as outside it; where torch.compile
    refuses this Python (torch 2.0 on Python 3.11), it refuses it before anything runs, and says so."""
    module = three_heads(flavour)
    ref = three_heads(flavour)
    x = torch.ones(2, 2)

    def train_step(m: Any) -> torch.Tensor:
        with m.toggle_optimizer(m.opts[0]):
            loss = m.a(x).square().sum()
            loss.backward()
        return loss.detach()

    from torch._dynamo.utils import counters

    refused = compile_refused()
    if refused is not None:
        with pytest.raises(RuntimeError, match=re.escape(refused)):
            torch.compile(train_step, backend="eager")(module)
        assert all(state(module).values()) and torch.equal(module.a.weight, ref.a.weight)
        return
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = torch.compile(train_step, backend="eager")
        for _ in range(2):
            compiled(module)
            train_step(ref)
        breaks = dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert all(state(module).values())
    assert torch.equal(module.a.weight, ref.a.weight)  # the optimizer stepped eagerly, as outside compile
    # dynamo broke the graph at toggleshim's entry points, never inside them
    assert breaks and all(map(kept_out, breaks)), breaks


def test_every_entry_point_of_a_block_runs_eagerly_under_torch_compile(flavour: str) -> None:
    """The patched methods, the block's ``__enter__`` and ``__exit__`` are ``torch.compiler.disable``d
    (public API): dynamo never traces toggleshim's code."""
    cls = pl(flavour).LightningModule
    for fn in (vars(cls)["toggle_optimizer"], vars(cls)["untoggle_optimizer"], toggleshim.Toggle.__enter__,
               vars(toggleshim.Toggle)["_exit"]):
        assert getattr(fn, "_torchdynamo_disable", False) is True, fn
    assert inspect.unwrap(vars(toggleshim.Toggle)["_exit"]).__module__ == "toggleshim._block"


# never patch blindly


def _with_replaced(flavour: str, fn: Any) -> list[str]:
    cls = pl(flavour).LightningModule
    toggleshim.uninstall()
    original = vars(cls)["toggle_optimizer"]
    cls.toggle_optimizer = fn
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        assert vars(cls)["toggle_optimizer"] is fn  # untouched
        assert vars(cls)["untoggle_optimizer"] is ORIGINAL[(flavour, "untoggle_optimizer")]
        return [str(w.message) for w in caught if issubclass(w.category, ToggleshimWarning)]
    finally:
        cls.toggle_optimizer = original
        toggleshim.install()


def test_someone_elses_patch_is_refused(flavour: str) -> None:
    def toggle_optimizer(self: Any, optimizer: Any) -> None:
        pass

    messages = _with_replaced(flavour, toggle_optimizer)
    assert messages and "already replaced by someone else" in messages[0]


def test_changed_signature_is_refused(flavour: str) -> None:
    original = ORIGINAL[(flavour, "toggle_optimizer")]
    ns: dict[str, Any] = {}
    exec("def toggle_optimizer(self, optimizer, extra):\n    pass\n", ns)  # a required extra argument
    fn = ns["toggle_optimizer"]
    fn.__qualname__, fn.__module__ = original.__qualname__, original.__module__
    messages = _with_replaced(flavour, fn)
    assert messages and "signature the shim does not know" in messages[0]


def test_context_manager_original_is_refused(flavour: str) -> None:
    import contextlib

    original = ORIGINAL[(flavour, "toggle_optimizer")]

    @contextlib.contextmanager
    def toggle_optimizer(self: Any, optimizer: Any) -> Any:
        yield

    toggle_optimizer.__wrapped__.__qualname__ = original.__qualname__
    toggle_optimizer.__wrapped__.__module__ = original.__module__
    toggle_optimizer.__qualname__, toggle_optimizer.__module__ = original.__qualname__, original.__module__
    messages = _with_replaced(flavour, toggle_optimizer)
    assert messages and "toggle_optimizer was already wrapped by someone else" in messages[0]


# versions no longer decide: tests/test_gate.py (code identity, the fallback)


# leaks


def test_toggle_object_keeps_nothing_alive_after_the_block(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    toggle = module.toggle_optimizer(opt)
    with toggle:
        pass
    refs = [weakref.ref(p) for p in module.parameters()] + [weakref.ref(opt), weakref.ref(module)]
    del module, opt
    gc.collect()
    assert all(r() is None for r in refs)
    assert toggle._optimizer is None and toggle._made is None
    assert repr(toggle) == "<toggleshim.Toggle closed (holds nothing)>"


def test_module_state_goes_with_its_module(flavour: str) -> None:
    """toggleshim's per-module state (cached plans, open toggles) is keyed by the module's id: it never
    keeps the module alive, leaves with it, and is never handed to another module that gets its id."""
    from toggleshim import _toggle

    gc.collect()  # modules of earlier tests, dying in cycles, would leave the count below
    states = len(_toggle._STATES)
    module = three_heads(flavour)
    with module.toggle_optimizer(module.opts[0], zero_grad=False, step=False):
        pass
    state = _toggle.state_if_any(module)
    assert state is not None and state.plans and len(_toggle._STATES) == states + 1
    key, ref = id(module), weakref.ref(module)
    del module
    gc.collect()
    assert ref() is None and key not in _toggle._STATES and len(_toggle._STATES) == states
    # A stale entry under a reused id (as if the callback had not run yet) is not taken for the new module.
    other = three_heads(flavour)
    _toggle._STATES[id(other)] = state
    assert _toggle.state_if_any(other) is None
    with other.toggle_optimizer(other.opts[1], zero_grad=False, step=False):
        assert _toggle.state_if_any(other) is not state
    assert len(_toggle.state_if_any(other).plans) == 1  # type: ignore[union-attr]


def test_many_blocks_do_not_grow_memory(flavour: str) -> None:
    import tracemalloc

    module = three_heads(flavour)
    opt = module.opts[0]
    for _ in range(1000):  # warm-up: caches, allocator pools
        with module.toggle_optimizer(opt, zero_grad=False, step=False):
            pass
    tracemalloc.start()
    marks = []
    for _ in range(2):  # growth is what the second 10,000 blocks add beyond the first 10,000
        for _ in range(10_000):
            with module.toggle_optimizer(opt, zero_grad=False, step=False):
                pass
        gc.collect()
        marks.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    grown = marks[1] - marks[0]
    # any object kept per block (the smallest is 16 bytes) would add at least 160,000 bytes
    assert grown < 4 * 1024, f"{grown} bytes more after another 10,000 blocks"


def test_import_toggleshim_before_lightning_imports_no_torch_and_marks_for_compile_later() -> None:
    """``import toggleshim`` with no Lightning loaded imports neither torch nor its dynamo (seconds of
    start-up for the CLI, a script that imports toggleshim first); the ``torch.compile`` marking comes
    when a Lightning flavour is imported, before any block can run."""
    code = textwrap.dedent(
        """
        import sys
        import toggleshim
        from toggleshim import _block
        assert "torch" not in sys.modules and "torch._dynamo" not in sys.modules, "torch imported"
        assert not hasattr(_block.Toggle.__enter__, "_torchdynamo_disable")
        import lightning.pytorch
        assert _block.Toggle.__enter__._torchdynamo_disable and vars(_block.Toggle)["_exit"]._torchdynamo_disable
        assert lightning.pytorch.LightningModule.toggle_optimizer._torchdynamo_disable
        print("ok", toggleshim.is_installed())
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "True"]
