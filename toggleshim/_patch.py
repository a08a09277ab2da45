"""Where the patch is made: ``LightningModule.toggle_optimizer`` / ``untoggle_optimizer`` on every flavour.

The gate is code identity, not version numbers: a flavour whose two methods are Lightning's own and
fingerprint (``_fingerprint.py``) as code toggleshim verified (``_known.py``, every release of the matrix),
or as code certified for the user's project by ``toggleshim certify`` (``_certify.py``), gets the shim,
whatever its version says. Lightning's own methods with code not verified get the
fallback (``_block.make_fallback``: the block runs that Lightning's own sequence; nesting raises a clear
error).
Anything else (someone else's patch, a missing method, a signature without ``(self, optimizer)``) is
left untouched with a warning.

Rules (those of wrapt, nest_asyncio and time-machine): read and write the raw class ``__dict__``;
recognise Lightning's own function before replacing it (never wrap somebody else's wrapper); mark
the replacement with a sentinel that points at the exact original, so ``install()`` is idempotent
and ``uninstall()`` restores the very same object, also after ``importlib.reload(toggleshim)``; and
with a weak reference to itself, so that someone else's wrapper carrying a copy of the marks
(``functools.wraps`` copies ``__dict__``) is theirs.

A flavour imported after toggleshim is patched the moment its ``core.module`` has run, by the
``sys.meta_path`` hook. ``sys.meta_path`` itself becomes a list that hands the import system toggleshim's
hook first, wherever it stands: a finder another tool inserts in front later (typeguard's import hook,
a delegating finder) is asked right after it, and the loader it returns is wrapped as any other. It
costs one short call per import of a module not yet loaded, and nothing at any other time. A warning
the filters turn into an error is never raised inside an import: it is kept and raised from
toggleshim's next entry point (docs/guarantees.md, "Other import hooks, warnings as errors").
"""

import contextlib
import functools
import importlib
import importlib.abc
import inspect
import os
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any, NamedTuple

from toggleshim import _block, _certify, _spawn
from toggleshim._block import FLAGS, Toggle, make_fallback
from toggleshim._fingerprint import fingerprint_function
from toggleshim._flavours import FLAVOURS, Flavour
from toggleshim._known import KNOWN
from toggleshim._ours import MODE as _MODE
from toggleshim._ours import ORIGINAL as _SENTINEL  # noqa: F401  (tests read it here)
from toggleshim._ours import mark, original_of
from toggleshim._toggle import untoggled

__all__ = ["ToggleshimWarning", "install", "is_installed", "uninstall"]

_PATCHED = ("toggle_optimizer", "untoggle_optimizer")
_OUR_FLAGS = tuple(FLAGS)


class ToggleshimWarning(UserWarning):
    """``install()`` left a Lightning flavour untouched, or gave it the fallback block (and why)."""


@dataclass(frozen=True)
class _Flavour:
    name: str  # import name (toggleshim/_flavours.py)
    distribution: str
    module_cls: type
    optimizer_cls: type

    @property
    def version(self) -> str:
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:  # pragma: no cover - vendored copies
            return str(getattr(importlib.import_module(self.name), "__version__", "0"))


def _loaded(flavour: Flavour) -> _Flavour | None:
    """``flavour``, with its classes, once its ``core.module`` has run, else None. Never imports anything.

    Importing a flavour the user did not import is not harmless: ``lightning.pytorch`` and
    ``pytorch_lightning`` each rebind ``lightning_utilities.core.rank_zero.log`` (and the fabric
    ``rank_zero_deprecation_category``) to their own when imported, so the last one imported decides
    which logger Lightning's ``rank_zero_info`` messages go to and which ``LightningDeprecationWarning``
    class its deprecations raise.
    """
    module_cls = getattr(sys.modules.get(flavour.core_module), "LightningModule", None)
    optimizer_cls = getattr(sys.modules.get(flavour.optimizer_module), "LightningOptimizer", None)
    if module_cls is None or optimizer_cls is None:
        return None
    return _Flavour(flavour.name, flavour.distribution, module_cls, optimizer_cls)


