"""Import orders toggleshim must survive (issue 25, points 4 and 5), each in a fresh process, as users run it.

Another import hook in front of toggleshim's (typeguard's import hook, ``beartype.claw``, a plain finder
delegating to ``PathFinder``): Lightning imported after it is still patched, and a ``with`` block runs
under a real ``Trainer.fit``. ``sys.meta_path`` stays a plain list in the order it shows; toggleshim's
finder patches a flavour it finds, one another finder loaded at the next import it is asked about,
and one no import showed it at the next ``Trainer``'s construction (``toggleshim_trainer.py``).
Issue 44's cases 1-4 (a finder delegating to every other, finders replaced by index, the list rebound,
Lightning imported by another thread meanwhile) are in the middle, each in a fresh process.

Warnings as errors (``python -W error``, pytest's ``filterwarnings = error``), in both import orders, on
verified and on unverified toggle code: the imports complete, and toggleshim's warning is raised from
toggleshim's own entry points (the fallback ``toggle_optimizer``, ``toggleshim.toggle()``, ``install()``)
before anything changes.

The unverified code: with toggleshim first, its list of verified code is emptied before Lightning is
imported (the installed Lightning's code is then unverified to it); with Lightning first, its toggle
is replaced by a changed copy under the label 2.7.0 before ``import toggleshim`` (``_fake_release``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures import half_of, state, three_heads

import toggleshim
from toggleshim import _patch
from toggleshim._flavours import by_name

TESTS = Path(__file__).parent
WORKTREE = TESTS.parent


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(WORKTREE), os.environ.get("PYTHONPATH", "")])}


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=600, cwd=cwd)


# A tiny GAN-like module under a real Trainer, manual optimization, one `with` block per optimizer:
# inside each block only that optimizer's parameters train; every step really updates.
_FIT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import {flavour} as pl

class TwoHeads(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
        self.inside = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        (x,) = batch
        with self.toggle_optimizer(opt_a):
            self.inside.append((self.a.weight.requires_grad, self.b.weight.requires_grad))
            self.manual_backward((self.a(x) + self.b(x)).pow(2).mean())
        with self.toggle_optimizer(opt_b):
            self.inside.append((self.a.weight.requires_grad, self.b.weight.requires_grad))
            self.manual_backward((self.a(x) - self.b(x)).pow(2).mean())

model = TwoHeads()
before = [p.detach().clone() for p in model.parameters()]
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, DataLoader(TensorDataset(torch.randn(12, 2, generator=torch.Generator().manual_seed(0))),
                              batch_size=4))
assert model.inside == [(True, False), (False, True)] * 3, model.inside
assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters())), "a step did not happen"
assert all(p.requires_grad for p in model.parameters())
print("fit ok")
"""

# Under typeguard's and beartype's checks Lightning's own Trainer.fit fails on Lightning's own hints
# (a 0 returned for a bool), with or without toggleshim: there the module gets a real Trainer, not fit.
_ATTACHED = """
import torch
import {flavour} as pl

class TwoHeads(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)

m = TwoHeads()
opts = [torch.optim.SGD(m.a.parameters(), lr=0.1), torch.optim.SGD(m.b.parameters(), lr=0.1)]
trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
trainer.strategy.optimizers = opts
m.trainer = trainer
before = m.b.weight.detach().clone()
with m.toggle_optimizer(opts[1]) as opt:
    assert opt is opts[1] and not m.a.weight.requires_grad and m.b.weight.requires_grad
    (m.a(torch.ones(1, 2)) + m.b(torch.ones(1, 2))).sum().backward()
assert m.a.weight.requires_grad and m.a.weight.grad is None and not torch.equal(before, m.b.weight)
print("block ok")
"""

