"""The gate and the patch: ``LightningModule.toggle_optimizer`` / ``untoggle_optimizer`` on every flavour.

The gate is code identity, not versions: Lightning's own methods fingerprinted as verified (``_known.py``)
or certified (``_certify.py``) get the shim; Lightning's own unverified code gets the fallback
(``_block.make_fallback``); anything else is left untouched with a warning. Rules of wrapt/nest_asyncio:
read and write the raw class ``__dict__``, never wrap somebody else's wrapper, mark the replacement with
its exact original (idempotent ``install()``, exact ``uninstall()``, also after ``importlib.reload``).
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
from toggleshim._ours import ToggleshimWarning, mark, original_of
from toggleshim._toggle import untoggled

__all__ = ["ToggleshimWarning", "install", "is_installed", "uninstall"]

_PATCHED = ("toggle_optimizer", "untoggle_optimizer")
_OUR_FLAGS = tuple(FLAGS)


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
    """``flavour`` once its ``core.module`` ran, else None; never imports (an import rebinds Lightning's logger)."""
    module_cls = getattr(sys.modules.get(flavour.core_module), "LightningModule", None)
    optimizer_cls = getattr(sys.modules.get(flavour.optimizer_module), "LightningOptimizer", None)
    if module_cls is None or optimizer_cls is None:
        return None
    return _Flavour(flavour.name, flavour.distribution, module_cls, optimizer_cls)


def _flavours() -> list[_Flavour]:
    """Every Lightning flavour already imported (the others are patched by the import hook)."""
    return [f for f in (_loaded(k) for k in FLAVOURS) if f is not None]


# a flavour's core.module (the patch) and its Trainer's (handed to spawned processes, _spawn.py)
_HOOKED = frozenset(name for f in FLAVOURS for name in (f.core_module, f.trainer_module))
# flavour name -> a warning the filters raised inside an import, raised at toggleshim's next entry point
_pending: dict[str, str] = {}
_DEFERRED = (" [Raised here, not during the import where it arose: the warnings filters turn it into an error, "
             "and an error there would fail that import.]")
# ``stacklevel`` below counts as ``warnings.warn`` does from the function taking it; one frame down: + 1


def _warn(message: str, stacklevel: int, defer: str | None = None) -> None:
    """Warn ``message``; with ``defer`` (a flavour's name), that very warning raised by the filters is kept."""
    warning = ToggleshimWarning(message)
    try:
        warnings.warn(warning, stacklevel=stacklevel)
    except ToggleshimWarning as raised:
        if defer is None or raised is not warning:
            raise
        _pending[defer] = message + _DEFERRED


def _emit_pending(names: Iterable[str], stacklevel: int) -> None:
    """Raise (or show) the kept warnings of ``names``; each is dropped only once not raised."""
    for name in names:
        message = _pending.get(name)  # (another thread may have shown it meanwhile)
        if message is not None:
            warnings.warn(ToggleshimWarning(message), stacklevel=stacklevel)
            _pending.pop(name, None)


def _judge_on_import(trust_unknown: bool, stacklevel: int) -> None:
    """``_install`` at an import: warnings kept, an ``Exception`` reported, so the import completes."""
    try:
        _install(trust_unknown, defer=True, stacklevel=stacklevel + 1)
    except Exception as error:
        _report_failure(error, stacklevel + 1)


def _report_failure(error: Exception, stacklevel: int) -> None:
    """A warning naming ``error`` (an install's at an import) for each unpatched flavour; where it cannot
    be shown, ``error`` goes to ``sys.unraisablehook`` (raising would fail the import)."""
    try:
        text = "".join(traceback.format_exception_only(type(error), error)).strip()
        for k in [k for k in FLAVOURS if (f := _loaded(k)) is not None and _mode(f) is None]:
            message = (f"toggleshim could not patch {k.name} when it was imported: {text}. `with "
                       "self.toggle_optimizer(...)` will not work there; `toggleshim.install()` tries again (and "
                       "raises that error if it recurs).")
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
        sys.unraisablehook(types.SimpleNamespace(exc_type=type(error), exc_value=error,
                                                 exc_traceback=error.__traceback__, err_msg=message, object=None))


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then ``install()`` (with the hook's ``trust_unknown``)."""

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
    """``sys.meta_path`` entry (a plain finder, in the list where it was put): wraps the loaders of
    ``_HOOKED`` it is asked for, and at any import it is asked about judges a flavour that another
    finder loaded meanwhile (``trust_unknown``: ``toggleshim check``)."""

    def __init__(self, trust_unknown: bool = False) -> None:
        self.trust_unknown = trust_unknown

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if _unjudged():  # a finder in front of this one loaded Lightning: patched at the next import asked here
            _judge_on_import(self.trust_unknown, stacklevel=_importers_level())
        if fullname not in _HOOKED:
            return None
        finding = _block._local.__dict__.setdefault("finding", set())  # (per thread)
        if fullname in finding:  # a finder that asks every other finder (this one too) asked back
            return None
        finding.add(fullname)
        try:
            spec = _find_behind(self, fullname, path, target)
        finally:
            finding.discard(fullname)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, self.trust_unknown)
        return spec


def _find_behind(hook: Any, fullname: str, path: Any, target: Any) -> Any:
    """The spec the finders after ``hook`` in ``sys.meta_path`` give (all of them, where it is not there),
    in their order, as the import system would ask them."""
    finders = list(sys.meta_path)
    start = next((i + 1 for i, f in enumerate(finders) if f is hook), 0)
    for finder in finders[start:]:
        find = getattr(finder, "find_spec", None)
        if _is_hook(finder) or find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


# flavour name -> the LightningModule class install() last judged (whatever its verdict): a class not
# judged yet was loaded by a finder in front of the hook (or another thread), and is judged at the next
# import the hook is asked about, or at the next Trainer's construction (_at_trainer); and _INSTALLED,
# present from install() to uninstall(): what _at_trainer acts on. (The names the hook is looking for,
# per thread, are in _block._local: a finder delegating back to it gets None.)
_judged: dict[str, type | None] = {}
_INSTALLED = "*"


def _unjudged() -> bool:
    """A flavour whose ``LightningModule`` is defined and not judged yet (cheap: run at every import)."""
    for flavour in FLAVOURS:
        module = sys.modules.get(flavour.core_module)
        if module is not None:
            cls = getattr(module, "LightningModule", None)
            if cls is not None and _judged.get(flavour.name) is not cls:
                return True
    return False


def _importers_level() -> int:
    """``stacklevel`` for :func:`_judge_on_import` called by ``find_spec``: the statement (or the call of
    ``importlib.util.find_spec``) that asked, past importlib's frozen frames."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 3  # frames: find_spec's caller and on
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame, level = frame.f_back, level + 1
    return level


def _at_trainer() -> None:
    """At each Trainer's construction (the ``callbacks_factory`` entry point, ``toggleshim_trainer.py``):
    a flavour no import hook saw loading (a finder in front answering every import, the hook taken out
    of ``sys.meta_path``) is judged now, before any block can run."""
    if _INSTALLED in _judged and _unjudged():
        hooks = _hooks()
        _judge_on_import(bool(hooks) and hooks[0].trust_unknown, stacklevel=_users_level())


def _users_level() -> int:
    """``stacklevel`` for :func:`_judge_on_import` called by our caller: the first frame outside toggleshim
    and Lightning (the user's ``Trainer(...)`` line)."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 3  # frames: this function's caller, its caller (the entry point), and so on
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _NOT_USERS:
        frame, level = frame.f_back, level + 1
    return level


# the top-level packages of toggleshim and of each flavour (its own, its Fabric's, their utilities)
_NOT_USERS = frozenset({"toggleshim", "toggleshim_trainer", "lightning_utilities",
                        *(f.top for f in FLAVOURS), *(f.fabric.partition(".")[0] for f in FLAVOURS)})


def _is_hook(finder: Any) -> bool:
    # by name, so that a hook left by a module object replaced by importlib.reload is recognised
    return type(finder).__name__ == "_ImportHook" and type(finder).__module__ == __name__


def _hooks() -> list[Any]:
    return [f for f in sys.meta_path if _is_hook(f)]


def _drop_hooks() -> None:
    # by position, not list.remove: another finder's __eq__ never decides what is removed
    for i in reversed(range(len(sys.meta_path))):
        if _is_hook(sys.meta_path[i]):
            del sys.meta_path[i]


def _hook(trust_unknown: bool) -> None:
    """One import hook of toggleshim's, with ``trust_unknown``: put first in ``sys.meta_path`` (a plain
    list, left as it is otherwise) where there is none; finders inserted later go where they are put."""
    hooks = _hooks()
    if not hooks or any(hook.trust_unknown != trust_unknown for hook in hooks):
        _drop_hooks()
        sys.meta_path.insert(0, _ImportHook(trust_unknown))


def _unhook() -> None:
    """No import hook of toggleshim's in ``sys.meta_path``."""
    _drop_hooks()


def _core(fn: Any) -> Any:
    """The plain function under torch's ``torch.compiler.disable`` or ``@beartype``'s wrapper, else ``fn``.
    Torch's own wrapper is code in torch's ``_dynamo`` (``functools.wraps`` copies its marks onto others;
    torch >= 2.2 also stamps it with ``_torchdynamo_wrapper_id``, which older torches do not write)."""
    if getattr(fn, "_torchdynamo_disable", False) and _is_torchs_wrapper(fn):
        return getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", fn)
    if _is_beartype_wrapper(fn):
        return _core(fn.__wrapped__)
    return fn


def _is_torchs_wrapper(fn: Any) -> bool:
    wrapper_id = getattr(fn, "_torchdynamo_wrapper_id", None)
    if wrapper_id is not None:
        return bool(wrapper_id == id(fn))
    return _DYNAMO_FILES in getattr(getattr(fn, "__code__", None), "co_filename", "")


def _is_beartype_wrapper(fn: Any) -> bool:
    """``@beartype``'s wrapper: its mark and its generated code's name (which ``functools.wraps`` cannot copy)."""
    code = getattr(fn, "__code__", None)
    return (getattr(fn, "__beartype_wrapper", False) is True and hasattr(fn, "__wrapped__")
            and getattr(code, "co_filename", "").startswith("<@beartype("))


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
    """The gate's verdict on a flavour: ``install()`` acts on it, ``toggleshim check`` reports it."""

    mode: str  # "shim" (verified code), "fallback" (Lightning's own, unverified), "refuse" (not ours to patch)
    reason: str


def _classify(flavour: _Flavour) -> Verdict:
    """What ``install()`` does with ``flavour``, and why."""
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
        return Verdict("fallback",
                       "the source of its toggle code is unavailable (a .pyc-only install?): it cannot be verified")
    seen = KNOWN.get((toggle, untoggle))
    if seen is not None:
        return Verdict("shim", f"toggle code verified: identical to the verified releases of {_ranges(seen)}")
    certificate = _certify.lookup(toggle, untoggle, _label(flavour))  # `toggleshim certify`'s, in the project
    if certificate.certified:
        return Verdict("shim", certificate.reason)
    differs = [name for i, (name, fp) in enumerate(zip(_PATCHED, (toggle, untoggle)))
               if all(fp != pair[i] for pair in KNOWN)]
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
    optimizer: the ``LightningOptimizer`` from ``self.optimizers()`` (a ``torch.optim.Optimizer`` toggles
        too, but its steps are not counted in ``trainer.global_step``: a warning, once per optimizer).
""" + "".join(f"    {name}: {doc}\n" for name, (_, doc) in FLAGS.items())

_TOGGLE_SIGNATURE = inspect.Signature([
    inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("optimizer", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=bool)
      for name, (default, _) in FLAGS.items()),
], return_annotation=Toggle[Any])


def _make_toggle(original: Any) -> Callable[..., Any]:
    # a copy, not a wrapper (one call less per toggle); each flavour's carries its own original
    impl = _block._toggle_optimizer
    toggle_optimizer = types.FunctionType(impl.__code__, impl.__globals__, "toggle_optimizer", impl.__defaults__,
                                          impl.__closure__)
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


# torch.compile runs a block's entry points eagerly (torch.compiler.disable, as Lightning's own toggle):
# traced, the bookkeeping would become dynamo guards (or a dynamo error) and zero_grad/step be compiled.
def _disabled(fn: Callable[..., Any], like: Any = None) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)`` with ``like``'s options. torch 2.0 has only ``torch._dynamo.disable(fn)``
    (no options at all); ``recursive`` arrives in 2.1, ``reason`` in 2.8: an option is passed only where
    ``like`` carries it, which only a torch that takes it writes."""
    import torch

    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None) or importlib.import_module("torch._dynamo").disable
    options: dict[str, Any] = {}
    if getattr(like, "_torchdynamo_disable_recursive", True) is False:
        options["recursive"] = False
    reason = getattr(like, "_torchdynamo_disable_msg", None)
    if reason is not None:
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
    """The fallback ``toggle_optimizer``; with ``name``, one that first emits that flavour's kept warning."""
    original = vars(flavour.module_cls)["toggle_optimizer"]
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
    """``stacklevel`` for :func:`_emit_pending` pointing at our caller's caller, past torch's wrapper."""
    frame: types.FrameType | None = sys._getframe(2)
    level = 3  # frames: _emit_pending, the function, its caller
    while frame is not None and _DYNAMO_FILES in frame.f_code.co_filename:
        frame, level = frame.f_back, level + 1
    return level


_DYNAMO_FILES = os.path.join("", "torch", "_dynamo", "")  # in the path of the wrapper's file


def install() -> None:
    """Patch ``toggle_optimizer`` (and ``untoggle_optimizer``) on every Lightning flavour; idempotent.
    Verified code gets the shim silently; Lightning's own unverified code gets the fallback block (nesting
    raises) with a :class:`ToggleshimWarning`; anything else is left untouched with one. A warning kept
    during an import is raised first (and then nothing changes). Subclasses' own methods are never touched.
    """
    _emit_pending(list(_pending), stacklevel=3)
    _install(False)


def _install_at_import() -> None:
    """``import toggleshim``'s ``install()``: a warning raised by the filters is kept, so the import completes."""
    _install(False, defer=True, stacklevel=3)  # toggleshim/__init__.py, as install() there points


def _install(trust_unknown: bool, defer: bool = False, stacklevel: int = 3) -> dict[str, Verdict]:
    """``install()``, returning the verdict on each flavour judged; ``trust_unknown`` (and its hook) shims
    unverified code too. ``defer``: warnings the filters raise are kept in ``_pending`` (a fallback raises
    them at its first call). ``stacklevel``: counting this function as 1."""
    _hook(trust_unknown)
    _judged[_INSTALLED] = None
    flavours = _flavours()
    for flavour in flavours:  # first: an import made while judging (torch._dynamo) does not judge again
        _judged[flavour.name] = flavour.module_cls
    if flavours:
        _keep_dynamo_out()  # Lightning has loaded torch by now
    verdicts: dict[str, Verdict] = {}
    for flavour in flavours:
        kept = flavour.name if defer else None
        cls_dict = vars(flavour.module_cls)
        if _original_of(cls_dict.get("toggle_optimizer")) is not None:
            continue
        # one of ours left alone (uninstalled under someone's patch, since undone) counts as its original
        found = _unpatched(flavour)
        originals = vars(found.module_cls)
        mode, reason = verdicts[flavour.name] = _classify(found)
        if mode == "refuse":
            _warn(f"toggleshim left {_label(flavour)} untouched: {reason}. `with self.toggle_optimizer(...)` "
                  "will not work there: it fails with Python's TypeError ('NoneType' object does not support "
                  "the context manager protocol) unless that replacement returns a context manager.",
                  stacklevel + 1, kept)
            continue
        if mode == "fallback" and not trust_unknown:
            _warn(f"toggleshim: {_label(flavour)}: {reason}. `with self.toggle_optimizer(opt):` runs "
                  "Lightning's own sequence there (its toggle; zero_grad; the block; step; its untoggle in "
                  "`finally`), statements stay Lightning's own, and nested blocks raise an error. "
                  + _certify.choices_sentence(flavour.distribution, flavour.version, None not in _fingerprints(found)),
                  stacklevel + 1, kept)
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
    _judged.clear()  # not installed, nothing judged
    _spawn.unregister()
    _unhook()
    for flavour in _flavours():
        for name in _PATCHED:
            original = _original_of(vars(flavour.module_cls).get(name))
            if original is not None:
                setattr(flavour.module_cls, name, original)


def is_installed() -> bool:
    """True when every imported Lightning flavour (at least one) has the shim, not the fallback or nothing."""
    found = _flavours()
    return bool(found) and all(_mode(f) == "shim" for f in found)


def _mode(flavour: _Flavour) -> str | None:
    """"shim", "fallback", or None (not patched by toggleshim)."""
    fn = vars(flavour.module_cls).get("toggle_optimizer")
    return getattr(fn, _MODE, None) if _original_of(fn) is not None else None


def _unpatched(flavour: _Flavour) -> _Flavour:
    """``flavour`` without toggleshim: a stand-in class holding the originals (the real one untouched)."""
    cls_dict = vars(flavour.module_cls)
    originals = {name: _original_of(cls_dict[name]) or cls_dict[name] for name in _PATCHED if name in cls_dict}
    return _Flavour(flavour.name, flavour.distribution, type("Probe", (), originals), flavour.optimizer_cls)


def _ranges(releases: list[str]) -> str:
    """``["lightning 2.0.9", "lightning 2.6.6", ...]`` (oldest first) -> ``"lightning 2.0.9 to 2.6.6 (2 releases)"``."""
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
    """The shim on every flavour of Lightning's own code, verified or not (``toggleshim check``), yielding
    the verdicts; afterwards the exact objects and import hook found before."""
    flavours = _flavours()
    saved = {(f.module_cls, name): vars(f.module_cls).get(name) for f in flavours for name in _PATCHED}
    hooked, pending, judged = bool(_hooks()), dict(_pending), dict(_judged)
    uninstall()
    try:
        yield _install(True)
    finally:
        uninstall()
        for (cls, name), fn in saved.items():
            if fn is not None:
                setattr(cls, name, fn)
        _pending.update(pending)
        _judged.update(judged)
        if hooked:
            _hook(False)

