"""``python -m toggleshim check``: does toggling on *this* Lightning still behave as the shim expects?

Runs the property harness in-process against every installed Lightning flavour, with progress, and
reports versions, flavours, each property's examples and verdict, and the total time. On a mismatch
it exits 1 and prints the shrunk counterexample as a runnable snippet with a plain sentence of what
differs. ``--json PATH`` (``-`` for stdout) writes the report as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["main"]


@dataclass
class _Result:
    flavour: str
    prop: str
    examples: int = 0
    verdict: str = "pass"
    seconds: float = 0.0
    message: str = ""
    snippet: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _properties() -> dict[str, tuple[str, Callable[..., Any], Callable[[Any, str], object], int]]:
    """name -> (what it shows, strategy factory, check(spec, flavour), examples divisor)."""
    from toggleshim.testing import (
        assert_lightning_follows_model,
        assert_toggle_equivalent,
        assert_toggle_equivalent_in_trainer,
        worlds,
    )

    return {
        "lightning-semantics": (
            "Lightning's own toggle/untoggle follow the model",
            lambda: worlds(nesting=False),
            assert_lightning_follows_model,
            1,
        ),
        "block-equals-manual": (
            "the block equals the manual sequence, bitwise",
            lambda: worlds(nesting=False),
            assert_toggle_equivalent,
            1,
        ),
        "nesting": ("nested blocks follow the model", lambda: worlds(nesting=True), assert_toggle_equivalent, 1),
        "trainer": (
            "inside Trainer.fit, through LightningOptimizer",
            lambda: worlds(nesting=False, max_ops=3),
            assert_toggle_equivalent_in_trainer,
            10,
        ),
    }


def _snippet(spec: Any, flavour: str, prop: str) -> str:
    checks = {"trainer": "assert_toggle_equivalent_in_trainer", "lightning-semantics": "assert_lightning_follows_model"}
    check = checks.get(prop, "assert_toggle_equivalent")
    return f"import toggleshim\nfrom toggleshim.testing import *\nspec = {spec!r}\n{check}(spec, {flavour!r})\n"


class _Progress:
    def __init__(self, total: int, stream: Any) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def update(self, label: str, n: int = 1) -> None:
        self.done += n
        if self.tty:
            width = 30
            filled = int(width * self.done / max(1, self.total))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label:<45}")
            self.stream.flush()

    def line(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 90 + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()


def _run_property(flavour: str, prop: str, entry: Any, examples: int, seed: int, progress: _Progress) -> _Result:
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import seed as hseed

    from toggleshim.testing import FLAT_EXAMPLES, NESTED_EXAMPLES

    _, strategy, check, divisor = entry
    n = max(2, examples // divisor)
    result = _Result(flavour, prop)
    failing: list[Any] = []

    examples_for = {"nesting": NESTED_EXAMPLES, "trainer": ()}.get(prop, FLAT_EXAMPLES)

    @hseed(seed)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        print_blob=False,
        report_multiple_bugs=False,
    )
    @given(strategy())
    def prop_test(spec: Any) -> None:
        if not failing:  # replays while shrinking are not new examples
            result.examples += 1
            progress.update(f"{flavour} {prop}")
        try:
            check(spec, flavour)
        except BaseException:
            failing.append(spec)
            raise

    for spec in examples_for:  # the hand-picked worlds run first, every time
        prop_test = example(spec)(prop_test)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prop_test()
    except Exception as exc:
        result.verdict = "FAIL"
        result.message = _plain(exc)
        if failing:
            result.snippet = _snippet(failing[-1], flavour, prop)  # Hypothesis replays the shrunk one last
    result.seconds = time.perf_counter() - start
    progress.update(f"{flavour} {prop}", n - min(n, result.examples))  # keep the bar honest on early stops
    return result


def _plain(exc: BaseException) -> str:
    """One plain sentence of what differs, from a Mismatch (or the error itself)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    for label, words in (
        ("left", "after leaving the block over optimizer "),
        ("untoggled", "after untoggle_optimizer "),
        ("toggled", "after toggling optimizer "),
    ):
        for part in text.split():
            if part.startswith(label) and part.rstrip(":,").removeprefix(label).isdigit():
                text = text.replace(part.rstrip(":,"), words + part.rstrip(":,").removeprefix(label))
    text = text.replace("manual world", "Lightning's own methods").replace("shim world", "the shim")
    return text if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {text}"


