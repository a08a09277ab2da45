"""The block runs the module's own methods: a subclass's ``toggle_optimizer`` / ``untoggle_optimizer``.

Every case trains the same module twice in a real ``Trainer.fit`` (manual optimization, two
optimizers over a shared backbone): once with the block (``with self.toggle_optimizer(opt):``,
``toggleshim.toggle``, ``toggleshim.Toggle``) and once with the manual sequence written with the
module's own methods, under Lightning's own methods (toggleshim uninstalled): ``self.toggle_optimizer
(opt); opt.zero_grad(); body; opt.step()``, ``self.untoggle_optimizer(opt)`` in ``finally``. Parameters,
optimizer state, every ``requires_grad`` after every block and ``global_step`` must be bitwise equal.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import toggleshim
from tests import _training_models as M

BATCHES = 3

# Overrides users write (Lightning 1.x documented both methods as "override for your own behavior").
# toggle: "super" (returns super()'s result, then freezes the backbone's bias), "none" (calls super,
# returns None), "own" (toggles by itself, never calls super, returns None).
# untoggle: "refreeze" (super(), then re-freezes the backbone: fine-tuning), "own" (never calls super:
# restores everything itself, but freezes the backbone's bias), "log" (super() and a count).
TOGGLES = (None, "super", "none", "own")
UNTOGGLES = (None, "refreeze", "own", "log")


def _module_class(flavour: str, toggle: str | None, untoggle: str | None) -> type:
    base = M.flavour_module(flavour).LightningModule

    class Backbone(base):  # type: ignore[misc, valid-type]
        def __init__(self, entry: str) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.entry = entry  # "method", "toggle", "Toggle", or "manual"
            gen = torch.Generator().manual_seed(0)
            self.backbone = M.mlp([2, 4], gen)
            self.head_a, self.head_b = M.mlp([4, 1], gen), M.mlp([4, 1], gen)
            self.untoggles = 0
            self.seen: list[tuple[bool, ...]] = []  # every requires_grad after every block

        def configure_optimizers(self) -> Any:
            a = torch.optim.Adam([*self.backbone.parameters(), *self.head_a.parameters()], lr=0.05)
            b = torch.optim.SGD([*self.head_b.parameters(), self.backbone[0].weight], lr=0.1, momentum=0.9)
            return [a, b]

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, _ = batch
            for opt, head in zip(self.optimizers(), (self.head_a, self.head_b)):
                self._block(opt, lambda head=head: head(self.backbone(x)).square().mean())
                self.seen.append(tuple(p.requires_grad for p in self.parameters()))

        def _block(self, opt: Any, loss: Any) -> None:
            if self.entry == "manual":
                self.toggle_optimizer(opt)
                try:
                    opt.zero_grad()
                    self.manual_backward(loss())
                    opt.step()
                finally:
                    self.untoggle_optimizer(opt)
                return
            if self.entry == "method":
                block = self.toggle_optimizer(opt)
            elif self.entry == "toggle":
                block = toggleshim.toggle(self, opt)
            else:
                block = toggleshim.Toggle(self, opt)
            with block:
                self.manual_backward(loss())

        def train_dataloader(self) -> Any:
            return M.loader(BATCHES * 4, 4)

    body: dict[str, Any] = {}
    if toggle == "super":
        def toggle_optimizer(self: Any, optimizer: Any) -> Any:
            made = super(cls, self).toggle_optimizer(optimizer)
            self.backbone[0].bias.requires_grad_(False)
            return made
        body["toggle_optimizer"] = toggle_optimizer
    elif toggle == "none":
        def toggle_optimizer(self: Any, optimizer: Any) -> None:  # type: ignore[misc]
            super(cls, self).toggle_optimizer(optimizer)
            self.backbone[0].bias.requires_grad_(False)
        body["toggle_optimizer"] = toggle_optimizer
    elif toggle == "own":
        def toggle_optimizer(self: Any, optimizer: Any) -> None:  # type: ignore[misc]
            mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
            self._own_record = {p: p.requires_grad for p in self.parameters()}
            for p in self.parameters():
                if id(p) not in mine:
                    p.requires_grad_(False)
        body["toggle_optimizer"] = toggle_optimizer
    if untoggle == "refreeze":
        def untoggle_optimizer(self: Any, optimizer: Any) -> None:
            super(cls, self).untoggle_optimizer(optimizer)
            self.backbone.requires_grad_(False)
        body["untoggle_optimizer"] = untoggle_optimizer
    elif untoggle == "own":
        def untoggle_optimizer(self: Any, optimizer: Any) -> None:  # type: ignore[misc]
            for p in self.parameters():  # everything trainable again, but the backbone's bias
                p.requires_grad_(True)
            self.backbone[0].bias.requires_grad_(False)
            self.untoggles += 1
        body["untoggle_optimizer"] = untoggle_optimizer
    elif untoggle == "log":
        def untoggle_optimizer(self: Any, optimizer: Any) -> None:  # type: ignore[misc]
            super(cls, self).untoggle_optimizer(optimizer)
            self.untoggles += 1
        body["untoggle_optimizer"] = untoggle_optimizer
    cls = type("UserModule", (Backbone,), body)
    return cls


@functools.cache
def _train(flavour: str, toggle: str | None, untoggle: str | None, entry: str) -> dict[str, Any]:
    model = _module_class(flavour, toggle, untoggle)(entry)
    trainer = M.flavour_module(flavour).Trainer(max_epochs=1, **M.TRAINER_DEFAULTS)
    error = None
    try:
        if entry == "manual":
            with M.lightning_original():
                trainer.fit(model)
        else:
            trainer.fit(model)
    except RuntimeError as e:  # a user's own toggle that never restores what it froze: the same failure
        error = str(e)
    return _outcome(model, trainer, error)


def _outcome(model: Any, trainer: Any, error: str | None) -> dict[str, Any]:
    """What a training run left, for :func:`_assert_same`."""
    return {
        "error": error,
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "state": [o.optimizer.state_dict() for o in model.trainer.optimizers]
        if hasattr(model.trainer.optimizers[0], "optimizer") else [o.state_dict() for o in model.trainer.optimizers],
        "seen": model.seen,
        "untoggles": model.untoggles,
        "global_step": trainer.global_step,
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["error"] == b["error"]
    assert a["seen"] == b["seen"], "requires_grad after a block differs"
    assert a["untoggles"] == b["untoggles"]
    assert a["global_step"] == b["global_step"]
    assert a["global_step"] == 2 * BATCHES or a["error"]
    differ = [k for k in a["params"] if not torch.equal(a["params"][k], b["params"][k])]
    assert not differ, f"not bit-identical: {differ}"
    for sa, sb in zip(a["state"], b["state"]):
        for key in sa["state"]:
            for name, value in sa["state"][key].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb["state"][key][name]))


# `with self.toggle_optimizer(opt):` needs an override that returns super()'s result; through
# toggleshim.toggle / Toggle every override works
CASES = [
    (t, u, entry)
    for t in TOGGLES
    for u in UNTOGGLES
    for entry in ("method", "toggle", "Toggle")
    if (t, u) != (None, None) and not (entry == "method" and t in ("none", "own"))
]


@pytest.mark.parametrize(("toggle", "untoggle", "entry"), CASES)
def test_block_with_overrides_equals_the_manual_sequence_with_them(
    flavour: str, toggle: str | None, untoggle: str | None, entry: str
) -> None:
    _assert_same(_train(flavour, toggle, untoggle, entry), _train(flavour, toggle, untoggle, "manual"))


@pytest.mark.parametrize("untoggle", ["refreeze", "own"])
def test_the_overrides_change_training(flavour: str, untoggle: str) -> None:
    """The cases above could fail: each override trains differently from Lightning's own methods
    (a block exiting through toggleshim's untoggle would train as the module without it)."""
    plain = _train(flavour, None, "log", "manual")
    overridden = _train(flavour, None, untoggle, "manual")
    assert plain["seen"] != overridden["seen"]
    assert any(not torch.equal(plain["params"][k], overridden["params"][k]) for k in plain["params"])


def test_an_override_returning_none_is_not_a_with_target_but_toggle_works(flavour: str) -> None:
    """Python's own error for `with self.toggle_optimizer(opt):` when the override returns None (the
    README says to write `with toggleshim.toggle(self, opt):`, shown bitwise above)."""
    model = _module_class(flavour, "none", None)("method")
    trainer = M.flavour_module(flavour).Trainer(max_epochs=1, **M.TRAINER_DEFAULTS)
    with pytest.raises(TypeError, match="context manager"):
        trainer.fit(model)


# -- an override that raises ---------------------------------------------------------------------


def _raising(flavour: str, calls_super: bool) -> Any:
    """A module (three heads, stand-in trainer) whose ``untoggle_optimizer`` raises, after its
    ``super()`` call or without one."""
    from tests._fixtures import three_heads

    module = three_heads(flavour)
    err = RuntimeError("the override's own")

    class Raising(type(module)):  # type: ignore[misc]
        def untoggle_optimizer(self, optimizer: Any) -> None:
            if calls_super:
                super().untoggle_optimizer(optimizer)
            raise err

    module.__class__ = Raising
    return module, err


@pytest.mark.parametrize("calls_super", [True, False], ids=["after super()", "without super()"])
def test_an_untoggle_override_that_raises_propagates_and_closes_the_block(flavour: str, calls_super: bool) -> None:
    """Its error propagates after a clean body (the very object), the body's error after a failing
    body; either way the block is closed: the next block is a flat one, Lightning's toggle exactly,
    and nothing of toggleshim's is left open. With ``super()`` the parameters are restored; without,
    they stay as the override left them (toggleshim writes nothing)."""
    from tests._fixtures import state
    from toggleshim import _toggle

    module, err = _raising(flavour, calls_super)
    before = state(module)
    with pytest.raises(RuntimeError) as info, module.toggle_optimizer(module.opts[0], zero_grad=False, step=False):
        assert not module.b.weight.requires_grad
    assert info.value is err
    body = ValueError("the body's own")
    with pytest.raises(ValueError) as caught, module.toggle_optimizer(module.opts[0], zero_grad=False, step=False):
        raise body
    assert caught.value is body
    s = _toggle.state_if_any(module)
    assert s is not None and not s.stack, "a block stayed open"
    assert (state(module) == before) is calls_super  # without super(), b stays frozen: the override's say
    module.b.weight.requires_grad_(True)
    module.b.bias.requires_grad_(True)
    block = module.toggle_optimizer(module.opts[1], zero_grad=False, step=False)
    assert len(s.stack) == 0 and type(block._made) is _toggle._Flat  # a flat toggle: Lightning's own
    assert not module.a.weight.requires_grad and module.b.weight.requires_grad
    with pytest.raises(RuntimeError), block:
        pass


# -- an override that forgets to return super()'s toggle, in nested blocks ----------------------------


@functools.cache
def _train_nested(flavour: str, toggle: str) -> dict[str, Any]:
    """Trains with a block over the backbone's optimizer and, inside it, one over head b's (sharing a
    backbone weight), through ``toggleshim.toggle``; ``toggle``: the class's ``toggle_optimizer``
    returns ``super()``'s toggle ("super") or forgets to ("none")."""
    base = _module_class(flavour, toggle, "log")

    class Nested(base):  # type: ignore[misc, valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, _ = batch
            a, b = self.optimizers()
            with toggleshim.toggle(self, a):
                self.manual_backward(self.head_a(self.backbone(x)).square().mean())
                with toggleshim.toggle(self, b):
                    self.seen.append(tuple(p.requires_grad for p in self.parameters()))
                    self.manual_backward(self.head_b(self.backbone(x)).square().mean())
                self.seen.append(tuple(p.requires_grad for p in self.parameters()))
            self.seen.append(tuple(p.requires_grad for p in self.parameters()))

    model = Nested("toggle")
    trainer = M.flavour_module(flavour).Trainer(max_epochs=1, **M.TRAINER_DEFAULTS)
    trainer.fit(model)
    inner = {id(p) for p in model.head_b.parameters()}
    trainable = [all(rg for p, rg in zip(model.parameters(), seen) if id(p) in inner) for seen in model.seen[::3]]
    return {**_outcome(model, trainer, None), "inner trainable": trainable}


def test_an_override_that_forgets_to_return_its_toggle_nests_as_one_that_returns_it(flavour: str) -> None:
    """``toggle_optimizer`` overridden around ``super()`` without ``return`` (a logging override): the
    toggle its ``super()`` made is the block all the same, so blocks nest as toggleshim's do, bitwise
    as with the override that returns it: the inner optimizer's own parameters are trainable in its
    block, and the outer block's exit restores the state it found. (Run as the module's own toggle
    and untoggle, Lightning's nesting would freeze head b for good.)"""
    returned, forgotten = _train_nested(flavour, "super"), _train_nested(flavour, "none")
    _assert_same(forgotten, returned)
    assert all(forgotten["inner trainable"]), "the inner block's own parameters were frozen"
    assert forgotten["seen"][2] == forgotten["seen"][-1]  # every step ends where the first did
    assert forgotten["untoggles"] == returned["untoggles"] == 2 * BATCHES
