"""What the block relies on in torch, checked on the installed torch: ``python -m toggleshim check``'s torch
properties, also run by the tests.

* ``step-refused``: ``opt.step()`` inside a block that steps on exit is refused at the exit, and the
  optimizer stepped exactly once (a real ``Trainer.fit``, through the ``LightningOptimizer``).
* ``step-refused-after-compile``: the same after ``torch.compile`` ran in the process (torch 2.0 and
  2.1's first compile strips the step hooks of every optimizer class: toggleshim's watch must not
  depend on them).
* ``compile-keeps-out``: a block inside a ``torch.compile``'d function trains as outside it, and dynamo
  breaks the graph at toggleshim's entry points, never inside them.

They run in a fresh interpreter, ``python -m toggleshim.testing.torchside FLAVOUR`` (JSON on stdout):
a compile changes torch for the rest of its process, which must not be the caller's. A planted bug
(``TOGGLESHIM_MUTANT``, :mod:`toggleshim.testing.mutants`) is planted there too.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["PROBES", "compile_refusal", "kept_out", "run_probes"]

#: name -> what it shows (``check`` prints it)
PROBES: dict[str, str] = {
    "step-refused": "torch: a step() inside a block that steps on exit is refused, one step made (Trainer.fit)",
    "step-refused-after-compile": "torch: the same after torch.compile ran in the process",
    "compile-keeps-out": "torch: a block inside torch.compile runs toggleshim's code eagerly, trains as outside",
}


def run_probes(flavour: str, timeout: float = 600) -> dict[str, tuple[str, str]]:
    """Every probe on ``flavour`` in a fresh interpreter: name -> (verdict, message); verdict ``pass``,
    ``FAIL``, or ``n/a`` (torch cannot do what the probe needs: the message says what)."""
    proc = subprocess.run([sys.executable, "-m", __name__, flavour], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {name: ("FAIL", f"the probe process exited {proc.returncode}: {' | '.join(tail)}") for name in PROBES}
    return {name: (found[name][0], found[name][1]) for name in PROBES}


# -- in the fresh interpreter -------------------------------------------------------------------


def compile_refusal() -> str | None:
    """What torch.compile says when it refuses this Python (torch 2.0 on Python 3.11), else None."""
    check = getattr(importlib.import_module("torch._dynamo.eval_frame"), "check_if_dynamo_supported", None)
    try:
        if check is not None:
            check()
    except RuntimeError as refusal:
        return str(refusal)
    return None


def _compile_something() -> str:
    """Use torch.compile once in this process (or, where it refuses this Python, the patching of torch a
    first compile does, on the torches that have it); says which."""
    import torch

    refusal = compile_refusal()
    if refusal is None:
        torch.compile(torch.nn.Linear(2, 2), backend="eager")(torch.ones(1, 2))
        return "after torch.compile"
    patcher = getattr(importlib.import_module("torch._dynamo.eval_frame"), "TorchPatcher", None)
    if patcher is not None:
        patcher.patch()
    return f"torch.compile refuses this Python ({refusal}); after the patching of torch a first compile makes"


def _step_refused(pl: Any) -> str:
    """A real Trainer.fit, one batch, two SGD optimizers: ``opt_a.step()`` inside ``opt_a``'s block."""
    import torch
    from torch import nn

    seen: dict[str, Any] = {}

    class TwoHeads(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b = nn.Linear(2, 1), nn.Linear(2, 1)

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)]

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt_a, _ = self.optimizers()
            before = self.a.weight.detach().clone()
            try:
                with self.toggle_optimizer(opt_a):
                    self.manual_backward(self.a(batch[0]).sum())
                    once = before.add(self.a.weight.grad.clone(), alpha=-0.1)  # type: ignore[union-attr]  # SGD's one step
                    opt_a.step()
            except RuntimeError as error:
                seen["error"] = str(error)
            seen["once"] = bool(torch.equal(self.a.weight.detach(), once))
            seen["steps"] = self.trainer.global_step
            seen["trainable"] = all(p.requires_grad for p in self.parameters())

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=4)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(TwoHeads(), data)
    problems = []
    if "step() ran inside" not in seen.get("error", ""):
        problems.append("the block did not refuse the step inside it" + (f" (it raised: {seen['error']})"
                                                                          if "error" in seen else ""))
    if seen.get("steps") != 1 or not seen.get("once"):
        problems.append(f"the optimizer stepped {seen.get('steps')} times (global_step), expected exactly once")
    if not seen.get("trainable"):
        problems.append("parameters left frozen after the block")
    if problems:
        raise AssertionError("; ".join(problems))
    return "refused at the exit, one step"


