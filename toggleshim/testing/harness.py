"""Worlds: a module, its optimizers and a trainer, built from specs; the runner; the oracles.

A *world* is driven by a program either through the shim (``with module.toggle_optimizer(...)``,
exactly as users write it) or through the manual sequence with Lightning's original methods
(``toggle; zero_grad; body; step`` with ``untoggle`` in ``finally``). While it runs, the reference
model (:mod:`toggleshim.testing.model`) is advanced beside it and checked at every point; every point
is also recorded as a snapshot, so two worlds can be compared bitwise afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from toggleshim._block import Toggle, toggle
from toggleshim._flavours import NAMES, of_module
from toggleshim._ours import MODE, original_of
from toggleshim.testing import model as _model
from toggleshim.testing.report import bounded, compact_record
from toggleshim.testing.specs import (
    SYNC_FAULTS,
    Backward,
    BadFlag,
    Block,
    EditRecord,
    GraphSpec,
    OptimizerSpec,
    Overrides,
    Raise,
    ReplaceRecord,
    SetRequiresGrad,
    Statement,
    Untoggle,
    WorldSpec,
    _nested_in_block,
)

__all__ = [
    "InjectedFault",
    "Mismatch",
    "World",
    "assert_toggle_equivalent",
    "build_world",
    "compare_runs",
    "run_program",
]


class InjectedFault(Exception):
    """The error a program raises on purpose (its identity is checked when it comes out)."""


class Mismatch(AssertionError):
    """Two worlds, or a world and the model, disagree; the message says where and what (a long list
    of differences as a count and a few: ``details`` holds every one)."""

    def __init__(self, message: str = "", details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


class _RecordLookalike(dict):  # type: ignore[type-arg]
    """A dict subclass that says it is a ``dict`` (``__class__``): only ``type()`` tells. Its lookups
    (``in``, ``[]``) are logged in ``reads``: Lightning's untoggle reads a record through them, and an
    exit that reads such a record another way (trusting its items) shows in the log."""

    reads: list[Any]

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return dict

    def __contains__(self, key: object) -> bool:
        self.reads.append(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key: Any) -> Any:
        self.reads.append(key)
        return dict.__getitem__(self, key)


# -- building ---------------------------------------------------------------------------------

_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
}


def _flavour_module(flavour: str) -> Any:
    return importlib.import_module(flavour)


_GRAPH_CLASSES: dict[str, type] = {}


def graph_module_class(flavour: str = NAMES[0]) -> type:
    """A LightningModule subclass (of ``flavour``) that holds a drawn graph."""
    if flavour not in _GRAPH_CLASSES:
        base = _flavour_module(flavour).LightningModule

        def __init__(self: Any, layers: nn.ModuleList, loose: nn.ParameterList) -> None:
            base.__init__(self)
            self.layers = layers
            self.loose = loose
            self.automatic_optimization = False

        _GRAPH_CLASSES[flavour] = type("GraphModule", (base,), {"__init__": __init__})
    return _GRAPH_CLASSES[flavour]


_TEMPLATES: dict[Any, nn.Module] = {}


def _make_layer(spec: Any) -> nn.Module:
    """A fresh layer for ``spec``: a deep copy of a template made once per spec (``skip_init`` costs
    ~3.5 ms a layer, a copy ~0.15 ms: docs/harness.md). Every value is overwritten from the seed."""
    template = _TEMPLATES.get(spec)
    if template is None:
        template = _TEMPLATES[spec] = _new_layer(spec)
    return copy.deepcopy(template)


def _new_layer(spec: Any) -> nn.Module:
    d = spec.dims
    skip = nn.utils.skip_init  # no draw from torch's global RNG: every value is filled from the seed
    if spec.kind == "linear":
        return cast(nn.Module, skip(nn.Linear, d[0], d[1], bias=spec.bias))  # type: ignore[no-untyped-call]
    if spec.kind == "conv1d":
        return cast(nn.Module, skip(nn.Conv1d, d[0], d[1], d[2], bias=spec.bias))  # type: ignore[no-untyped-call]
    if spec.kind == "embedding":
        return cast(nn.Module, skip(nn.Embedding, d[0], d[1]))  # type: ignore[no-untyped-call]
    if spec.kind == "layernorm":
        return cast(nn.Module, skip(nn.LayerNorm, d[0], bias=spec.bias))  # type: ignore[no-untyped-call]
    if spec.kind == "batchnorm":
        return cast(nn.Module, skip(nn.BatchNorm1d, d[0]))  # type: ignore[no-untyped-call]
    raise ValueError(f"unknown layer kind {spec.kind!r}")


def _inputs(layer_spec: Any, gen: torch.Generator) -> torch.Tensor:
    d = layer_spec.dims
    if layer_spec.kind == "embedding":
        return torch.randint(0, d[0], (3,), generator=gen)
    if layer_spec.kind == "conv1d":
        return torch.randn(2, d[0], d[2] + 2, generator=gen)
    return torch.randn(4, d[0], generator=gen)


def user_module_class(flavour: str, overrides: Overrides) -> type:
    """A subclass of the graph module whose ``toggle_optimizer`` / ``untoggle_optimizer`` are the user's
    own, as ``overrides`` draws them: on the class or set on each instance, plain functions or
    ``functools.wraps`` wrappers. Their ``super()`` is Lightning's own method in the manual world
    (``module._lightning_super``: the reference sequence runs under Lightning's methods alone), the
    class's (toggleshim's, where installed) otherwise; ``"original"`` calls Lightning's own in both."""
    base = graph_module_class(flavour)
    lightning = _flavour_module(flavour).LightningModule
    ov = overrides

    def lightnings(name: str) -> Callable[..., Any]:
        fn = vars(lightning)[name]
        return original_of(fn) or fn  # type: ignore[no-any-return]

    def parent(self: Any, name: str) -> Callable[..., Any]:
        if self._lightning_super or getattr(ov, name.split("_")[0]) == "original":
            return functools.partial(lightnings(name), self)
        return getattr(super(cls, self), name)  # type: ignore[no-any-return]

    def write(self: Any, sets: tuple[tuple[int, bool], ...]) -> None:
        for i, value in sets:
            if i < len(self._drawn):
                self._drawn[i].requires_grad_(value)

    def wrapped(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        if ov.wraps is None:
            return fn
        return functools.wraps(lightnings(name) if ov.wraps == "original" else vars(lightning)[name])(fn)

    methods: dict[str, Any] = {}
    if ov.toggle:
        def toggle_optimizer(self: Any, optimizer: Any, **flags: Any) -> Any:
            self.override_log.append("toggle")
            made = None
            if ov.toggle != "own":
                own = {} if self._lightning_super or ov.toggle == "original" else {**flags, **dict(ov.super_flags)}
                made = parent(self, "toggle_optimizer")(optimizer, **own)
            write(self, ov.toggle_sets)
            return made if ov.toggle == "super" else None

        methods["toggle_optimizer"] = wrapped(toggle_optimizer, "toggle_optimizer")
    if ov.untoggle:
        def untoggle_optimizer(self: Any, optimizer: Any) -> None:
            self.override_log.append("untoggle")
            if ov.untoggle != "own":
                parent(self, "untoggle_optimizer")(optimizer)
            write(self, ov.untoggle_sets)

        methods["untoggle_optimizer"] = wrapped(untoggle_optimizer, "untoggle_optimizer")
    body: dict[str, Any] = {"_lightning_super": False}
    if ov.on_instance:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)  # type: ignore[misc]
            for name, fn in methods.items():  # as mock.patch.object(module, name, ...) sets them
                self.__dict__[name] = types.MethodType(fn, self)

        body["__init__"] = __init__
    else:
        body.update(methods)
    cls = type("UserModule", (base,), body)
    return cls


