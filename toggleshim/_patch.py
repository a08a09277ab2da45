"""Where the patch is made: ``LightningModule.toggle_optimizer`` / ``untoggle_optimizer`` on every flavour.

The gate is code identity, not version numbers: a flavour whose two methods are Lightning's own and
fingerprint (``_fingerprint.py``) as code toggleshim verified (``_known.py``, every release of the matrix)
gets the shim, whatever its version says. Lightning's own methods with code not verified get the
fallback (``_fallback.py``: the block runs that Lightning's own sequence; nesting raises a clear error).
Anything else (someone else's patch, a missing method, a signature without ``(self, optimizer)``) is
left untouched with a warning.

Rules (see STYLE.md): read and write the raw class ``__dict__``; recognise Lightning's own function
before replacing it (never wrap somebody else's wrapper); mark the replacement with a sentinel that
points at the exact original, so ``install()`` is idempotent and ``uninstall()`` restores the very same
object, also after ``importlib.reload(toggleshim)``; and with a weak reference to itself, so that
someone else's wrapper carrying a copy of the marks (``functools.wraps`` copies ``__dict__``) is theirs.
"""

import contextlib
import importlib
import importlib.abc
import inspect
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from toggleshim import _toggle
from toggleshim._fallback import make_fallback
from toggleshim._fingerprint import fingerprint_function
from toggleshim._known import KNOWN
from toggleshim._ours import MODE as _MODE
from toggleshim._ours import ORIGINAL as _SENTINEL  # noqa: F401  (tests read it here)
from toggleshim._ours import mark, original_of
from toggleshim._toggle import Toggle, _keep_dynamo_out, _untoggled

__all__ = ["ToggleshimWarning", "install", "is_installed", "uninstall"]

_PATCHED = ("toggle_optimizer", "untoggle_optimizer")
_OUR_FLAGS = ("zero_grad", "step", "sync_grad")


class ToggleshimWarning(UserWarning):
    """``install()`` left a Lightning flavour untouched, or gave it the fallback block (and why)."""


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
_hook_trust_unknown = [False]


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
        _install(_hook_trust_unknown[0])


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


def _core(fn: Any) -> Any:
    """The plain function under a ``torch.compiler.disable`` marking, else ``fn``.

    Only under torch's own wrapper: ``functools.wraps`` copies the marks onto someone else's wrapper
    too; torch tells its own by ``_torchdynamo_wrapper_id == id(wrapper)`` (where a torch sets no
    such id, the marks are trusted).
    """
    if getattr(fn, "_torchdynamo_disable", False) and getattr(fn, "_torchdynamo_wrapper_id", id(fn)) == id(fn):
        return getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", fn)
    return fn


def _label(flavour: _Flavour) -> str:
    return f"{flavour.distribution} {flavour.version} ({flavour.name})"


def _foreign_reason(flavour: _Flavour, name: str, fn: Any) -> str | None:
    """Why ``fn`` is not Lightning's own method (nothing to patch), or None when it is."""
    core = _core(fn)
    if not inspect.isfunction(core):
        return f"{name} is not a plain function ({type(fn).__name__})"
    where = f"{core.__module__}.{core.__qualname__}"
    if hasattr(core, "__wrapped__"):  # functools.wraps copies the name of what it wraps: say so first
        return f"{name} was already wrapped by someone else (over {where})"
    if core.__qualname__ != f"LightningModule.{name}" or not core.__module__.startswith(flavour.name):
        return f"{name} was already replaced by someone else ({where})"
    if inspect.isgeneratorfunction(core):
        return f"{name} is a generator function ({where})"
    params = list(inspect.signature(core).parameters.values())
    extra = [p for p in params[2:] if p.default is inspect.Parameter.empty or p.name in _OUR_FLAGS]
    if [p.name for p in params[:2]] != ["self", "optimizer"] or extra:
        return f"{name} has a signature the shim does not know: {inspect.signature(core)}"
    return None


