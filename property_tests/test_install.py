"""Stateful: ``install()``, ``uninstall()``, someone else's patch and ``toggleshim check``'s trust,
in any order, on every Lightning flavour this process has, whose two methods are drawn as a release
could have them.

The model is a few lines: for each flavour and each of the two methods, the code Lightning ships
(its own; marked with ``torch.compiler.disable``; changed; without source; with a signature the shim
does not know) and what the class holds now, Lightning's own function (``"lightning"``), toggleshim's
(``"ours"``: the shim or the fallback) or someone else's (a plain wrapper or a ``functools.wraps`` one,
``"foreign"``); and whether the import hook is in ``sys.meta_path``. Checked after every step: the
very objects in the class ``__dict__`` (toggleshim's point at the very original and carry its
``torch.compile`` marking), ``is_installed()``, the mode and reason ``toggleshim check`` reports,
one import hook or none, the warnings ``install()`` gives (one per flavour it leaves untouched or
gives the fallback, naming why, pointing at the caller), and toggling itself: a statement toggle is
Lightning's in every state, a block works where toggleshim's method is there. A flavour imported
later is patched by the import hook as ``install()`` would, never with ``toggleshim check``'s trust.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from _fake_release import function_like, method_copy
from _fixtures import DISABLE, DISABLE_TAKES_RECURSIVE
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import toggleshim
from toggleshim import _patch
from toggleshim._fingerprint import fingerprint_function
from toggleshim._known import KNOWN

_METHODS = ("toggle_optimizer", "untoggle_optimizer")

# Every flavour installed, whatever ``TOGGLESHIM_FLAVOUR`` selects for the other tests: what install()
# does with one flavour can depend on another (the order it meets them in).
for _name in ("lightning.pytorch", "pytorch_lightning"):
    if importlib.util.find_spec(_name.split(".")[0]) is not None:
        importlib.import_module(_name)


def _foreign(previous: Any, name: str, style: str, flavour: str) -> Any:
    """Someone else's patch: a plain wrapper of what the class held (as a callback library writes),
    one made with ``functools.wraps`` (which copies the name, ``__dict__`` and torch's marks), or one
    defined in another module of the flavour itself, under another name."""
    def patched(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        return previous(self, optimizer, *args, **kwargs)

    if style == "wraps":
        return functools.wraps(previous)(patched)
    patched.__name__ = patched.__qualname__ = f"their_{name}"
    if style.startswith("in "):  # e.g. "in Callback": sorts before "LightningModule", "in Patches" after
        patched.__qualname__ = f"{style[3:]}.{name}"
        patched.__module__ = f"{flavour}.utilities.patches"
    return patched


# The code a release could ship for each method; "changed" and "unreadable" are Lightning's own
# methods whose code toggleshim has not verified (the fallback), "signature" one it refuses.
_CODES = ("own", "marked", "changed", "unreadable", "signature")
_FIRST, _SECOND = ("self", "module", "this"), ("optimizer", "opt", "optimizers", "optimizer_", "zzz")
_EXTRAS = ("step=True", "zero_grad=False", "sync_grad=True", "*args", "**kwargs")


@st.composite
def _release_method(draw: st.DrawFn, fn: Any, key: tuple[str, str]) -> tuple[str, Any]:
    """(code, function): Lightning's method ``fn`` as a release could ship it."""
    code = draw(st.sampled_from(_CODES), label=f"{key} code")
    if code == "own":
        return code, fn
    if code == "marked":  # Lightning's newest source does this
        recursive = draw(st.booleans(), label="recursive")  # (torch 2.0's disable takes no options)
        options = f"(recursive={recursive})" if DISABLE_TAKES_RECURSIVE else ""
        return code, method_copy(fn, (), decorate=DISABLE + options)
    if code == "changed":  # a new optional parameter: the shim could wrap it, but the code is not verified
        return code, method_copy(fn, ((") -> None:", ", extra: int = 1) -> None:"),))
    if code == "unreadable":
        source = f"def {fn.__name__}(self, optimizer):\n    return ORIGINAL(self, optimizer)\n"
        return code, function_like(fn, source, {"ORIGINAL": fn}, readable=False)
    first, second = "self", "optimizer"  # as often as not, only the extra parameters differ
    if draw(st.booleans(), label="renamed"):
        first, second = draw(st.sampled_from(_FIRST), label="first"), draw(st.sampled_from(_SECOND), label="second")
    extras = draw(st.lists(st.sampled_from(_EXTRAS), unique=True, min_size=(first, second) == ("self", "optimizer")),
                  label="extra parameters")
    parameters = ", ".join([first, second, *sorted(extras, key=_EXTRAS.index)])
    source = f"def {fn.__name__}({parameters}):\n    return ORIGINAL({first}, {second})\n"
    return code, function_like(fn, source, {"ORIGINAL": fn})


class _Loader:
    """The real loader of a flavour imported later, as the import hook wraps it."""

    def __init__(self) -> None:
        self.executed: list[Any] = []

    def exec_module(self, module: Any) -> None:
        self.executed.append(module)


def _module(flavour: Any) -> Any:
    """A LightningModule of ``flavour`` with two heads, each with its optimizer, on a stand-in trainer."""
    m = flavour.module_cls()
    m.a, m.b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    opts = [torch.optim.SGD(m.a.parameters(), lr=0.1), torch.optim.SGD(m.b.parameters(), lr=0.1)]
    m._trainer = SimpleNamespace(optimizers=opts, strategy=SimpleNamespace())
    return m


class InstallMachine(RuleBasedStateMachine):
    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """Each flavour's methods as a release could ship them; then any arrangement to start from:
        each method Lightning's own, toggleshim's (maybe one left behind alone) or someone else's over
        either."""
        toggleshim.uninstall()
        self.flavours = _patch._flavours()
        assert self.flavours, "no Lightning flavour imported"
        self.real = {(f.name, n): vars(f.module_cls)[n] for f in self.flavours for n in _METHODS}
        assert all(_patch._foreign_reason(f, n, self.real[f.name, n]) is None
                   for f in self.flavours for n in _METHODS), "not Lightning's own methods to start from"
        self.code, self.lightning = {}, {}
        for key, cls in self._classes():
            self.code[key], self.lightning[key] = data.draw(_release_method(self.real[key], key))
            setattr(cls, key[1], self.lightning[key])
        self.held = {key: "lightning" for key in self.lightning}  # the model
        self.trusting = False  # inside toggleshim check's context
        # each foreign patch: (it, what it replaced, the model's word for that, its style); the last
        # one is the patch the class holds, where the model says "foreign"
        self.foreign: dict[tuple[str, str], list[Any]] = {}
        self.hooked = False
        self.modules = {f.name: _module(f) for f in self.flavours}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            toggleshim.install()  # the shim or the fallback toggle, as install() makes them
            ours = {key: vars(cls)[key[1]] for key, cls in self._classes()}
            toggleshim.uninstall()
            with _patch._trusting():  # the shim's untoggle, also where the code is not verified
                ours.update({key: vars(cls)[key[1]] for key, cls in self._classes() if key[1] == "untoggle_optimizer"})
        for key, cls in self._classes():
            made = _patch._original_of(ours[key]) is not None  # not where install() refuses the flavour
            can = ["lightning", "foreign"] + ["ours", "foreign over ours"] * made
            start = data.draw(st.sampled_from(can), label=f"{key} at the start")
            if start in ("ours", "foreign over ours"):
                setattr(cls, key[1], ours[key])
                self.held[key] = "ours"
            if start.startswith("foreign"):
                self.patch(cls, key, data)
        if data.draw(st.booleans(), label="the import hook at the start"):  # left by `import toggleshim`
            sys.meta_path.insert(0, _patch._ImportHook())
            self.hooked = True

    def flavour(self, data: st.DataObject) -> Any:
        return data.draw(st.sampled_from(self.flavours), label="flavour")

    def verdict(self, name: str) -> tuple[str, str]:
        """("shim" | "fallback" | "refuse", words of the reason): the gate's verdict, by the model,
        on the flavour as it would be without toggleshim."""
        for n in _METHODS:
            if self.held[name, n] == "foreign":
                how = "wrapped" if self.foreign[name, n][-1][3] == "wraps" else "replaced"
                return "refuse", f"{n} was already {how} by someone else"
            if self.code[name, n] == "signature":
                return "refuse", f"{n} has a signature the shim does not know"
        if any(self.code[name, n] == "unreadable" for n in _METHODS):
            return "fallback", "the source of its toggle code is unavailable"
        prints = [fingerprint_function(getattr(self.lightning[name, n], "__wrapped__", self.lightning[name, n]))
                  for n in _METHODS]
        differs = [n for n in _METHODS if self.code[name, n] == "changed"]
        if differs:
            return "fallback", (f"its {' and '.join(differs)} code differs from every release toggleshim verified "
                                f"(fingerprints {prints[0][:12]}, {prints[1][:12]}; ")  # type: ignore[index]
        seen = KNOWN[tuple(prints)]  # type: ignore[index]
        dists = list(dict.fromkeys(r.split()[0] for r in seen))  # each distribution's range on its own
        versions = {d: [r.split()[1] for r in seen if r.split()[0] == d] for d in dists}
        spans = " and ".join(f"{d} {v[0]}" + (f" to {v[-1]}" if len(v) > 1 else "") for d, v in versions.items())
        plural = "s" if len(seen) != 1 else ""
        return "shim", (f"toggle code verified: identical to the verified releases of {spans} ({len(seen)} "
                        f"release{plural})")

    def mode(self, name: str) -> str:
        """Of toggleshim's toggle on the flavour, where the class holds it: the fallback on code not
        verified, unless ``toggleshim check`` made it (its context restores what was there before)."""
        unverified = any(self.code[name, n] in ("changed", "unreadable") for n in _METHODS)
        return "fallback" if unverified and not self.trusting else "shim"

    def _install_model(self, trust: bool = False) -> dict[str, str]:
        """What ``install()`` does, by the model; the warning each flavour gets (words of it)."""
        warned = {}
        for f in self.flavours:
            if self.held[f.name, "toggle_optimizer"] == "ours":
                continue  # already patched
            mode, why = self.verdict(f.name)
            if mode == "refuse":
                warned[f.name] = f"({f.name}) untouched: {why}"
                continue
            if mode == "fallback" and not trust:
                warned[f.name] = f"({f.name}): {why}"
                self.held[f.name, "toggle_optimizer"] = "ours"
                if self.held[f.name, "untoggle_optimizer"] == "ours":
                    self.held[f.name, "untoggle_optimizer"] = "lightning"  # the fallback keeps Lightning's
                continue
            for n in _METHODS:
                self.held[f.name, n] = "ours"
        self.hooked = True
        return warned

    def _check_warnings(self, caught: list[warnings.WarningMessage], warned: dict[str, str]) -> None:
        texts = [str(w.message) for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
        assert len(texts) == len(warned), (texts, warned)
        for name, words in warned.items():  # one each, saying which flavour (and release) and why
            dist = next(f.distribution for f in self.flavours if f.name == name)
            assert [t for t in texts if words in t and f"{dist} {importlib.metadata.version(dist)} ({name})" in t], (
                words, texts)

    # -- rules --
    @rule()
    def install(self) -> None:
        warned = self._install_model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        self._check_warnings(caught, warned)
        assert all(w.filename == __file__ for w in caught), "a warning that does not point at install()'s caller"

    @rule()
    def uninstall(self) -> None:
        toggleshim.uninstall()
        for key, held in self.held.items():
            if held == "ours":
                self.held[key] = "lightning"
        self.hooked = False

    @rule(data=st.data(), name=st.sampled_from(_METHODS))
    def someone_else_patches(self, data: st.DataObject, name: str) -> None:
        f = self.flavour(data)
        self.patch(f.module_cls, (f.name, name), data)

    def patch(self, cls: type, key: tuple[str, str], data: st.DataObject) -> None:
        previous = vars(cls)[key[1]]
        style = data.draw(st.sampled_from(["plain", "wraps", "in Callback", "in Patches"]), label="their patch")
        theirs = _foreign(previous, key[1], style, key[0])
        setattr(cls, key[1], theirs)
        self.foreign.setdefault(key, []).append((theirs, previous, self.held[key], style))
        self.held[key] = "foreign"

    @precondition(lambda self: any(self.foreign.values()))
    @rule(data=st.data())
    def someone_else_unpatches(self, data: st.DataObject) -> None:
        """The last foreign patch of a method undone: what it replaced is put back."""
        key = data.draw(st.sampled_from(sorted(k for k, v in self.foreign.items() if v)), label="method")
        if self.held[key] != "foreign":
            return  # replaced since (uninstall leaves a foreign method; install never replaces one)
        _, previous, held, _ = self.foreign[key].pop()
        cls = next(f.module_cls for f in self.flavours if f.name == key[0])
        setattr(cls, key[1], previous)
        self.held[key] = held

    @rule(data=st.data(), then_import=st.booleans())
    def toggleshim_check_trusts(self, data: st.DataObject, then_import: bool) -> None:
        """``toggleshim check``'s context: the shim on every flavour whose methods are Lightning's
        own (or toggleshim's), verified or not; afterwards the very objects found before, the import
        hook as found (and, maybe, a flavour imported right after: the trust is gone)."""
        before = {key: vars(cls)[key[1]] for key, cls in self._classes()}
        hooks = len(_patch._hooks())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _patch._trusting():
                saved, hooked, self.trusting = dict(self.held), self.hooked, True
                for key, held in self.held.items():
                    if held == "ours":
                        self.held[key] = "lightning"
                warned = self._install_model(trust=True)
                self.check_objects()
                self.is_installed_and_check_say_the_state()
                self.held, self.hooked, self.trusting = saved, hooked, False
        self._check_warnings(caught, warned)
        assert {key: vars(cls)[key[1]] for key, cls in self._classes()} == before
        assert all(vars(cls)[key[1]] is before[key] for key, cls in self._classes())
        assert len(_patch._hooks()) == hooks
        if then_import and self.hooked:
            self.a_flavour_is_imported_through_the_hook(data)

    @precondition(lambda self: self.hooked)
    @rule(data=st.data())
    def a_flavour_is_imported_through_the_hook(self, data: st.DataObject) -> None:
        """A flavour imported now: its class fresh, with Lightning's own methods (nobody patched it
        yet); once its ``core.module`` has run, the hook's loader runs ``install()``, as ``import
        toggleshim`` did (without ``toggleshim check``'s trust, whenever that ran)."""
        f = self.flavour(data)
        for n in _METHODS:
            setattr(f.module_cls, n, self.lightning[f.name, n])
            self.held[f.name, n] = "lightning"
            self.foreign.pop((f.name, n), None)
        warned = self._install_model()
        loader, module = _Loader(), types.ModuleType("core_module")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _patch._PatchingLoader(loader).exec_module(module)
        assert loader.executed == [module]
        self._check_warnings(caught, warned)

    def _classes(self) -> list[tuple[tuple[str, str], type]]:
        return [((f.name, n), f.module_cls) for f in self.flavours for n in _METHODS]

    # -- invariants --
    @invariant()
    def check_objects(self) -> None:
        for key, cls in self._classes():
            fn, held = vars(cls)[key[1]], self.held[key]
            if held == "lightning":
                assert fn is self.lightning[key], f"{key}: not Lightning's own function"
            elif held == "ours":
                assert _patch._original_of(fn) is self.lightning[key], f"{key}: not toggleshim's"
                # torch.compile runs ours eagerly, as Lightning's newest source marks its own
                assert getattr(fn, "_torchdynamo_disable", None) is True, key
                recursive = getattr(self.lightning[key], "_torchdynamo_disable_recursive", True)
                assert fn._torchdynamo_disable_recursive == recursive, key
            else:
                assert fn is self.foreign[key][-1][0], f"{key}: someone else's patch was replaced"
        assert len(_patch._hooks()) == int(self.hooked), "not exactly one import hook while installed"
        if self.hooked:  # first, so that it sees a flavour's import before any finder that would find it
            assert isinstance(sys.meta_path[0], _patch._ImportHook), sys.meta_path

    @invariant()
    def is_installed_and_check_say_the_state(self) -> None:
        modes = [self.mode(f.name) if self.held[f.name, "toggle_optimizer"] == "ours" else "untouched"
                 for f in self.flavours]
        assert toggleshim.is_installed() == all(m == "shim" for m in modes)
        for f, mode in zip(self.flavours, modes):
            status, why = _patch._status(f)
            assert status == mode, (f.name, status, mode)
            assert self.verdict(f.name)[1] in why, (f.name, why, self.verdict(f.name))

    @invariant()
    def toggling_works(self) -> None:
        for f in self.flavours:
            m = self.modules[f.name]
            opt = m.trainer.optimizers[0]
            if self.held[f.name, "toggle_optimizer"] == "ours":  # the shim's block or the fallback's
                with m.toggle_optimizer(opt, zero_grad=False, step=False):
                    assert [p.requires_grad for p in m.parameters()] == [True, True, False, False]
            m.toggle_optimizer(opt)  # a statement: Lightning's toggle in every state
            assert [p.requires_grad for p in m.parameters()] == [True, True, False, False]
            m.untoggle_optimizer(opt)
            assert all(p.requires_grad for p in m.parameters())

    def teardown(self) -> None:
        toggleshim.uninstall()
        for key, cls in self._classes() if hasattr(self, "real") else []:
            setattr(cls, key[1], self.real[key])
        toggleshim.install()
        assert toggleshim.is_installed()


TestInstall = InstallMachine.TestCase
# A tenth of the profile's examples (each step checks every flavour, toggling included): as long
# as the other stateful machine takes
TestInstall.settings = settings(settings.default, max_examples=max(5, settings().max_examples // 10))


class _Finder:
    """A ``sys.meta_path`` entry: finds ``spec`` (or nothing); maybe equal to every object (as
    ``unittest.mock.ANY`` is), maybe without ``find_spec`` (an old-style finder)."""

    def __init__(self, spec: Any, equal_to_all: bool) -> None:
        self.spec, self.equal_to_all, self.asked = spec, equal_to_all, 0

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        self.asked += 1
        return self.spec

    def __eq__(self, other: object) -> bool:
        return self.equal_to_all or other is self

    __hash__ = object.__hash__


class _OldFinder:
    def find_module(self, fullname: str, path: Any = None) -> None:  # pragma: no cover - never asked
        raise AssertionError("an old-style finder was asked")


_FINDERS = st.one_of(
    st.builds(_Finder, st.one_of(st.none(), st.builds(lambda loader: importlib.machinery.ModuleSpec("m", loader),
                                                      st.sampled_from([_Loader, object]).map(lambda c: c()))),
              st.booleans()),
    st.builds(_OldFinder),
    st.builds(_patch._ImportHook),
)


@given(finders=st.lists(_FINDERS, max_size=5), at=st.integers(0, 5),
       name=st.sampled_from(["lightning.pytorch.core.module", "pytorch_lightning.core.module",
                             "lightning.pytorch.core.optimizer", "lightning", "json"]))
def test_the_import_hook_finds_what_the_other_finders_find(finders: list[Any], at: int, name: str) -> None:
    """The hook asks the finders after it (and before it), skipping every import hook of toggleshim's
    and the old-style finders, in order; the first spec found is the answer, its loader wrapped to
    install toggleshim after it ran (where it runs modules with ``exec_module``). Any module but a
    flavour's ``core.module`` is not the hook's business: None, nobody asked."""
    hook = _patch._ImportHook()
    path = [*finders[:at], hook, *finders[at:]]
    asked = [f for f in path if isinstance(f, _Finder)]
    loaders = [f.spec.loader if isinstance(f, _Finder) and f.spec else None for f in path]
    saved = sys.meta_path[:]
    sys.meta_path[:] = path
    try:
        spec = hook.find_spec(name, None)
    finally:
        sys.meta_path[:] = saved
    if name not in ("lightning.pytorch.core.module", "pytorch_lightning.core.module"):
        assert spec is None and all(f.asked == 0 for f in asked)
        return
    first = next((i for i, f in enumerate(path) if isinstance(f, _Finder) and f.spec is not None), None)
    if first is None:
        assert spec is None and all(f.asked == 1 for f in asked)
        return
    assert spec is path[first].spec
    assert [f.asked for f in asked] == [int(i <= first) for i, f in enumerate(path) if isinstance(f, _Finder)]
    if isinstance(loaders[first], _Loader):
        assert isinstance(spec.loader, _patch._PatchingLoader) and spec.loader._loader is loaders[first]
    else:
        assert spec.loader is loaders[first]  # no exec_module: left as it is
