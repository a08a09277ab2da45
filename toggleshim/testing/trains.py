"""``assert_trains_like_manual``: your own training code, fitted through toggleshim and fitted again with
every block expanded into Lightning's manual sequence, compared bit for bit.

The harness (``programs``, ``assert_program_equivalent``) draws synthetic programs over a module's
parameters; this runs *your* ``training_step`` on *your* data, unchanged. The second fit needs no edit of
your source: for its duration ``toggle_optimizer`` and ``untoggle_optimizer`` of your module's Lightning
flavour are replaced (toggleshim uninstalled) by an expansion. ``self.toggle_optimizer(opt, **flags)``
(your override first, if any: its ``super()`` call reaches the expansion) toggles with Lightning's own
method and returns a plain context manager::

    enter:  strategy.block_backward_sync() (sync_grad=False); opt.zero_grad() (zero_grad)
    body
    exit:   opt.step() (step, the body raised nothing); finally: self.untoggle_optimizer(opt), then the
            no-sync context is left

Flat toggles and untoggles are Lightning's original methods. A toggle made while a block is open
(toggleshim's nesting, which has no manual sequence) follows the reference model
(:class:`toggleshim.testing.model.ToggleModel`, written from the documentation, not from the shim): the
expansion keeps one beside the module and writes its ``requires_grad`` back to the parameters.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

import toggleshim
from toggleshim import Toggle
from toggleshim._flavours import FLAVOURS, Flavour, of_module
from toggleshim._ours import describe, mark, original_of
from toggleshim.testing.model import FLAG_DEFAULTS, Frame, ToggleModel

__all__ = ["TRAINER_DEFAULTS", "assert_trains_like_manual"]

#: The ``Trainer`` options of both fits; ``trainer_kwargs`` override them.
TRAINER_DEFAULTS: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "deterministic": True,
}
SEED = 0  # torch, random and numpy are seeded with it before each make()


def assert_trains_like_manual(make: Callable[[], Any], *, max_steps: int, **trainer_kwargs: Any) -> None:
    """Fit ``make()`` twice under a real ``Trainer`` and compare the results bitwise.

    ``make()`` returns a fresh LightningModule (manual optimization) with its own data (its
    ``train_dataloader``). One fit runs every block expanded into Lightning's manual sequence with the
    module's own methods (see the module docstring): the reference, run first; it decides how many
    batches the fits take. The other runs the blocks through toggleshim, over at most as many batches (a
    shim that never steps cannot keep it training for ever). Each starts from the same seed. Then
    parameters, buffers, gradients (None and zeros differ), ``requires_grad``, every optimizer's and LR
    scheduler's ``state_dict`` and ``trainer.global_step`` must be equal, tensors bit for bit; the first
    difference raises ``AssertionError`` naming it. A fit that never toggled raises too (nothing was
    checked). An exception of the toggleshim fit propagates unchanged.

    ``max_steps`` and ``trainer_kwargs`` go to both ``Trainer`` s (defaults: :data:`TRAINER_DEFAULTS`, and
    ``max_epochs=max_steps``, so that a fit that never steps ends too); the same objects serve both fits
    (a stateful callback passed here sees both). Both fits run in this process, one device
    (``strategy="ddp"`` included: ``sync_grad=False`` then blocks its gradient sync).
    Afterwards the random generators, torch's determinism flags, the environment, the process group and
    toggleshim's installed state are as they were.

    Out of scope, with an error saying so: ``toggleshim.toggle(self, opt)`` on a class whose
    ``toggle_optimizer`` is overridden (toggleshim's own block would run in the manual fit: write
    ``with self.toggle_optimizer(opt):``, the override returning ``super().toggle_optimizer(opt)``), and a
    toggle over an optimizer that is not one of ``trainer.optimizers``.
    """
    if not callable(make):
        raise TypeError(f"assert_trains_like_manual(): make must be a callable returning a fresh LightningModule, "
                        f"got {describe(make)}")
    if type(max_steps) is not int or max_steps < 1:
        raise ValueError(f"assert_trains_like_manual(): max_steps must be a positive int, got {describe(max_steps)}")
    # max_epochs: a fit whose code stops stepping still ends (Lightning's default is no limit then)
    options = {**TRAINER_DEFAULTS, "max_epochs": max_steps, **trainer_kwargs, "max_steps": max_steps}
    made: list[Any] = []

    def fresh() -> Any:
        module = make()
        if any(module is m for m in made):
            raise ValueError("assert_trains_like_manual(): make() returned the module it returned before; it must "
                             "build a fresh one each call (the second fit would start from the first's result)")
        made.append(module)
        return module

    with _global_state_kept():
        counter = _Counter()
        try:
            manual = _fit(fresh, options, counter, expand=True)
        except _ManualRaised as raised:  # the same code through toggleshim: its own exception, if it raises one
            _fit(fresh, options, _Counter(limit=counter.batches))
            e = raised.__cause__
            raise AssertionError(f"the manual fit raised {type(e).__name__}: {e} (the toggleshim fit did not)") from e
        shim = _fit(fresh, options, _Counter(limit=counter.batches))
    first = _first_difference(shim, manual)
    if first is not None:
        raise AssertionError(f"after fit: {first}" + ("" if "with toggleshim" in first else " (toggleshim vs manual)"))


class _OutOfScope(ValueError):
    """Code the manual fit cannot expand; nothing to compare."""


class _ManualRaised(Exception):
    """The manual fit's ``Trainer.fit`` raised (its ``__cause__``)."""


