"""Finder arrangements and racing imports, drawn (issue 44): whatever other tools do to ``sys.meta_path``
after ``import toggleshim``, and whether Lightning is being imported by another thread meanwhile, the
flavour ends patched and blocks train under a real ``Trainer.fit``, in a fresh process.

Hypothesis draws the family of issue 44's cases (tests/test_import_order.py has each one by hand):
finders that delegate to every other finder (skipping themselves, or asking toggleshim's back), that
answer every import themselves, that decline everything, inserted anywhere; entries replaced by index
(toggleshim's finder too); the list rebound (with a finder in front, or as a copy); and toggleshim
imported while another thread is inside Lightning's ``core.module`` (held there until toggleshim is
imported and the arrangement made). Never a ``RecursionError``, never the bare ``'NoneType' object does
not support the context manager protocol``, never an unpatched flavour, and no warning (there is
nothing to warn about: every arrangement ends patched).
"""

from __future__ import annotations

import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st
from test_import_order import _FIT, _run

from toggleshim.testing import installed_flavours

_FINDERS = """
import importlib.machinery, sys, threading

class Delegating:  # asks every other finder, toggleshim's too, skipping itself
    def find_spec(self, fullname, path, target=None):
        for finder in list(sys.meta_path):
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None

class Answering:  # answers every import itself: the finders behind it are never asked
    def find_spec(self, fullname, path, target=None):
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)

class Declining:
    def find_spec(self, fullname, path, target=None):
        return None

inside, go = threading.Event(), threading.Event()

class Pause:  # holds another thread's Lightning import inside core.module, LightningModule not defined yet
    def find_spec(self, fullname, path, target=None):
        core = sys.modules.get("{flavour}.core.module")
        if core is not None and not hasattr(core, "LightningModule") and not inside.is_set():
            inside.set()
            go.wait(60)
        return None
"""

# what another tool does to sys.meta_path, one line each ({k}: an index drawn; clipped by insert). At
# most one Delegating finder: two ask each other for ever, with or without toggleshim
_KINDS = ("Answering", "Declining")
_STEPS = st.one_of(
    st.builds(lambda kind, k: f"sys.meta_path.insert({k}, {kind}())", st.sampled_from(_KINDS), st.integers(0, 6)),
    # replaced by index, as `for i, f in enumerate(sys.meta_path): sys.meta_path[i] = Better()` does
    st.builds(lambda name, kind: (f"for i, f in enumerate(sys.meta_path):\n"
                                  f"    if type(f).__name__ == {name!r}:\n"
                                  f"        sys.meta_path[i] = {kind}()"),
              st.sampled_from(["_ImportHook", "PathFinder", "Delegating", *_KINDS]), st.sampled_from(_KINDS)),
    st.builds(lambda kind: f"sys.meta_path = [{kind}()] + sys.meta_path", st.sampled_from(_KINDS)),
    st.just("sys.meta_path = list(sys.meta_path)"),
)


@st.composite
def _arrangements(draw: st.DrawFn) -> list[str]:
    """Up to four steps (a bound: each example is a fresh interpreter), maybe one Delegating among them."""
    steps = draw(st.lists(_STEPS, max_size=4))
    if draw(st.booleans()):
        where = draw(st.integers(0, len(steps)))
        k = draw(st.integers(0, 6))
        steps.insert(where, draw(st.sampled_from([f"sys.meta_path.insert({k}, Delegating())",
                                                  "sys.meta_path = [Delegating()] + sys.meta_path"])))
    return steps


def _script(flavour: str, steps: list[str], race: bool) -> str:
    arrangement = "\n".join(steps)
    if race:  # another thread is inside core.module while toggleshim is imported and the list arranged
        body = f"""
sys.meta_path.insert(0, Pause())
lightning = threading.Thread(target=lambda: __import__({flavour!r}))
lightning.start()
assert inside.wait(300), "the other thread never reached core.module"
import toggleshim
{arrangement}
go.set()
lightning.join()
"""
    else:
        body = f"\nimport toggleshim\n{arrangement}\n"
    return (_FINDERS.format(flavour=flavour) + "import warnings\nwarnings.simplefilter('always')\n"
            "_caught = warnings.catch_warnings(record=True)\n_warned = _caught.__enter__()\n" + body
            + f"import {flavour}\n" + _FIT.format(flavour=flavour) + textwrap.dedent("""
                assert toggleshim.is_installed() and type(sys.meta_path) is list
                assert not [w for w in _warned if "toggleshim" in str(w.message).lower()], [
                    str(w.message) for w in _warned]
                print("patched")
            """))


# each example is a fresh interpreter importing Lightning and fitting (seconds): a tenth of the profile's
@settings(max_examples=max(3, settings().max_examples // 10))
@given(steps=_arrangements(), race=st.booleans(), data=st.data())
def test_every_finder_arrangement_and_racing_import_ends_patched(steps: list[str], race: bool,
                                                                 data: st.DataObject) -> None:
    flavour = data.draw(st.sampled_from(installed_flavours()), label="flavour")
    proc = _run([sys.executable, "-c", _script(flavour, steps, race)])
    assert "RecursionError" not in proc.stderr and "NoneType" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and "fit ok" in proc.stdout and "patched" in proc.stdout, proc.stderr[-3000:]