def _flavours() -> list[_Flavour]:
    """Every Lightning flavour already imported (the others are patched by the import hook)."""
    return [f for f in (_loaded(k) for k in FLAVOURS) if f is not None]


# the modules whose import the hook waits for: a flavour's core.module (the patch), its Trainer's
# (handed to spawned processes through toggleshim, _spawn.py)
_HOOKED = frozenset(name for f in FLAVOURS for name in (f.core_module, f.trainer_module))
# flavour name -> a ToggleshimWarning the filters turned into an error inside an import, kept to be
# raised from toggleshim's next entry point (install(), the fallback toggle_optimizer, toggle())
_pending: dict[str, str] = {}
_DEFERRED = (
    " [Raised here, not during the import where it arose: the warnings filters turn it into an error, "
    "and an error there would fail that import.]"
)
# ``stacklevel`` below: the frame a warning points at, counted as ``warnings.warn`` counts it from
# the function that takes it (1: that function); one frame down passes ``stacklevel + 1``.


def _warn(message: str, stacklevel: int, defer: str | None = None) -> None:
    """``warnings.warn(ToggleshimWarning(message))``; with ``defer`` (a flavour's name), a warning the
    filters raise as an error is kept in ``_pending`` instead of raised (only that very warning:
    anything else raised propagates)."""
    warning = ToggleshimWarning(message)
    try:
        warnings.warn(warning, stacklevel=stacklevel)
    except ToggleshimWarning as raised:
        if defer is None or raised is not warning:
            raise
        _pending[defer] = message + _DEFERRED


def _emit_pending(names: Iterable[str], stacklevel: int) -> None:
    """Raise (or show) the kept warnings of ``names``. Each stays kept while the filters raise it as
    an error, and is dropped once shown, recorded or ignored."""
    for name in names:
        message = _pending.get(name)  # (another thread may have shown it meanwhile)
        if message is not None:
            warnings.warn(ToggleshimWarning(message), stacklevel=stacklevel)
            _pending.pop(name, None)


def _judge_on_import(trust_unknown: bool, stacklevel: int) -> None:
    """``_install`` at an import (the meta_path hook's loader): its warnings kept if
    the filters raise them, and its own failure (an ``Exception``) reported instead of raised, so that
    the import it runs in completes. ``KeyboardInterrupt`` and ``SystemExit`` propagate."""
    try:
        _install(trust_unknown, defer=True, stacklevel=stacklevel + 1)
    except Exception as error:
        _report_failure(error, stacklevel + 1)


def _report_failure(error: Exception, stacklevel: int) -> None:
    """``error`` (raised by an install at an import, where raising would fail that import): a
    ToggleshimWarning naming it for each flavour left unpatched, at that import. Where the warning
    cannot be shown (the filters raise it, a ``showwarning`` fails), ``error`` itself goes to
    ``sys.unraisablehook``, Python's channel for exceptions that cannot propagate (it prints the
    traceback; pytest turns it into a warning). ``install()`` tries again, raising it if it recurs."""
    try:
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        unpatched = [k for k in FLAVOURS if (f := _loaded(k)) is not None and _mode(f) is None]
        for k in unpatched:
            message = (
                f"toggleshim could not patch {k.name} when it was imported: {text}. `with "
                "self.toggle_optimizer(...)` will not work there; `toggleshim.install()` tries again (and "
                "raises that error if it recurs)."
            )
            warning = ToggleshimWarning(message)
            try:
                warnings.warn(warning, stacklevel=stacklevel)
            except ToggleshimWarning as raised:
                if raised is not warning:
                    raise
                _unraisable(error, f"toggleshim could not patch {k.name} when it was imported")
    except Exception:
        _unraisable(error, "toggleshim could not patch a Lightning flavour when it was imported")


def _unraisable(error: BaseException, message: str) -> None:
    # a failing unraisablehook is the end of the line: nothing is left to report through
    with contextlib.suppress(Exception):
        sys.unraisablehook(types.SimpleNamespace(
            exc_type=type(error), exc_value=error, exc_traceback=error.__traceback__, err_msg=message, object=None
        ))


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then ``install()``: the flavour is patched the moment it exists.
    ``trust_unknown``: the hook's (``toggleshim check`` installs the shim on unverified code too)."""

    def __init__(self, loader: Any, trust_unknown: bool = False) -> None:
        self._loader = loader
        self._trust_unknown = trust_unknown

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # from here: this, the import statement (2; warnings skips importlib's frames); one frame down
        _judge_on_import(self._trust_unknown, stacklevel=3)


