"""Worlds: a module, its optimizers and a trainer, built from specs (or from the user's own module).

The harness's bottom layer (:mod:`toggleshim.testing.harness` re-exports its public names): the
graph module and the user's overriding subclass of it, the optimizers, the stand-in trainer and
strategy, :class:`World` with its instrumented optimizers, and the errors the harness speaks in
(:class:`InjectedFault`, raised by a program on purpose; :class:`Mismatch`, the harness's verdict).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import os
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from toggleshim._flavours import NAMES, of_module
from toggleshim._ours import original_of
from toggleshim.testing.specs import GraphSpec, OptimizerSpec, Overrides, WorldSpec


class InjectedFault(Exception):
    """The error a program raises on purpose (its identity is checked when it comes out)."""


class Mismatch(AssertionError):
    """Two worlds, or a world and the model, disagree; the message says where and what (a long list
    of differences as a count and a few: ``details`` holds every one)."""

    def __init__(self, message: str = "", details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


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
    ~3.5 ms a layer, a copy ~0.15 ms: docs/dev/harness.md). Every value is overwritten from the seed."""
    template = _TEMPLATES.get(spec)
    if template is None:
        template = _TEMPLATES[spec] = _new_layer(spec)
    return copy.deepcopy(template)


_LAYERNORM_TAKES_BIAS = "bias" in inspect.signature(nn.LayerNorm.__init__).parameters  # from torch 2.1


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
        if _LAYERNORM_TAKES_BIAS:
            return cast(nn.Module, skip(nn.LayerNorm, d[0], bias=spec.bias))  # type: ignore[no-untyped-call]
        layer = cast(nn.Module, skip(nn.LayerNorm, d[0]))  # type: ignore[no-untyped-call]
        if not spec.bias:  # torch 2.0: what LayerNorm(bias=False) is from torch 2.1 on
            layer.register_parameter("bias", None)
        return layer
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


def _built() -> None:
    """One more world built in this process (:data:`WORLDS_BUILT`)."""
    global WORLDS_BUILT
    WORLDS_BUILT += 1


def build_world(spec: WorldSpec, flavour: str = NAMES[0]) -> World:
    """A world on a stand-in trainer (what most properties use; ``run_in_trainer`` for the real one)."""
    _built()
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


def _names(world: World) -> list[str]:
    by_id = {id(p): n for n, p in world.module.named_parameters()}
    return [by_id.get(id(p), f"#{i}") for i, p in enumerate(world.params)]


# -- your own module --------------------------------------------------------------------------


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


def installed_flavours() -> list[str]:
    """The Lightning flavours to test: ``TOGGLESHIM_FLAVOUR`` (comma-separated) or every importable one."""
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