_PATCHED = """
import sys
from toggleshim import _patch
cls = sys.modules["{flavour}"].LightningModule
assert toggleshim.is_installed()
assert vars(cls)["toggle_optimizer"].__module__ == "toggleshim._block", vars(cls)["toggle_optimizer"]
assert _patch._original_of(vars(cls)["toggle_optimizer"]) is not None
assert _patch._original_of(vars(cls)["untoggle_optimizer"]) is not None
from toggleshim import _spawn
import colorsys  # a module not loaded yet: behind another finder, its import registers the Trainer
assert _spawn.registered(sys.modules["{flavour}"].Trainer)  # spawned ranks import toggleshim
loader = sys.modules["{flavour}.core.module"].__spec__.loader
print("loaded by", type(loader).__name__, "over", type(getattr(loader, "_loader", None)).__name__)
"""


# point 4: an import hook in front of toggleshim's


@pytest.mark.one_flavour_by_default
@pytest.mark.parametrize("how", ["import {flavour}", "importlib.import_module({flavour!r})",
                                 "importlib.import_module({flavour!r} + '.core.module')"])
def test_lightning_behind_a_delegating_finder_is_patched_and_trains(flavour: str, how: str) -> None:
    """A finder inserted in front of toggleshim's hook, answering every module itself (toggleshim's
    hook may never be asked): the flavour is patched by the first ``Trainer`` at the latest, however
    the user's code imported Lightning: an import statement, or ``importlib.import_module``, of the
    package or of ``core.module`` itself. (Until issue 44 ``sys.meta_path`` was a list subclass that
    handed toggleshim's hook out first; it is a plain list now, and the ``Trainer`` is the last point.)"""
    name = flavour
    code = textwrap.dedent("""
        import importlib, importlib.machinery, sys, warnings
        import toggleshim

        class Delegating:  # answers for every module itself: toggleshim's hook is never asked
            def find_spec(self, fullname, path, target=None):
                return importlib.machinery.PathFinder.find_spec(fullname, path, target)

        sys.meta_path.insert(0, Delegating())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            {how}
        assert not [w for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)], caught
        assert type(sys.meta_path) is list and isinstance(sys.meta_path[0], Delegating)
        import {flavour}
    """).format(flavour=name, how=how.format(flavour=name)) + _FIT.format(flavour=name) + _PATCHED.format(
        flavour=name)
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert "fit ok" in proc.stdout and "loaded by SourceFileLoader" in proc.stdout, proc.stdout


# Lightning < 2.4 warns at its own import (pkg_resources, lightning_utilities' deprecations): those
# are Lightning's, raised under -W error with or without toggleshim; every other warning is an error
_LIGHTNINGS_OWN = ("ignore::DeprecationWarning", "ignore:pkg_resources is deprecated:UserWarning")