class _ImportHook:
    """``sys.meta_path`` entry that wraps the loader of a flavour's ``core.module`` and its Trainer's. It
    carries the trust its loaders install with (``trust_unknown``: only while ``toggleshim check`` runs)."""

    def __init__(self, trust_unknown: bool = False) -> None:
        self.trust_unknown = trust_unknown

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _HOOKED:
            return None
        for finder in sys.meta_path:  # the finders in their order (this one is handed out first)
            if _is_hook(finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self.trust_unknown)
                return spec
        return None


class _MetaPath(list):  # type: ignore[type-arg]
    """``sys.meta_path`` while toggleshim is installed: the same list (``insert``, ``remove``, indexing
    and ``repr`` are a list's), whose iteration (the import system's, at every import of a module not
    yet loaded) hands toggleshim's hook out first. A finder that another tool inserts in front of it
    later is then asked by the hook itself, right after it, so the flavour it finds is still patched."""

    def __iter__(self) -> Any:
        finders = list(list.__iter__(self))
        for i, finder in enumerate(finders):
            if _is_hook(finder):
                if i:
                    finders.insert(0, finders.pop(i))
                break
        return iter(finders)


def _is_hook(finder: Any) -> bool:
    # by name, so that a hook left by a module object replaced by importlib.reload is recognised
    return type(finder).__name__ == "_ImportHook" and type(finder).__module__ == __name__


def _hooks() -> list[Any]:
    return [f for f in list.__iter__(sys.meta_path) if _is_hook(f)]


def _hook(trust_unknown: bool) -> None:
    """One import hook of toggleshim's, with ``trust_unknown``, and ``sys.meta_path`` a :class:`_MetaPath`."""
    hooks = _hooks()
    if not hooks or any(hook.trust_unknown != trust_unknown for hook in hooks):
        for hook in hooks:
            sys.meta_path.remove(hook)
        sys.meta_path.insert(0, _ImportHook(trust_unknown))
    if type(sys.meta_path).__name__ != "_MetaPath":
        sys.meta_path = _MetaPath(sys.meta_path)


def _unhook() -> None:
    """No import hook of toggleshim's, and ``sys.meta_path`` a plain list again (the same finders)."""
    for hook in _hooks():
        sys.meta_path.remove(hook)
    if type(sys.meta_path).__name__ == "_MetaPath":
        sys.meta_path = list(list.__iter__(sys.meta_path))


def _core(fn: Any) -> Any:
    """The plain function under a ``torch.compiler.disable`` marking or ``@beartype``'s wrapper, else ``fn``.

    Only under torch's own wrapper: ``functools.wraps`` copies the marks onto someone else's wrapper
    too; torch tells its own by ``_torchdynamo_wrapper_id == id(wrapper)`` (where a torch sets no
    such id, the marks are trusted).
    """
    if getattr(fn, "_torchdynamo_disable", False) and getattr(fn, "_torchdynamo_wrapper_id", id(fn)) == id(fn):
        return getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", fn)
    if _is_beartype_wrapper(fn):
        return _core(fn.__wrapped__)
    return fn


def _is_beartype_wrapper(fn: Any) -> bool:
    """``@beartype``'s type-checking wrapper (``beartype.claw`` puts one on every method it decorates):
    its mark and, what ``functools.wraps`` cannot copy onto someone else's, its generated code's name."""
    code = getattr(fn, "__code__", None)
    return (
        getattr(fn, "__beartype_wrapper", False) is True
        and hasattr(fn, "__wrapped__")
        and getattr(code, "co_filename", "").startswith("<@beartype(")
    )


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


class Verdict(NamedTuple):
    """The gate's verdict on a flavour: what ``install()`` does with it and why. ``install()`` acts on
    it, ``toggleshim check`` reports it; nothing else decides."""

    mode: str  # "shim" (verified code), "fallback" (Lightning's own, unverified), "refuse" (not ours to patch)
    reason: str