def _versions() -> dict[str, str]:
    from importlib import metadata

    import torch

    import toggleshim

    found = {"toggleshim": toggleshim.__version__, "torch": torch.__version__, "python": platform.python_version()}
    for dist in ("lightning", "pytorch-lightning"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[dist] = metadata.version(dist)
    return found


def check(examples: int, seed: int, flavours: list[str] | None, json_path: str | None, only: list[str] | None) -> int:
    import toggleshim
    from toggleshim._patch import _flavours
    from toggleshim.testing import installed_flavours

    out = sys.stderr if json_path == "-" else sys.stdout
    for name in ("lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # Trainer.fit's banners would drown the report
    with warnings.catch_warnings(record=True) as refused:
        warnings.simplefilter("always")
        toggleshim.install(allow_untested=True)  # checking an untested release is the point
    names = flavours or installed_flavours()
    patched = {
        f.name
        for f in _flavours()
        if all(
            hasattr(vars(f.module_cls)[n], "_toggleshim_original") for n in ("toggle_optimizer", "untoggle_optimizer")
        )
    }
    props = {k: v for k, v in _properties().items() if not only or k in only}
    total = sum(max(2, examples // v[3]) for v in props.values()) * len(names)
    progress = _Progress(total, out)
    versions = _versions()
    progress.line("toggleshim check: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    progress.line(
        f"flavours: {', '.join(names) or 'none found'}; {examples} examples a property; seed {seed}"
    )
    start = time.perf_counter()
    results: list[_Result] = []
    for flavour in names:
        if flavour not in patched:
            reasons = "; ".join(str(w.message) for w in refused) or "not patched"
            results.append(_Result(flavour, "install", verdict="FAIL", message=reasons))
            progress.line(f"  {flavour:<18} install                FAIL  {reasons}")
            continue
        for prop, entry in props.items():
            r = _run_property(flavour, prop, entry, examples, seed, progress)
            results.append(r)
            progress.line(
                f"  {flavour:<18} {prop:<22} {r.verdict:<4}  {r.examples:>4} examples  {r.seconds:6.1f} s  ({entry[0]})"
            )
    elapsed = time.perf_counter() - start
    failed = [r for r in results if r.verdict != "pass"] or (
        [] if names else [_Result("-", "flavours", verdict="FAIL", message="no Lightning found")]
    )
    for r in failed:
        progress.line(f"\nMISMATCH in {r.flavour} / {r.prop}: {r.message}")
        if r.snippet:
            progress.line("Reproduce with:\n\n" + r.snippet)
    progress.line(
        f"{'FAILED' if failed else 'OK'}: {len(results) - len(failed)} passed, {len(failed)} failed in {elapsed:.1f} s"
    )
    if json_path:
        report = {
            "versions": versions,
            "flavours": names,
            "examples": examples,
            "seed": seed,
            "seconds": round(elapsed, 2),
            "ok": not failed,
            "properties": [r.__dict__ for r in results],
        }
        text = json.dumps(report, indent=2, default=str)
        if json_path == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(json_path, "w") as fh:
                fh.write(text + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["migrate"]:  # `toggleshim migrate` (docs/migrate.md); imported only when used
        from toggleshim import _migrate

        return _migrate.main(args_in[1:])
    parser = argparse.ArgumentParser(prog="toggleshim", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check toggling on the installed Lightning (every flavour)")
    c.add_argument("--examples", type=int, default=100, help="random worlds a property (default 100)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random worlds (default 0: reproducible)")
    c.add_argument("--json", metavar="PATH", help="write a machine-readable report ('-' for stdout)")
    c.add_argument(
        "--flavour",
        action="append",
        choices=["lightning.pytorch", "pytorch_lightning"],
        help="only this flavour (repeatable; default: every installed one)",
    )
    c.add_argument("--property", action="append", dest="only", help="only this property (repeatable)")
    args = parser.parse_args(argv)
    return check(args.examples, args.seed, args.flavour, args.json, args.only)


if __name__ == "__main__":
    sys.exit(main())
