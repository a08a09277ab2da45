"""Robustness in long-lived processes: Ctrl-C at every line the package runs, failing
``requires_grad`` writes, interleaved block lifetimes, edited records, error messages that cannot
fail themselves, and nothing kept alive that Lightning would not keep (docs/guarantees.md).

Stand-in trainers here (fast, one toggle per assertion); real ``Trainer.fit`` runs at the end."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _fixtures import pl, state, three_heads
from _hostile import AtFirstLine, Interrupter, Refusing
from torch import nn

import toggleshim
from toggleshim import _block, _toggle


def original(flavour: str, name: str) -> Any:
    fn = vars(pl(flavour).LightningModule)[name]
    return getattr(fn, "_toggleshim_original", fn)


def open_toggles(module: Any) -> list[Any]:
    s = _toggle.state_if_any(module)
    return [] if s is None else list(s.stack)


# -- Ctrl-C at every line ----------------------------------------------------------------------


class SyncSpy:
    """A strategy whose ``block_backward_sync`` records whether gradient sync is blocked."""

    def __init__(self) -> None:
        self.blocked = 0

    def block_backward_sync(self) -> Any:
        spy = self

        class _Ctx:
            def __enter__(self) -> None:
                spy.blocked += 1

            def __exit__(self, *exc: object) -> None:
                spy.blocked -= 1

        return _Ctx()


def _flat(m: Any) -> None:
    with m.toggle_optimizer(m.opts[0]):
        pass


def _flat_no_sync(m: Any) -> None:
    with m.toggle_optimizer(m.opts[0], sync_grad=False):
        pass


def _nested(m: Any) -> None:
    with m.toggle_optimizer(m.opts[0], zero_grad=False), m.toggle_optimizer(m.opts[1]):
        pass


def _statement(m: Any) -> None:
    m.toggle_optimizer(m.opts[0])
    m.untoggle_optimizer(m.opts[0])


def _statement_in_block(m: Any) -> None:
    with m.toggle_optimizer(m.opts[0], step=False):
        m.toggle_optimizer(m.opts[1])
        m.untoggle_optimizer(m.opts[1])


def _exit_stack(m: Any) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(m.toggle_optimizer(m.opts[0], sync_grad=False))
        stack.enter_context(m.toggle_optimizer(m.opts[1]))


def _async_exit_stack(m: Any) -> None:
    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(m.toggle_optimizer(m.opts[0]))

    asyncio.run(main())


def _by_hand(m: Any) -> None:
    block = m.toggle_optimizer(m.opts[0], sync_grad=False)
    block.__enter__()
    block.__exit__(None, None, None)


def _own_untoggle_block(m: Any) -> None:
    with m.toggle_optimizer(m.opts[0]):  # the class overrides untoggle_optimizer (calls super)
        pass


def _own_toggle_block(m: Any) -> None:
    with toggleshim.toggle(m, m.opts[0]):  # the class's toggle_optimizer toggles by itself
        pass


def _forgotten_return_block(m: Any) -> None:
    with toggleshim.toggle(m, m.opts[0]):  # the class's toggle_optimizer calls super(), returns None
        pass


def _own_nested_blocks(m: Any) -> None:
    with m.toggle_optimizer(m.opts[0], zero_grad=False), m.toggle_optimizer(m.opts[1]):
        pass


# The user's own methods (tests/test_user_methods.py): the class overrides untoggle_optimizer, calling
# super() and counting its calls; and toggle_optimizer, for the scenarios named here: "own" toggles by
# itself (Lightning's own code, not super(): the block runs the module's own toggle and untoggle, and
# toggleshim calls the untoggle once, never twice), "none" calls super() and returns None (its
# toggle is the block all the same)
_USER_METHODS: dict[Callable[[Any], None], str | None] = {
    _own_untoggle_block: None,
    _own_nested_blocks: None,
    _own_toggle_block: "own",
    _forgotten_return_block: "none",
}


def _with_own_methods(m: Any, toggle: str | None, flavour: str) -> None:
    """``m``'s class becomes a subclass overriding ``untoggle_optimizer`` (``super()``, counted) and,
    unless ``toggle`` is None, ``toggle_optimizer``, as users write them."""
    base = type(m)
    lightning_toggle = original(flavour, "toggle_optimizer")

    def toggle_optimizer(self: Any, optimizer: Any) -> None:
        if toggle == "own":
            lightning_toggle(self, optimizer)
        else:
            super(cls, self).toggle_optimizer(optimizer)

    def untoggle_optimizer(self: Any, optimizer: Any) -> None:
        self.untoggles += 1
        super(cls, self).untoggle_optimizer(optimizer)

    body: dict[str, Any] = {"untoggle_optimizer": untoggle_optimizer}
    if toggle is not None:
        body["toggle_optimizer"] = toggle_optimizer
    cls = type("UserHeads", (base,), body)
    m.__class__ = cls
    m.untoggles = 0


SCENARIOS: dict[str, Callable[[Any], None]] = {
    "flat block": _flat,
    "flat block, sync_grad=False": _flat_no_sync,
    "nested blocks": _nested,
    "statement toggle": _statement,
    "statement toggle inside a block": _statement_in_block,
    "nested blocks in an ExitStack": _exit_stack,
    "a block in an AsyncExitStack": _async_exit_stack,
    "a block entered and left by hand": _by_hand,
    "a block, untoggle_optimizer overridden": _own_untoggle_block,
    "nested blocks, untoggle_optimizer overridden": _own_nested_blocks,
    "a block over the module's own toggle_optimizer": _own_toggle_block,
    "a block, toggle_optimizer returning None": _forgotten_return_block,
}
# An ExitStack calls the __exit__ it looked up on the class, and a block left by hand the __exit__ its
# caller looked up: interrupted at that function's first line (or in torch's wrapper around it), the
# block closes once its toggle object is let go of, which the interrupt's traceback delays (a reference
# cycle) until the next garbage collection at the latest (docs/guarantees.md)
_CLOSED_BY_THE_COLLECTOR = {_exit_stack, _async_exit_stack, _by_hand}


def _module(flavour: str, cached: bool, scenario: Callable[[Any], None]) -> tuple[Any, SyncSpy]:
    m = three_heads(flavour, n_opt=3, frozen=True, shared=True)
    spy = SyncSpy()
    m._trainer.strategy = spy
    if scenario in _USER_METHODS:
        _with_own_methods(m, _USER_METHODS[scenario], flavour)
    if cached:
        scenario(m)  # every plan the scenario needs is cached
        m.untoggles = 0
    return m, spy


@pytest.mark.parametrize("cached", [False, True], ids=["new plan", "cached plan"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_ctrl_c_at_every_line_leaves_nothing_behind(flavour: str, scenario: str, cached: bool) -> None:
    """``KeyboardInterrupt`` at each line the package runs: it propagates unchanged; ``requires_grad``
    is the user's state before, or (an interrupt before the block began: after the toggle, before
    ``__enter__``'s first line) what Lightning's manual sequence leaves when interrupted right after
    its toggle; nothing stays open on the module, gradient sync is resumed, the module is collectable,
    and the next block is a flat one."""
    run = SCENARIOS[scenario]
    run(_module(flavour, True, run)[0])  # what runs once a process (torch's step hook registered) is done
    m, _ = _module(flavour, cached, run)
    before = state(m)
    with Interrupter() as counter:
        run(m)
    assert state(m) == before and not open_toggles(m)
    lines = counter.lines
    assert lines > 20, lines  # the tracer sees the package
    twin = three_heads(flavour, n_opt=3, frozen=True, shared=True)
    original(flavour, "toggle_optimizer")(twin, twin.opts[0])
    toggled = state(twin)  # Lightning's manual sequence, interrupted right after its toggle

    outcomes: dict[str, int] = {}
    with _young_heap():
        for k in range(1, lines + 1):
            _interrupt_at(k, flavour, cached, run, before, toggled, outcomes)
    assert outcomes.get("before", 0) > lines // 2, outcomes


@contextlib.contextmanager
def _young_heap() -> Iterator[None]:
    """The objects alive now (torch, Lightning, the test session) out of the collector's sight: a
    ``gc.collect()`` then looks at what the test made since, in milliseconds instead of a third of a
    second, and finds the same cycles (none of them can pass through an object made before them)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _interrupt_at(k: int, flavour: str, cached: bool, run: Callable[[Any], None], before: Any, toggled: Any,
                  outcomes: dict[str, int]) -> None:
    """Interrupt ``run`` at the ``k``-th line the package runs, and check what it leaves."""
    m, spy = _module(flavour, cached, run)
    with Interrupter(k) as inter:
        try:
            run(m)
        except KeyboardInterrupt as caught:
            assert caught is inter.raised, (k, inter.where)
        else:
            raise AssertionError(f"line {k} ({inter.where}): the interrupt did not propagate")
    # the module's own untoggle_optimizer is user code: called once by a block's exit, never again
    assert m.__dict__.get("untoggles", 0) <= (2 if run is _own_nested_blocks else 1), (k, inter.where, m.untoggles)
    if run in _CLOSED_BY_THE_COLLECTOR:
        inter.raised = None
        gc.collect()
    after = state(m)
    assert after in (before, toggled), (k, inter.where, after)
    outcome = "before" if after == before else "toggled"
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert not open_toggles(m), (k, inter.where)
    assert spy.blocked == 0, (k, inter.where)
    if m.__dict__.get("_param_requires_grad_state"):  # as after Lightning's toggle: the user untoggles
        m.untoggle_optimizer(m.opts[0])
        assert state(m) == before, (k, inter.where)
    # the next block is a flat one, exactly Lightning's toggle
    with toggleshim.toggle(m, m.opts[1], zero_grad=False, step=False):
        stack = open_toggles(m)
        if _USER_METHODS.get(run) != "own":  # (the module's own toggle: none of toggleshim's)
            assert len(stack) == 1 and type(stack[0]) is _toggle._Flat, (k, inter.where)
        expected = three_heads(flavour, n_opt=3, frozen=True, shared=True)
        original(flavour, "toggle_optimizer")(expected, expected.opts[1])
        assert state(m) == state(expected), (k, inter.where)
    assert state(m) == before and not open_toggles(m)
    inter.raised = None
    ref = weakref.ref(m)
    del m
    if ref() is not None:  # freed by reference counting as a rule; a cycle needs the collector
        gc.collect()
    assert ref() is None, (k, inter.where)