def build_graph(spec: GraphSpec, flavour: str = NAMES[0],
                overrides: Overrides | None = None) -> tuple[nn.Module, list[torch.Tensor]]:
    """The module for ``spec`` (values from ``spec.seed`` only) and one input per layer."""
    layers = nn.ModuleList(_make_layer(layer) for layer in spec.layers)
    for dst, src in spec.ties:
        layers[dst].weight = layers[src].weight  # one Parameter in two submodules
    loose = nn.ParameterList(nn.Parameter(torch.empty(n)) for n in spec.loose)
    cls = graph_module_class(flavour) if overrides is None else user_module_class(flavour, overrides)
    module = cls(layers, loose)
    module.override_log = []
    module._drawn = list(module.parameters())
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for _, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for name, b in module.named_buffers():
            if name.endswith("running_var"):
                b.fill_(1.0)
            else:
                b.zero_()
    inputs = [_inputs(layer, gen) for layer in spec.layers]
    return module, inputs


def _graph_terms(module: Any, inputs: list[torch.Tensor]) -> list[Callable[[], torch.Tensor]]:
    terms: list[Callable[[], torch.Tensor]] = []
    for layer, x in zip(module.layers, inputs):
        terms.append(functools.partial(_layer_term, layer, x))
    for p in module.loose:
        terms.append(functools.partial(_loose_term, p))
    return terms