def test_lightning_behind_typeguards_import_hook_is_patched() -> None:
    """typeguard's finder answers for ``lightning.pytorch.core.*`` in front of toggleshim's: its loader
    runs ``core.module`` (instrumented as the user asked), and toggleshim's finder, asked about the
    next module Lightning imports, patches the flavour before ``import lightning.pytorch`` returns."""
    code = textwrap.dedent("""
        import sys
        import toggleshim
        from typeguard import install_import_hook
        # its finder goes in front and instruments lightning.pytorch.core.* (where LightningModule is
        # defined; typeguard's checks break other parts of Lightning 2.0's own code)
        install_import_hook(["lightning.pytorch.core"])
        assert type(sys.meta_path[0]).__name__ == "TypeguardFinder", sys.meta_path
        import lightning.pytorch
    """) + _PATCHED.format(flavour="lightning.pytorch") + _ATTACHED.format(flavour="lightning.pytorch")
    proc = _run([sys.executable, "-W", "ignore", "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded by TypeguardLoader" in proc.stdout and "block ok" in proc.stdout, proc.stdout


def test_lightning_under_beartype_claw_is_patched_and_uninstall_gives_beartypes_method_back() -> None:
    code = textwrap.dedent("""
        import sys
        import toggleshim
        from beartype import BeartypeConf
        from beartype.claw import beartype_package
        # its path hook's loader decorates every method with @beartype; checking annotated assignments
        # too (the default), LightningModule() fails on Lightning's own hints (a NameError), toggleshim or not
        beartype_package("lightning", conf=BeartypeConf(claw_is_pep526=False))
        import lightning.pytorch
    """) + _PATCHED.format(flavour="lightning.pytorch") + textwrap.dedent("""
        cls = lightning.pytorch.LightningModule
        originals = [_patch._original_of(vars(cls)[n]) for n in ("toggle_optimizer", "untoggle_optimizer")]
        assert all(getattr(o, "__beartype_wrapper", False) for o in originals), originals  # beartype's, kept
    """) + _ATTACHED.format(flavour="lightning.pytorch") + textwrap.dedent("""
        toggleshim.uninstall()
        assert [vars(cls)[n] for n in ("toggle_optimizer", "untoggle_optimizer")] == originals
        print("uninstalled")
    """)
    proc = _run([sys.executable, "-W", "ignore", "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "block ok" in proc.stdout and "uninstalled" in proc.stdout, proc.stdout


def test_lightning_behind_a_finder_after_uninstall_is_left_alone_until_install() -> None:
    code = textwrap.dedent("""
        import importlib.machinery, sys
        import toggleshim

        class Delegating:
            def find_spec(self, fullname, path, target=None):
                return importlib.machinery.PathFinder.find_spec(fullname, path, target)

        toggleshim.uninstall()
        sys.meta_path.insert(0, Delegating())
        import lightning.pytorch as pl
        import json.tool  # more imports: nothing of toggleshim's acts
        assert not toggleshim.is_installed()
        assert not hasattr(vars(pl.LightningModule)["toggle_optimizer"], "_toggleshim_original")
        toggleshim.install()
        assert toggleshim.is_installed()
        print("ok")
    """)
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


@pytest.mark.parametrize("finder", ["in front", "none"])
def test_warning_at_a_lightning_import_points_at_lightnings_import_statement(finder: str) -> None:
    """The gate's warning for a flavour imported later points where that import happened in
    Lightning's package (the statement importing core.module), never into toggleshim; where a finder in
    front answers every import (toggleshim's hook never asked), it comes at the first ``Trainer(...)``
    and points at that line, the user's."""
    code = textwrap.dedent("""
        import importlib.machinery, os, sys, warnings
        import toggleshim
        from toggleshim import _known
        _known.KNOWN.clear()  # the installed Lightning's code is now unverified to toggleshim: a warning

        class Delegating:
            def find_spec(self, fullname, path, target=None):
                return importlib.machinery.PathFinder.find_spec(fullname, path, target)

        if {behind}:
            sys.meta_path.insert(0, Delegating())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import lightning.pytorch
            if {behind}:
                lightning.pytorch.Trainer(logger=False, enable_checkpointing=False)  # the user's line
        (w,) = [w for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
        package = os.path.dirname(lightning.pytorch.__file__)
        if {behind}:
            # at the Trainer, or at an import asked of toggleshim's finder meanwhile: never in toggleshim
            assert "toggleshim" not in w.filename and not w.filename.startswith("<frozen"), w.filename
        else:
            assert w.filename.startswith(package + os.sep), w.filename
        print(os.path.relpath(w.filename, package), w.lineno)
    """).format(behind=finder == "in front")
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]


# the install an import runs (the hook's loader, in this process): never raises what it can hold back,
# never holds back an interrupt


@pytest.fixture
def unpatched(flavour: str) -> Iterator[str]:
    """``flavour`` as if its ``core.module`` had just run: not patched yet."""
    toggleshim.uninstall()
    yield flavour
    toggleshim.uninstall()
    toggleshim.install()


def _at_import() -> None:
    # what _PatchingLoader.exec_module runs once the real loader has run the module
    _patch._judge_on_import(False, stacklevel=2)


def test_an_install_at_an_import_patches(unpatched: str) -> None:
    assert not toggleshim.is_installed()
    _at_import()
    assert toggleshim.is_installed()


def test_an_install_at_an_import_turns_a_failure_into_a_warning_naming_it(
    unpatched: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(flavour: Any) -> Any:
        raise ValueError("a broken gate")

    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(_patch, "_classify", broken)
        warnings.simplefilter("always")
        _at_import()  # returns
        (w,) = [w for w in caught if f"could not patch {unpatched} " in str(w.message)]
        assert issubclass(w.category, toggleshim.ToggleshimWarning) and "ValueError: a broken gate" in str(w.message)
        assert w.filename == __file__  # at the import (here: the caller)
        with pytest.raises(ValueError, match="a broken gate"):  # install() tries again: the error, unchanged
            toggleshim.install()


def test_an_install_at_an_import_failing_under_warnings_as_errors_goes_to_the_unraisable_hook(
    unpatched: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the warning naming the failure cannot be shown (the filters raise it), the very exception
    goes to ``sys.unraisablehook`` (printed with its traceback; pytest makes it a warning)."""
    error = ValueError("a broken gate")
    reported: list[Any] = []

    def broken(flavour: Any) -> Any:
        raise error

    with monkeypatch.context() as patch, warnings.catch_warnings():
        patch.setattr(_patch, "_classify", broken)
        patch.setattr(sys, "unraisablehook", reported.append)
        warnings.simplefilter("error")
        _at_import()  # returns
    assert [r.exc_value for r in reported if unpatched in r.err_msg] == [error]
    assert all(r.exc_traceback is error.__traceback__ is not None for r in reported)


def test_an_install_at_an_import_lets_an_interrupt_through(unpatched: str, monkeypatch: pytest.MonkeyPatch) -> None:
    interrupt = KeyboardInterrupt()

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise interrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt) as info:
        patch.setattr(_patch, "_install", interrupted)
        _at_import()
    assert info.value is interrupt


def test_an_install_at_an_import_under_warnings_as_errors_keeps_the_warning(
    unpatched: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch, warnings.catch_warnings():
        patch.setattr(_patch, "KNOWN", {})  # its code unverified to toggleshim: the fallback, and a warning
        warnings.simplefilter("error")
        _at_import()  # returns
        loaded = _patch._loaded(by_name(unpatched))
        assert loaded is not None and _patch._mode(loaded) == "fallback"
        m = three_heads(unpatched)
        before = state(m)
        with pytest.raises(toggleshim.ToggleshimWarning, match="Raised here, not during the import"):
            m.toggle_optimizer(m.opts[0])
        assert state(m) == before


# the meta path: a plain list, in the order it shows, toggleshim's finder one entry of it


def test_the_meta_path_stays_a_plain_list_in_the_order_it_shows() -> None:
    """``import toggleshim`` puts one plain finder first and nothing else: ``type(sys.meta_path) is
    list``, iteration, indexing, ``copy`` and ``pickle`` agree; a finder inserted later stays where it
    was put; ``uninstall()`` takes the finder out and leaves every other entry in its place."""
    code = textwrap.dedent("""
        import copy, importlib.machinery, pickle, sys
        plain = list(sys.meta_path)
        import toggleshim
        from toggleshim import _patch

        class Theirs:
            def find_spec(self, fullname, path, target=None):
                return None

        theirs = Theirs()
        sys.meta_path.insert(0, theirs)
        (hook,) = _patch._hooks()
        assert type(sys.meta_path) is list and sys.meta_path[:2] == [theirs, hook]
        assert list(sys.meta_path) == [sys.meta_path[i] for i in range(len(sys.meta_path))] == [theirs, hook, *plain]
        assert copy.copy(sys.meta_path) == sys.meta_path and type(copy.copy(sys.meta_path)) is list
        assert [type(f) for f in pickle.loads(pickle.dumps(sys.meta_path[2:]))] == [type(f) for f in plain]
        toggleshim.uninstall()
        assert type(sys.meta_path) is list and sys.meta_path == [theirs, *plain]
        toggleshim.install()
        assert sys.meta_path[0] is _patch._hooks()[0] and sys.meta_path[1:] == [theirs, *plain]
        print("ok")
    """)
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr[-3000:]


# issue 44, cases 1-4: every finder arrangement and thread interleaving ends patched (each case in a
# fresh process, trained under a real Trainer.fit); before issue 44 case 1 died with RecursionError,
# cases 2-4 trained unpatched (the first block: 'NoneType' object does not support the context manager
# protocol), silently

_RECORD = """
import warnings
warnings.simplefilter("always")
_caught = warnings.catch_warnings(record=True)
_warned = _caught.__enter__()
"""
_NO_WARNING = """
assert not [w for w in _warned if "toggleshim" in str(w.message).lower()], [str(w.message) for w in _warned]
"""

_CASES_44 = {
    "1: a finder delegating to every other finder, inserted at 0": """
        import importlib.machinery, sys
        import toggleshim

        class Delegating:  # asks the other finders (toggleshim's too), skipping itself
            def find_spec(self, fullname, path, target=None):
                for finder in sys.meta_path:
                    if finder is not self and hasattr(finder, "find_spec"):
                        spec = finder.find_spec(fullname, path, target)
                        if spec is not None:
                            return spec
                return None

        sys.meta_path.insert(0, Delegating())
        import {flavour}
        assert toggleshim.is_installed()  # patched at the import itself: toggleshim's finder was asked
    """,
    "2: finders replaced by index after another finder was inserted at 0": """
        import importlib.machinery, sys
        import toggleshim

        class Theirs:
            def find_spec(self, fullname, path, target=None):
                return None

        class Better(Theirs):  # their finder's next version, put where the old one is
            pass

        sys.meta_path.insert(0, Theirs())
        for i, f in enumerate(sys.meta_path):
            if type(f) is Theirs:
                sys.meta_path[i] = Better()
        assert type(sys.meta_path[0]) is Better and type(sys.meta_path[1]).__name__ == "_ImportHook"
        import {flavour}
        assert toggleshim.is_installed()
    """,
    "2b: toggleshim's own finder replaced by index": """
        import importlib.machinery, sys
        import toggleshim

        class Finder:
            def find_spec(self, fullname, path, target=None):
                return importlib.machinery.PathFinder.find_spec(fullname, path, target)

        for i, f in enumerate(sys.meta_path):
            if type(f).__name__ == "_ImportHook":
                sys.meta_path[i] = Finder()  # no finder of toggleshim's is left: the Trainer patches
        import {flavour}
    """,
    "3: import toggleshim while another thread is importing Lightning": """
        import sys, threading

        inside, go = threading.Event(), threading.Event()

        class Pause:  # holds the Lightning import in its core.module, LightningModule not defined yet
            def find_spec(self, fullname, path, target=None):
                core = sys.modules.get("{flavour}.core.module")
                if core is not None and not hasattr(core, "LightningModule") and not inside.is_set():
                    inside.set()
                    go.wait(60)
                return None

        sys.meta_path.insert(0, Pause())
        lightning = threading.Thread(target=lambda: __import__("{flavour}"))
        lightning.start()
        assert inside.wait(300), "the other thread never reached core.module"
        import toggleshim  # while that thread is inside core.module
        go.set()
        lightning.join()
        import {flavour}
    """,
    "4: sys.meta_path rebound with a finder answering every import in front": """
        import importlib.machinery, sys
        import toggleshim

        class Finder:
            def find_spec(self, fullname, path, target=None):
                return importlib.machinery.PathFinder.find_spec(fullname, path, target)

        sys.meta_path = [Finder()] + sys.meta_path
        import {flavour}
    """,
}


@pytest.mark.one_flavour_by_default
@pytest.mark.parametrize("case", list(_CASES_44))
def test_issue_44_every_finder_arrangement_ends_patched_and_trains(case: str, flavour: str) -> None:
    """Each arrangement of issue 44, in a fresh process: the flavour ends patched without a word
    (at the import, or at the latest at the first ``Trainer``), ``sys.meta_path`` a plain list, and
    blocks train under a real ``Trainer.fit`` (_FIT: each block freezes the other head, every step ran)."""
    code = (_RECORD + textwrap.dedent(_CASES_44[case]).format(flavour=flavour) + _FIT.format(flavour=flavour)
            + textwrap.dedent("""
                assert toggleshim.is_installed() and type(sys.meta_path) is list
            """) + _NO_WARNING)
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fit ok" in proc.stdout, proc.stdout


def test_the_first_trainer_judges_a_flavour_no_import_showed_and_respects_uninstall() -> None:
    """toggleshim's finder taken out of ``sys.meta_path``: the flavour is judged at the first
    ``Trainer(...)`` (here unverified code: the fallback, and its warning points at the user's
    ``Trainer`` line); after ``uninstall()`` a Trainer patches nothing."""
    code = textwrap.dedent("""
        import sys, warnings
        import toggleshim
        from toggleshim import _known, _patch
        _known.KNOWN.clear()  # the installed Lightning's code is now unverified to toggleshim: a warning
        sys.meta_path[:] = [f for f in sys.meta_path if not _patch._is_hook(f)]
        import lightning.pytorch as pl
        assert not _patch._hooks() and _patch._mode(_patch._flavours()[0]) is None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pl.Trainer(logger=False, enable_checkpointing=False)  # line 11
        (w,) = [w for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
        assert (w.filename, w.lineno) == ("<string>", 11), (w.filename, w.lineno)
        assert _patch._mode(_patch._flavours()[0]) == "fallback"
        toggleshim.uninstall()
        pl.Trainer(logger=False, enable_checkpointing=False)
        assert _patch._mode(_patch._flavours()[0]) is None
        print("ok")
    """)
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_issue_44_the_hook_is_asked_for_nothing_it_cannot_answer_twice() -> None:
    """A finder delegating to every finder (toggleshim's too) without skipping toggleshim's, behind
    it: toggleshim's finder, asked back for the name it is looking for, says None (no recursion)."""
    code = textwrap.dedent("""
        import sys
        import toggleshim
        from toggleshim import _patch

        class Asking:  # behind toggleshim's, asks every finder but itself, toggleshim's included
            def find_spec(self, fullname, path, target=None):
                for finder in list(sys.meta_path):
                    if finder is not self and hasattr(finder, "find_spec"):
                        spec = finder.find_spec(fullname, path, target)
                        if spec is not None:
                            return spec
                return None

        sys.meta_path.insert(1, Asking())
        import lightning.pytorch
        assert toggleshim.is_installed()
        print("ok")
    """)
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


# point 5: warnings as errors, both import orders, verified and unverified toggle code

_IMPORTS = {
    ("toggleshim first", "verified"): """
        import toggleshim
        import {flavour}
    """,
    ("toggleshim first", "unverified"): """
        import toggleshim
        from toggleshim import _known
        _known.KNOWN.clear()  # the installed Lightning's code is now unverified to toggleshim
        import {flavour}
    """,
    ("lightning first", "verified"): """
        import {flavour}
        import toggleshim
    """,
    ("lightning first", "unverified"): """
        import {flavour}
        from _fake_release import FORCE_TRAINABLE, method_copy, relabelled
        cls = {flavour}.LightningModule
        cls.toggle_optimizer = method_copy(cls.toggle_optimizer, (FORCE_TRAINABLE,))
        with relabelled("2.7.0"):
            import toggleshim
    """,
}

_CHECK = {
    "verified": """
        def check():
            import warnings
            import toggleshim
            from _fixtures import three_heads, state
            assert toggleshim.is_installed()
            m = three_heads("{flavour}")
            with m.toggle_optimizer(m.opts[1]):
                assert not m.a.weight.requires_grad and m.b.weight.requires_grad
            with toggleshim.toggle(m, m.opts[0]):
                assert m.a.weight.requires_grad and not m.b.weight.requires_grad
            assert all(state(m).values())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                toggleshim.install()
            assert caught == [], caught
            print("checked verified")
    """,
    "unverified": """
        def check():
            import warnings
            import toggleshim
            from toggleshim import ToggleshimWarning
            from _fixtures import three_heads, state
            assert not toggleshim.is_installed()
            m = three_heads("{flavour}")
            before = state(m)
            raised = []
            for call in (lambda: m.toggle_optimizer(m.opts[0]), lambda: toggleshim.toggle(m, m.opts[0]),
                         lambda: m.toggle_optimizer(m.opts[0], zero_grad=False), toggleshim.install):
                try:
                    call()  # raised before anything changes, while the filters make it an error
                except ToggleshimWarning as w:
                    raised.append(str(w))
                assert state(m) == before
            assert len(raised) == 4 and len(set(raised)) == 1, raised
            assert "toggleshim: " in raised[0] and "({flavour})" in raised[0], raised[0]
            assert "{words}" in raised[0] and "Raised here, not during the import" in raised[0], raised[0]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with m.toggle_optimizer(m.opts[0], step=False):  # shown once: then gone
                    assert m.a.weight.requires_grad and not m.b.weight.requires_grad
            assert [str(w.message) for w in caught] == raised[:1], caught
            assert caught[0].filename == __file__, caught[0].filename  # points at the toggle's caller
            with m.toggle_optimizer(m.opts[0], step=False):  # delivered: no warning any more
                pass
            toggleshim.install()
            print("checked unverified")
    """,
}

_WORDS = {"toggleshim first": "code differs from every release toggleshim verified",
          "lightning first": "toggle_optimizer code differs from every release toggleshim verified"}
_CASES = [(order, code) for order in ("toggleshim first", "lightning first") for code in ("verified", "unverified")]


def _user_code(order: str, code: str, flavour: str) -> tuple[str, str]:
    imports = textwrap.dedent(_IMPORTS[order, code]).format(flavour=flavour)
    check = textwrap.dedent(_CHECK[code]).format(flavour=flavour, words=_WORDS[order])
    return imports, check


# each case is a fresh process or two: in the default run, the two tests below share the four cases
# (each case once, by one mechanism); under ci every case runs by both
@pytest.mark.parametrize(("order", "code"), half_of(_CASES, 0))
def test_warnings_as_errors_python_w_error(tmp_path: Path, order: str, code: str) -> None:
    flavour = "lightning.pytorch"
    imports, check = _user_code(order, code, flavour)
    script = tmp_path / "train.py"
    script.write_text(f"{imports}\nprint('imported')\n{check}\ncheck()\n")
    proc = _run([sys.executable, "-W", "error", *(f"-W{f}" for f in _LIGHTNINGS_OWN), str(script)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["imported", f"checked {code}"], proc.stdout
    assert "ToggleshimWarning" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(("order", "code"), half_of(_CASES, 1))
def test_warnings_as_errors_pytest_filterwarnings(tmp_path: Path, order: str, code: str) -> None:
    flavour = "pytorch_lightning"
    imports, check = _user_code(order, code, flavour)
    own = "".join(f"    {f}\n" for f in _LIGHTNINGS_OWN)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nfilterwarnings =\n    error\n{own}")
    tests = f"""
def test_imported():
    import sys
    assert "{flavour}.core.module" in sys.modules


def test_toggle():
    check()
"""
    (tmp_path / "test_user.py").write_text(f"{imports}\n{check}\n{tests}")
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-s",
                 "test_user.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout and f"checked {code}" in proc.stdout, proc.stdout