def _classify(flavour: _Flavour) -> Verdict:
    """What ``install()`` does with ``flavour``, and why (fingerprint, known releases, classification)."""
    cls_dict = vars(flavour.module_cls)
    for name in _PATCHED:
        fn = cls_dict.get(name)
        if fn is None:
            return Verdict("refuse", f"{flavour.name}.LightningModule has no {name}")
        reason = _foreign_reason(flavour, name, fn)
        if reason:
            return Verdict("refuse", reason)
    toggle, untoggle = _fingerprints(flavour)
    if toggle is None or untoggle is None:
        return Verdict(
            "fallback", "the source of its toggle code is unavailable (a .pyc-only install?): it cannot be verified"
        )
    seen = KNOWN.get((toggle, untoggle))
    if seen is not None:
        return Verdict("shim", f"toggle code verified: identical to the verified releases of {_ranges(seen)}")
    certificate = _certify.lookup(toggle, untoggle, _label(flavour))  # `toggleshim certify`'s, in the project
    if certificate.certified:
        return Verdict("shim", certificate.reason)
    differs = [
        name for i, (name, fp) in enumerate(zip(_PATCHED, (toggle, untoggle))) if all(fp != pair[i] for pair in KNOWN)
    ]
    what = " and ".join(differs) or "pairing of toggle_optimizer and untoggle_optimizer"
    return Verdict("fallback", (
        f"its {what} code differs from every release toggleshim verified "
        f"(fingerprints {toggle[:12]}, {untoggle[:12]}; toggleshim/_known.py lists the verified ones"
        + (f"; {certificate.reason})" if certificate.reason else ")")
    ))


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
""" + "".join(f"    {name}: {doc}\n" for name, (_, doc) in FLAGS.items())

# What inspect.signature and help() show: Lightning's parameters, then the flags (keyword-only)
_TOGGLE_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("optimizer", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=bool)
          for name, (default, _) in FLAGS.items()),
    ],
    return_annotation=Toggle[Any],
)


def _make_toggle(original: Any) -> Callable[..., Any]:
    # A copy of the toggle itself, not a wrapper around it: one call less on every toggle. Its own
    # function object (each flavour's carries the sentinel to its own original), with the signature
    # and help of Lightning's method plus the flags.
    impl = _block._toggle_optimizer
    toggle_optimizer = types.FunctionType(
        impl.__code__, impl.__globals__, "toggle_optimizer", impl.__defaults__, impl.__closure__
    )
    toggle_optimizer.__kwdefaults__ = impl.__kwdefaults__
    toggle_optimizer.__doc__ = _TOGGLE_DOC
    toggle_optimizer.__signature__ = _TOGGLE_SIGNATURE  # type: ignore[attr-defined]
    toggle_optimizer.__annotations__ = {
        "self": Any, "optimizer": Any, **{name: bool for name in FLAGS}, "return": Toggle[Any]
    }
    return _finish(toggle_optimizer, original, "shim")


def _make_untoggle(original: Any) -> Callable[..., Any]:
    def untoggle_optimizer(self: Any, optimizer: Any) -> None:
        """Lightning's ``untoggle_optimizer``; inside a toggleshim block it closes a nested statement
        toggle, and called by a block's exit (through a subclass's override) it closes that block."""
        if not untoggled(self, optimizer):
            original(self, optimizer)

    return _finish(untoggle_optimizer, original, "shim")


# torch.compile runs toggleshim's code eagerly: the entry points of a block (the patched methods, the
# block's __enter__ and __exit__) are torch.compiler.disable'd, as Lightning's newest source does with
# its own toggle. Traced, the toggle's bookkeeping would become dynamo guards (or an internal error of
# dynamo's, over the module state it reads), and the zero_grad and step inside would be compiled;
# disabled, dynamo breaks the graph at each and runs it, and all it calls, eagerly (the wrapper's cost in
# eager code: docs/performance.md, "One block against the manual sequence").


def _disabled(fn: Callable[..., Any], like: Any = None) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)``, with the options of ``like`` (Lightning's own marked method).
    torch 2.0 has only ``torch._dynamo.disable``; before torch 2.7 neither takes ``reason``."""
    import torch

    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None) or importlib.import_module("torch._dynamo").disable
    options: dict[str, Any] = {"recursive": getattr(like, "_torchdynamo_disable_recursive", True)}
    reason = getattr(like, "_torchdynamo_disable_msg", None)
    if reason is not None:  # only a torch that takes it wrote it
        options["reason"] = reason
    wrapped: Callable[..., Any] = disable(fn, **options)
    return wrapped


