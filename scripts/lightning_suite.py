#!/usr/bin/env python
"""Run Lightning's own toggling / manual-optimization unit tests with toggleshim active, and without it.

Requirement shown: "Lightning's own unit tests for toggling and for manual optimization must pass with
the shim active". This script runs those tests twice per Lightning flavour, once as a *baseline*
(toggleshim never imported) and once with the *shim* active, compares the two, and exits non-zero when
a test fails (or errors) with the shim but not without it, when the shim was not really active, or when
Lightning's toggle tests did not go through the shim at all.

Where Lightning's tests come from
---------------------------------
They are NOT on PyPI: the ``lightning`` and ``pytorch-lightning`` sdists (``pip download --no-deps
--no-binary :all: lightning==2.6.6``) ship ``src/`` and ``requirements/`` only, the wheels ship no
tests, and Debian has no Lightning package. They live in the GitHub repository only, so this script
needs a Lightning checkout and cannot run in CI (which reaches package registries only). Get one with::

    git clone --filter=blob:none https://github.com/Lightning-AI/pytorch-lightning /tmp/pytorch-lightning

and pass either that work tree (its checked-out commit is used; ``git -C /tmp/pytorch-lightning checkout
2.6.6`` first) or its git directory (``/tmp/pytorch-lightning/.git``, or a bare / mirror clone): with a
git directory the tests are taken with ``git archive`` from ``--ref``, by default the tag equal to the
installed ``lightning`` version, else the newest lower tag of the same minor series (a warning says so;
e.g. a snapshot without 2.6.6 uses 2.6.5, whose ``lightning.pytorch`` differs from 2.6.6 only in
``core/saving.py``). Only ``tests/tests_pytorch`` and Lightning's ``pyproject.toml`` (its pytest
settings) are copied, into a temporary directory; nothing is written into the checkout or this repo.

What runs
---------
``--selection toggle`` (default): every test file about toggling and manual optimization
(see ``SELECTIONS``); ``--selection broad`` adds neighbouring suites (all of ``core/``, ``loops/``,
``trainer/optimization/``, hooks, torchscript, lr finder/monitor, AMP plugins, ...), which also catch
global side effects of ``import toggleshim``.

Lightning gates its two Trainer-level toggle tests on CUDA GPUs
(``test_multiple_optimizers_logging``: 1 GPU; ``..._ddp_with_toggle_model``: 2 GPUs, DDP, standalone).
Unless ``--no-cpu-port``, they run on CPU anyway: the plugin lifts their ``RunIf`` skip and maps
``accelerator="gpu"`` to ``"cpu"`` and ``precision="16-mixed"`` to ``"bf16-mixed"`` for them only; the
DDP one runs in its own pytest process, as Lightning runs standalone tests (the ``ddp`` launcher
re-runs that pytest command for rank 1, so the shim is active in both ranks).

``--flavour pytorch_lightning`` runs the same tests against ``pytorch_lightning`` by rewriting
``lightning.pytorch`` -> ``pytorch_lightning`` and ``lightning.fabric`` -> ``lightning_fabric`` in the
staged copy (what Lightning's own release tooling does for that package).

Everything runs on CPU (``CUDA_VISIBLE_DEVICES`` is emptied). Tests that fail in *both* modes are
reported as environment failures (e.g. ``test_property_logger`` needs ``tensorboard``) and do not make
the run fail unless ``--strict``.

Examples::

    python scripts/lightning_suite.py /tmp/pytorch-lightning/.git               # toggle selection
    python scripts/lightning_suite.py /tmp/pytorch-lightning --selection broad --flavour both
    python scripts/lightning_suite.py CHECKOUT --mode shim --import-order shim-first --json out.json

Exit status: 0 all checks passed, 1 a check failed, 2 usage or staging error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLUGIN = "lightning_suite_plugin"

TOGGLE_FILES = [
    "tests_pytorch/core/test_lightning_module.py",  # toggle/untoggle, toggled_optimizer
    "tests_pytorch/core/test_lightning_optimizer.py",  # LightningOptimizer (toggle_model's home)
    "tests_pytorch/trainer/optimization/test_manual_optimization.py",
    "tests_pytorch/trainer/optimization/test_multiple_optimizers.py",
    "tests_pytorch/trainer/optimization/test_optimizers.py",
    "tests_pytorch/loops/optimization/test_manual_loop.py",
    "tests_pytorch/callbacks/test_model_checkpoint_manual_opt.py",
]
BROAD_EXTRA = [
    "tests_pytorch/core",
    "tests_pytorch/trainer/optimization",
    "tests_pytorch/loops",
    "tests_pytorch/models/test_hooks.py",
    "tests_pytorch/models/test_torchscript.py",
    "tests_pytorch/callbacks/test_lr_monitor.py",
    "tests_pytorch/callbacks/test_gradient_accumulation_scheduler.py",
    "tests_pytorch/tuner/test_lr_finder.py",
    "tests_pytorch/trainer/test_config_validator.py",
    "tests_pytorch/plugins/test_amp_plugins.py",
]
SELECTIONS = {"toggle": TOGGLE_FILES, "broad": TOGGLE_FILES + BROAD_EXTRA}
#: The file every selection needs: without it there is nothing about toggling to run.
REQUIRED_FILE = TOGGLE_FILES[0]

MANUAL_OPT = "tests_pytorch/trainer/optimization/test_manual_optimization.py"
CPU_PORT_IN_PROCESS = ["test_multiple_optimizers_logging"]
CPU_PORT_STANDALONE = "test_step_with_optimizer_closure_with_different_frequencies_ddp_with_toggle_model"

FLAVOURS = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
FAILED = ("failed", "error", "xpassed")


class StageError(Exception):
    pass


# -- staging Lightning's tests -------------------------------------------------------------------


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, check=False)


def _version_key(tag: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?", tag)  # 2.0.9.post0 is a release too
    return tuple(int(x) for x in m.groups()) if m else None


def choose_ref(git_dir: Path, installed: str) -> tuple[str, str | None]:
    """The tag matching ``installed`` or the newest lower one of the same minor (ref, warning)."""
    out = _git(git_dir, "tag", "--list")
    if out.returncode:
        raise StageError(f"git tag failed in {git_dir}: {out.stderr.decode(errors='replace').strip()}")
    tags = {t: _version_key(t) for t in out.stdout.decode().split()}
    want = _version_key(installed)
    if want is None:
        raise StageError(f"cannot parse the installed Lightning version {installed!r}; pass --ref")
    for tag in (installed, f"v{installed}"):
        if tag in tags:
            return tag, None
    for tag, key in tags.items():
        if key == want:
            return tag, None
    lower = [(key, tag) for tag, key in tags.items() if key and key[:2] == want[:2] and key < want]
    if not lower:
        raise StageError(f"no tag {installed} nor an older {want[0]}.{want[1]}.x tag in {git_dir}; pass --ref")
    tag = max(lower)[1]
    return tag, f"no tag {installed} in {git_dir}; using {tag}, the newest older {want[0]}.{want[1]}.x tag"


def stage(source: Path, ref: str | None, installed: str, dest: Path) -> str:
    """Copy ``tests/tests_pytorch`` and ``pyproject.toml`` of a checkout into ``dest``; describe what."""
    dest.mkdir(parents=True)
    work_tree = source / "tests" / "tests_pytorch"
    if work_tree.is_dir() and ref is None:
        shutil.copytree(work_tree, dest / "tests" / "tests_pytorch", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(source / "pyproject.toml", dest / "pyproject.toml")
        head = subprocess.run(
            ["git", "-C", str(source), "describe", "--tags", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        version = source / "src" / "version.info"
        v = version.read_text().strip() if version.is_file() else "?"
        note = f"work tree {source} at {head or 'unknown commit'} (src/version.info {v})"
        if v != installed:
            note += f"; WARNING: installed lightning is {installed}"
        return note
    git_dir = source / ".git" if (source / ".git").is_dir() else source
    if _git(git_dir, "rev-parse", "--git-dir").returncode:
        raise StageError(f"{source} is neither a Lightning work tree (no tests/tests_pytorch) nor a git directory")
    warning = None
    if ref is None:
        ref, warning = choose_ref(git_dir, installed)
    out = _git(git_dir, "archive", "--format=tar", ref, "tests/tests_pytorch", "pyproject.toml")
    if out.returncode or not out.stdout:
        raise StageError(f"git archive {ref} failed: {out.stderr.decode(errors='replace').strip()}")
    tar_path = dest / "lightning-tests.tar"
    tar_path.write_bytes(out.stdout)
    with tarfile.open(tar_path) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python without extraction filters (< 3.10.12 / 3.11.4)
            tar.extractall(dest)  # our own git archive of tests/ and pyproject.toml
    tar_path.unlink()
    if not (dest / "tests" / "tests_pytorch" / "conftest.py").is_file():
        raise StageError(f"{ref} has no tests/tests_pytorch/conftest.py")
    commit = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").stdout.decode().strip()
    return f"git {git_dir} ref {ref} ({commit[:12]})" + (f"; WARNING: {warning}" if warning else "")


def convert_to_pytorch_lightning(root: Path) -> int:
    """Rewrite the staged tests to import ``pytorch_lightning`` / ``lightning_fabric``; files changed."""
    changed = 0
    for path in (root / "tests" / "tests_pytorch").rglob("*.py"):
        text = path.read_text()
        new = re.sub(r"\blightning\.pytorch\b", "pytorch_lightning", text)
        new = re.sub(r"\blightning\.fabric\b", "lightning_fabric", new)
        if new != text:
            path.write_text(new)
            changed += 1
    return changed


# -- running -------------------------------------------------------------------------------------


@dataclass
class Run:
    flavour: str
    mode: str
    commands: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    per_test_toggles: Counter[str] = field(default_factory=Counter)
    toggles: int = 0
    processes: int = 0
    problems: list[str] = field(default_factory=list)
    cpu_ported: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> Counter[str]:
        return Counter(self.outcomes.values())


_SHOWN_ENV = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")


def _run_pytest(
    args: list[str],
    *,
    python: str,
    cwd: Path,
    env: dict[str, str],
    out: Path,
    timeout: float,
    log: Path,
    verbose: bool,
    run: Run,
) -> None:
    out.mkdir(parents=True)
    env = dict(env, TOGGLESHIM_SUITE_OUT=str(out))
    cmd = [python, "-m", "pytest", *args]
    shown = " ".join(f"{k}={env[k]}" for k in sorted(env) if k.startswith("TOGGLESHIM_SUITE") or k in _SHOWN_ENV)
    run.commands.append(f"(cd {cwd} && {shown} {' '.join(cmd)})")
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=None if verbose else fh,
            stderr=subprocess.STDOUT if not verbose else None,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session, still led by it: pytest, workers, DDP ranks
            proc.wait()
            run.problems.append(f"pytest timed out after {timeout:.0f}s: {' '.join(args)}")
            return
    if rc not in (0, 1):
        run.problems.append(
            f"pytest exited {rc} (not a test failure: usage, internal or shim check): {' '.join(args)}; see {log}"
        )
    files = sorted(out.glob("proc-*.json"))
    main = out / f"proc-{proc.pid}.json"
    if not main.is_file():
        run.problems.append(f"pytest (pid {proc.pid}) wrote no result file: {' '.join(args)}; see {log}")
    for path in files:
        rec: dict[str, Any] = json.loads(path.read_text())
        run.processes += 1
        run.toggles += rec["toggles"]
        run.per_test_toggles.update(rec["per_test_toggles"])
        run.problems.extend(rec["problems"])
        run.cpu_ported.extend(n for n in rec["cpu_ported"] if n not in run.cpu_ported)
        if (rec["mode"] == "shim") != rec["toggleshim_imported"]:
            run.problems.append(
                f"pid {rec['pid']}: mode {rec['mode']} but toggleshim imported={rec['toggleshim_imported']}"
            )
        if path == main:
            run.outcomes.update(rec["outcomes"])


def run_mode(root: Path, flavour: str, mode: str, files: list[str], opts: argparse.Namespace, work: Path) -> Run:
    run = Run(flavour, mode)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PL_", "TOGGLESHIM_SUITE", "PYTEST_")) and k != "RUN_ONLY_CUDA_TESTS"
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]),
        CUDA_VISIBLE_DEVICES="",
        TOGGLESHIM_SUITE_MODE=mode,
        TOGGLESHIM_SUITE_FLAVOUR=FLAVOURS[flavour],
        TOGGLESHIM_SUITE_IMPORT_ORDER=opts.import_order,
        TOGGLESHIM_SUITE_STANDALONE=CPU_PORT_STANDALONE,
        TOGGLESHIM_SUITE_CPU_PORT="" if opts.no_cpu_port else ",".join([*CPU_PORT_IN_PROCESS, CPU_PORT_STANDALONE]),
    )
    base = ["-p", PLUGIN, "-p", "no:cacheprovider", "--color=no", "-q", "-o", "console_output_style=classic"]
    base += [f"--rootdir={root}"]  # node ids are relative to it: "tests/tests_pytorch/..."
    tests_dir = root / "tests"
    standalone = f"{MANUAL_OPT}::{CPU_PORT_STANDALONE}"
    has_standalone = MANUAL_OPT in files and CPU_PORT_STANDALONE in (tests_dir / MANUAL_OPT).read_text()
    xdist = ["-n", str(opts.workers)] if opts.workers > 0 else []
    log = work / f"{flavour}-{mode}.log"
    start = time.monotonic()
    pytest = functools.partial(
        _run_pytest, python=opts.python, cwd=tests_dir, env=env, timeout=opts.timeout, log=log,
        verbose=opts.verbose, run=run,
    )  # fmt: skip
    pytest([*base, *xdist, *files, "--deselect", f"tests/{standalone}"], out=work / f"{flavour}-{mode}-main")
    if has_standalone:
        # DDP with the `ddp` launcher re-runs this very command for rank 1: keep it alone, no xdist.
        pytest([*base, standalone], out=work / f"{flavour}-{mode}-ddp")
    run.seconds = time.monotonic() - start
    return run


# -- judging -------------------------------------------------------------------------------------


def judge(runs: dict[tuple[str, str], Run], opts: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(failures, notes): every check that failed, and what is worth knowing but not a failure."""
    failures: list[str] = []
    notes: list[str] = []
    for (flavour, mode), run in runs.items():
        where = f"[{flavour}/{mode}]"
        failures.extend(f"{where} {p}" for p in run.problems)
        if not run.outcomes:
            failures.append(f"{where} no test outcome was recorded")
            continue
        if run.counts()["passed"] == 0:
            failures.append(f"{where} not a single test passed")
        if mode != "shim":
            continue
        toggle_tests = [n for n, o in run.outcomes.items() if "toggle" in n.split("::")[-1] and o == "passed"]
        if not toggle_tests:
            failures.append(f"{where} no Lightning toggle test ran and passed (all skipped or deselected?)")
        silent = [n for n in toggle_tests if run.per_test_toggles.get(n, 0) == 0]
        if silent:
            failures.append(
                f"{where} these toggle tests passed without creating one toggleshim Toggle "
                f"(the shim was bypassed): {silent}"
            )
        if not opts.no_cpu_port and flavour == "lightning" and not run.cpu_ported:
            notes.append(f"{where} no GPU-gated toggle test was found to port to CPU")
        base = runs.get((flavour, "baseline"))
        shim_failed = {n for n, o in run.outcomes.items() if o in FAILED}
        if base is None:
            failures.extend(f"{where} failed: {n} ({run.outcomes[n]})" for n in sorted(shim_failed))
            continue
        base_failed = {n for n, o in base.outcomes.items() if o in FAILED}
        for n in sorted(shim_failed - base_failed):
            failures.append(
                f"{where} fails only with the shim: {n} ({run.outcomes[n]}; baseline: "
                f"{base.outcomes.get(n, 'not run')})"
            )
        for n in sorted(shim_failed & base_failed):
            (failures if opts.strict else notes).append(f"{where} fails with and without the shim (environment?): {n}")
        for n in sorted(set(base.outcomes) - set(run.outcomes)):
            failures.append(f"{where} ran at baseline but not with the shim: {n}")
        fixed = sorted(base_failed - shim_failed)
        if fixed:
            notes.append(f"{where} fail at baseline, pass with the shim: {fixed}")
    return failures, notes