# -- one fit ------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    """What a fit leaves, copied: names are the module's (``named_parameters``)."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None]
    requires_grad: dict[str, bool]
    optimizers: list[tuple[str, dict[str, Any], list[str]]]  # class, state_dict, its parameters' names
    schedulers: list[tuple[str, dict[str, Any]]]
    global_step: int


@dataclass
class _Counter:
    """The training batches a fit started; with ``limit``, the fit stops after that many."""

    limit: int | None = None
    batches: int = 0

    def callback(self, flavour: Flavour) -> Any:
        counter = self

        class _CountBatches(importlib.import_module(flavour.name).Callback):  # type: ignore[misc]
            def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
                counter.batches += 1

            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                if counter.limit is not None and counter.batches >= counter.limit:
                    trainer.should_stop = True

        return _CountBatches()


def _fit(make: Callable[[], Any], options: dict[str, Any], counter: _Counter, expand: bool = False) -> _Outcome:
    _seed(SEED)
    module = make()
    flavour = _flavour_of(module)
    if module.automatic_optimization:
        raise ValueError(f"assert_trains_like_manual(): {type(module).__qualname__} uses automatic optimization; "
                         "blocks are for manual optimization (set self.automatic_optimization = False)")
    callbacks = options.get("callbacks") or []
    callbacks = [*(callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]), counter.callback(flavour)]
    trainer = importlib.import_module(flavour.name).Trainer(**{**options, "callbacks": callbacks})
    if trainer.world_size != 1:
        raise ValueError(f"assert_trains_like_manual() runs both fits in this process: one device, one node "
                         f"(got world size {trainer.world_size})")
    if not expand:
        toggleshim.install()
        trainer.fit(module)
    else:
        with _expanded(flavour) as expansion:
            try:
                trainer.fit(module)
            except _OutOfScope:
                raise
            except Exception as e:
                raise _ManualRaised from e
        if expansion.toggles == 0:
            raise AssertionError(f"the fit of {type(module).__qualname__} never called toggle_optimizer: "
                                 "nothing was compared (is training_step using the blocks?)")
    return _outcome(module, trainer)