def _layer_term(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return cast(torch.Tensor, layer(x)).square().mean()


def _loose_term(p: torch.Tensor) -> torch.Tensor:
    return (p * p).sum() * 0.5


class _ParamList(list):  # type: ignore[type-arg]
    """A list subclass for a param group's ``"params"`` (as some libraries put there)."""


_CONTAINERS: dict[str, Callable[[list[Any]], Sequence[Any]]] = {
    "list": list, "tuple": tuple, "list subclass": _ParamList
}


def _build_optimizers(
    specs: Sequence[OptimizerSpec], params: list[nn.Parameter], container: str = "list"
) -> list[torch.optim.Optimizer]:
    optimizers = [
        _OPTIMIZERS[s.kind]([{"params": [params[i] for i in idx], **dict(h)} for idx, h in s.groups]) for s in specs
    ]
    if container != "list":  # torch makes lists; the user (or a library) may put another sequence there
        for o in optimizers:
            for group in o.param_groups:
                group["params"] = _CONTAINERS[container](group["params"])
    return optimizers


@dataclass
class World:
    """A module, the optimizers the program toggles, and what happened to them.

    ``opts`` are the objects passed to ``toggle_optimizer`` (raw optimizers, or the
    ``LightningOptimizer`` wrappers under a real Trainer); ``terms`` are the loss pieces
    ``Backward`` picks from; ``calls`` logs every ``zero_grad``/``step`` an optimizer received.
    """

    module: Any
    params: list[nn.Parameter]
    opts: list[Any]
    terms: list[Callable[[], torch.Tensor]]
    optimizers_spec: list[list[int]]
    calls: list[tuple[str, int]] = field(default_factory=list)
    fault: tuple[str, int] | None = None
    raised: list[BaseException] = field(default_factory=list)
    global_step: Callable[[], int] = lambda: 0
    strategy: StandInStrategy | None = None
    reached: list[tuple[str, int]] = field(default_factory=list)
    wrapped: tuple[int, ...] = ()
    overrides: Overrides | None = None  # the module's class overrides toggle/untoggle_optimizer
    record_reads: list[Any] = field(default_factory=list)  # the lookups of a replaced record (_RecordLookalike)

    def instrument(self) -> None:
        """Log (and, when armed, fail) every zero_grad/step called on the toggled objects.

        ``calls`` logs every call; ``reached`` the calls that went on to the object's own method (a
        fault injected before the update stops it there).
        """
        for k, opt in enumerate(self.opts):
            for name in ("zero_grad", "step"):
                original = getattr(opt, name)

                def wrapper(*args: Any, _k: int = k, _name: str = name, _orig: Any = original, **kwargs: Any) -> Any:
                    self.calls.append((_name, _k))
                    armed = self.fault
                    if armed is not None and armed[1] == _k and armed[0] in (_name, f"{_name}_after"):
                        self.fault = None
                        if armed[0] == f"{_name}_after":
                            self.reached.append((_name, _k))
                            _orig(*args, **kwargs)
                        self.raised.append(err := InjectedFault(f"{armed[0]} of optimizer {_k} failed"))
                        raise err
                    self.reached.append((_name, _k))
                    return _orig(*args, **kwargs)

                opt.__dict__[name] = wrapper


class _SyncBlock:
    """What ``StandInStrategy.block_backward_sync()`` returns: counts and logs entries and exits;
    ``fault`` (``"sync_enter"``, ``"sync_exit"``) makes its entry fail, or its exit fail once it has
    restored sync (as a context manager whose ``finally`` runs, then raises)."""

    __slots__ = ("fault", "strategy")

    def __init__(self, strategy: StandInStrategy, fault: str | None) -> None:
        self.strategy, self.fault = strategy, fault

    def __enter__(self) -> None:
        if self.fault == "sync_enter":
            self.strategy.fail("entering block_backward_sync() failed")
        self.strategy.blocked += 1
        self.strategy.sync_log.append("enter")

    def __exit__(self, *exc: object) -> None:
        self.strategy.blocked -= 1
        self.strategy.sync_log.append("exit")
        if self.fault == "sync_exit":
            self.strategy.fail("leaving block_backward_sync() failed")


class StandInStrategy:
    """A stand-in for a parallel strategy (DDP): ``block_backward_sync()`` records whether gradient
    sync is blocked (``blocked``: how many no-sync contexts are open) and every entry and exit
    (``sync_log``); ``optimizer_step`` is what a ``LightningOptimizer``'s ``step`` calls. The loop's
    hooks (``on_before_step``/``on_after_step``, installed on the wrappers) log and count global steps
    as Lightning's manual loop does (one per completed optimizer step).

    ``fault``, when armed with one of :data:`SYNC_FAULTS`, goes to the next ``block_backward_sync()``
    call: ``"sync_call"`` makes the call itself fail; the exceptions raised go to ``raised``."""

    def __init__(self) -> None:
        self.blocked = 0
        self.sync_log: list[str] = []
        self.hooks: list[tuple[str, int]] = []
        self.global_step = 0
        self.fault: str | None = None
        self.raised: list[BaseException] = []

    def block_backward_sync(self) -> _SyncBlock:
        fault, self.fault = self.fault, None
        if fault == "sync_call":
            self.fail("block_backward_sync() failed")
        return _SyncBlock(self, fault)

    def fail(self, what: str) -> None:
        self.raised.append(err := InjectedFault(what))
        raise err

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        return optimizer.step(closure=closure, **kwargs)

    def hook(self, name: str, k: int) -> Callable[[], None]:
        def on_step() -> None:
            self.hooks.append((name, k))
            if name == "after_step":
                self.global_step += 1

        return on_step


def _stand_in_trainer(module: Any, optimizers: list[torch.optim.Optimizer], strategy: Any = None) -> None:
    """Attach a minimal trainer exposing only ``optimizers`` and ``strategy`` (fast, for unit-level
    properties)."""
    module._trainer = SimpleNamespace(optimizers=optimizers, strategy=strategy or SimpleNamespace())


def _wrap(flavour: str, optimizer: torch.optim.Optimizer, strategy: StandInStrategy, k: int) -> Any:
    """The ``LightningOptimizer`` of ``flavour`` around ``optimizer``, as ``self.optimizers()`` returns
    it in manual optimization: the strategy set, the loop's step hooks installed."""
    cls = importlib.import_module(f"{flavour}.core.optimizer").LightningOptimizer
    wrapper = cls(optimizer)
    wrapper._strategy = strategy
    wrapper._on_before_step = strategy.hook("before_step", k)
    wrapper._on_after_step = strategy.hook("after_step", k)
    return wrapper


#: Worlds built in this process (benchmarks report worlds per second from it).
WORLDS_BUILT = 0


def build_world(spec: WorldSpec, flavour: str = NAMES[0]) -> World:
    """A world on a stand-in trainer (what most properties use; ``run_in_trainer`` for the real one)."""
    global WORLDS_BUILT
    WORLDS_BUILT += 1
    module, inputs = build_graph(spec.graph, flavour, spec.overrides)
    params = list(module.parameters())
    for i in spec.frozen:
        params[i].requires_grad_(False)
    optimizers = _build_optimizers(spec.optimizers, params, spec.container)
    strategy = StandInStrategy()
    _stand_in_trainer(module, optimizers, strategy)
    opts = [_wrap(flavour, o, strategy, k) if k in spec.wrapped else o for k, o in enumerate(optimizers)]
    world = World(
        module,
        params,
        opts,
        _graph_terms(module, inputs),
        _optimizer_params(optimizers, params),
        global_step=lambda: strategy.global_step,
        strategy=strategy,
        wrapped=tuple(spec.wrapped),
        overrides=spec.overrides,
    )
    strategy.raised = world.raised
    world.instrument()
    return world


def _optimizer_params(optimizers: Sequence[Any], params: list[nn.Parameter]) -> list[list[int]]:
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for g in o.param_groups for p in g["params"]] for o in optimizers]


# -- drivers ------------------------------------------------------------------------------------


class ShimDriver:
    """Drives the shim exactly as users write it."""

    name = "shim"

    def block(self, world: World, op: Block, after_toggle: Callable[[], None], body: Callable[[], None]) -> None:
        # As users write it: unless ``op.explicit``, a flag is passed only when it differs from its
        # default (so the defaults are under test too), through the entry point ``op.entry``
        flags = dict(op.flags) if op.explicit else op.changed()
        module, opt = world.module, world.opts[op.k]
        if op.entry == "toggle":
            toggled = toggle(module, opt, **flags)
        elif op.entry == "Toggle" and not _fallback(module):
            # Toggle(...) builds the shim's toggle whatever the gate decided (it is not routed to
            # the fallback as toggle() is): drawn only where the shim is installed
            toggled = Toggle(module, opt, **flags)
        else:
            toggled = module.toggle_optimizer(opt, **flags)
        after_toggle()
        kind = _kind(world, op)
        _says(toggled, "toggled", kind)
        entered = False  # (a toggle never entered stays toggled, as a statement toggle)

        def inside() -> None:
            nonlocal entered
            entered = True
            _says(toggled, "open", kind)
            body()

        try:
            if op.way == "ExitStack":  # which looks __exit__ up on the class, and calls it later
                with contextlib.ExitStack() as stack:
                    stack.enter_context(toggled)
                    inside()
            else:
                with toggled:
                    inside()
        except BaseException:
            # Closed as the exception leaves the with statement; not yet with ExitStack's own exit
            # interrupted at its first line: the stack's frame, in the traceback, holds that exit
            # until the exception is let go of (docs/guarantees.md, "Every way into a block")
            if entered and op.way == "with":
                _says(toggled, "closed", kind)
            raise
        if entered:
            _says(toggled, "closed", kind)

    def toggle(self, world: World, k: int) -> None:
        world.module.toggle_optimizer(world.opts[k])

    def untoggle(self, world: World, k: int, other: bool = False) -> None:
        world.module.untoggle_optimizer(_inner(world.opts[k]) if other else world.opts[k])

    def bad_flag(self, world: World, op: BadFlag) -> None:
        """A flag of another type: a TypeError that names it, before anything changes (through
        ``toggleshim.toggle`` where the user's ``toggle_optimizer`` takes no flags of its own)."""
        own = world.overrides is not None and world.overrides.toggle is not None
        try:
            if own:
                toggle(world.module, world.opts[op.k], **{op.flag: op.value})  # type: ignore[arg-type]
            else:
                world.module.toggle_optimizer(world.opts[op.k], **{op.flag: op.value})
        except TypeError as exc:
            if f"{op.flag} must be True or False" not in str(exc):
                raise Mismatch(f"toggle_optimizer({op.flag}={op.value!r}): a TypeError not naming it: {exc}") from exc
            return
        raise Mismatch(f"toggle_optimizer({op.flag}={op.value!r}) did not refuse the value")


