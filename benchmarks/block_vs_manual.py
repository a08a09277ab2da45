#!/usr/bin/env python
"""One block against what a user would run instead, in a process WITHOUT toggleshim.

    python benchmarks/block_vs_manual.py                      # 10, 100, 1,000 parameters; 7 pairs each
    python benchmarks/block_vs_manual.py --params 10 --runs 11
    python benchmarks/block_vs_manual.py --variant toggled    # Lightning's own toggled_optimizer instead
    python benchmarks/block_vs_manual.py --params 10 --body none --each   # what each guarantee costs

Then the calls per toggled optimizer, counted by cProfile (Python functions and builtins), each side in
a fresh process without the other: the block's at most the manual sequence's is a target too.

Per row, fresh processes alternate (``benchmarks/_crossproc.py``):

* ``block``: ``import toggleshim``; ``with module.toggle_optimizer(opt): body()`` (toggle, zero_grad on
  entry, step on a clean exit, untoggle), the module's class checked for overrides as always;
* ``manual``: toggleshim never imported (the child checks); Lightning's manual sequence
  ``module.toggle_optimizer(opt)``; ``try: opt.zero_grad(); body(); opt.step()``
  ``finally: module.untoggle_optimizer(opt)``.

The module holds ``P`` parameters (each ``torch.zeros(4)``) split evenly over ``K`` plain SGD optimizers,
attached to a stand-in trainer exposing ``optimizers``; one iteration toggles every optimizer once, and
times are per toggled optimizer. Body ``grad`` gives every parameter of the optimizer a gradient (SGD
updates each); ``none`` does nothing (the optimizer's fixed costs only). The ratio is block/manual:
below 1, the block is cheaper than the sequence it replaces.

``--variant toggled`` puts Lightning's own context manager (2.5.1 and later) in the block's place, also
without toggleshim: ``with module.toggled_optimizer(opt): opt.zero_grad(); body(); opt.step()``, the
least a context manager on Lightning's own functions costs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from _crossproc import child_main, compare, header

TARGETS = {10: 1.05}  # block/manual at most this; 1.00 from 100 parameters up


def _workload(variant: str, options: dict[str, str]) -> Callable[[int], None]:
    import torch
    from lightning.pytorch import LightningModule
    from torch import nn

    if variant == "block":
        import toggleshim

        assert toggleshim.is_installed()
        _ablate(options.get("without", ""))

    assert ("toggleshim" in sys.modules) == (variant == "block"), "the anchor must run without toggleshim"
    if variant == "toggled" and not hasattr(LightningModule, "toggled_optimizer"):
        raise SystemExit("this Lightning has no toggled_optimizer (2.5.1 and later)")
    n_params, n_opts, body_kind = int(options["params"]), int(options["opts"]), options["body"]

    class Bench(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.params = nn.ParameterList([nn.Parameter(torch.zeros(4)) for _ in range(n_params)])

    class TrainerStandIn:
        def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
            self.optimizers = optimizers

    module = Bench()
    params = list(module.params)
    groups = [params[i * n_params // n_opts:(i + 1) * n_params // n_opts] for i in range(n_opts)]
    opts = [torch.optim.SGD(g, lr=1e-3) for g in groups]
    module.trainer = TrainerStandIn(opts)
    grad = torch.full((4,), 1e-3)

    def make_body(group: list[nn.Parameter]) -> Callable[[], None]:
        def body() -> None:
            for p in group:
                p.grad = grad

        return body if body_kind == "grad" else (lambda: None)

    pairs = [(opt, make_body(g)) for opt, g in zip(opts, groups)]

    def block(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                with module.toggle_optimizer(opt):
                    body()

    def manual(n: int) -> None:
        for _ in range(n):
            for opt, body in pairs:
                module.toggle_optimizer(opt)
                try:
                    opt.zero_grad()
                    body()
                    opt.step()
                finally:
                    module.untoggle_optimizer(opt)

    def toggled(n: int) -> None:  # Lightning's own context manager (>= 2.5.1), doing the same
        for _ in range(n):
            for opt, body in pairs:
                with module.toggled_optimizer(opt):
                    opt.zero_grad()
                    body()
                    opt.step()

    run = {"block": block, "manual": manual, "toggled": toggled}[variant]

    def per_toggle(n: int) -> None:
        run(n)

    return per_toggle


_GUARANTEES = ["watch", "compile", "guard", "overrides"]


def _ablate(without: str) -> None:
    """Take guarantees out of the block, to measure what each costs (``--without``): never for users.

    ``watch``: the step watch (a step inside a block stepping on exit is refused); ``compile``: the
    ``torch.compiler.disable`` of the entry points (torch.compile runs the block eagerly); ``guard``:
    the exit guard (Ctrl-C at the first line of ``__exit__``); ``overrides``: the check of the
    user's own ``untoggle_optimizer`` at the exit."""
    import inspect
    import types
    import weakref

    from lightning.pytorch import LightningModule

    from toggleshim import _block, _toggle

    names = set(filter(None, without.split("+")))
    if "watch" in names:
        _block.Toggle._watch_steps = lambda self, inner: None  # type: ignore[method-assign]
    if "compile" in names:
        _block.Toggle.__enter__ = inspect.unwrap(_block.Toggle.__enter__)  # type: ignore[method-assign]
        _block.Toggle._exit = inspect.unwrap(vars(_block.Toggle)["_exit"])  # type: ignore[method-assign]
        for name in ("toggle_optimizer", "untoggle_optimizer"):
            fn = vars(LightningModule)[name]
            plain = inspect.unwrap(fn)
            for mark in ("_toggleshim_original", "_toggleshim_mode"):
                setattr(plain, mark, getattr(fn, mark))
            plain._toggleshim_self = weakref.ref(plain)  # type: ignore[attr-defined]
            setattr(LightningModule, name, plain)
    if "guard" in names:
        class Unguarded:
            def __get__(self, toggle: object, cls: object = None) -> object:
                return types.MethodType(vars(_block.Toggle)["_exit"], toggle)

        _block.Toggle.__exit__ = Unguarded()  # type: ignore[assignment,method-assign]
    if "overrides" in names:
        _toggle.users = lambda module, name: None


