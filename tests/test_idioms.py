"""Lightning's own idioms typed into a block, and the object a statement toggle returns.

* A ``step()`` of the block's optimizer inside a block that steps on exit is refused at the exit
  (never a silent double step), naming both fixes; nothing is added to the optimizer.
* A block inside an open statement toggle, or inside Lightning's own ``toggled_optimizer``, nests as
  inside a block; the statement itself stays exactly Lightning's.
* After ``untoggle_optimizer`` the object a statement toggle returned holds nothing, and says so.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import pickle
import weakref
from typing import Any

import pytest
import torch

import toggleshim
from tests import _training_models as M
from tests._fixtures import state, three_heads

# -- a step inside the block ----------------------------------------------------------------------


def test_a_step_inside_a_stepping_block_is_refused_at_the_exit(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    before = state(module)
    weight = module.a.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"step\(\) ran inside") as caught, module.toggle_optimizer(opt):
        module.a.weight.sum().backward()
        opt.step()  # Lightning's toggled_optimizer idiom, one letter off
    message = str(caught.value)
    assert "step=False" in message and "drop the call" in message
    assert state(module) == before  # untoggled all the same
    once = weight - 0.1 * module.a.weight.grad  # SGD, momentum buffer empty at the first step: one update
    assert torch.equal(module.a.weight.detach(), once)


def test_a_step_inside_a_block_with_step_false_is_the_users(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    with module.toggle_optimizer(opt, step=False):
        module.a.weight.sum().backward()
        opt.step()
    with module.toggle_optimizer(opt):  # and a block that leaves the stepping to its exit
        module.a.weight.sum().backward()


def test_a_step_of_another_optimizer_inside_a_block_is_fine(flavour: str) -> None:
    module = three_heads(flavour)
    with module.toggle_optimizer(module.opts[0]):
        with module.toggle_optimizer(module.opts[1]):  # its exit steps optimizer 1
            module.b.weight.sum().backward()
        module.a.weight.sum().backward()


def test_a_nested_block_over_the_same_optimizer_steps_once(flavour: str) -> None:
    module = three_heads(flavour)
    opt = module.opts[0]
    with (
        # the message names the nested block, not "your own step() call" (issue 44)
        pytest.raises(RuntimeError, match=r"a nested `with self.toggle_optimizer\(opt\):` over the same SGD stepped"),
        module.toggle_optimizer(opt),
        module.toggle_optimizer(opt),  # its exit steps, the enclosing one's refuses to
    ):
        module.a.weight.sum().backward()


def test_a_step_that_raises_is_no_step_for_the_blocks_around_it(flavour: str) -> None:
    """A step that fails (an inner block's exit, or the body's own call) made no step: the block around it
    steps on its clean exit, once, as the manual sequence would (found on torch 2.1.2 by the stateful
    machine: a watch that marked before calling the step refused the outer block's)."""
    module = three_heads(flavour)
    opt = module.opts[0]
    real, failing, calls = opt.step, [False], []

    def step(*args: Any, **kwargs: Any) -> Any:  # on the instance before the blocks: their watches cover it
        if failing[0]:
            calls.append("failed")
            raise RuntimeError("step failed")
        return real(*args, **kwargs)

    opt.step = step
    weight = module.a.weight.detach().clone()
    with module.toggle_optimizer(opt):
        with pytest.raises(RuntimeError, match="step failed"), module.toggle_optimizer(opt, zero_grad=False):
            module.a.weight.sum().backward()
            failing[0] = True  # the inner block's exit steps: it fails
        with pytest.raises(RuntimeError, match="step failed"):
            opt.step()  # the body's own, failing
        failing[0] = False
    assert calls == ["failed", "failed"]
    assert not torch.equal(weight, module.a.weight) and all(state(module).values())  # the outer block stepped


def test_watching_for_steps_leaves_the_optimizer_as_it_was(flavour: str) -> None:
    """Nothing stays on the optimizer: inside the block and after it, its attributes, ``state_dict``,
    deepcopy and pickle round trip are those of the same optimizer driven by Lightning's own manual
    sequence (the same keys, the same momentum buffers, bit for bit) but for the block's own step watch
    (``step`` on the instance) while the block is open, taken off at its exit; its step hooks and torch's
    process-wide ones are never touched."""
    from torch.optim import optimizer as torch_optimizer

    global_hooks = dict(torch_optimizer._global_optimizer_post_hooks)
    module, twin = three_heads(flavour), three_heads(flavour)
    opt, twin_opt = module.opts[0], twin.opts[0]

    def plain(value: Any) -> Any:  # a state_dict with every tensor as its dtype, shape and values
        if isinstance(value, torch.Tensor):
            return (str(value.dtype), tuple(value.shape), value.flatten().tolist())
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    def seen(o: Any) -> tuple[Any, ...]:
        return (sorted(vars(o)), vars(o).get("step"), dict(o._optimizer_step_post_hooks), plain(o.state_dict()),
                plain(copy.deepcopy(o).state_dict()), plain(pickle.loads(pickle.dumps(o)).state_dict()))

    lightning = type(twin).__mro__[1]  # the flavour's LightningModule: its originals, by hand
    toggle_fn = vars(lightning)["toggle_optimizer"]._toggleshim_original
    untoggle_fn = vars(lightning)["untoggle_optimizer"]._toggleshim_original
    for _ in range(2):  # the second step has momentum state to compare
        with module.toggle_optimizer(opt):
            module.a.weight.sum().backward()
            inside = seen(opt)
            watch = inside[1]  # the block's own, alone
            assert watch.__self__ is opt and watch.__func__.__qualname__.startswith("Toggle._watch_steps")
            inside = ([k for k in inside[0] if k != "step"], None, *inside[2:])
        toggle_fn(twin, twin_opt)
        try:
            twin_opt.zero_grad()
            twin.a.weight.sum().backward()
            twin_inside = seen(twin_opt)
            twin_opt.step()
        finally:
            untoggle_fn(twin, twin_opt)
        assert inside == twin_inside
        assert seen(opt) == seen(twin_opt)
    assert seen(opt)[1:3] == (None, {}) and opt.state_dict()["state"]  # nothing of ours on it; state to compare
    assert dict(torch_optimizer._global_optimizer_post_hooks) == global_hooks


def test_lightning_idiom_typed_into_a_block_fails_at_the_first_batch_in_trainer_fit(flavour: str) -> None:
    pl = M.flavour_module(flavour)

    class Idiom(M.gan_class(pl)):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, z = batch
            _, d_opt = self.optimizers()
            with self.toggle_optimizer(d_opt):  # the documented toggled_optimizer body
                d_opt.zero_grad()
                self.manual_backward(self.d_loss(x, z))
                d_opt.step()

    model = Idiom()
    trainer = pl.Trainer(max_epochs=1, **M.TRAINER_DEFAULTS)
    with pytest.raises(RuntimeError, match=r"step\(\) ran inside"):
        trainer.fit(model, M.loader(8, 4))
    assert trainer.global_step == 1  # the body's own step ran, the block did not step again


# -- a block inside an open statement toggle ----------------------------------------------------------


def _nested_inside(flavour: str, open_outer: Any, close_outer: Any) -> None:
    """Inside the statement toggle over optimizer 0 (heads a, with a.weight shared by optimizer 1), a
    block over optimizer 1: its own parameters trainable (a.weight too), the others frozen; leaving it
    restores exactly what was there; the statement's untoggle then is Lightning's."""
    module = three_heads(flavour, n_opt=3, shared=True)
    opt0, opt1 = module.opts[0], module.opts[1]
    before = state(module)
    open_outer(module, opt0)
    inside_statement = state(module)
    record = module._param_requires_grad_state
    with module.toggle_optimizer(opt1):
        assert state(module) == {"a.weight": True, "a.bias": False, "b.weight": True, "b.bias": True,
                                 "c.weight": False, "c.bias": False, "free": True}
        (module.b.weight.sum() + module.a.weight.sum()).backward()
    assert state(module) == inside_statement
    assert module._param_requires_grad_state is record
    close_outer(module, opt0)
    assert state(module) == before


def test_a_block_inside_an_open_statement_toggle_nests(flavour: str) -> None:
    _nested_inside(flavour, lambda m, o: m.toggle_optimizer(o), lambda m, o: m.untoggle_optimizer(o))


def test_a_block_inside_lightnings_toggled_optimizer_nests(flavour: str) -> None:
    module = three_heads(flavour)
    if not hasattr(module, "toggled_optimizer"):
        pytest.skip("this Lightning has no toggled_optimizer (added in 2.5.1)")
    contexts: list[Any] = []

    def open_outer(m: Any, o: Any) -> None:
        contexts.append(m.toggled_optimizer(o))
        contexts[-1].__enter__()

    _nested_inside(flavour, open_outer, lambda m, o: contexts[-1].__exit__(None, None, None))


@pytest.mark.parametrize("outer", ["toggled_optimizer", "statement toggle"])
def test_a_block_inside_an_outer_toggle_trains_as_a_block_inside_a_block_in_trainer_fit(
    flavour: str, outer: str
) -> None:
    """A code base in the middle of a migration: the generator's block sits inside Lightning's
    ``toggled_optimizer`` over the discriminator (or an open statement toggle). The two share no
    parameter, so Lightning's flat toggle would leave the generator frozen and its backward fail
    ("element 0 of tensors does not require grad"); the block nests as inside a block: the generator
    trains, bit for bit as with a block around it, and everything is trainable again after."""
    pl = M.flavour_module(flavour)
    if outer == "toggled_optimizer" and not hasattr(pl.LightningModule, "toggled_optimizer"):
        pytest.skip("this Lightning has no toggled_optimizer (added in 2.5.1)")

    class Mixed(M.gan_class(pl)):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, z = batch
            g_opt, d_opt = self.optimizers()
            if self.style == "block":  # the reference: a block inside a block
                context: Any = self.toggle_optimizer(d_opt, zero_grad=False, step=False)
            elif outer == "toggled_optimizer":
                context = self.toggled_optimizer(d_opt)
            else:
                context = contextlib.nullcontext(self.toggle_optimizer(d_opt))
            with context:
                d_opt.zero_grad()
                self.manual_backward(self.d_loss(x, z))
                d_opt.step()
                with self.toggle_optimizer(g_opt):
                    self.inside.append(all(p.requires_grad for p in self.generator.parameters())
                                       and not any(p.requires_grad for p in self.discriminator.parameters()))
                    self.manual_backward(self.g_loss(z))
            if self.style != "block" and outer == "statement toggle":
                self.untoggle_optimizer(d_opt)

    runs = {}
    for style in ("block", "mixed"):
        torch.manual_seed(0)
        model = Mixed(style=style)
        model.inside = []
        pl.Trainer(max_epochs=1, **M.TRAINER_DEFAULTS).fit(model, M.loader(16, 4))
        assert model.inside == [True] * 4
        assert all(p.requires_grad for p in model.parameters())
        runs[style] = [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(runs["block"], runs["mixed"]))


def test_a_statement_toggle_inside_a_statement_toggle_stays_lightnings(flavour: str) -> None:
    """Lightning's own flat behaviour (its nesting defect included): toggleshim does not change statements."""
    module = three_heads(flavour, n_opt=2)
    module.toggle_optimizer(module.opts[0])
    module.toggle_optimizer(module.opts[1])
    assert not module.b.weight.requires_grad  # frozen by the first toggle, recorded frozen by the second
    module.untoggle_optimizer(module.opts[1])
    module.untoggle_optimizer(module.opts[0])
    assert not module.b.weight.requires_grad  # Lightning's defect, kept for statements


# -- the object a statement toggle returns -----------------------------------------------------------


def test_a_kept_statement_toggle_holds_nothing_after_its_untoggle(flavour: str) -> None:
    module = three_heads(flavour)
    kept = module.toggle_optimizer(module.opts[0])  # as IPython's Out[] keeps a cell's value
    assert "toggled" in repr(kept)
    module.untoggle_optimizer(module.opts[0])
    assert repr(kept) == "<toggleshim.Toggle untoggled (holds nothing)>"
    module_ref, opt_ref = weakref.ref(module), weakref.ref(module.opts[0])
    param_ref = weakref.ref(module.a.weight)
    del module
    gc.collect()
    assert module_ref() is None and opt_ref() is None and param_ref() is None
    with pytest.raises(RuntimeError, match="undone or superseded"), kept:
        pass


def test_toggleshim_toggle_is_typed_and_exact_for_a_kept_statement(flavour: str) -> None:
    module = three_heads(flavour)
    kept = toggleshim.toggle(module, module.opts[1])
    module.untoggle_optimizer(module.opts[1])
    assert "holds nothing" in repr(kept)