def _fallback(module: Any) -> bool:
    """The module's Lightning flavour has the fallback installed (toggle code toggleshim has not verified)."""
    for cls in type(module).__mro__:
        fn = vars(cls).get("toggle_optimizer")
        if original_of(fn) is not None:
            return getattr(fn, MODE, None) == "fallback"
    return False


def _kind(world: World, op: Block) -> str:
    """What a block of ``op`` is over, as its repr names it: the module's own toggle (an override that
    never calls ``super()``: one that returns None has its ``super()``'s toggle caught), the fallback
    (unverified Lightning code), or toggleshim's toggle of the optimizer passed (its class's name)."""
    if world.overrides is not None and world.overrides.toggle in ("own", "original"):
        return "own"
    if _fallback(world.module):
        return "fallback"
    return type(world.opts[op.k]).__name__


def _says(toggled: Any, status: str, kind: str) -> None:
    """The block's repr says what it is (users see it in a debugger, IPython's Out[], a log): made,
    in its block, or closed and holding nothing; over which kind of toggle (:func:`_kind`)."""
    text = repr(toggled)
    if status == "closed":
        expected = "<toggleshim.Toggle closed (holds nothing)>"
    elif kind == "own":
        expected = f"<toggleshim.Toggle {status} (the module's own toggle_optimizer)>"
    elif kind == "fallback":
        if not re.fullmatch(rf"<toggleshim fallback toggle {status} on \S+ \S+ \(\S+\)>", text):
            raise Mismatch(f"a fallback block {status} says {text!r}")
        return
    else:
        expected = f"<toggleshim.Toggle {status} optimizer={kind}>"
    if text != expected:
        raise Mismatch(f"a block {status} says {text!r}, not {expected!r}")


class ManualDriver:
    """Drives Lightning's original methods: ``toggle; zero_grad; body; step``, untoggle in ``finally``."""

    name = "manual"

    def __init__(self, toggle: Callable[[Any, Any], None], untoggle: Callable[[Any, Any], None]) -> None:
        self._toggle = toggle
        self._untoggle = untoggle

    @classmethod
    def for_flavour(cls, flavour: str = NAMES[0]) -> ManualDriver:
        """Lightning's own methods, even while the shim is installed."""
        module_cls = _flavour_module(flavour).LightningModule
        fns = [vars(module_cls)[n] for n in ("toggle_optimizer", "untoggle_optimizer")]
        fns = [original_of(f) or f for f in fns]
        return cls(fns[0], fns[1])

    def _methods(self, world: World) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """The module's own methods where its class overrides them (their ``super()`` is Lightning's
        own, see ``user_module_class``), else Lightning's."""
        ov, module = world.overrides, world.module
        toggle_fn = module.toggle_optimizer if ov is not None and ov.toggle else functools.partial(self._toggle, module)
        untoggle_fn = (module.untoggle_optimizer if ov is not None and ov.untoggle
                       else functools.partial(self._untoggle, module))
        return toggle_fn, untoggle_fn

    def block(self, world: World, op: Block, after_toggle: Callable[[], None], body: Callable[[], None]) -> None:
        opt = world.opts[op.k]
        op = _effective(op, world.overrides)  # what the user's code asks for, spelled out by hand
        toggle_fn, untoggle_fn = self._methods(world)
        toggle_fn(opt)
        after_toggle()
        try:
            # LightningOptimizer.toggle_model(sync_grad=False): the strategy's no-sync context, when
            # the strategy has one (a parallel strategy)
            block_sync = None if op.sync_grad else getattr(world.module.trainer.strategy, "block_backward_sync", None)
            context = block_sync() if block_sync is not None else contextlib.nullcontext()
            context.__enter__()
            try:
                if op.zero_grad:
                    opt.zero_grad()
                body()
                if op.step:
                    opt.step()
            except BaseException:
                # Written out rather than a with statement, whose failing __exit__ would replace the
                # error in flight: the first error propagates (docs/guarantees.md)
                with contextlib.suppress(Exception):
                    context.__exit__(None, None, None)
                raise
            context.__exit__(None, None, None)
        finally:
            untoggle_fn(opt)

    def toggle(self, world: World, k: int) -> None:
        self._methods(world)[0](world.opts[k])

    def untoggle(self, world: World, k: int, other: bool = False) -> None:
        self._methods(world)[1](_inner(world.opts[k]) if other else world.opts[k])

    def bad_flag(self, world: World, op: BadFlag) -> None:
        """Lightning's toggle takes no flags: nothing to do (the shim's must change nothing either)."""


# -- running, with the model checked at every point -------------------------------------------


@dataclass
class Snapshot:
    """What a world looks like at one point of the program."""

    where: str
    requires_grad: tuple[bool, ...]
    grads: tuple[torch.Tensor | None, ...]
    record: tuple[tuple[int, bool], ...] | None
    full: dict[str, Any] | None = None
    sync_blocked: bool | None = None  # the stand-in strategy's gradient sync is blocked (None: no stand-in)
    record_reads: tuple[int, ...] = ()  # the lookups of a replaced record so far, by parameter