def test_ctrl_c_before_exit_runs_closes_the_block(flavour: str) -> None:
    """An interrupt at the very first line of ``__exit__`` (no ``try`` of its own can catch it): the
    block is closed when the ``with`` statement lets go of its ``__exit__``."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    with m.toggle_optimizer(m.opts[0]):
        pass  # cached plan
    at_exit = AtFirstLine(inspect.unwrap(_block.Toggle._exit).__code__)
    with at_exit as inter, pytest.raises(KeyboardInterrupt) as caught, m.toggle_optimizer(m.opts[0]):
        assert state(m) != before
    assert caught.value is inter.raised
    assert state(m) == before and not open_toggles(m)


@pytest.mark.parametrize("way", ["ExitStack", "AsyncExitStack", "with"])
def test_ctrl_c_at_the_first_line_of_the_exit_closes_the_block_every_way_in(flavour: str, way: str) -> None:
    """``contextlib.ExitStack``/``AsyncExitStack.enter_context`` look ``__exit__`` up on the class; an
    interrupt at the first line of the exit they call (the class-level function, or ``_exit`` itself)
    leaves nothing open for good: the block closes when the exit the stack held is let go (with the
    interrupt, once handled: the stack's frame in its traceback holds it)."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    codes = {inspect.unwrap(_block.Toggle._exit).__code__, type(m.toggle_optimizer(m.opts[0])).__exit__.__code__}
    m.untoggle_optimizer(m.opts[0])

    async def in_async_stack() -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(m.toggle_optimizer(m.opts[0]))
            assert state(m) != before

    def interrupted() -> bool:
        with AtFirstLine(*codes) as inter:
            try:
                if way == "ExitStack":
                    with contextlib.ExitStack() as stack:
                        stack.enter_context(m.toggle_optimizer(m.opts[0]))
                        assert state(m) != before
                elif way == "AsyncExitStack":
                    asyncio.run(in_async_stack())
                else:
                    with m.toggle_optimizer(m.opts[0]):
                        assert state(m) != before
            except KeyboardInterrupt as caught:
                return caught is inter.raised
        return False

    assert interrupted()  # the very interrupt came out; handled, it is let go
    # The stack's frame, in the interrupt's traceback, held the exit it called: released with the
    # interrupt (its traceback is a reference cycle: a collection frees it)
    gc.collect()
    assert state(m) == before and not open_toggles(m)
    with m.toggle_optimizer(m.opts[1]):  # the next block is a flat one
        assert m._param_requires_grad_state
    assert state(m) == before


def test_a_class_level_exit_held_elsewhere_never_takes_the_with_statements_watch(flavour: str) -> None:
    """``Toggle.__exit__`` looked up on the class and kept (a debugger, ``pydoc``, ``inspect``) right
    before a with statement: the block still watches the exit the with statement holds, and closes
    when an interrupt at that exit's first line makes the with statement let go of it."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    with AtFirstLine(inspect.unwrap(_block.Toggle._exit).__code__) as inter:
        held = _block.Toggle.__exit__  # (after the tracer's __enter__, which forgets any lookup)
        with pytest.raises(KeyboardInterrupt) as caught, m.toggle_optimizer(m.opts[0]):
            assert state(m) != before
    assert caught.value is inter.raised
    assert state(m) == before and not open_toggles(m)
    del held


def test_a_class_level_exit_let_go_before_a_block_entered_by_hand_is_harmless(flavour: str) -> None:
    """A lookup of ``Toggle.__exit__`` on the class, let go at once (``pydoc``, ``inspect``), then a
    block entered and left by hand: nothing watches an exit that no longer exists."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    _block.Toggle.__exit__  # noqa: B018 (looked up and let go)
    block = m.toggle_optimizer(m.opts[0])
    block.__enter__()
    assert state(m) != before and open_toggles(m)
    block.__exit__(None, None, None)
    assert state(m) == before and not open_toggles(m)


@pytest.mark.parametrize("other", ["looked up in another thread", "entered in another thread"])
def test_a_class_level_exit_looked_up_in_one_thread_is_never_a_block_of_another_threads(
    flavour: str, other: str
) -> None:
    """``Toggle.__exit__`` looked up on the class in one thread (an ``ExitStack`` about to enter
    there) and a block entered by hand in another: the block does not take that exit as its own, so
    letting go of it does not close the block while it is open. Both ways round: one thread's id is
    the larger."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    held: list[Any] = []
    block = m.toggle_optimizer(m.opts[0])

    def look_up() -> None:
        held.append(_block.Toggle.__exit__)

    def in_thread(fn: Callable[[], Any]) -> None:
        t = threading.Thread(target=fn)
        t.start()
        t.join()

    if other == "looked up in another thread":
        in_thread(look_up)
        block.__enter__()
    else:
        look_up()
        in_thread(block.__enter__)
    assert state(m) != before
    held.clear()  # that thread's exit let go: this block is still open
    assert state(m) != before and open_toggles(m), "the block closed when another thread's exit was let go"
    block.__exit__(None, None, None)
    assert state(m) == before and not open_toggles(m)


def test_a_stray_untoggle_after_a_block_leaves_the_closed_block_closed(flavour: str) -> None:
    """``untoggle_optimizer`` called as a statement after a block over the same optimizer (nothing
    open: Lightning's untoggle restores nothing): the block's object stays closed, and entering it
    again says it was used, not that an untoggle undid it before its block started."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    block = m.toggle_optimizer(m.opts[0])
    with block:
        pass
    m.untoggle_optimizer(m.opts[0])
    assert state(m) == before and "closed" in repr(block), repr(block)
    with pytest.raises(RuntimeError, match="already used"):
        block.__enter__()
    assert state(m) == before and not open_toggles(m)


def test_explicit_enter_and_exit_calls_keep_the_guarantees_with_a_retry(flavour: str) -> None:
    """Called by hand, ``__exit__`` interrupted at its first line leaves the block open, and calling
    ``__exit__`` again closes it (docs/guarantees.md: the exact scope)."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)
    block = m.toggle_optimizer(m.opts[0])
    block.__enter__()
    exit_method = block.__exit__
    with AtFirstLine(inspect.unwrap(_block.Toggle._exit).__code__), pytest.raises(KeyboardInterrupt):
        exit_method(None, None, None)
    assert open_toggles(m)  # still open: the caller holds the exit it called
    block.__exit__(None, None, None)
    assert state(m) == before and not open_toggles(m)


# -- nothing process-wide --------------------------------------------------------------------------

_GLOBALS_SCRIPT = textwrap.dedent(
    """
    import copyreg, gc, sys, threading
    import torch
    from torch.optim import optimizer
    import {flavour}
    from multiprocessing.reduction import ForkingPickler
    sys.path.insert(0, {tests!r})

    def seen():
        return (list(gc.callbacks), dict(optimizer._global_optimizer_pre_hooks),
                dict(optimizer._global_optimizer_post_hooks), list(sys.path_hooks), sys.gettrace(),
                sys.getprofile(), threading.gettrace(), threading.getprofile(), dict(copyreg.dispatch_table),
                sys.excepthook, sys.unraisablehook)

    before, finders, reducers = seen(), list(sys.meta_path), dict(ForkingPickler._extra_reducers)
    import toggleshim
    from _fixtures import three_heads
    m = three_heads({flavour!r}, n_opt=3)
    with m.toggle_optimizer(m.opts[0]), m.toggle_optimizer(m.opts[1]):
        m.toggle_optimizer(m.opts[2])
        m.untoggle_optimizer(m.opts[2])
    print(seen() == before)
    hooks = [f for f in sys.meta_path if type(f).__module__.startswith("toggleshim")]
    print(len(hooks), [f for f in sys.meta_path if f not in hooks] == finders)
    added = {{cls for cls in ForkingPickler._extra_reducers if cls not in reducers}}
    print(added == {{sys.modules[{flavour!r} + ".trainer.trainer"].Trainer}})
    toggleshim.uninstall()
    print(seen() == before, list(sys.meta_path) == finders, type(sys.meta_path) is list,
          dict(ForkingPickler._extra_reducers) == reducers)
    """
)


@pytest.mark.one_flavour_by_default
def test_toggleshim_adds_nothing_process_wide_but_its_import_hook(flavour: str) -> None:
    """In a fresh process, ``import toggleshim`` and nested blocks leave every process-wide registry
    as it was (gc callbacks, torch's global optimizer hooks, path hooks, tracers, pickling tables, the
    exception hooks), but for its import hook in ``sys.meta_path`` and the reduction that hands each
    Trainer to spawned ranks; ``uninstall()`` takes those back too."""
    script = _GLOBALS_SCRIPT.format(tests=str(Path(__file__).parent), flavour=flavour)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    expected = ["True", "1", "True", "True", "True", "True", "True", "True"]
    assert r.stdout.split() == expected, r.stdout + r.stderr[-2000:]


def test_the_package_registers_no_process_wide_hook_but_these() -> None:
    """No audit hook (it cannot be removed, and CPython calls it at every ``id()``), no gc callback,
    no global optimizer hook, tracer, signal or exception hook anywhere in the package's source: the
    only process-wide registrations are the import hook (``_patch``) and the spawn reduction
    (``_spawn``), docs/architecture.md."""
    import ast

    calls = {"addaudithook", "settrace", "setprofile", "register_optimizer_step_pre_hook",
             "register_optimizer_step_post_hook", "signal", "pickle", "register"}
    registries = {"callbacks", "meta_path", "path_hooks", "excepthook", "unraisablehook", "displayhook"}
    by_name = calls - {"register"}  # (a name `register` is the block's own step watch, per optimizer)
    allowed = {("_patch.py", "meta_path"), ("_spawn.py", "register")}
    package = Path(toggleshim.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                func = node.func
                if func.attr in calls and ast.unparse(func.value) not in ("_spawn",):
                    name = func.attr
                elif func.attr in ("append", "insert", "extend") and isinstance(func.value, ast.Attribute):
                    name = func.value.attr if func.value.attr in registries else None
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in by_name:
                name = node.func.id  # imported by name
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                name = next((t.attr for t in targets if isinstance(t, ast.Attribute) and t.attr in registries), None)
            if name is not None and (path.name, name) not in allowed:
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []


# -- failing writes: all or nothing --------------------------------------------------------------


def six(flavour: str) -> Any:
    """Six parameters p0..p5, three optimizers of two each; p2..p5 refuse on demand."""

    class Six(pl(flavour).LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.ps = nn.ParameterList(
                [nn.Parameter(torch.ones(1)) for _ in range(2)] + [Refusing(torch.ones(1)) for _ in range(4)]
            )

    m = Six()
    ps = list(m.ps)
    m.opts = [torch.optim.SGD(ps[i : i + 2], lr=0.1) for i in (0, 2, 4)]
    m._trainer = SimpleNamespace(optimizers=m.opts, strategy=SimpleNamespace())
    return m


def rg(m: Any) -> list[int]:
    return [int(p.requires_grad) for p in m.ps]


def test_a_toggle_that_cannot_freeze_changes_nothing(flavour: str) -> None:
    m = six(flavour)
    m.ps[3].refuse = False  # the fourth parameter cannot be frozen
    record = m.__dict__.get("_param_requires_grad_state")
    Refusing.errors.clear()
    with pytest.raises(RuntimeError, match="refused") as caught:
        m.toggle_optimizer(m.opts[0])
    assert caught.value is Refusing.errors[0]
    assert rg(m) == [1, 1, 1, 1, 1, 1] and m._param_requires_grad_state is record and not open_toggles(m)
    # Lightning's own toggle leaves the parameters before it frozen, with no record to undo them.
    lightning = six(flavour)
    lightning.ps[3].refuse = False
    with pytest.raises(RuntimeError, match="refused"):
        original(flavour, "toggle_optimizer")(lightning, lightning.opts[0])
    assert rg(lightning) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(RuntimeError, match="refused"), m.toggle_optimizer(m.opts[0]):  # the block too
        raise AssertionError("the body must not run")
    assert rg(m) == [1, 1, 1, 1, 1, 1] and not open_toggles(m)


def test_an_exit_that_cannot_restore_one_parameter_restores_the_others(flavour: str) -> None:
    m = six(flavour)
    Refusing.errors.clear()
    with (
        pytest.raises(RuntimeError, match="refused requires_grad=True") as caught,
        m.toggle_optimizer(m.opts[0], zero_grad=False, step=False),
    ):
        assert rg(m) == [1, 1, 0, 0, 0, 0]
        m.ps[2].refuse = True  # the first parameter the exit restores refuses
    assert caught.value is Refusing.errors[0]
    assert rg(m) == [1, 1, 0, 1, 1, 1] and not open_toggles(m)
    m.ps[2].refuse = None
    with m.toggle_optimizer(m.opts[1], zero_grad=False, step=False):  # usable again, flat
        assert len(open_toggles(m)) == 1 and rg(m) == [0, 0, 0, 1, 0, 0]


class _InterruptsOnce(Refusing):
    """Ctrl-C lands while this parameter's ``requires_grad`` is being set to ``refuse``, once."""

    def refusal(self, value: bool) -> BaseException:
        self.refuse = None
        return KeyboardInterrupt(f"at requires_grad={value}")


def test_a_second_ctrl_c_in_the_rollback_of_a_toggle_still_rolls_everything_back(flavour: str) -> None:
    """Ctrl-C at the toggle's third freeze, and again while its rollback writes the first parameter
    back: the rollback is run once more, so every parameter is back, the record too, and the second
    interrupt propagates (the first is its context)."""
    m = six(flavour)
    p2, p4 = m.ps[2], m.ps[4]
    p2.__class__ = p4.__class__ = _InterruptsOnce
    p4.refuse, p2.refuse = False, True  # the toggle of optimizer 0 freezes p2..p5, in this order
    record = m.__dict__.get("_param_requires_grad_state")
    Refusing.errors.clear()
    with pytest.raises(KeyboardInterrupt) as caught:
        m.toggle_optimizer(m.opts[0])
    first, second = Refusing.errors
    assert caught.value is second and second.__context__ is first, (caught.value, Refusing.errors)
    assert rg(m) == [1, 1, 1, 1, 1, 1], "the rollback stopped at the second interrupt"
    assert m.__dict__.get("_param_requires_grad_state") is record and not open_toggles(m)


def test_the_first_refusal_propagates_when_the_rollback_is_refused_too(flavour: str) -> None:
    """The fourth parameter, frozen by the user, refuses False: the toggle's freeze is refused, then
    the rollback's write of its value (False) is refused again; the first refusal propagates."""
    m = six(flavour)
    m.ps[3].requires_grad = False
    m.ps[3].refuse = False
    Refusing.errors.clear()
    with pytest.raises(RuntimeError, match="refused") as caught:
        m.toggle_optimizer(m.opts[0])
    assert len(Refusing.errors) >= 2 and caught.value is Refusing.errors[0]
    assert rg(m) == [1, 1, 1, 0, 1, 1] and not open_toggles(m)


@pytest.mark.parametrize("where", ["body", "step"])
def test_a_failing_exit_never_replaces_the_exception_in_flight(flavour: str, where: str) -> None:
    """The body (or step) raises; then the exit cannot restore one parameter. The body's exception
    comes out, the same object; every other parameter is restored; nothing stays open."""
    m = six(flavour)
    err = ValueError("the body's own")
    if where == "step":

        def failing_step(*args: Any, **kwargs: Any) -> None:
            raise err

        m.opts[0].step = failing_step
    Refusing.errors.clear()
    with pytest.raises(ValueError) as caught, m.toggle_optimizer(m.opts[0], zero_grad=False):
        m.ps[2].refuse = True  # the first parameter the exit restores refuses
        if where == "body":
            raise err
    assert caught.value is err and Refusing.errors  # the exit's refusal happened, and was dropped
    assert rg(m) == [1, 1, 0, 1, 1, 1] and not open_toggles(m)


def test_an_interrupt_during_the_exit_propagates_ahead_of_the_body_error(flavour: str) -> None:
    """Ctrl-C while the exit restores parameters (after the body raised): never dropped; the exit
    still makes every other write."""
    m = six(flavour)

    class Interrupting(Refusing):
        def refusal(self, value: bool) -> BaseException:
            self.refuse = None  # one Ctrl-C
            return KeyboardInterrupt()

    err = ValueError("the body's own")
    with pytest.raises(KeyboardInterrupt), m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
        m.ps[2].__class__ = Interrupting
        m.ps[2].refuse = True
        m.ps[4].refuse = True  # and a refusal after it: the interrupt still wins
        raise err
    assert rg(m) == [1, 1, 1, 1, 0, 1] and not open_toggles(m)  # p2 restored by the retry


def test_a_nested_toggle_that_cannot_freeze_leaves_the_outer_block_intact(flavour: str) -> None:
    """Nested over A inside C, C's second parameter refusing to be frozen: the nested toggle changes
    nothing; after the outermost block the user's state is back."""
    m = six(flavour)
    with m.toggle_optimizer(m.opts[2], zero_grad=False, step=False):
        inside = rg(m)
        m.ps[5].refuse = False
        with pytest.raises(RuntimeError, match="refused"):
            m.toggle_optimizer(m.opts[0])
        assert rg(m) == inside == [0, 0, 0, 0, 1, 1] and len(open_toggles(m)) == 1
    assert rg(m) == [1, 1, 1, 1, 1, 1] and not open_toggles(m)


# -- interleaved lifetimes ---------------------------------------------------------------------


def test_a_block_outlived_by_its_nested_block_never_replaces_the_exception(flavour: str) -> None:
    """A generator holds a block over A; its caller opens a block over B; the generator ends first
    (unwinding B). B's exit must let B's exception through unchanged, and step on a clean exit."""
    m = three_heads(flavour, n_opt=3)
    before = state(m)

    def holder() -> Iterator[None]:
        with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
            yield

    steps: list[int] = []
    m.opts[1].step = lambda *a, **k: steps.append(1)  # type: ignore[method-assign]
    for fail in (True, False):
        gen = holder()
        next(gen)
        error = ValueError("from the body")
        expect = pytest.raises(ValueError) if fail else _nothing()
        with expect as caught, m.toggle_optimizer(m.opts[1], zero_grad=False):
            next(gen, None)  # the generator's block ends first
            assert state(m) == before
            if fail:
                raise error
        if fail:
            assert caught.value is error
        assert state(m) == before and not open_toggles(m)
    assert steps == [1]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- records edited inside a block: as Lightning's untoggle reads them -----------------------------


class _FakeDict(dict):  # type: ignore[type-arg]
    """Reports ``dict`` as its class and inverts what it holds."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        return dict

    def __getitem__(self, key: Any) -> Any:
        return not super().__getitem__(key)


class _Impostor:
    """A key with a parameter's hash whose ``__eq__`` has a side effect (and answers True)."""

    def __init__(self, param: Any, calls: list[int]) -> None:
        self.param, self.calls = param, calls

    def __hash__(self) -> int:
        return hash(self.param)

    def __eq__(self, other: object) -> bool:
        self.calls.append(1)
        return True


def _edit_fake(m: Any) -> None:
    m._param_requires_grad_state = _FakeDict(m._param_requires_grad_state)


def _edit_impostor(m: Any) -> None:
    record = m._param_requires_grad_state
    victim = next(iter(m.opts[2].param_groups[0]["params"]))
    value = record.pop(victim)
    m.calls = []
    record[_Impostor(victim, m.calls)] = not value


def _edit_delete(m: Any) -> None:
    del m._param_requires_grad_state


@pytest.mark.parametrize(
    "edit",
    [_edit_fake, _edit_impostor, _edit_delete],
    ids=["dict subclass faking __class__", "key with __eq__", "deleted"],
)
def test_edited_record_exit_is_lightnings_untoggle(flavour: str, edit: Callable[[Any], None]) -> None:
    results = []
    for shim in (True, False):
        m = three_heads(flavour, n_opt=3, frozen=True)
        if shim:
            with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
                pass  # a cached plan: the fast exit is what is under test
        error: BaseException | None = None
        try:
            if shim:
                with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
                    edit(m)
            else:
                original(flavour, "toggle_optimizer")(m, m.opts[0])
                edit(m)
                original(flavour, "untoggle_optimizer")(m, m.opts[0])
        except Exception as e:
            error = e
        results.append((state(m), type(error), str(error), len(getattr(m, "calls", []))))
        assert not open_toggles(m)
    assert results[0] == results[1]
    assert results[0][0] != state(three_heads(flavour, n_opt=3, frozen=True)) or results[0][1] is not None


# -- bad input: messages that cannot fail ------------------------------------------------------------


class _BadRepr:
    param_groups = None

    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")


@pytest.mark.parametrize(
    "bad",
    [_BadRepr(), SimpleNamespace(param_groups=[{"params": [1, 2]}]), SimpleNamespace(param_groups=[{"params": ["w"]}])],
    ids=["raising repr", "ints", "strings"],
)
def test_bad_optimizer_messages_never_fail(flavour: str, bad: Any) -> None:
    m = three_heads(flavour)
    before = state(m)
    with pytest.raises(TypeError, match=r"expects an optimizer|where a parameter"):
        m.toggle_optimizer(bad)
    assert state(m) == before and not open_toggles(m)


def test_a_stranger_is_described_when_the_module_cannot_name_its_parameters(flavour: str) -> None:
    """The name in the message is a courtesy: a module whose ``named_parameters`` fails still gets the
    clear ValueError (the stranger described by its shape), and nothing changes."""
    m = three_heads(flavour)
    stranger = torch.optim.SGD([torch.nn.Parameter(torch.ones(3, 5))], lr=0.1)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a module that cannot list its parameters")

    m.named_parameters = broken
    before = {n: p.requires_grad for n, p in type(m).named_parameters(m)}
    with pytest.raises(ValueError, match=r"an unnamed parameter of shape \(3, 5\)"):
        m.toggle_optimizer(stranger)
    assert {n: p.requires_grad for n, p in type(m).named_parameters(m)} == before


def test_a_trainer_optimizer_holding_a_non_tensor_is_named(flavour: str) -> None:
    m = three_heads(flavour)
    m.opts[1].param_groups[0]["params"].append(7)
    before = state(m)
    with pytest.raises(TypeError, match=r"builtins\.int \(7\) where a parameter"):
        m.toggle_optimizer(m.opts[0])
    assert state(m) == before


@pytest.mark.parametrize(
    "value",
    [2, -1, 0, 1, None, "yes", 1.0, pytest.param("numpy", id="numpy.True_"), pytest.param("tensor", id="tensor(True)")],
)
def test_flags_are_exactly_true_or_false(flavour: str, value: Any) -> None:
    """One rule: each flag is the bool ``True`` or ``False``; anything else (``1``, ``numpy.True_``,
    ``torch.tensor(True)``) is a TypeError naming the flag, before anything changes."""
    if value == "numpy":
        np = pytest.importorskip("numpy")
        value = np.True_
    elif value == "tensor":
        value = torch.tensor(True)
    m = three_heads(flavour)
    before = state(m)
    for flag in ("zero_grad", "step", "sync_grad"):
        with pytest.raises(TypeError, match=rf"{flag} must be True or False \(a bool\)"):
            m.toggle_optimizer(m.opts[0], **{flag: value})
        assert state(m) == before and not open_toggles(m)
    with m.toggle_optimizer(m.opts[0], zero_grad=False, step=True, sync_grad=True):
        pass


def test_reloading_the_private_module_keeps_lightning_optimizers_unwrapped() -> None:
    """``importlib.reload(toggleshim._toggle)`` (in a fresh process): a ``LightningOptimizer`` is still
    toggled as Lightning toggles it (its inner optimizer is the toggled one)."""
    code = textwrap.dedent(
        """
        import importlib, torch
        from types import SimpleNamespace
        import lightning.pytorch as pl
        from lightning.pytorch.core.optimizer import LightningOptimizer
        import toggleshim, toggleshim._toggle
        importlib.reload(toggleshim._toggle)
        m = pl.LightningModule()
        m.a, m.b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
        opts = [torch.optim.SGD(m.a.parameters(), lr=1), torch.optim.SGD(m.b.parameters(), lr=1)]
        m._trainer = SimpleNamespace(optimizers=opts, strategy=SimpleNamespace())
        wrapped = LightningOptimizer(opts[0])
        with m.toggle_optimizer(wrapped, zero_grad=False, step=False):
            inside = [p.requires_grad for p in m.parameters()]
        m.toggle_optimizer(wrapped)
        m.untoggle_optimizer(wrapped)
        print(inside, [p.requires_grad for p in m.parameters()])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[True, True, False, False] [True, True, True, True]"


def test_reloading_the_patch_module_keeps_one_import_hook_and_every_other_finder() -> None:
    """``importlib.reload(toggleshim._patch)``, twice (in a fresh process): ``sys.meta_path`` holds
    exactly one import hook of toggleshim's, where it was (behind the finder inserted in front of it
    later), and every finder of anyone else, in order; the flavour imported afterwards is patched."""
    code = textwrap.dedent(
        """
        import importlib, sys
        import toggleshim, toggleshim._patch

        class Theirs:
            def find_spec(self, fullname, path, target=None):
                return None

        sys.meta_path.insert(0, Theirs())
        others = [f for f in sys.meta_path if type(f).__name__ != "_ImportHook"]
        for _ in range(2):
            importlib.reload(toggleshim._patch)
            toggleshim._patch.install()
        ours = [f for f in sys.meta_path if type(f).__name__ == "_ImportHook"]
        print(len(ours), sys.meta_path[1] is ours[0], [f for f in sys.meta_path if f not in ours] == others)
        import lightning.pytorch
        print(toggleshim.is_installed())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "True", "True", "True"]


# -- nothing kept alive that Lightning would not -----------------------------------------------------


def _lightning_optimizer(flavour: str) -> type:
    return __import__(f"{flavour}.core.optimizer", fromlist=["LightningOptimizer"]).LightningOptimizer  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["block", "statement"])
