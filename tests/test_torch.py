"""The torch behaviours the block relies on, on the installed torch (``check``'s torch properties,
:mod:`toggleshim.testing.torchside`), and what the step watch must survive.

torch 2.0 and 2.1's first ``torch.compile`` strips the step hooks of every optimizer class for the rest
of the process; a watch built on them let a step inside a stepping block through, and the block
stepped again (torch 2.1.2: ``global_step`` 2, no error). Each probe runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _fixtures import compile_refused, state, three_heads

from toggleshim.testing.torchside import PROBES, kept_out, run_probes

ROOT = Path(__file__).resolve().parent.parent


def test_every_torch_probe_passes_on_the_installed_torch(flavour: str) -> None:
    """Each probe passes; only where torch.compile refuses this Python (torch 2.0 on Python 3.11) is the
    compile probe not applicable, and it says why, while the step watch is still shown to hold after the
    patching a first compile makes."""
    found = run_probes(flavour)
    assert set(found) == set(PROBES)
    refused = compile_refused()
    for name, (verdict, message) in found.items():
        if name == "compile-keeps-out" and refused is not None:
            assert verdict == "n/a" and refused in message, (name, verdict, message)
        else:
            assert verdict == "pass", (name, verdict, message)
    assert "refused at the exit, one step" in found["step-refused-after-compile"][1]


def _check(*extra: str, mutant: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TOGGLESHIM_MUTANT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if mutant is not None:
        env["TOGGLESHIM_MUTANT"] = mutant
    return subprocess.run([sys.executable, "-m", "toggleshim", "check", "--property", "torch", *extra],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)


# What each torch says where dynamo stops at a disabled entry point, as the matrix's cells recorded it
# (a torch 2.6.0 cell failed `check` on the quotes around its reason: the probe, not the block).
_DYNAMO = "/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py"
_KEPT_OUT = [
    f"inline in skipfiles: LightningModule.toggle_optimizer | _fn {_DYNAMO}",  # torch 2.1.2
    f"'inline in skipfiles: LightningModule.toggle_optimizer | _fn {_DYNAMO}, skipped according trace_rules.lookup "
    "SKIP_DIRS'",  # torch 2.6.0
    "call torch._dynamo.disable() wrapped function <function Toggle.__enter__ at 0x7f>",  # torch 2.1 to 2.7
    "Skip inlining `torch.compiler.disable()`d function\n  Explanation: Skip inlining function "
    "<function LightningModule.toggle_optimizer at 0x7f>",  # torch 2.8 on
]
_INSIDE = [  # a break inside toggleshim's code, or anywhere else: not kept out
    "'inline in skipfiles: Toggle.__enter__ | __enter__ /src/toggleshim/_block.py, skipped'",
    "Attempted to call function marked as skipped\n  Explanation: Dynamo does not know how to trace the builtin",
    "Unsupported context manager",
]


@pytest.mark.parametrize("reason", _KEPT_OUT + _INSIDE)
def test_the_compile_probe_reads_what_every_torch_says_of_a_disabled_entry_point(reason: str) -> None:
    assert kept_out(reason) is (reason in _KEPT_OUT)


@pytest.mark.one_flavour_by_default
def test_check_fails_when_the_step_watch_never_fires(flavour: str) -> None:
    """A planted "the step watch never fires" makes ``check`` fail on its torch properties (the optimizer
    stepped twice), with and without a compile; the unaltered code passes the same command."""
    planted = _check("--flavour", flavour, mutant="the step watch never fires")
    assert planted.returncode == 1, planted.stdout + planted.stderr
    for name in ("step-refused", "step-refused-after-compile"):
        line = next(x for x in planted.stdout.splitlines() if f" {name} " in x)
        assert " FAIL " in line and "stepped 2 times" in line, line
    clean = _check("--flavour", flavour)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "OK: " in clean.stdout and "FAIL" not in clean.stdout


# the watch on the optimizer instance, beside what else lives there


def test_a_step_watch_covers_an_lr_schedulers_own_step_and_gives_it_back(flavour: str) -> None:
    """torch's LR schedulers put their own ``step`` on the optimizer instance (to warn about a scheduler
    stepped first): the block's watch sits over it while open and gives it back at the exit; a scheduler
    made inside a block wraps the watch in turn, which then only passes steps through."""
    module = three_heads(flavour)
    opt = module.opts[0]
    before = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    theirs = vars(opt).get("step")
    with module.toggle_optimizer(opt):
        module.a.weight.sum().backward()
    assert vars(opt).get("step") is theirs  # given back (None where this torch puts nothing there)
    with pytest.raises(RuntimeError, match=r"step\(\) ran inside"), module.toggle_optimizer(opt):
        module.a.weight.sum().backward()
        inside = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps the watch
        opt.step()
    assert all(state(module).values())
    weight = module.a.weight.detach().clone()
    module.a.weight.sum().backward()
    opt.step()  # through the scheduler's wrapper and the closed watch: one step
    assert not torch.equal(weight, module.a.weight)
    before.step()
    inside.step()
    with module.toggle_optimizer(opt, step=False):  # a later block: steps of its own are still seen
        module.a.weight.sum().backward()
        opt.step()
    with pytest.raises(RuntimeError, match=r"step\(\) ran inside"), module.toggle_optimizer(opt):
        module.a.weight.sum().backward()
        opt.step()