def _outcome(module: Any, trainer: Any) -> _Outcome:
    named = dict(module.named_parameters())
    names = {id(p): n for n, p in named.items()}
    optimizers = []
    for opt in trainer.optimizers:
        params = [p for g in opt.param_groups for p in g["params"]]
        optimizers.append((type(opt).__name__, copy.deepcopy(opt.state_dict()),
                           [names.get(id(p), f"<parameter #{i}, not the module's>") for i, p in enumerate(params)]))
    return _Outcome(
        params={n: p.detach().clone() for n, p in named.items()},
        buffers={n: b.detach().clone() for n, b in module.named_buffers()},
        grads={n: None if p.grad is None else p.grad.detach().clone() for n, p in named.items()},
        requires_grad={n: p.requires_grad for n, p in named.items()},
        optimizers=optimizers,
        schedulers=[(type(c.scheduler).__name__, copy.deepcopy(c.scheduler.state_dict()))
                    for c in trainer.lr_scheduler_configs],
        global_step=int(trainer.global_step),
    )


def _flavour_of(module: Any) -> Flavour:
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule" and (flavour := of_module(cls.__module__)) is not None:
            return flavour
    raise TypeError(f"assert_trains_like_manual(): make() must return a LightningModule, got {describe(module)}")


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


@contextlib.contextmanager
def _global_state_kept() -> Iterator[None]:
    """The random generators, torch's determinism flags (``deterministic=True`` sets them), the
    environment (Lightning sets variables for determinism and DDP), a process group a DDP fit started
    and toggleshim's installed state, restored on every exit."""
    numpy = sys.modules.get("numpy")
    rng = (random.getstate(), torch.get_rng_state(), numpy.random.get_state() if numpy is not None else None)
    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    env = dict(os.environ)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    installed = _patched()
    try:
        yield
    finally:
        if installed:
            toggleshim.install()
        else:
            toggleshim.uninstall()
        if not distributed and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # strategy="ddp" on one device started it
        for key in set(os.environ) - set(env):
            del os.environ[key]
        os.environ.update(env)
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = flags[2], flags[3]
        random.setstate(rng[0])
        torch.set_rng_state(rng[1])
        if numpy is not None:
            numpy.random.set_state(rng[2])


def _patched() -> bool:
    """Whether toggleshim's method is on an imported flavour's ``LightningModule``."""
    for flavour in FLAVOURS:
        core = sys.modules.get(flavour.core_module)
        if core is not None and original_of(vars(core.LightningModule).get("toggle_optimizer")) is not None:
            return True
    return False


# -- the expansion ------------------------------------------------------------------------------------

_NAMES = ("toggle_optimizer", "untoggle_optimizer")


@contextlib.contextmanager
def _expanded(flavour: Flavour) -> Iterator[_Expansion]:
    """toggleshim uninstalled; ``flavour``'s ``toggle_optimizer`` / ``untoggle_optimizer`` the expansion's
    (on exit: Lightning's own again, the very objects). ``toggleshim.toggle(self, opt)`` takes the
    expansion as it takes an unverified Lightning's fallback; a toggleshim block entered all the same is
    refused (it would compare toggleshim with itself)."""
    toggleshim.uninstall()
    cls = importlib.import_module(flavour.core_module).LightningModule
    originals = {name: vars(cls)[name] for name in _NAMES}
    expansion = _Expansion(originals["toggle_optimizer"], originals["untoggle_optimizer"])
    enter = vars(Toggle)["__enter__"]
    toggle_fn, untoggle_fn = expansion.methods()
    mark(toggle_fn, originals["toggle_optimizer"], "fallback")
    try:
        cls.toggle_optimizer, cls.untoggle_optimizer = toggle_fn, untoggle_fn
        setattr(Toggle, "__enter__", _refuse)  # noqa: B010  (a method of the class, replaced for the fit)
        yield expansion
    finally:
        setattr(Toggle, "__enter__", enter)  # noqa: B010
        for name, fn in originals.items():
            setattr(cls, name, fn)


