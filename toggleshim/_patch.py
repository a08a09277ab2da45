"""Where the patch is made: ``LightningModule.toggle_optimizer`` / ``untoggle_optimizer`` on every flavour.

Rules (see STYLE.md): read and write the raw class ``__dict__``; recognise Lightning's own function
before replacing it (never wrap somebody else's wrapper); mark the replacement with a sentinel that
points at the exact original, so ``install()`` is idempotent and ``uninstall()`` restores the very same
object, also after ``importlib.reload(toggleshim)``.
"""

import importlib
import importlib.abc
import inspect
import os
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from toggleshim import _toggle
from toggleshim._toggle import Toggle, _keep_dynamo_out, _open_statement_toggle

__all__ = ["ToggleshimWarning", "install", "is_installed", "uninstall"]

#: Lightning releases the shim knows: >= 2.0 (the toggle semantics it reimplements) and below the
#: first release the CI matrix has not seen. Keep in step with ``noxfile.py`` and the workflow.
SUPPORTED = ((2, 0), (2, 7))
_ALLOW_UNTESTED_ENV = "TOGGLESHIM_ALLOW_UNTESTED"
_SENTINEL = "_toggleshim_original"
_PATCHED = ("toggle_optimizer", "untoggle_optimizer")


class ToggleshimWarning(UserWarning):
    """``install()`` left a Lightning flavour untouched (and why)."""


@dataclass(frozen=True)
class _Flavour:
    name: str  # import name: "lightning.pytorch" or "pytorch_lightning"
    distribution: str
    module_cls: type
    optimizer_cls: type

    @property
    def version(self) -> str:
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:  # pragma: no cover - vendored copies
            return str(getattr(importlib.import_module(self.name), "__version__", "0"))


_FLAVOURS = (("lightning.pytorch", "lightning"), ("pytorch_lightning", "pytorch-lightning"))


def _loaded(name: str, dist: str) -> _Flavour | None:
    """The flavour ``name`` once its ``core.module`` has run, else None. Never imports anything.

    Importing a flavour the user did not import is not harmless: ``lightning.pytorch`` and
    ``pytorch_lightning`` each rebind ``lightning_utilities.core.rank_zero.log`` (and the fabric
    ``rank_zero_deprecation_category``) to their own when imported, so the last one imported decides
    which logger Lightning's ``rank_zero_info`` messages go to and which ``LightningDeprecationWarning``
    class its deprecations raise.
    """
    module_cls = getattr(sys.modules.get(f"{name}.core.module"), "LightningModule", None)
    optimizer_cls = getattr(sys.modules.get(f"{name}.core.optimizer"), "LightningOptimizer", None)
    if module_cls is None or optimizer_cls is None:
        return None
    return _Flavour(name, dist, module_cls, optimizer_cls)


def _flavours() -> list[_Flavour]:
    """Every Lightning flavour already imported (the others are patched by the import hook)."""
    return [f for f in (_loaded(name, dist) for name, dist in _FLAVOURS) if f is not None]


_HOOKED = frozenset(f"{name}.core.module" for name, _ in _FLAVOURS)
_hook_allow_untested: list[bool | None] = [None]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then ``install()``: the flavour is patched the moment it exists."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        install(_hook_allow_untested[0])


class _ImportHook:
    """``sys.meta_path`` entry that wraps the loader of ``<flavour>.core.module``."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _HOOKED:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _ImportHook) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def _hooks() -> list[Any]:
    # by name, so that a hook left by a module object replaced by importlib.reload is recognised
    return [f for f in sys.meta_path if type(f).__name__ == "_ImportHook" and type(f).__module__ == __name__]


def _parse(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _core(fn: Any) -> Any:
    """The plain function under a ``torch.compiler.disable`` marking, else ``fn``."""
    if getattr(fn, "_torchdynamo_disable", False):
        return getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", fn)
    return fn


def _unknown_reason(flavour: _Flavour, name: str, fn: Any) -> str | None:
    """Why ``fn`` is not the Lightning method the shim knows, or None when it is."""
    core = _core(fn)
    if not inspect.isfunction(core):
        return f"{name} is not a plain function ({type(fn).__name__})"
    where = f"{core.__module__}.{core.__qualname__}"
    if core.__qualname__ != f"LightningModule.{name}" or not core.__module__.startswith(flavour.name):
        return f"{name} was already replaced by someone else ({where})"
    if hasattr(core, "__wrapped__") or inspect.isgeneratorfunction(core):
        return f"{name} is already wrapped or returns a context manager ({where})"
    if list(inspect.signature(core).parameters) != ["self", "optimizer"]:
        return f"{name} has a signature the shim does not know: {inspect.signature(core)}"
    return None


def _refusal(flavour: _Flavour, allow_untested: bool) -> str | None:
    low, high = SUPPORTED
    version = _parse(flavour.version)
    if version < low:
        return f"{flavour.distribution} {flavour.version} is older than 2.0, which toggleshim does not support"
    if version >= high and not allow_untested:
        return (
            f"{flavour.distribution} {flavour.version} is newer than the releases toggleshim was tested on "
            f"(< {high[0]}.{high[1]}); run `python -m toggleshim check` and, if it passes, set "
            f"{_ALLOW_UNTESTED_ENV}=1"
        )
    cls_dict = vars(flavour.module_cls)
    for name in _PATCHED:
        fn = cls_dict.get(name)
        if fn is None:
            return f"{flavour.name}.LightningModule has no {name}"
        reason = _unknown_reason(flavour, name, fn)
        if reason:
            return reason
    return None


def _marked_like(original: Any, replacement: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``replacement`` the ``torch.compiler.disable`` marking ``original`` has, if any."""
    if not getattr(original, "_torchdynamo_disable", False):
        return replacement
    import torch._dynamo

    marked: Callable[..., Any] = torch._dynamo.disable(  # type: ignore[no-untyped-call]
        replacement,
        recursive=getattr(original, "_torchdynamo_disable_recursive", True),
        reason=getattr(original, "_torchdynamo_disable_msg", None),
    )
    return marked


