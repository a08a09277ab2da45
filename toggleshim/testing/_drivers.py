"""The drivers: one program run through toggleshim's block, or through Lightning's manual sequence.

:class:`ShimDriver` writes each block as users write it (``with module.toggle_optimizer(...)``, or
``toggleshim.toggle`` / ``Toggle``, by ``with``, ``ExitStack`` or by hand) and checks what its repr says;
:class:`ManualDriver` writes the same block out with Lightning's original methods (``toggle;
zero_grad; body; step`` with ``untoggle`` in ``finally``), or with the module's own where its class
overrides them. Re-exported by :mod:`toggleshim.testing.harness`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

from toggleshim._block import Toggle, toggle
from toggleshim._flavours import NAMES
from toggleshim._ours import MODE, original_of
from toggleshim.testing import model as _model
from toggleshim.testing._worlds import Mismatch, World, _flavour_module
from toggleshim.testing.specs import BadFlag, Block, Overrides


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
            elif op.way == "by hand":
                toggled.__enter__()
                try:
                    inside()
                except BaseException as e:
                    toggled.__exit__(type(e), e, e.__traceback__)  # (never swallows: returns False)
                    raise
                toggled.__exit__(None, None, None)
            else:
                with toggled:
                    inside()
        except BaseException:
            # Closed as the exception leaves the with statement; not yet with ExitStack's own exit (or
            # the exit called by hand) interrupted at its first line: the stack's frame (this one), in
            # the traceback, holds the block until the exception is let go of (docs/guarantees.md,
            # "Every way into a block")
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


def _inner(opt: Any) -> Any:
    return getattr(opt, "_optimizer", opt)


def _effective(op: Block, overrides: Overrides | None) -> Block:
    """``op`` with the flags its block runs with (``model.block_flags``): those it passes, or those the
    user's ``toggle_optimizer`` passes to ``super()``."""
    flags = _model.block_flags(op.passed(), op.entry, overrides)
    return dataclasses.replace(op, flags=tuple(flags.items()))