def _keep_dynamo_out() -> None:
    """The block's ``__enter__`` and ``__exit__`` run eagerly under torch.compile. Idempotent."""
    for name in ("__enter__", "_exit"):
        fn = vars(Toggle)[name]
        if not getattr(fn, "_torchdynamo_disable", False):
            setattr(Toggle, name, _disabled(fn))


def _finish(replacement: Callable[..., Any], original: Any, mode: str) -> Callable[..., Any]:
    replacement.__qualname__ = f"LightningModule.{replacement.__name__}"
    patched = _disabled(replacement, like=original)
    mark(patched, original, mode)
    return patched


_original_of = original_of  # the one rule for "ours": toggleshim/_ours.py


def _make_fallback(flavour: _Flavour, name: str | None = None) -> Callable[..., Any]:
    """The fallback ``toggle_optimizer``; with ``name``, one that first raises (or shows) the warning
    kept for flavour ``name``, before anything changes."""
    cls_dict = vars(flavour.module_cls)
    original = cls_dict["toggle_optimizer"]
    fallback = make_fallback(original, _label(flavour))
    if name is not None:
        fallback = _warning_first(fallback, name)
    return _finish(fallback, original, "fallback")


def _warning_first(fallback: Callable[..., Any], name: str) -> Callable[..., Any]:
    # installed (and so marked "fallback") in the fallback's place: toggleshim.toggle() routes through it too
    @functools.wraps(fallback)
    def toggle_optimizer(self: Any, optimizer: Any, **flags: bool) -> Any:
        if name in _pending:
            _emit_pending((name,), stacklevel=_callers_level())
        return fallback(self, optimizer, **flags)

    return toggle_optimizer


def _callers_level() -> int:
    """The ``stacklevel`` of a warning from :func:`_emit_pending` that points at the code calling the
    function that calls this one, past torch.compile's wrapper of it (:func:`_disabled`)."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 3  # frames: _emit_pending, the function, its caller
    while frame is not None and _DYNAMO_FILES in frame.f_code.co_filename:
        frame, level = frame.f_back, level + 1
    return level


_DYNAMO_FILES = os.path.join("", "torch", "_dynamo", "")  # in the path of the wrapper's file


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

    A warning the filters turned into an error during an import (``import toggleshim``, or a
    flavour's) was kept: this raises it first, and then changes nothing.
    """
    _emit_pending(list(_pending), stacklevel=3)
    _install(False)


def _install_at_import() -> None:
    """``import toggleshim``'s ``install()``: a warning the filters turn into an error is kept (raised
    from toggleshim's next entry point), so that the import completes."""
    _install(False, defer=True, stacklevel=3)  # toggleshim/__init__.py, as install() there points