_TOGGLE_DOC = """Toggle ``optimizer`` now; the result is also a context manager (patched by toggleshim).

As a statement this is exactly Lightning's ``toggle_optimizer``: only ``optimizer``'s
parameters keep ``requires_grad`` (as the user set it), every other parameter held by
``trainer.optimizers`` is frozen; undo it with ``untoggle_optimizer(optimizer)``.

As a block::

    with self.toggle_optimizer(opt, zero_grad=True, step=True) as opt:
        self.manual_backward(loss)

entering calls ``opt.zero_grad()`` (if ``zero_grad``); a clean exit calls ``opt.step()``
(if ``step``); every exit untoggles, exceptions are never swallowed. Blocks nest: inside,
``requires_grad`` is what toggling ``opt`` from the user's own state gives, and leaving a
nested block restores the state found on entry.

Args:
    optimizer: a ``torch.optim.Optimizer`` or the ``LightningOptimizer`` from ``self.optimizers()``.
    zero_grad: call ``optimizer.zero_grad()`` on entering the block.
    step: call ``optimizer.step()`` when the block ends without an exception.
    sync_grad: ``False`` skips the DDP gradient all-reduce inside the block (gradient
        accumulation micro-batches), restored on every exit.
"""


def _make_toggle(original: Any) -> Callable[..., Any]:
    # A copy of the toggle itself, not a wrapper around it: one call less on every toggle. Its own
    # function object (each flavour's carries the sentinel to its own original), with the signature
    # and help of Lightning's method plus the new parameters.
    impl = _toggle._toggle_optimizer
    toggle_optimizer = types.FunctionType(
        impl.__code__, impl.__globals__, "toggle_optimizer", impl.__defaults__, impl.__closure__
    )
    toggle_optimizer.__doc__ = _TOGGLE_DOC
    toggle_optimizer.__annotations__ = {
        "self": Any, "optimizer": Any, "zero_grad": bool, "step": bool, "sync_grad": bool, "return": Toggle[Any]
    }
    return _finish(toggle_optimizer, original)


def _make_untoggle(original: Any) -> Callable[..., Any]:
    def untoggle_optimizer(self: Any, optimizer: Any) -> None:
        """Lightning's ``untoggle_optimizer``; inside a toggleshim block it closes a nested statement toggle."""
        nested = _open_statement_toggle(self, optimizer)
        if nested is not None:
            nested._untoggle_statement()
            return
        original(self, optimizer)

    return _finish(untoggle_optimizer, original)


def _finish(replacement: Callable[..., Any], original: Any) -> Callable[..., Any]:
    replacement.__qualname__ = f"LightningModule.{replacement.__name__}"
    patched = _marked_like(original, replacement)
    setattr(patched, _SENTINEL, original)
    return patched


def install(allow_untested: bool | None = None) -> None:
    """Patch ``toggle_optimizer`` (and ``untoggle_optimizer``) on every installed Lightning flavour.

    Idempotent; ``import toggleshim`` calls it. A flavour whose methods are not the ones toggleshim
    knows (unsupported or untested version, changed signature, patched by someone else) is left
    untouched with a :class:`ToggleshimWarning`. ``allow_untested`` (default: the environment variable
    ``TOGGLESHIM_ALLOW_UNTESTED=1``) patches a Lightning newer than the tested range.
    Subclasses that define their own ``toggle_optimizer`` are never touched.
    """
    _hook_allow_untested[0] = allow_untested
    if not _hooks():
        sys.meta_path.insert(0, _ImportHook())
    if allow_untested is None:
        allow_untested = os.environ.get(_ALLOW_UNTESTED_ENV, "") not in ("", "0")
    for flavour in _flavours():
        cls_dict = vars(flavour.module_cls)
        if all(hasattr(cls_dict.get(name), _SENTINEL) for name in _PATCHED):
            continue
        reason = _refusal(flavour, allow_untested)
        if reason is not None:
            warnings.warn(
                f"toggleshim left {flavour.name} untouched: {reason}. "
                "`with self.toggle_optimizer(...)` will not work there.",
                ToggleshimWarning,
                stacklevel=2,
            )
            continue
        for name, make in (("toggle_optimizer", _make_toggle), ("untoggle_optimizer", _make_untoggle)):
            setattr(flavour.module_cls, name, make(cls_dict[name]))


def uninstall() -> None:
    """Put back the exact original function objects on every flavour (a no-op where not installed)."""
    for hook in _hooks():
        sys.meta_path.remove(hook)
    for flavour in _flavours():
        for name in _PATCHED:
            original = getattr(vars(flavour.module_cls).get(name), _SENTINEL, None)
            if original is not None:
                setattr(flavour.module_cls, name, original)


def is_installed() -> bool:
    """True when every imported Lightning flavour (at least one) is patched."""
    found = _flavours()
    return bool(found) and all(hasattr(vars(f.module_cls).get(name), _SENTINEL) for f in found for name in _PATCHED)
_keep_dynamo_out(globals())