def _fingerprints(flavour: _Flavour) -> tuple[str | None, str | None]:
    cls_dict = vars(flavour.module_cls)
    toggle, untoggle = (fingerprint_function(_core(cls_dict[name])) for name in _PATCHED)
    return toggle, untoggle


def _classify(flavour: _Flavour) -> tuple[str, str]:
    """("shim" | "fallback" | "refuse", why): what ``install()`` does with ``flavour``."""
    cls_dict = vars(flavour.module_cls)
    for name in _PATCHED:
        fn = cls_dict.get(name)
        if fn is None:
            return "refuse", f"{flavour.name}.LightningModule has no {name}"
        reason = _foreign_reason(flavour, name, fn)
        if reason:
            return "refuse", reason
    toggle, untoggle = _fingerprints(flavour)
    if toggle is None or untoggle is None:
        return "fallback", "the source of its toggle code is unavailable (a .pyc-only install?): it cannot be verified"
    seen = KNOWN.get((toggle, untoggle))
    if seen is not None:
        return "shim", f"toggle code verified: identical to {len(seen)} verified release(s), {seen[0]} to {seen[-1]}"
    differs = [
        name for i, (name, fp) in enumerate(zip(_PATCHED, (toggle, untoggle))) if all(fp != pair[i] for pair in KNOWN)
    ]
    what = " and ".join(differs) or "pairing of toggle_optimizer and untoggle_optimizer"
    return "fallback", (
        f"its {what} code differs from every release toggleshim verified "
        f"(fingerprints {toggle[:12]}, {untoggle[:12]}; toggleshim/_known.py lists the verified ones)"
    )


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
    return _finish(toggle_optimizer, original, "shim")


def _make_untoggle(original: Any) -> Callable[..., Any]:
    def untoggle_optimizer(self: Any, optimizer: Any) -> None:
        """Lightning's ``untoggle_optimizer``; inside a toggleshim block it closes a nested statement
        toggle, and called by a block's exit (through a subclass's override) it closes that block."""
        if not _untoggled(self, optimizer):
            original(self, optimizer)

    return _finish(untoggle_optimizer, original, "shim")


def _finish(replacement: Callable[..., Any], original: Any, mode: str) -> Callable[..., Any]:
    replacement.__qualname__ = f"LightningModule.{replacement.__name__}"
    patched = _marked_like(original, replacement)
    mark(patched, original, mode)
    return patched


_original_of = original_of  # the one rule for "ours": toggleshim/_ours.py


def _make_fallback(flavour: _Flavour) -> Callable[..., Any]:
    cls_dict = vars(flavour.module_cls)
    original = cls_dict["toggle_optimizer"]
    fallback = make_fallback(original, _label(flavour))
    return _finish(fallback, original, "fallback")


def install() -> None:
    """Patch ``toggle_optimizer`` (and ``untoggle_optimizer``) on every installed Lightning flavour.

    Idempotent; ``import toggleshim`` calls it, and a flavour imported later is patched on import.
    The gate is the code, not the version: where both methods are code toggleshim verified (any
    release, also one newer than the matrix), the shim is installed silently. Where they are
    Lightning's own methods with code toggleshim has not verified, ``toggle_optimizer`` runs
    Lightning's own toggle and its block Lightning's own sequence (nested blocks raise an error),
    with one :class:`ToggleshimWarning`. Anything else (someone else's patch, a changed signature)
    is left untouched with a :class:`ToggleshimWarning`. Subclasses that define their own
    ``toggle_optimizer`` are never touched.
    """
    _install(False)


