"""A new block flag touches at most three files of the package: shown by adding one.

A copy of the package gets a flag ``set_to_none`` (``False``: the block's ``zero_grad()`` zeroes the
gradients instead of setting them to None) by editing three files: ``_block.py`` (its declaration,
its help and what the block does with it), ``testing/model.py`` (its documented default: the
harness takes the defaults from the model, not from the code under test) and ``testing/_drivers.py``
(what Lightning's manual sequence does with it, the reference the harness compares the block with).
Everything else reads the flag from ``_block.FLAGS`` or the model: the patched method's signature
and help, every entry point, the flag check, the gate (a Lightning method with a parameter of that
name is refused), the harness's drawn blocks.

Then, in a fresh process on the copy: the flag is in the signature and the help, a bad value is a
``TypeError`` naming it, the harness draws it both ways and proves the block equal to the manual
sequence with it; and with the manual sequence left as it was, the harness finds the difference."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "toggleshim"

EDITS: dict[str, list[tuple[str, str]]] = {
    "_block.py": [
        ("    sync_grad: bool\n", "    sync_grad: bool\n    set_to_none: bool\n"),
        ('    "sync_grad": (True,', '    "set_to_none": (True, "``False``: ``zero_grad()`` zeroes the gradients."),\n'
                                  '    "sync_grad": (True,'),
        ("                self._optimizer.zero_grad()",
         '                self._optimizer.zero_grad(set_to_none=flags["set_to_none"])'),
    ],
    "testing/model.py": [
        ('{"zero_grad": True, "step": True, "sync_grad": True}',
         '{"zero_grad": True, "step": True, "sync_grad": True, "set_to_none": True}'),
    ],
    "testing/_drivers.py": [
        ("                if op.zero_grad:\n                    opt.zero_grad()\n",
         "                if op.zero_grad:\n                    opt.zero_grad(set_to_none=op.set_to_none)\n"),
    ],
}

CHECK = textwrap.dedent(
    """
    import inspect, pydoc, sys
    import toggleshim
    assert toggleshim.__file__.startswith(sys.argv[1]), toggleshim.__file__  # the copy
    import lightning.pytorch as pl
    from hypothesis import find, strategies as st
    from toggleshim import _patch
    from toggleshim.testing import FLAT_EXAMPLES, Backward, Block, assert_toggle_equivalent
    from toggleshim.testing.harness import Mismatch
    from toggleshim.testing.specs import programs

    fn = pl.LightningModule.toggle_optimizer
    assert inspect.signature(fn).parameters["set_to_none"].default is True
    assert "set_to_none: ``False``" in fn.__doc__ and "set_to_none: bool = True" in pydoc.render_doc(fn)
    assert "set_to_none" in _patch._OUR_FLAGS  # the gate refuses a Lightning method taking it
    # the harness draws the flag, both ways
    for value in (True, False):
        find(programs(n_optimizers=2, n_params=4, n_terms=4),
             lambda p: any(isinstance(op, Block) and op.set_to_none is value for op in p))
    spec = FLAT_EXAMPLES[0]
    world = type(spec)(spec.graph, (), spec.optimizers, (
        Backward((0, 1)), Block(0, (Backward((0,)),), set_to_none=False), Backward((0, 1)),
        Block(1, set_to_none=False, explicit=True), Block(0, set_to_none=False, entry="toggle")))
    try:
        assert_toggle_equivalent(world, "lightning.pytorch")
        print("equivalent")
    except Mismatch as mismatch:
        print("mismatch:", str(mismatch).splitlines()[0])
    from toggleshim.testing.harness import build_world
    w = build_world(world, "lightning.pytorch")
    try:
        w.module.toggle_optimizer(w.opts[0], set_to_none=1)
    except TypeError as e:
        assert "set_to_none must be True or False" in str(e), e
        print("refused")
    """
)


def _copy(tmp: Path, files: list[str]) -> Path:
    root = tmp / "copy"
    shutil.copytree(PACKAGE, root / "toggleshim", ignore=shutil.ignore_patterns("__pycache__"))
    for name in files:
        path = root / "toggleshim" / name
        text = path.read_text()
        for old, new in EDITS[name]:
            assert text.count(old) == 1, (name, old)  # the edit still fits the code
            text = text.replace(old, new)
        path.write_text(text)
    return root


def _check(root: Path) -> list[str]:
    env_path = str(root)
    proc = subprocess.run([sys.executable, "-c", CHECK, str(root / "toggleshim")], capture_output=True,
                          text=True, timeout=600, cwd=root, env={**_env(), "PYTHONPATH": env_path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split("\n")


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_new_block_flag_touches_at_most_three_package_files(tmp_path: Path) -> None:
    assert len(EDITS) <= 3
    out = _check(_copy(tmp_path / "whole", list(EDITS)))
    assert out[:2] == ["equivalent", "refused"], out


def test_the_harness_finds_a_new_flag_that_the_manual_sequence_ignores(tmp_path: Path) -> None:
    """The control: the block honours the flag, the harness's manual sequence does not: a mismatch."""
    out = _check(_copy(tmp_path / "half", ["_block.py", "testing/model.py"]))
    assert out[0].startswith("mismatch:") and out[1] == "refused", out