def report(runs: dict[tuple[str, str], Run], failures: list[str], notes: list[str], staged: str) -> str:
    lines = [f"Lightning tests: {staged}", ""]
    header = (
        f"{'flavour':<18} {'mode':<9} {'passed':>6} {'failed':>6} {'error':>5} {'skipped':>7} "
        f"{'other':>5} {'toggles':>8} {'tests w/ toggles':>16} {'secs':>6}"
    )
    lines += [header, "-" * len(header)]
    for (flavour, mode), run in runs.items():
        c = run.counts()
        other = sum(v for k, v in c.items() if k not in ("passed", "failed", "error", "skipped"))
        exercised = sum(1 for n, k in run.per_test_toggles.items() if k and n in run.outcomes)
        lines.append(
            f"{flavour:<18} {mode:<9} {c['passed']:>6} {c['failed']:>6} {c['error']:>5} {c['skipped']:>7} "
            f"{other:>5} {run.toggles:>8} {exercised:>16} {run.seconds:>6.0f}"
        )
    for run in runs.values():
        if run.cpu_ported:
            lines.append(
                f"\n[{run.flavour}/{run.mode}] GPU-gated toggle tests run on CPU: "
                + ", ".join(n.split("::")[-1] for n in run.cpu_ported)
            )
            break
    if notes:
        lines += ["", "Notes:", *(f"  - {n}" for n in notes)]
    lines += ["", "FAILED checks:" if failures else "All checks passed.", *(f"  - {f}" for f in failures)]
    return "\n".join(lines)


