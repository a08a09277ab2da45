"""Stateful: ``install()``, ``uninstall()``, someone else's patch and ``toggleshim check``'s trust,
in any order, on every Lightning flavour this process has.

The model is a few lines: for each flavour and each of the two methods, what the class holds now,
Lightning's own function (``"lightning"``), toggleshim's (``"ours"``) or someone else's (a plain
wrapper, ``"foreign"``); and whether the import hook is in ``sys.meta_path``. Checked after every
step: the very objects in the class ``__dict__`` (toggleshim's point at the very original),
``is_installed()``, the mode ``toggleshim check`` reports, one import hook or none, the warnings
``install()`` gives (one per flavour it leaves untouched, naming why), and toggling itself: a
statement toggle is Lightning's in every state, a block works where toggleshim's method is there.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import toggleshim
from toggleshim import _patch

_METHODS = ("toggle_optimizer", "untoggle_optimizer")

# Every flavour installed, whatever ``TOGGLESHIM_FLAVOUR`` selects for the other tests: what install()
# does with one flavour can depend on another (the order it meets them in).
for _name in ("lightning.pytorch", "pytorch_lightning"):
    if importlib.util.find_spec(_name.split(".")[0]) is not None:
        importlib.import_module(_name)


def _foreign(previous: Any, name: str) -> Any:
    """Someone else's patch: a plain wrapper of what the class held (as a callback library writes)."""
    def patched(self: Any, optimizer: Any) -> Any:
        return previous(self, optimizer)

    patched.__name__ = patched.__qualname__ = f"their_{name}"
    return patched


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
        """Any arrangement to start from: each method Lightning's own, toggleshim's (maybe one left
        behind alone) or someone else's over either."""
        toggleshim.uninstall()
        self.flavours = _patch._flavours()
        assert self.flavours, "no Lightning flavour imported"
        self.lightning = {(f.name, n): vars(f.module_cls)[n] for f in self.flavours for n in _METHODS}
        assert all(_patch._foreign_reason(f, n, self.lightning[f.name, n]) is None
                   for f in self.flavours for n in _METHODS), "not Lightning's own methods to start from"
        self.held = {key: "lightning" for key in self.lightning}  # the model
        self.foreign: dict[tuple[str, str], list[Any]] = {}  # what each foreign patch replaced
        self.hooked = False
        self.modules = {f.name: _module(f) for f in self.flavours}
        toggleshim.install()
        ours = {key: vars(cls)[key[1]] for key, cls in self._classes()}
        toggleshim.uninstall()
        for key, cls in self._classes():
            start = data.draw(st.sampled_from(["lightning", "ours", "foreign"]), label=f"{key} at the start")
            if start != "lightning":
                setattr(cls, key[1], ours[key])
                self.held[key] = "ours"
            if start == "foreign":
                self.patch(cls, key)

    def flavour(self, data: st.DataObject) -> Any:
        return data.draw(st.sampled_from(self.flavours), label="flavour")

    def _install_model(self) -> set[str]:
        """What ``install()`` does, by the model; the flavours it leaves untouched (with a warning)."""
        refused = set()
        for f in self.flavours:
            if self.held[f.name, "toggle_optimizer"] == "ours":
                continue  # already patched
            if any(self.held[f.name, n] == "foreign" for n in _METHODS):
                refused.add(f.name)
                continue
            for n in _METHODS:
                self.held[f.name, n] = "ours"
        self.hooked = True
        return refused

    def _check_warnings(self, caught: list[warnings.WarningMessage], refused: set[str]) -> None:
        texts = [str(w.message) for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
        assert len(texts) == len(refused), texts
        for name in refused:  # one each, saying which flavour and why
            assert [t for t in texts if f"({name}) untouched" in t and "replaced by someone else" in t], texts

    # -- rules --
    @rule()
    def install(self) -> None:
        refused = self._install_model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
        self._check_warnings(caught, refused)
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
        self.patch(f.module_cls, (f.name, name))

    def patch(self, cls: type, key: tuple[str, str]) -> None:
        previous = vars(cls)[key[1]]
        theirs = _foreign(previous, key[1])
        setattr(cls, key[1], theirs)
        self.foreign.setdefault(key, []).append((theirs, previous, self.held[key]))
        self.held[key] = "foreign"

    @precondition(lambda self: any(self.foreign.values()))
    @rule(data=st.data())
    def someone_else_unpatches(self, data: st.DataObject) -> None:
        """The last foreign patch of a method undone: what it replaced is put back."""
        key = data.draw(st.sampled_from(sorted(k for k, v in self.foreign.items() if v)), label="method")
        if self.held[key] != "foreign":
            return  # replaced since (uninstall leaves a foreign method; install never replaces one)
        _, previous, held = self.foreign[key].pop()
        cls = next(f.module_cls for f in self.flavours if f.name == key[0])
        setattr(cls, key[1], previous)
        self.held[key] = held

    @rule()
    def toggleshim_check_trusts(self) -> None:
        """``toggleshim check``'s context: the shim on every flavour whose methods are Lightning's
        own (or toggleshim's); afterwards the very objects found before, the import hook as found."""
        before = {key: vars(cls)[key[1]] for key, cls in self._classes()}
        hooks = len(_patch._hooks())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _patch._trusting():
                saved, hooked = dict(self.held), self.hooked
                for key, held in self.held.items():
                    if held == "ours":
                        self.held[key] = "lightning"
                refused = self._install_model()
                self.check_objects()
                self.held, self.hooked = saved, hooked
        self._check_warnings(caught, refused)
        assert {key: vars(cls)[key[1]] for key, cls in self._classes()} == before
        assert all(vars(cls)[key[1]] is before[key] for key, cls in self._classes())
        assert len(_patch._hooks()) == hooks

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
                assert getattr(fn, _patch._SENTINEL, None) is self.lightning[key], f"{key}: not toggleshim's"
            else:
                assert fn is self.foreign[key][-1][0], f"{key}: someone else's patch was replaced"
        assert len(_patch._hooks()) == int(self.hooked), "not exactly one import hook while installed"

    @invariant()
    def is_installed_and_check_say_the_state(self) -> None:
        ours = [self.held[f.name, "toggle_optimizer"] == "ours" for f in self.flavours]
        assert toggleshim.is_installed() == all(ours)
        for f, shim in zip(self.flavours, ours):
            assert _patch._status(f)[0] == ("shim" if shim else "untouched"), (f.name, _patch._status(f))

    @invariant()
    def toggling_works(self) -> None:
        for f in self.flavours:
            m = self.modules[f.name]
            opt = m.trainer.optimizers[0]
            if self.held[f.name, "toggle_optimizer"] == "ours":
                with m.toggle_optimizer(opt, zero_grad=False, step=False):
                    assert [p.requires_grad for p in m.parameters()] == [True, True, False, False]
            m.toggle_optimizer(opt)  # a statement: Lightning's toggle in every state
            assert [p.requires_grad for p in m.parameters()] == [True, True, False, False]
            m.untoggle_optimizer(opt)
            assert all(p.requires_grad for p in m.parameters())

    def teardown(self) -> None:
        toggleshim.uninstall()
        for key, cls in self._classes() if hasattr(self, "flavours") else []:
            setattr(cls, key[1], self.lightning[key])
        toggleshim.install()
        assert toggleshim.is_installed()


TestInstall = InstallMachine.TestCase
# A tenth of the profile's examples (each step checks every flavour, toggling included): as long
# as the other stateful machine takes
TestInstall.settings = settings(settings.default, max_examples=max(5, settings().max_examples // 10))
