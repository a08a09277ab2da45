"""``python -m toggleshim check``: passes on an unaltered Lightning, fails (with a snippet and a plain
sentence) when Lightning's own toggle/untoggle semantics are altered before it runs."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import pytest

import toggleshim
from toggleshim.__main__ import main
from toggleshim.testing import Mismatch, installed_flavours, mutants

FAST = ["--examples", "12", "--property", "lightning-semantics"]  # the property that watches Lightning itself


@pytest.fixture
def restore_lightning() -> Any:
    saved = {}
    for flavour in ("lightning.pytorch", "pytorch_lightning"):
        try:
            cls = importlib.import_module(flavour).LightningModule
        except ImportError:
            continue
        for name in ("toggle_optimizer", "untoggle_optimizer"):
            fn = vars(cls)[name]
            saved[(cls, name)] = getattr(fn, "_toggleshim_original", fn)
    yield
    toggleshim.uninstall()
    for (cls, name), fn in saved.items():
        setattr(cls, name, fn)
    toggleshim.install()


def test_check_passes_on_unaltered_lightning(flavour: str, tmp_path: Any, capsys: Any) -> None:
    report = tmp_path / "report.json"
    assert main(["check", "--flavour", flavour, "--examples", "10", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["ok"] and data["flavours"] == [flavour]
    assert {p["prop"] for p in data["properties"]} == {"lightning-semantics", "block-equals-manual", "nesting",
                                                        "trainer", "own-methods", "own-methods-trainer"}
    assert all(p["verdict"] == "pass" and p["examples"] > 0 for p in data["properties"])
    assert {"toggleshim", "torch", "python"} <= set(data["versions"])
    out = capsys.readouterr().out
    assert "OK:" in out and flavour in out


@pytest.mark.parametrize(
    ("mutant", "words"),
    [
        ("toggle unfreezes user-frozen parameters", "trainable"),
        ("toggle freezes shared parameters", "frozen"),
        ("untoggle restores nothing", "frozen"),
        ("untoggle unfreezes everything", "trainable"),
    ],
)
def test_check_fails_when_lightning_changes_toggling(
    restore_lightning: Any, flavour: str, mutant: str, words: str, capsys: Any
) -> None:
    mutants.apply(mutant)
    assert main(["check", "--flavour", flavour, *FAST]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "Lightning's own methods" in out and words in out
    assert "Reproduce with:" in out and "spec = WorldSpec(" in out
    snippet = out.split("Reproduce with:\n\n", 1)[1].split("\n\n", 1)[0]
    # the printed snippet is self-contained (run on an empty namespace) and reproduces the mismatch
    with pytest.raises(Mismatch):
        exec(compile(snippet, "<snippet>", "exec"), {})
    if mutant == "toggle unfreezes user-frozen parameters":  # and runs as pasted, in a fresh process
        code = f"from toggleshim.testing import mutants\nmutants.apply({mutant!r})\n{snippet}"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert proc.returncode != 0 and "Mismatch" in proc.stderr


def test_console_script_and_module_agree() -> None:
    proc = subprocess.run([sys.executable, "-m", "toggleshim", "check", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--examples" in proc.stdout and "--json" in proc.stdout


# the module's own methods (issue 36, point 1)

_SHIM_BUG = "the exit bypasses an overridden untoggle_optimizer"
_PLANTED = f"from toggleshim.testing import mutants\nmutants.apply({_SHIM_BUG!r})\n"


def test_check_catches_a_shim_that_bypasses_the_modules_own_untoggle() -> None:
    """A shim whose block exit calls Lightning's untoggle where the module's class overrides it: the
    own-methods properties fail, in every flavour and under Trainer.fit; the properties that draw no
    overrides pass (which is why they exist). Their counterexamples reproduce it as printed."""
    code = _PLANTED + ("import sys\nfrom toggleshim.__main__ import main\n"
                       "sys.exit(main(['check', '--examples', '20', '--json', '-']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    verdicts = {(p["flavour"], p["prop"]): p["verdict"] for p in report["properties"]}
    for (flavour, prop), verdict in verdicts.items():
        assert verdict == ("FAIL" if prop.startswith("own-methods") else "pass"), (flavour, prop, verdict)
    assert {f for f, _ in verdicts} == set(installed_flavours())
    assert "MISMATCH in" in proc.stderr and "/ own-methods [" in proc.stderr and "Overrides(" in proc.stderr
    failed = [p for p in report["properties"] if p["verdict"] == "FAIL"]
    for p in failed[:2]:  # each property's snippet, in a fresh process with the shim's bug planted
        run = subprocess.run([sys.executable, "-c", _PLANTED + p["snippet"]], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 1 and "Mismatch" in run.stderr, run.stderr
        assert p["message"].split(": ", 1)[1] in run.stderr, (p["message"], run.stderr)