def _calls_child(argv: list[str]) -> None:
    """``--calls-child VARIANT key=value...``: the calls (cProfile's count: Python functions and builtins)
    of one toggled optimizer, warmed up, as JSON."""
    import cProfile
    import json
    import pstats

    import torch

    variant, *pairs = argv
    options = dict(p.split("=", 1) for p in pairs)
    torch.set_num_threads(1)
    run = _workload(variant, options)
    run(50)
    profile = cProfile.Profile()
    profile.enable()
    run(100)
    profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    print(json.dumps({"calls": calls / (100 * int(options["opts"]))}))


def _calls(variant: str, options: dict[str, str]) -> float:
    import json
    import subprocess

    pairs = [f"{k}={v}" for k, v in options.items() if k != "seconds"]
    out = subprocess.run([sys.executable, __file__, "--calls-child", variant, *pairs], capture_output=True,
                         text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["calls"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1:], {"toggle": _workload})
        return 0
    if argv[:1] == ["--calls-child"]:
        _calls_child(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", default="10,100,1000", help="parameter counts (comma-separated)")
    p.add_argument("--opts", type=int, default=2, help="optimizers (default 2)")
    p.add_argument("--body", default="grad,none", help="bodies: grad, none (comma-separated)")
    p.add_argument("--runs", type=int, default=7, help="pairs of processes per row (default 7)")
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds timed per process (default 1)")
    p.add_argument("--variant", default="block", choices=("block", "toggled"), help="what is timed against manual")
    p.add_argument("--without", default="", help="measurement only: the block without watch+compile+guard+overrides")
    p.add_argument("--each", action="store_true", help="a row without each guarantee in turn, then without all")
    args = p.parse_args(argv)
    command = "python benchmarks/block_vs_manual.py " + " ".join(argv)
    withouts = ["", *_GUARANTEES, "+".join(_GUARANTEES)] if args.each else [args.without]
    first = "| without " if args.each else ""
    lines = [header(command.strip()), "",
             f"{first}| params | opts | body | {args.variant} µs | manual µs | {args.variant}/manual "
             "(range over pairs) | target |",
             ("|:---" if args.each else "") + "|---:|---:|:---|---:|---:|:---|---:|"]
    failed = False
    for n in (int(x) for x in args.params.split(",")):
        for body in args.body.split(","):
            for without in withouts:
                options = {"params": str(n), "opts": str(args.opts), "body": body, "seconds": str(args.seconds),
                           "without": without}
                r = compare(__file__, "toggle", args.variant, "manual", options, args.runs)
                target = TARGETS.get(n, 1.00)
                failed |= r.ratio > target
                per = args.opts  # an iteration toggles every optimizer once
                label = f"| {without.replace('+', ', ') or '(nothing)'} " if args.each else ""
                lines.append(f"{label}| {n:,} | {args.opts} | {body} | {r.a_us / per:.1f} | {r.b_us / per:.1f} | "
                             f"{r.cell()} | ≤ {target:.2f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    # Python calls per toggled optimizer (cProfile), the block against the manual sequence: at most as many
    lines += ["", f"Calls per toggled optimizer (cProfile: Python functions and builtins), {args.variant} against "
              "manual:", "", f"| params | body | {args.variant} calls | manual calls | target |",
              "|---:|:---|---:|---:|:---|"]
    for n in (int(x) for x in args.params.split(",")):
        for body in args.body.split(","):
            options = {"params": str(n), "opts": str(args.opts), "body": body, "without": ""}
            mine, manual = _calls(args.variant, options), _calls("manual", options)
            failed |= args.variant == "block" and mine > manual
            lines.append(f"| {n:,} | {body} | {mine:.0f} | {manual:.0f} | ≤ manual |")
            print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