def _refuse(toggle: Toggle[Any]) -> Any:
    raise _OutOfScope(
        "assert_trains_like_manual(): a toggleshim block was entered in the manual fit, where every block must be "
        "expanded: `toggleshim.toggle(self, opt)` on a class that overrides toggle_optimizer runs toggleshim's own "
        "block around the override. Write `with self.toggle_optimizer(opt):`, the override returning "
        "`super().toggle_optimizer(opt)`."
    )


class _Expansion:
    """One manual fit: the reference model of the toggles open on the module, and the parameters it numbers."""

    def __init__(self, toggle: Callable[..., Any], untoggle: Callable[..., Any]) -> None:
        self.toggle, self.untoggle = toggle, untoggle  # Lightning's own
        self.model: ToggleModel | None = None
        self.params: list[torch.nn.Parameter] = []  # numbered as the model numbers them
        self.number: dict[int, int] = {}  # id(parameter) -> its number (the list keeps it alive)
        self.records: dict[int, tuple[dict[int, bool], dict[Any, bool]]] = {}  # id(model's) -> (model's, module's)
        self.exiting: list[_Block] = []  # the blocks whose exit is calling the module's untoggle_optimizer
        self.toggles = 0

    def methods(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        expansion = self

        def toggle_optimizer(self: Any, optimizer: Any, **flags: bool) -> _Block:
            """The manual sequence: toggled now; the result is a plain context manager (assert_trains_like_manual)."""
            return expansion.toggled(self, optimizer, {**FLAG_DEFAULTS, **flags})

        def untoggle_optimizer(self: Any, optimizer: Any) -> None:
            """Lightning's untoggle, or the exit of the block toggled last (assert_trains_like_manual)."""
            expansion.untoggled(self, optimizer)

        return toggle_optimizer, untoggle_optimizer

    # -- the model beside the module

    def _read(self, module: Any) -> ToggleModel:
        """The model brought up to the module: the optimizers' parameter lists, every ``requires_grad``."""
        lists = []
        for opt in module.trainer.optimizers:
            numbers = []
            for p in (p for g in opt.param_groups for p in g["params"]):
                if id(p) not in self.number:
                    self.number[id(p)] = len(self.params)
                    self.params.append(p)
                    if self.model is not None:
                        self.model.rg.append(p.requires_grad)
                numbers.append(self.number[id(p)])
            lists.append(numbers)
        if self.model is None:
            self.model = ToggleModel(lists, [p.requires_grad for p in self.params])
        self.model.set_optimizers(lists)
        for i, p in enumerate(self.params):
            self.model.set_requires_grad(i, p.requires_grad)
        return self.model

    def _write(self, module: Any, model: ToggleModel) -> None:
        """The model's ``requires_grad`` onto the parameters, and its record as ``_param_requires_grad_state``."""
        for p, value in zip(self.params, model.rg):
            if p.requires_grad != value:
                p.requires_grad = value
        module._param_requires_grad_state = self._record(model.record)

    def _record(self, record: dict[int, bool] | None) -> dict[Any, bool]:
        if record is None:
            return {}
        if id(record) not in self.records:
            self.records[id(record)] = (record, {self.params[i]: v for i, v in record.items()})
        return self.records[id(record)][1]

    def _index(self, module: Any, optimizer: Any) -> int | None:
        inner = _inner(optimizer)
        return next((k for k, opt in enumerate(module.trainer.optimizers) if opt is inner), None)

    # -- toggling

    def toggled(self, module: Any, optimizer: Any, flags: dict[str, bool]) -> _Block:
        k = self._index(module, optimizer)
        if k is None:
            raise _OutOfScope(f"assert_trains_like_manual(): toggle_optimizer({describe(optimizer)}): not one of "
                              "trainer.optimizers; the manual fit expands toggles of the trainer's optimizers")
        sync = None if flags["sync_grad"] else getattr(module.trainer.strategy, "block_backward_sync", None)
        model = self._read(module)
        frame = model.toggle(k)
        self.toggles += 1
        if frame.nested:
            self._write(module, model)
        else:
            self.toggle(module, optimizer)
            record = model.record
            assert record is not None  # a flat toggle's: Lightning's record, numbered
            self.records[id(record)] = (record, module._param_requires_grad_state)
            self._read(module)
        return _Block(self, module, optimizer, frame, flags, sync)

    def untoggled(self, module: Any, optimizer: Any) -> None:
        block = self.exiting[-1] if self.exiting else None
        if block is not None and block.module is module and not block.closed and _inner(block.optimizer) is _inner(
                optimizer):
            self._close(block)
            return
        model = self._read(module)
        k = self._index(module, optimizer)
        top = model.stack[-1] if model.stack else None
        if top is not None and k is not None and not top.entered and top.k == k:  # a statement toggle in a block
            model.untoggle(k)
            self._write(module, model)
            return
        model.untoggle(k)  # type: ignore[arg-type]  # (None: no trainer optimizer; Lightning restores all others)
        self.untoggle(module, optimizer)
        self._settled(self._read(module))

    def _close(self, block: _Block) -> None:
        """A block's exit reached ``untoggle_optimizer`` (directly, or through an override's ``super()``)."""
        block.closed = True
        model, frame = self._read(block.module), block.frame
        if frame.nested:
            model.exit(frame)  # statement toggles left open in it are unwound first
            self._write(block.module, model)
            return
        while model.stack and model.stack[-1] is not frame and not model.stack[-1].entered:
            model.untoggle(model.stack[-1].k)  # a statement toggle left open inside it
            self._write(block.module, model)
        model.exit(frame)
        self.untoggle(block.module, block.optimizer)
        self._settled(self._read(block.module))

    def _settled(self, model: ToggleModel) -> None:
        """After a flat untoggle: with no toggle open, the records kept for nesting can go."""
        if not model.stack and not model.record:
            self.records.clear()

    def forget(self, block: _Block) -> None:
        """An override of ``untoggle_optimizer`` that never calls ``super()``: ``requires_grad`` is its
        business; the block and the toggles left open inside it are let go without writing."""
        block.closed = True
        model = self._read(block.module)
        model._forget(block.frame)
        if block.frame.nested:
            block.module._param_requires_grad_state = self._record(model.record)


def _inner(optimizer: Any) -> Any:
    """A ``LightningOptimizer``'s torch optimizer; a torch optimizer itself."""
    return getattr(optimizer, "_optimizer", optimizer)


class _Block:
    """What the expansion's ``toggle_optimizer`` returns: the manual sequence around a ``with`` body."""

    def __init__(self, expansion: _Expansion, module: Any, optimizer: Any, frame: Frame, flags: dict[str, bool],
                 sync: Callable[[], Any] | None) -> None:
        self.expansion, self.module, self.optimizer, self.frame = expansion, module, optimizer, frame
        self.flags, self.sync = flags, sync
        self.context: Any = None
        self.closed = False

    def __enter__(self) -> Any:
        model = self.expansion._read(self.module)
        model.enter(self.frame, self.flags["sync_grad"])
        try:
            if self.sync is not None:
                self.context = self.sync()
                self.context.__enter__()
            if self.flags["zero_grad"]:
                self.optimizer.zero_grad()
        except BaseException:
            self._leave()
            raise
        model.start_body(self.frame)  # a block inside an open statement toggle nests in it now
        if self.frame.nested:
            self.expansion._write(self.module, model)
        return self.optimizer

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> Literal[False]:
        try:
            if exc_type is None and self.flags["step"]:
                self.optimizer.step()
        finally:
            self._leave()
        return False

    def _leave(self) -> None:
        expansion = self.expansion
        try:
            expansion.exiting.append(self)
            try:
                self.module.untoggle_optimizer(self.optimizer)
            finally:
                expansion.exiting.remove(self)
            if not self.closed:
                expansion.forget(self)
        finally:
            if self.context is not None:
                self.context.__exit__(None, None, None)


# -- comparing ----------------------------------------------------------------------------------------


def _first_difference(a: _Outcome, b: _Outcome) -> str | None:
    """The first difference between the toggleshim fit ``a`` and the manual fit ``b``, said in words."""
    if a.params.keys() != b.params.keys():
        return f"the modules have different parameters: {sorted(a.params)} vs {sorted(b.params)}"
    for what, mine, theirs in (("parameter", a.params, b.params), ("buffer", a.buffers, b.buffers)):
        for name in mine:
            found = _tensor_difference(mine[name], theirs.get(name))
            if found:
                return f"{what} {name!r} {found}"
    for name in a.grads:
        found = _tensor_difference(a.grads[name], b.grads[name])
        if found:
            return f"the gradient of {name!r} {found}"
    for name, trainable in a.requires_grad.items():
        if trainable != b.requires_grad[name]:
            return (f"parameter {name!r} has requires_grad={trainable} with toggleshim, "
                    f"{b.requires_grad[name]} with manual")
    if len(a.optimizers) != len(b.optimizers):
        return f"the trainer has {len(a.optimizers)} optimizers with toggleshim, {len(b.optimizers)} with manual"
    for k, ((kind, state, names), (_, other, _)) in enumerate(zip(a.optimizers, b.optimizers)):
        per_param = {names[i] if isinstance(i, int) and i < len(names) else i: s for i, s in state["state"].items()}
        other_per_param = {names[i] if isinstance(i, int) and i < len(names) else i: s
                           for i, s in other["state"].items()}
        found = _difference(per_param, other_per_param, "") or _difference(
            state["param_groups"], other["param_groups"], "")
        if found:
            return f"optimizer {k} ({kind}) state{found}"
    for k, ((kind, state), (_, other)) in enumerate(zip(a.schedulers, b.schedulers)):
        found = _difference(state, other, "")
        if found:
            return f"LR scheduler {k} ({kind}) state{found}"
    if len(a.schedulers) != len(b.schedulers):
        return f"the trainer has {len(a.schedulers)} LR schedulers with toggleshim, {len(b.schedulers)} with manual"
    if a.global_step != b.global_step:
        return f"trainer.global_step is {a.global_step} with toggleshim, {b.global_step} with manual"
    return None


def _tensor_difference(a: torch.Tensor | None, b: torch.Tensor | None) -> str | None:
    """How ``a`` and ``b`` differ bitwise, or None (None equals only None; zeros are a tensor)."""
    if a is None or b is None:
        if a is None and b is None:
            return None
        def said(t: torch.Tensor | None) -> str:
            return "None" if t is None else "a tensor" + (" of zeros" if not t.any() else "")
        return f"is {said(a)} with toggleshim, {said(b)} with manual"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"is {a.dtype} {tuple(a.shape)} with toggleshim, {b.dtype} {tuple(b.shape)} with manual"
    bits_a, bits_b = (t.reshape(-1).contiguous().view(torch.uint8) for t in (a, b))
    if torch.equal(bits_a, bits_b):
        return None
    if a.is_floating_point():
        gap = (a.double() - b.double()).abs().max().item()
        if gap == 0:
            return "differs bitwise (equal values: signed zeros or NaN payloads)"
        return f"differs: max |a-b| = {gap:.3g}"
    return f"differs: {int((a != b).sum())} of {a.numel()} elements"


def _difference(a: Any, b: Any, path: str) -> str | None:
    """The first difference inside two state dicts: ``"['exp_avg'] differs: ..."`` with its path."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {a!r} with toggleshim, {b!r} with manual"
        found = _tensor_difference(a, b)
        return f"{path} {found}" if found else None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path} has entries {sorted(map(str, a))} with toggleshim, {sorted(map(str, b))} with manual"
        for key in a:
            found = _difference(a[key], b[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} with toggleshim, {b!r} with manual"