def test_no_class_is_kept_per_lightning_optimizer(flavour: str, how: str) -> None:
    """Lightning makes a class for every ``LightningOptimizer``: none may outlive its wrapper."""
    m = three_heads(flavour, n_opt=2)
    wrapper_cls = _lightning_optimizer(flavour)
    classes = []
    for _ in range(300):
        w = wrapper_cls(m.opts[0])
        if how == "block":
            with m.toggle_optimizer(w, zero_grad=False, step=False):
                pass
        else:
            m.toggle_optimizer(w)
            m.untoggle_optimizer(w)
        classes.append(weakref.ref(type(w)))
        del w
    gc.collect()
    assert sum(c() is not None for c in classes) == 0


def test_an_optimizer_appended_to_trainer_optimizers_is_seen(flavour: str) -> None:
    """The cached layout is a prefix of the new one (an optimizer appended): the next toggle must
    plan anew and freeze the new optimizer's parameters too, as Lightning's toggle does."""
    m = three_heads(flavour, n_opt=2)
    with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
        assert all(p.requires_grad for p in m.c.parameters())  # in no optimizer yet: untouched
    m._trainer.optimizers.append(torch.optim.SGD(m.c.parameters(), lr=0.1))
    with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
        assert not any(p.requires_grad for p in m.c.parameters())
        assert all(p.requires_grad for p in m.a.parameters())
    assert all(p.requires_grad for p in m.parameters())