def _install(trust_unknown: bool) -> None:
    """``install()``; ``trust_unknown`` installs the shim on unverified code too (``toggleshim check``)."""
    _hook_trust_unknown[0] = trust_unknown
    if not _hooks():
        sys.meta_path.insert(0, _ImportHook())
    for flavour in _flavours():
        cls_dict = vars(flavour.module_cls)
        if _original_of(cls_dict.get("toggle_optimizer")) is not None:
            continue
        # One of our methods left alone (uninstall() ran while someone else's patch wrapped it, and
        # that patch was undone since) counts as the original it points at: judged and replaced as such.
        found = _unpatched(flavour)
        originals = vars(found.module_cls)
        mode, reason = _classify(found)
        if mode == "refuse":
            warnings.warn(
                f"toggleshim left {_label(flavour)} untouched: {reason}. `with self.toggle_optimizer(...)` "
                "will not work there: it fails with Python's TypeError ('NoneType' object does not support "
                "the context manager protocol) unless that replacement returns a context manager.",
                ToggleshimWarning,
                stacklevel=3,
            )
            continue
        if mode == "fallback" and not trust_unknown:
            warnings.warn(
                f"toggleshim: {_label(flavour)}: {reason}. `with self.toggle_optimizer(opt):` runs "
                "Lightning's own sequence there (its toggle; zero_grad; the block; step; its untoggle in "
                "`finally`), statements stay Lightning's own, and nested blocks raise an error. Run "
                "`python -m toggleshim check`, pin Lightning to a release toggleshim verified, and report it.",
                ToggleshimWarning,
                stacklevel=3,
            )
            setattr(flavour.module_cls, _PATCHED[0], _make_fallback(found))
            if _original_of(cls_dict["untoggle_optimizer"]) is not None:  # the fallback keeps Lightning's own
                setattr(flavour.module_cls, _PATCHED[1], originals["untoggle_optimizer"])
            continue
        for name, make in (("toggle_optimizer", _make_toggle), ("untoggle_optimizer", _make_untoggle)):
            setattr(flavour.module_cls, name, make(originals[name]))


def uninstall() -> None:
    """Put back the exact original function objects on every flavour (a no-op where not installed)."""
    for hook in _hooks():
        sys.meta_path.remove(hook)
    for flavour in _flavours():
        for name in _PATCHED:
            original = _original_of(vars(flavour.module_cls).get(name))
            if original is not None:
                setattr(flavour.module_cls, name, original)


def is_installed() -> bool:
    """True when every imported Lightning flavour (at least one) has the shim (verified toggle code);
    False where a flavour is untouched or has the fallback block (unverified toggle code)."""
    found = _flavours()
    return bool(found) and all(_mode(f) == "shim" for f in found)


def _mode(flavour: _Flavour) -> str | None:
    """"shim", "fallback", or None (not patched by toggleshim)."""
    fn = vars(flavour.module_cls).get("toggle_optimizer")
    return getattr(fn, _MODE, None) if _original_of(fn) is not None else None


def _unpatched(flavour: _Flavour) -> _Flavour:
    """``flavour`` as it would be without toggleshim: each method of ours replaced, in a stand-in
    class, by the original it points at (the real class is not touched)."""
    cls_dict = vars(flavour.module_cls)
    originals = {name: _original_of(cls_dict[name]) or cls_dict[name] for name in _PATCHED if name in cls_dict}
    return _Flavour(flavour.name, flavour.distribution, type("Probe", (), originals), flavour.optimizer_cls)


def _status(flavour: _Flavour) -> tuple[str, str]:
    """(mode now or "untouched", why): the gate's verdict on a flavour, for ``toggleshim check``."""
    return _mode(flavour) or "untouched", _classify(_unpatched(flavour))[1]


@contextlib.contextmanager
def _trusting() -> Iterator[None]:
    """The shim on every flavour whose methods are Lightning's own, verified or not (what
    ``toggleshim check`` tests); afterwards the exact objects found before, and the import hook as found."""
    flavours = _flavours()
    saved = {(f.module_cls, name): vars(f.module_cls).get(name) for f in flavours for name in _PATCHED}
    hooked = bool(_hooks())
    uninstall()
    _install(True)
    try:
        yield
    finally:
        uninstall()
        for (cls, name), fn in saved.items():
            if fn is not None:
                setattr(cls, name, fn)
        _hook_trust_unknown[0] = False
        if hooked:
            sys.meta_path.insert(0, _ImportHook())
_keep_dynamo_out(globals())