_PROBE = """
import importlib.metadata as m, importlib.util as u, pytest
try:
    v = m.version("lightning")
except m.PackageNotFoundError:
    v = m.version("pytorch-lightning")
print(v, u.find_spec("xdist") is not None)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("lightning", type=Path, help="Lightning work tree, or its git directory / a bare clone")
    parser.add_argument(
        "--ref",
        help="tag or commit to take the tests from (git directory: default the tag "
        "of the installed version; work tree: default its checked-out files)",
    )
    parser.add_argument("--selection", choices=sorted(SELECTIONS), default="toggle")
    parser.add_argument("--flavour", choices=["lightning", "pytorch_lightning", "both"], default="lightning")
    parser.add_argument("--mode", choices=["both", "shim", "baseline"], default="both")
    parser.add_argument(
        "--import-order",
        choices=["lightning-first", "shim-first"],
        default="lightning-first",
        help="import toggleshim after Lightning (as isort orders user code) or before it",
    )
    parser.add_argument("--no-cpu-port", action="store_true", help="leave Lightning's GPU-only toggle tests skipped")
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (0: none)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per pytest process")
    parser.add_argument("--strict", action="store_true", help="also fail on tests failing in both modes")
    parser.add_argument("--python", help="interpreter to run pytest with (default: this one)")
    parser.add_argument("--json", type=Path, help="write every outcome and the verdict here")
    parser.add_argument("--keep", action="store_true", help="keep the staging directory (logs, results)")
    parser.add_argument("-v", "--verbose", action="store_true", help="stream pytest's output")
    opts = parser.parse_args(argv)
    opts.python = python = opts.python or sys.executable
    probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=False)
    if probe.returncode:
        print(f"error: {python} cannot import Lightning and pytest:\n{probe.stderr}", file=sys.stderr)
        return 2
    installed, has_xdist = probe.stdout.split()
    if opts.workers and has_xdist != "True":
        print("pytest-xdist is not installed there; running without -n", file=sys.stderr)
        opts.workers = 0

    work = Path(tempfile.mkdtemp(prefix="toggleshim-lightning-suite-"))
    keep = opts.keep
    try:
        flavours = ["lightning", "pytorch_lightning"] if opts.flavour == "both" else [opts.flavour]
        modes = ["baseline", "shim"] if opts.mode == "both" else [opts.mode]
        try:
            staged = stage(opts.lightning.resolve(), opts.ref, installed, work / "lightning")
        except (StageError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"staged Lightning's tests from {staged}\n  into {work}", flush=True)
        runs: dict[tuple[str, str], Run] = {}
        for flavour in flavours:
            root = work / "lightning"
            if flavour == "pytorch_lightning":
                root = work / "pytorch_lightning"
                shutil.copytree(work / "lightning", root)
                convert_to_pytorch_lightning(root)
            files = [f for f in SELECTIONS[opts.selection] if (root / "tests" / f).exists()]
            missing = sorted(set(SELECTIONS[opts.selection]) - set(files))
            if REQUIRED_FILE not in files:
                print(f"error: the staged tests have no {REQUIRED_FILE}", file=sys.stderr)
                return 2
            if missing:
                print(f"not in this Lightning version, skipped: {missing}", flush=True)
            for mode in modes:
                print(f"running {flavour} / {mode} ...", flush=True)
                runs[(flavour, mode)] = run_mode(root, flavour, mode, files, opts, work)
        failures, notes = judge(runs, opts)
        print("\n" + report(runs, failures, notes, staged))
        print("\nCommands (run from the staging directory):")
        for run in runs.values():
            for cmd in run.commands:
                print(f"  {cmd}")
        if opts.json:
            opts.json.write_text(
                json.dumps(
                    {
                        "staged": staged,
                        "runs": {
                            f"{f}/{m}": {
                                "outcomes": r.outcomes,
                                "toggles": r.toggles,
                                "per_test_toggles": dict(r.per_test_toggles),
                                "problems": r.problems,
                                "cpu_ported": r.cpu_ported,
                                "commands": r.commands,
                            }
                            for (f, m), r in runs.items()
                        },
                        "failures": failures,
                        "notes": notes,
                    },
                    indent=1,
                    sort_keys=True,
                )
            )
        keep = keep or bool(failures)
        if keep:
            print(f"\nlogs and per-process results kept in {work}")
        return 1 if failures else 0
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
