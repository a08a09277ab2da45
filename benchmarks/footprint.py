#!/usr/bin/env python
"""What ``import toggleshim`` costs code that never enters a block.

    python benchmarks/footprint.py            # every workload, 7 pairs of processes each
    python benchmarks/footprint.py --runs 11 --only deepcopy,id

Per workload, fresh processes alternate (``benchmarks/_crossproc.py``): ``with`` imports Lightning and
then toggleshim, ``without`` imports Lightning only (the child checks toggleshim is absent). The ratio
is with/without: 1.00 is no cost; the target is within 2%.

Workloads (none of them enters a block):

* ``id``: ``id(x)`` 1,000 times (CPython raises an audit event at every ``id()``: a process-wide audit
  hook is called there);
* ``deepcopy``: ``copy.deepcopy`` of 20,000 small dicts (``id()``-heavy);
* ``state_dict``: ``Adam.state_dict()`` over 2,000 parameters, each with state;
* ``lightning_toggle``: Lightning's own ``toggle_optimizer`` + ``untoggle_optimizer`` functions over 10
  parameters in 2 optimizers (in the ``with`` process the originals toggleshim keeps, called directly);
* ``step``: ``SGD.step()`` over 10 parameters with gradients (a process-wide optimizer hook runs there);
* ``import``: importing 50 small fresh modules from a temporary directory (an import hook runs there).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _crossproc import child_main, compare, header

TARGET = 1.02


def _setup(variant: str) -> None:
    import lightning.pytorch  # noqa: F401

    if variant == "with":
        import toggleshim

        assert toggleshim.is_installed()
    assert ("toggleshim" in sys.modules) == (variant == "with")


def _id(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    _setup(variant)
    xs = [object() for _ in range(1000)]

    def run(n: int) -> None:
        for _ in range(n):
            for x in xs:
                id(x)

    return run


def _deepcopy(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    _setup(variant)
    data = [{"a": k, "b": [k, k + 1], "c": "x"} for k in range(20_000)]

    def run(n: int) -> None:
        for _ in range(n):
            copy.deepcopy(data)

    return run


def _state_dict(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    _setup(variant)
    import torch

    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2000)]
    opt = torch.optim.Adam(params)
    for p in params:
        p.grad = torch.ones(2)
    opt.step()

    def run(n: int) -> None:
        for _ in range(n):
            opt.state_dict()

    return run


def _lightning_toggle(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    _setup(variant)
    import torch
    from lightning.pytorch import LightningModule

    def lightnings(name: str) -> Any:
        fn = vars(LightningModule)[name]
        return getattr(fn, "_toggleshim_original", fn)  # toggleshim keeps the original here

    toggle, untoggle = lightnings("toggle_optimizer"), lightnings("untoggle_optimizer")
    module = LightningModule()
    module.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(4)) for _ in range(10)])
    ps = list(module.params)
    opts = [torch.optim.SGD(ps[:5], lr=0.1), torch.optim.SGD(ps[5:], lr=0.1)]

    class TrainerStandIn:
        optimizers = opts

    module.trainer = TrainerStandIn()

    def run(n: int) -> None:
        for _ in range(n):
            for opt in opts:
                toggle(module, opt)
                untoggle(module, opt)

    return run


def _step(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    _setup(variant)
    import torch

    params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(10)]
    for p in params:
        p.grad = torch.full((4,), 1e-3)
    opt = torch.optim.SGD(params, lr=1e-3)

    def run(n: int) -> None:
        for _ in range(n):
            opt.step()

    return run


def _import(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    _setup(variant)
    folder = Path(tempfile.mkdtemp())
    sys.path.insert(0, str(folder))
    counter = [0]

    def run(n: int) -> None:
        for _ in range(n):
            names = []
            for _ in range(50):
                counter[0] += 1
                name = f"footprint_mod_{counter[0]}"
                (folder / f"{name}.py").write_text("X = 1\n")
                names.append(name)
            importlib.invalidate_caches()
            for name in names:
                importlib.import_module(name)

    return run


WORKLOADS: dict[str, Callable[[str, dict[str, str]], Callable[[int], None]]] = {
    "id": _id, "deepcopy": _deepcopy, "state_dict": _state_dict, "lightning_toggle": _lightning_toggle,
    "step": _step, "import": _import,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1:], WORKLOADS)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads (comma-separated)")
    p.add_argument("--runs", type=int, default=7, help="pairs of processes per workload (default 7)")
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds timed per process (default 1)")
    args = p.parse_args(argv)
    lines = [header(("python benchmarks/footprint.py " + " ".join(argv)).strip()), "",
             "| workload | with µs | without µs | with/without (range over pairs) | target |",
             "|:---|---:|---:|:---|---:|"]
    failed = False
    for name in args.only.split(","):
        r = compare(__file__, name, "with", "without", {"seconds": str(args.seconds)}, args.runs)
        failed |= r.ratio > TARGET
        lines.append(f"| `{name}` | {r.a_us:.1f} | {r.b_us:.1f} | {r.cell()} | ≤ {TARGET:.2f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