def _install(trust_unknown: bool, defer: bool = False, stacklevel: int = 3) -> dict[str, Verdict]:
    """``install()``; ``trust_unknown`` installs the shim on unverified code too (``toggleshim check``),
    and so does the import hook it leaves. Returns the verdict on each flavour it judged (not those
    already patched).

    ``defer`` (at an import): a warning the filters raise as an error is kept in ``_pending`` and, on
    a fallback, raised by its first call, instead of raised here. ``stacklevel``: the frame warnings
    point at, counting this function as 1."""
    _hook(trust_unknown)
    flavours = _flavours()
    if flavours:
        _keep_dynamo_out()  # Lightning has loaded torch by now
    verdicts: dict[str, Verdict] = {}
    for flavour in flavours:
        kept = flavour.name if defer else None
        cls_dict = vars(flavour.module_cls)
        if _original_of(cls_dict.get("toggle_optimizer")) is not None:
            continue
        # One of our methods left alone (uninstall() ran while someone else's patch wrapped it, and
        # that patch was undone since) counts as the original it points at: judged and replaced as such.
        found = _unpatched(flavour)
        originals = vars(found.module_cls)
        mode, reason = verdicts[flavour.name] = _classify(found)
        if mode == "refuse":
            _warn(
                f"toggleshim left {_label(flavour)} untouched: {reason}. `with self.toggle_optimizer(...)` "
                "will not work there: it fails with Python's TypeError ('NoneType' object does not support "
                "the context manager protocol) unless that replacement returns a context manager.",
                stacklevel + 1,
                kept,
            )
            continue
        if mode == "fallback" and not trust_unknown:
            _warn(
                f"toggleshim: {_label(flavour)}: {reason}. `with self.toggle_optimizer(opt):` runs "
                "Lightning's own sequence there (its toggle; zero_grad; the block; step; its untoggle in "
                "`finally`), statements stay Lightning's own, and nested blocks raise an error. "
                + _certify.choices_sentence(flavour.distribution, flavour.version, None not in _fingerprints(found)),
                stacklevel + 1,
                kept,
            )
            held = flavour.name if flavour.name in _pending else None
            setattr(flavour.module_cls, _PATCHED[0], _make_fallback(found, held))
            if _original_of(cls_dict["untoggle_optimizer"]) is not None:  # the fallback keeps Lightning's own
                setattr(flavour.module_cls, _PATCHED[1], originals["untoggle_optimizer"])
            continue
        for name, make in (("toggle_optimizer", _make_toggle), ("untoggle_optimizer", _make_untoggle)):
            setattr(flavour.module_cls, name, make(originals[name]))
    for key in (f.trainer_module for f in FLAVOURS):  # spawned ranks import toggleshim (_spawn.py)
        trainer_cls = getattr(sys.modules.get(key), "Trainer", None)
        if isinstance(trainer_cls, type):
            _spawn.register(trainer_cls)
    return verdicts


def uninstall() -> None:
    """Put back the exact original function objects on every flavour (a no-op where not installed)."""
    _pending.clear()  # about what toggleshim did, undone now: install() judges afresh
    _spawn.unregister()
    _unhook()
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


def _ranges(releases: list[str]) -> str:
    """``["lightning 2.0.9", "pytorch-lightning 2.0.9", "lightning 2.6.6", ...]`` ->
    ``"lightning 2.0.9 to 2.6.6 and pytorch-lightning 2.0.9 to 2.6.6 (4 releases)"``: each
    distribution's range on its own (the list holds each distribution's releases oldest first)."""
    by_dist: dict[str, list[str]] = {}
    for release in releases:
        dist, _, version = release.partition(" ")
        by_dist.setdefault(dist, []).append(version)
    spans = [f"{d} {v[0]}" if len(v) == 1 else f"{d} {v[0]} to {v[-1]}" for d, v in by_dist.items()]
    return f"{' and '.join(spans)} ({len(releases)} release{'s' if len(releases) != 1 else ''})"


def _status(flavour: _Flavour) -> tuple[str, str]:
    """(mode now or "untouched", why): the gate's verdict on a flavour, for ``toggleshim check``."""
    return _mode(flavour) or "untouched", _classify(_unpatched(flavour)).reason


@contextlib.contextmanager
def _trusting() -> Iterator[dict[str, Verdict]]:
    """The shim on every flavour whose methods are Lightning's own, verified or not (what
    ``toggleshim check`` tests), yielding the gate's verdict on each (a "refuse" one is left as it
    was); afterwards the exact objects found before, and the import hook as found."""
    flavours = _flavours()
    saved = {(f.module_cls, name): vars(f.module_cls).get(name) for f in flavours for name in _PATCHED}
    hooked, pending = bool(_hooks()), dict(_pending)
    uninstall()
    try:
        yield _install(True)
    finally:
        uninstall()
        for (cls, name), fn in saved.items():
            if fn is not None:
                setattr(cls, name, fn)
        _pending.update(pending)
        if hooked:
            _hook(False)