def test_replaced_parameters_are_freed(flavour: str) -> None:
    """Model surgery: a head replaced again and again (new optimizers, or its parameters swapped inside
    a living optimizer). The old heads and optimizers die as they do without toggleshim: at once when
    the optimizers are re-created and the next toggle runs, else at the next full collection."""
    m = three_heads(flavour, n_opt=3)
    old: list[weakref.ref[Any]] = []
    for round_ in range(6):
        old += [weakref.ref(p) for p in m.c.parameters()]
        m.c = nn.Linear(2, 2)
        if round_ % 2:
            m.opts[2].param_groups[0]["params"] = list(m.c.parameters())  # in place
        else:
            old.append(weakref.ref(m.opts[2]))  # the replaced optimizer dies too
            m.opts = [*m.opts[:2], torch.optim.SGD(m.c.parameters(), lr=0.1)]
            m._trainer.optimizers = m.opts
        for k in range(3):
            with m.toggle_optimizer(m.opts[k], zero_grad=False, step=False):
                pass
        m.toggle_optimizer(m.opts[1])
        m.untoggle_optimizer(m.opts[1])
    gc.collect()
    assert [r() for r in old if r() is not None] == []
    # swapped in place after the last toggle: freed at once, as without toggleshim (no collection)
    last = [weakref.ref(p) for p in m.c.parameters()]
    m.c = nn.Linear(2, 2)
    m.opts[2].param_groups[0]["params"] = list(m.c.parameters())
    assert all(r() is None for r in last)
    # the next toggle plans anew (the cache was dropped with them) and freezes the new head
    with m.toggle_optimizer(m.opts[0], zero_grad=False, step=False):
        assert not any(p.requires_grad for p in m.c.parameters())
    # parameters in a reference cycle (a hook, an attribute holding the tensor): freed by the very
    # collection that frees them without toggleshim
    for k in range(3):
        with m.toggle_optimizer(m.opts[k], zero_grad=False, step=False):
            pass
    cyclic = [weakref.ref(p) for p in m.c.parameters()]
    for p in m.c.parameters():
        p.cycle = p  # type: ignore[attr-defined]
    m.c = nn.Linear(2, 2)
    m.opts[2].param_groups[0]["params"] = list(m.c.parameters())
    del p
    gc.collect()
    assert all(r() is None for r in cyclic)


def test_nothing_outlives_the_module_and_its_optimizers(flavour: str) -> None:
    m = three_heads(flavour, n_opt=3, shared=True)
    wrapper = _lightning_optimizer(flavour)(m.opts[1])
    with m.toggle_optimizer(m.opts[0]), m.toggle_optimizer(wrapper, zero_grad=False, step=False):
        m.toggle_optimizer(m.opts[2])
    m.toggle_optimizer(m.opts[2])
    m.untoggle_optimizer(m.opts[2])
    refs = [weakref.ref(x) for x in (m, *m.opts, type(wrapper), *m.parameters())]
    del m, wrapper
    gc.collect()
    assert [r() for r in refs if r() is not None] == []


def test_long_lived_process_holds_a_bounded_state(flavour: str) -> None:
    """Many modules and optimizers come and go (a sweep, a notebook): toggleshim's own tables end empty."""
    gc.collect()
    states = len(_toggle._STATES)
    for _ in range(50):
        m = three_heads(flavour, n_opt=3)
        for k in (0, 1, 2, 0):
            with m.toggle_optimizer(m.opts[k], zero_grad=False, step=False):
                pass
        del m
    gc.collect()
    assert len(_toggle._STATES) == states
