"""A fake "Lightning 2.7.0" for the gate's tests: the installed flavour's own toggle code (or a changed
copy of it) under a relabelled version, as a new release would look to ``import toggleshim``.

Importable from a fresh process too (``PYTHONPATH=tests``): the subprocess tests use it before
``import toggleshim``, as a user upgrading Lightning would meet it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import shutil
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the changed release: the toggled optimizer's parameters forced trainable (a user-frozen one too)
FORCE_TRAINABLE = ("param.requires_grad = param_requires_grad_state[param]", "param.requires_grad = True")
#: docstring, comments and a torch.compiler.disable marking: what must not change a fingerprint
COSMETIC = (
    ('"""Makes sure only', '"""A reworded docstring. Makes sure only'),
    ("param_requires_grad_state = {}\n", "param_requires_grad_state = {}  # a new comment\n    # and another\n"),
)
#: semantics kept, code changed (a fingerprint of its own): one no-op line in toggle_optimizer
NO_OP = ("        param_requires_grad_state = {}\n",
         "        param_requires_grad_state = {}\n        pass  # a no-op line\n")
#: another such change: the same no-op line in untoggle_optimizer
NO_OP_UNTOGGLE = ("        # save memory\n", "        pass  # a no-op line\n        # save memory\n")
#: a Lightning whose untoggle_optimizer does nothing at all
UNTOGGLE_NOTHING = ("        for opt in self.trainer.optimizers:\n            if not (opt is optimizer",
                    "        return\n        for opt in self.trainer.optimizers:\n            if not (opt is optimizer")
_count = [0]


@functools.cache
def _directory() -> Path:
    """Where the copies' source files go: made at the first copy, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix="toggleshim-fake-release-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def original(flavour: str, name: str) -> Any:
    """Lightning's own method ``name`` of ``flavour`` (under toggleshim's patch, if any)."""
    fn = vars(importlib.import_module(flavour).LightningModule)[name]
    return getattr(fn, "_toggleshim_original", fn)


def method_copy(fn: Any, edits: tuple[tuple[str, str], ...] = (), decorate: str = "") -> Any:
    """A copy of Lightning's method ``fn`` from its source with ``edits`` (old, new) applied, compiled
    from a real file (so ``inspect.getsource`` reads it), in ``fn``'s globals, with ``fn``'s name,
    qualname and module: what the same method of a new release looks like."""
    source = textwrap.dedent(inspect.getsource(fn))
    for old, new in edits:
        if old not in source:
            raise ValueError(f"edit {old!r} does not apply to {fn.__qualname__}")
        source = source.replace(old, new, 1)
    if decorate:
        source = f"@{decorate}\n{source}"
    return function_like(fn, source, fn.__globals__)


def function_like(fn: Any, source: str, namespace: dict[str, Any], readable: bool = True) -> Any:
    """The function ``source`` defines, named as ``fn`` (qualname and module), run in a copy of
    ``namespace``; compiled from a real file (``inspect.getsource`` reads it) unless not ``readable``
    (then it has no source, as in a ``.pyc``-only install)."""
    filename = "<no source>"
    if readable:
        _count[0] += 1
        path = _directory() / f"release_copy_{_count[0]}.py"
        path.write_text(source)
        filename = str(path)
    namespace = dict(namespace)
    exec(compile(source, filename, "exec"), namespace)
    copy = namespace[fn.__name__]
    core = getattr(copy, "__wrapped__", copy)
    for f in {id(copy): copy, id(core): core}.values():
        f.__qualname__, f.__module__ = fn.__qualname__, fn.__module__
    return copy


@contextlib.contextmanager
def relabelled(version: str) -> Iterator[None]:
    """``importlib.metadata.version`` says ``version`` for both Lightning distributions."""
    real = importlib.metadata.version

    def version_of(dist: str) -> str:
        return version if dist in ("lightning", "pytorch-lightning") else real(dist)

    importlib.metadata.version = version_of
    try:
        yield
    finally:
        importlib.metadata.version = real


@contextlib.contextmanager
def fake_release(flavour: str, version: str = "2.7.0", changed: bool = False) -> Iterator[list[str]]:
    """Inside: ``flavour`` looks like Lightning ``version`` (its own toggle code, or with
    ``changed`` the FORCE_TRAINABLE copy) and toggleshim was installed on it; yields the messages of
    the ToggleshimWarnings that install gave. Afterwards Lightning's own methods and the shim are back."""
    import toggleshim

    cls = importlib.import_module(flavour).LightningModule
    toggleshim.uninstall()
    saved = {name: vars(cls)[name] for name in ("toggle_optimizer", "untoggle_optimizer")}
    if changed:
        cls.toggle_optimizer = method_copy(saved["toggle_optimizer"], (FORCE_TRAINABLE,))
    try:
        with relabelled(version), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            toggleshim.install()
            yield [str(w.message) for w in caught if issubclass(w.category, toggleshim.ToggleshimWarning)]
    finally:
        toggleshim.uninstall()
        for name, fn in saved.items():
            setattr(cls, name, fn)
        toggleshim.install()


def release_tree(dest: Path, flavour: str, edits: tuple[tuple[str, str], ...] = (), version: str | None = None) -> Path:
    """A copy of the installed ``flavour``'s package in ``dest`` with ``edits`` (old, new) made to the
    source of its ``core/module.py`` (each must apply exactly once), and with ``version``, its
    distribution's metadata saying so: ``dest`` first on ``PYTHONPATH``, a fresh process imports it
    as that Lightning, exactly as if it were installed (``python -m toggleshim ...`` as users run it).
    Returns ``dest``."""
    import importlib.util
    import re

    top = flavour.split(".")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.origin is not None, top
    package = Path(spec.origin).parent
    shutil.copytree(package, dest / top, ignore=shutil.ignore_patterns("__pycache__"))
    module = dest / top / Path(*flavour.split(".")[1:]) / "core" / "module.py"
    text = module.read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise ValueError(f"edit {old!r} applies {text.count(old)} times to {module} (once needed)")
        text = text.replace(old, new)
    module.write_text(text)
    if version is not None:
        dist = importlib.metadata.distribution("lightning" if top == "lightning" else "pytorch-lightning")
        info = Path(str(dist._path))  # type: ignore[attr-defined]
        copy = dest / re.sub(r"-[^-]+\.dist-info$", f"-{version}.dist-info", info.name)
        shutil.copytree(info, copy)
        metadata = copy / "METADATA"
        metadata.write_text(re.sub(r"^Version: .*$", f"Version: {version}", metadata.read_text(), count=1,
                                   flags=re.MULTILINE))
    return dest


def user_env(*paths: Path) -> dict[str, str]:
    """The environment of a user's fresh process whose ``PYTHONPATH`` starts with ``paths`` (a
    :func:`release_tree`), then this directory; nothing of the test session's (pytest, Hypothesis,
    toggleshim variables such as ``TOGGLESHIM_CERTIFIED``)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TOGGLESHIM_", "HYPOTHESIS_"))}
    return {**env, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(Path(__file__).parent)]), "COLUMNS": "200"}