@dataclass
class Run:
    """A program's run on one world: snapshots, the exceptions that came out, and the optimizer calls."""

    snapshots: list[Snapshot]
    outcomes: list[tuple[str, str, bool] | None]
    calls: list[tuple[str, int]]
    expected_calls: list[tuple[str, int]]
    sync_log: list[str] = field(default_factory=list)
    expected_sync: list[str] = field(default_factory=list)
    hooks: list[tuple[str, int]] = field(default_factory=list)
    expected_hooks: list[tuple[str, int]] = field(default_factory=list)
    nested: bool = False  # a toggle took the shim's nesting rule: no manual sequence to compare with
    override_log: list[str] = field(default_factory=list)  # the calls of the user's own methods


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


def _placed(record: Any, cls: Any, where: str) -> Any:
    """``cls(record)``, made at a lower (``"below"``) or higher (``"above"``) address than ``record``
    where one of a few tries gets there: toggleshim knows a record by identity only, so no order of
    addresses may count (an ``id`` compared with ``>=`` would take a replacement made above the old
    record for it, one compared with ``<=`` one made below)."""
    tries = [cls(record) for _ in range(16)]
    return (min if where == "below" else max)(tries, key=id)


class _Runner:
    def __init__(self, world: World, driver: Any, check_model: bool) -> None:
        self.world = world
        self.driver = driver
        self.model = _model.ToggleModel(world.optimizers_spec, [p.requires_grad for p in world.params],
                                        lightning=isinstance(driver, ManualDriver), overrides=world.overrides)
        if world.overrides is not None:  # the overrides' super(): Lightning's own in the manual world
            world.module._lightning_super = isinstance(driver, ManualDriver)
        self.check_model = check_model
        self.snapshots: list[Snapshot] = []
        self.expected: list[tuple[str, int]] = []
        self.expected_sync: list[str] = []
        self.path: list[str] = []

    def expected_global_step(self) -> int:
        """In stand-in worlds, the model's count: one per step that reached a ``LightningOptimizer``."""
        w = self.world
        if w.strategy is None:
            return int(w.global_step())  # under a real Trainer: compared between the runs instead
        return sum(len(_model.expected_hooks(k, k in w.wrapped, name == "step")) // 2 for name, k in w.reached)

    # -- points --
    def point(self, label: str, full: bool = False) -> None:
        w = self.world
        where = "/".join([*self.path, label])
        rg = tuple(p.requires_grad for p in w.params)
        index = {id(p): i for i, p in enumerate(w.params)}
        raw = w.module.__dict__.get("_param_requires_grad_state")
        record = None if raw is None else tuple((index.get(id(p), -1), v) for p, v in raw.items())
        strategy = w.strategy
        snap = Snapshot(where, rg, tuple(_clone(p.grad) for p in w.params), record,
                        sync_blocked=None if strategy is None else strategy.blocked > 0,
                        record_reads=tuple(index.get(id(p), -1) for p in w.record_reads))
        if full:
            snap.full = {
                "params": [_clone(p) for p in w.params],
                "buffers": [_clone(b) for b in w.module.buffers()],
                "state": [copy.deepcopy(_inner(o).state_dict()) for o in w.opts],
                "global_step": w.global_step(),
            }
        self.snapshots.append(snap)
        if self.check_model:
            self._check_model(snap)

    def _check_model(self, snap: Snapshot) -> None:
        m = self.model
        if list(snap.requires_grad) != m.rg:
            names = _names(self.world)
            diff = [
                f"parameter `{names[i]}` is {'trainable' if got else 'frozen'}, the model says "
                f"{'trainable' if want else 'frozen'}"
                for i, (got, want) in enumerate(zip(snap.requires_grad, m.rg))
                if got != want
            ]
            raise Mismatch(f"{self.driver.name} world at {snap.where}: " + bounded(diff, "parameters"), diff)
        if snap.sync_blocked is not None and snap.sync_blocked != m.sync_blocked():
            raise Mismatch(
                f"{self.driver.name} world at {snap.where}: gradient sync is "
                f"{'blocked' if snap.sync_blocked else 'on'}, the model says "
                f"{'blocked (inside a block with sync_grad=False)' if m.sync_blocked() else 'on'}"
            )
        if snap.full is not None and snap.full["global_step"] != self.expected_global_step():
            raise Mismatch(
                f"{self.driver.name} world at {snap.where}: global_step is {snap.full['global_step']}, the "
                f"model says {self.expected_global_step()} (one per step through a LightningOptimizer)"
            )
        want_record = None if m.record is None else tuple(m.record.items())
        if snap.record != want_record:
            raise Mismatch(
                f"{self.driver.name} world at {snap.where}: _param_requires_grad_state is "
                f"{compact_record(snap.record, want_record)}, the model says {compact_record(want_record, snap.record)}"
            )

    # -- ops --
    def run(self, program: Sequence[object]) -> Run:
        outcomes: list[tuple[str, str, bool] | None] = []
        self.point("start", full=True)
        for n, op in enumerate(program):
            self.path = [f"op{n}"]
            before = len(self.world.raised)
            try:
                self.op(op)
                outcomes.append(None)
            except Mismatch:  # the harness's verdict, never one of the program's outcomes
                raise
            except BaseException as exc:  # the program's faults come out here, KeyboardInterrupt too
                ours = self.world.raised[before:]
                injected = any(exc is e for e in ours)
                if ours and exc is not ours[0]:  # the first error propagates (docs/guarantees.md)
                    raise Mismatch(
                        f"{self.driver.name} world at op{n}: {exc!r} came out instead of the very "
                        f"exception the program raised first ({ours[0]!r})"
                    ) from exc
                if not ours and self.check_model:  # the model has no error the program did not raise
                    raise Mismatch(
                        f"{self.driver.name} world at op{n}: {exc!r} came out, which the program did not "
                        f"raise (the model says nothing fails here)"
                    ) from exc
                outcomes.append((type(exc).__name__, str(exc), injected))
            self.path = [f"op{n}"]
            self.point("end", full=True)
        strategy = self.world.strategy
        wrapped = self.world.wrapped
        expected_hooks = [
            hook for name, k in self.world.reached for hook in _model.expected_hooks(k, k in wrapped, name == "step")
        ]
        return Run(
            self.snapshots,
            outcomes,
            list(self.world.calls),
            self.expected,
            [] if strategy is None else list(strategy.sync_log),
            self.expected_sync,
            [] if strategy is None else list(strategy.hooks),
            expected_hooks if strategy is not None else [],
            nested=self.model.nested_seen,
            override_log=list(getattr(self.world.module, "override_log", [])),
        )

    def op(self, op: object) -> None:
        w, m = self.world, self.model
        if isinstance(op, SetRequiresGrad):
            w.params[op.param].requires_grad_(op.value)
            m.set_requires_grad(op.param, op.value)
            self.point("set")
        elif isinstance(op, EditRecord):
            self.edit_record(op)
        elif isinstance(op, Backward):
            loss = sum((w.terms[t]() for t in op.terms), torch.zeros(()))
            try:
                if hasattr(w.module, "_trainer") and not isinstance(w.module._trainer, SimpleNamespace):
                    w.module.manual_backward(loss)
                else:
                    torch.autograd.backward(loss)
            except BaseException as error:  # nothing to differentiate: raised by the program as well
                w.raised.append(error)
                raise
            self.point("backward")
        elif isinstance(op, Raise):
            exc: BaseException = (
                KeyboardInterrupt("injected") if op.kind == "interrupt" else InjectedFault("body failed")
            )
            w.raised.append(exc)
            raise exc
        elif isinstance(op, Block):
            self.block(op)
        elif isinstance(op, Statement):
            self.statement(op)
        elif isinstance(op, Untoggle):
            self.driver.untoggle(w, op.k)
            m.untoggle_call(op.k)
            self.point(f"untoggled{op.k}")
        elif isinstance(op, BadFlag):
            self.driver.bad_flag(w, op)
            self.point("bad flag")
        elif isinstance(op, ReplaceRecord):
            record = w.module.__dict__.get("_param_requires_grad_state")
            if record is not None:
                replaced = _placed(record, dict if op.how == "dict" else _RecordLookalike, op.where)
                if isinstance(replaced, _RecordLookalike):
                    replaced.reads = w.record_reads
                w.module._param_requires_grad_state = replaced
                self.model.replace_record()
            self.point("record replaced")
        else:  # pragma: no cover - specs are closed
            raise TypeError(op)

    def edit_record(self, op: EditRecord) -> None:
        w, m = self.world, self.model
        record = w.module.__dict__.get("_param_requires_grad_state")
        if record:
            index = {id(p): i for i, p in enumerate(w.params)}
            param = list(record)[op.entry % len(record)]
            absent = [p for p in w.params if not any(p is q for q in record)]
            if op.how == "flip":
                record[param] = not record[param]
                m.edit_record(index[id(param)], record[param])
            elif op.how == "add":
                if absent:
                    record[absent[0]] = False
                    m.edit_record(index[id(absent[0])], False)
            else:
                del record[param]
                m.edit_record(index[id(param)], None)
                absent = [p for p in w.params if p is not param and not any(p is q for q in record)]
                if op.how == "replace" and absent:
                    record[absent[0]] = False
                    m.edit_record(index[id(absent[0])], False)
        self.point("record")

    def body(self, ops: Sequence[object], label: str) -> None:
        saved = self.path
        for n, op in enumerate(ops):
            self.path = [*saved, f"{label}{n}"]
            self.op(op)
        self.path = saved

    def block(self, written: Block) -> None:
        w, m = self.world, self.model
        op = _effective(written, w.overrides)  # the flags the block runs with (the user's methods decide)
        frame: _model.Frame | None = None
        completed = False
        # An enclosing block's fault still to fire (at its step, or its no-sync context's exit) waits
        # while this block runs, and is armed again after it: one fault slot, one block at a time
        waiting = (w.fault, w.strategy.fault if w.strategy is not None else None)
        w.fault = None
        if w.strategy is not None:
            w.strategy.fault = None
        # a fault of the no-sync context fires only where there is one (not under a real Trainer on CPU)
        sync_fault = op.fail if op.fail in SYNC_FAULTS and not op.sync_grad and w.strategy is not None else None

        def after_toggle() -> None:
            nonlocal frame
            frame = m.block_toggle(op.k)
            m.enter(frame, op.sync_grad)
            self.expected.extend(_model.expected_calls(op.k, op.zero_grad, op.step, None, sync_fault))
            if w.strategy is not None:
                self.expected_sync.extend(_model.expected_sync(op.sync_grad, True, sync_fault))
            self.point(f"toggled{op.k}")
            if sync_fault is not None:
                w.strategy.fault = sync_fault  # type: ignore[union-attr]
            elif op.fail not in (None, *SYNC_FAULTS):
                w.fault = (op.fail, op.k)

        body_done = -1  # where the exceptions raised once the body completed begin in w.raised

        def run_body() -> None:
            nonlocal completed, body_done
            if frame is not None:
                m.start_body(frame)
            self.point("entered")
            self.body(op.body, "b")
            completed, body_done = True, len(w.raised)

        refused = False
        try:
            self.driver.block(w, written, after_toggle, run_body)
            if frame is not None and m.refuses_step(frame, op.step, completed):
                raise Mismatch(f"{self.driver.name} world: the block over optimizer {op.k} stepped again after a "
                               "step inside it (the model says: a double step, refused)")
        except Mismatch:
            raise
        except BaseException as exc:
            refused = frame is not None and m.refuses_step(frame, op.step, completed)
            # toggleshim's refusal is this block's outcome (it comes first: the body completed), unless
            # an interrupt landed in the exit (it propagates ahead of errors)
            if refused and isinstance(exc, Exception) and self.check_model:
                if not (isinstance(exc, RuntimeError) and "step() ran inside" in str(exc)):
                    raise Mismatch(f"{self.driver.name} world: {exc!r} came out where the model expects the "
                                   "double step's RuntimeError") from exc
                # raised ahead of whatever the untoggle then raised (a no-sync context's exit fault)
                w.raised.insert(body_done, exc)
            raise
        finally:
            w.fault = waiting[0]
            if w.strategy is not None:
                w.strategy.fault = waiting[1]
            if frame is not None:
                m.exit(frame)
                self.expected.extend(_model.expected_calls(op.k, op.zero_grad, op.step and not refused, completed))
                if w.strategy is not None:
                    self.expected_sync.extend(_model.expected_sync(op.sync_grad, False, sync_fault))
                if op.step and completed and not refused and op.fail != "step":  # torch's step ran
                    m.stepped(op.k)
            self.point(f"left{op.k}", full=True)

    def statement(self, op: Statement) -> None:
        self.driver.toggle(self.world, op.k)
        self.model.toggle_call(op.k)
        self.point(f"toggled{op.k}")
        self.body(op.body, "s")
        self.driver.untoggle(self.world, op.k, op.other)
        self.model.untoggle_call(op.k)
        self.point(f"untoggled{op.k}")


def _inner(opt: Any) -> Any:
    return getattr(opt, "_optimizer", opt)


def _effective(op: Block, overrides: Overrides | None) -> Block:
    """``op`` with the flags its block runs with (``model.block_flags``): those it passes, or those the
    user's ``toggle_optimizer`` passes to ``super()``."""
    flags = _model.block_flags(op.passed(), op.entry, overrides)
    return dataclasses.replace(op, flags=tuple(flags.items()))


def _names(world: World) -> list[str]:
    by_id = {id(p): n for n, p in world.module.named_parameters()}
    return [by_id.get(id(p), f"#{i}") for i, p in enumerate(world.params)]


def run_program(world: World, program: Sequence[object], driver: Any, check_model: bool = True) -> Run:
    """Run ``program`` on ``world`` with ``driver``; with ``check_model``, the model is checked at every point."""
    return _Runner(world, driver, check_model).run(program)


# -- comparing --------------------------------------------------------------------------------


def _bitwise(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return torch.equal(a, b)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _bitwise(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def compare_runs(a: Run, b: Run, world: World | None = None) -> None:
    """Raise :class:`Mismatch` at the first point where two runs differ (bitwise for tensors)."""
    names = _names(world) if world is not None else None

    def name(i: int) -> str:
        return f"`{names[i]}`" if names else f"#{i}"

    if a.outcomes != b.outcomes:
        raise Mismatch(f"the programs ended differently: {a.outcomes} vs {b.outcomes}")
    if a.calls != b.calls:
        raise Mismatch(f"optimizer calls differ: {a.calls} vs {b.calls}")
    if a.hooks != b.hooks:
        raise Mismatch(f"LightningOptimizer step hooks differ: {a.hooks} vs {b.hooks}")
    if a.override_log != b.override_log:
        raise Mismatch(f"the module's own toggle/untoggle_optimizer ran differently: {a.override_log} vs "
                       f"{b.override_log}")
    for sa, sb in zip(a.snapshots, b.snapshots):
        where = sa.where
        if sa.where != sb.where:
            raise Mismatch(f"the runs took different paths: {sa.where} vs {sb.where}")
        for i, (x, y) in enumerate(zip(sa.requires_grad, sb.requires_grad)):
            if x != y:
                raise Mismatch(
                    f"at {where}, parameter {name(i)} is {'trainable' if x else 'frozen'} in one "
                    f"world and {'trainable' if y else 'frozen'} in the other"
                )
        if sa.record != sb.record:
            raise Mismatch(f"at {where}, _param_requires_grad_state differs: {compact_record(sa.record, sb.record)} "
                           f"vs {compact_record(sb.record, sa.record)}")
        if sa.sync_blocked != sb.sync_blocked:
            raise Mismatch(f"at {where}, gradient sync is blocked in one world and not in the other")
        if sa.record_reads != sb.record_reads:
            raise Mismatch(f"at {where}, a replaced record was read otherwise than Lightning's untoggle reads it "
                           f"(lookups by parameter: {sa.record_reads} vs {sb.record_reads})")
        for i, (ga, gb) in enumerate(zip(sa.grads, sb.grads)):
            if not _bitwise(ga, gb):
                what = "None" if ga is None else "a tensor"
                other = "None" if gb is None else "a tensor"
                raise Mismatch(f"at {where}, the gradient of {name(i)} differs ({what} vs {other})")
        if (sa.full is None) != (sb.full is None):
            raise Mismatch(f"at {where}, the runs took different paths")
        if sa.full is not None and sb.full is not None:
            for key in ("params", "buffers", "state", "global_step"):
                if not _same(sa.full[key], sb.full[key]):
                    raise Mismatch(f"at {where}, {key} differ bitwise")
    if len(a.snapshots) != len(b.snapshots):
        raise Mismatch(f"the runs took different paths ({len(a.snapshots)} vs {len(b.snapshots)} points)")


def check_calls(run: Run, driver_name: str = "shim") -> None:
    """The model's expected optimizer calls (exit paths) against what the world received."""
    if run.calls != run.expected_calls:
        raise Mismatch(f"{driver_name} world: optimizer calls {run.calls}, the model expects {run.expected_calls}")
    if run.sync_log != run.expected_sync:
        raise Mismatch(
            f"{driver_name} world: the strategy's block_backward_sync was {run.sync_log}, the model expects "
            f"{run.expected_sync} (entered when a sync_grad=False block starts, left once when it ends)"
        )
    if run.hooks != run.expected_hooks:
        raise Mismatch(
            f"{driver_name} world: LightningOptimizer step hooks ran {run.hooks}, the model expects "
            f"{run.expected_hooks} (before/after around every step through a LightningOptimizer)"
        )


def assert_toggle_equivalent(spec: WorldSpec, flavour: str = NAMES[0]) -> None:
    """The shim world equals the model at every point; for flat programs, also Lightning's manual
    sequence, bitwise (requires_grad, gradients, parameters, buffers, optimizer state, exceptions)."""
    assert_program_equivalent(functools.partial(build_world, spec, flavour), spec.program, flavour)


# -- under a real Trainer -----------------------------------------------------------------------


def run_in_trainer(
    spec: WorldSpec,
    driver: Any,
    flavour: str = NAMES[0],
    check_model: bool = True,
    batches: int = 1,
    **trainer_kwargs: Any,
) -> tuple[Run, World]:
    """Run ``spec.program`` inside ``Trainer.fit`` (manual optimization, CPU): the program runs in
    every ``training_step`` (``batches`` of them) through the ``LightningOptimizer`` s that
    ``self.optimizers()`` returns, so steps go through Lightning's strategy and precision plugin and
    ``global_step`` counts them. The runs of all batches are returned as one."""
    global WORLDS_BUILT
    WORLDS_BUILT += 1
    pl = _flavour_module(flavour)
    module, inputs = build_graph(spec.graph, flavour, spec.overrides)
    params = list(module.parameters())
    for i in spec.frozen:
        params[i].requires_grad_(False)
    optimizers = _build_optimizers(spec.optimizers, params)
    result: dict[str, Any] = {}

    def training_step(self: Any, batch: Any, batch_idx: int) -> None:
        opts = self.optimizers()
        opts = list(opts) if isinstance(opts, (list, tuple)) else [opts]
        world = World(
            self,
            params,
            opts,
            _graph_terms(self, inputs),
            _optimizer_params(optimizers, params),
            global_step=lambda: int(self.trainer.global_step),
            overrides=spec.overrides,  # the module's class overrides toggle/untoggle_optimizer
        )
        world.instrument()
        try:
            run = run_program(world, spec.program, driver, check_model)
            if "run" in result:
                prev = result["run"]
                run = Run(
                    prev.snapshots + run.snapshots,
                    prev.outcomes + run.outcomes,
                    prev.calls + run.calls,
                    prev.expected_calls + run.expected_calls,
                )
            result["run"] = run
        finally:
            for opt in opts:  # the wrappers go: Lightning keeps these objects after fit
                opt.__dict__.pop("zero_grad", None)
                opt.__dict__.pop("step", None)
        result["world"] = world

    def train_dataloader(self: Any) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(batches, 1)), batch_size=1)

    module.__class__ = type(
        "TrainerGraphModule",
        (type(module),),
        {
            "training_step": training_step,
            "train_dataloader": train_dataloader,
            "configure_optimizers": lambda self: optimizers,
        },
    )
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_steps=-1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer = pl.Trainer(**{**options, **trainer_kwargs})
    trainer.fit(module)
    if "run" not in result:
        raise Mismatch("the program did not run inside Trainer.fit")
    return result["run"], result["world"]


def assert_toggle_equivalent_in_trainer(
    spec: WorldSpec, flavour: str = NAMES[0], batches: int = 1, **trainer_kwargs: Any
) -> Run:
    """:func:`assert_toggle_equivalent` inside two real ``Trainer.fit`` runs (flat programs only);
    returns the shim's run (its snapshots carry ``global_step``)."""
    if spec.nested:
        raise ValueError("the manual sequence has no nesting rule: pass a flat program")
    shim, world = run_in_trainer(spec, ShimDriver(), flavour, batches=batches, **trainer_kwargs)
    check_calls(shim)
    if shim.nested:  # a block inside a statement toggle left open by an exception: checked by the model
        return shim
    manual, _ = run_in_trainer(spec, ManualDriver.for_flavour(flavour), flavour, batches=batches, **trainer_kwargs)
    check_calls(manual, "manual")
    compare_runs(shim, manual, world)
    return shim


def installed_flavours() -> list[str]:
    """The Lightning flavours to test: ``TOGGLESHIM_FLAVOUR`` (comma-separated) or every importable one."""
    import os

    wanted = [f.strip() for f in os.environ.get("TOGGLESHIM_FLAVOUR", "").split(",") if f.strip()]
    found = []
    for name in wanted or NAMES:
        try:
            importlib.import_module(name)
        except ImportError:
            if wanted:  # asked for explicitly: its absence is an error, not a skip
                raise
            continue
        found.append(name)
    return found


def assert_lightning_follows_model(spec: WorldSpec, flavour: str = NAMES[0]) -> None:
    """Lightning's *own* methods, driven by the manual sequence, against the model (flat programs).

    The regression guard for Lightning upgrades: the differential check cannot see a change that
    both worlds share, this one can.
    """
    if spec.nested:
        raise ValueError("the manual sequence has no nesting rule: pass a flat program")
    run = run_program(build_world(spec, flavour), spec.program, ManualDriver.for_flavour(flavour))
    check_calls(run, "manual")


# -- your own module ------------------------------------------------------------------------------


def user_world(module: Any, optimizers: Sequence[torch.optim.Optimizer],
               terms: Sequence[Callable[[], torch.Tensor]] | None = None) -> World:
    """A world from *your* module and optimizers (made fresh for each call, identically).

    ``terms`` are the loss pieces a program's ``Backward`` picks from (default: one per parameter,
    ``(p * p).sum()``, so a program touches random subsets). A module not attached to a Trainer gets
    a stand-in that exposes ``optimizers``.
    """
    params = list(module.parameters())
    strategy = None
    if getattr(module, "_trainer", None) is None:
        strategy = StandInStrategy()  # blocks with sync_grad=False are checked against it
        _stand_in_trainer(module, list(optimizers), strategy)
    world = World(module, params, list(optimizers),
                  list(terms) if terms is not None else [functools.partial(_loose_term, p) for p in params],
                  _optimizer_params(optimizers, params), strategy=strategy)
    if strategy is not None:
        strategy.raised = world.raised
    world.instrument()
    return world


def flavour_of(module: Any) -> str:
    """The Lightning flavour (``lightning.pytorch`` or ``pytorch_lightning``) whose ``LightningModule``
    ``module`` is an instance of."""
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule" and (flavour := of_module(cls.__module__)) is not None:
            return flavour.name
    raise TypeError(f"{type(module).__qualname__} is not a LightningModule of {' or '.join(NAMES)}")


def assert_program_equivalent(make_world: Callable[[], World], program: Sequence[object],
                              flavour: str | None = None) -> None:
    """Run ``program`` on two fresh worlds from ``make_world``: the shim against the model at every
    point, and (for flat programs) against Lightning's manual sequence, bitwise. ``flavour``: the
    Lightning whose methods are the manual sequence (default: the one the module subclasses)."""
    spec_nested = any(_nested_in_block(op, False) for op in program)
    shim_world = make_world()
    if flavour is None:
        flavour = flavour_of(shim_world.module)
    shim = run_program(shim_world, program, ShimDriver())
    check_calls(shim)
    if not spec_nested and not shim.nested:
        manual = run_program(make_world(), program, ManualDriver.for_flavour(flavour))
        check_calls(manual, "manual")
        compare_runs(shim, manual, shim_world)