def _compile_keeps_out(pl: Any) -> str:
    """A block inside a compiled function: trains bitwise as outside; dynamo breaks at toggleshim's
    entry points only (what torch says of a disabled function, or of its disable wrapper's file)."""
    import torch
    from torch import nn

    refusal = compile_refusal()
    if refusal is not None:
        raise _NotApplicable(f"torch.compile refuses this Python: {refusal}")
    from types import SimpleNamespace

    from torch._dynamo.utils import counters

    def heads() -> Any:
        module = pl.LightningModule()
        torch.manual_seed(0)
        module.a, module.b = nn.Linear(2, 2), nn.Linear(2, 2)
        module.opts = [torch.optim.SGD(h.parameters(), lr=0.1, momentum=0.9) for h in (module.a, module.b)]
        module._trainer = SimpleNamespace(optimizers=module.opts, strategy=SimpleNamespace())
        return module

    x = torch.ones(2, 2)

    def train_step(m: Any) -> Any:
        with m.toggle_optimizer(m.opts[0]):
            loss = m.a(x).square().sum()
            loss.backward()
        return loss.detach()

    module, ref = heads(), heads()
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = torch.compile(train_step, backend="eager")
        for _ in range(3):
            compiled(module)
            train_step(ref)
        breaks = dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    problems = []
    if not all(torch.equal(p, q) for p, q in zip(module.parameters(), ref.parameters())):
        problems.append("the compiled block trained differently from the same block run eagerly")
    if not all(p.requires_grad for p in module.parameters()):
        problems.append("parameters left frozen after the compiled block")
    inside = [reason for reason in breaks if not kept_out(reason)]
    if not breaks or inside:
        problems.append(f"dynamo did not stop at toggleshim's entry points (graph breaks: {inside or 'none'})")
    if problems:
        raise AssertionError("; ".join(problems))
    return f"{sum(breaks.values())} graph breaks, each at a disabled entry point"


def kept_out(reason: str) -> bool:
    """A graph break dynamo reports at a ``torch.compiler.disable``d function: what torch says of one (torch
    2.8 on; 2.1 to 2.7: "call torch._dynamo.disable() wrapped function"), or of torch's disable wrapper,
    whose file it skips (torch 2.1 to 2.7; torch 2.6 quotes that reason: ``'inline in skipfiles: ...'``)."""
    reason = reason.removeprefix("'")
    return reason.startswith(("Skip inlining `torch.compiler.disable()`d function",
                              "call torch._dynamo.disable() wrapped function")) or (
        reason.startswith("inline in skipfiles: ") and "| _fn " in reason and "_dynamo" in reason)


class _NotApplicable(Exception):
    pass


def _main(flavour: str) -> dict[str, tuple[str, str]]:
    import warnings

    warnings.simplefilter("ignore")
    import logging

    from toggleshim._flavours import FLAVOURS

    for name in (name for f in FLAVOURS for name in (f.name, f.fabric)):  # Lightning's banners
        logging.getLogger(name).setLevel(logging.ERROR)
    pl = importlib.import_module(flavour)
    import toggleshim

    if os.environ.get("TOGGLESHIM_MUTANT"):  # a planted bug reaches this process too
        from toggleshim.testing.mutants import apply

        apply(os.environ["TOGGLESHIM_MUTANT"])
    toggleshim.install()
    results: dict[str, tuple[str, str]] = {}

    def probe(name: str, fn: Callable[[], str]) -> None:
        try:
            results[name] = ("pass", fn())
        except _NotApplicable as why:
            results[name] = ("n/a", str(why))
        except Exception as error:  # what failed is the verdict
            results[name] = ("FAIL", f"{type(error).__name__}: {error}")

    probe("step-refused", lambda: _step_refused(pl))
    probe("compile-keeps-out", lambda: _compile_keeps_out(pl))
    probe("step-refused-after-compile", lambda: f"{_compile_something()}: {_step_refused(pl)}")
    return results


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1])))
