"""The canary (issue 13, point 6): ``scripts/fingerprints.py --checkout`` tells a checkout's toggle code
verified or not, and the scheduled workflow runs ``nox -s canary`` on Lightning's main branch with
least privileges. (The nox session itself was run against a snapshot of Lightning's main branch:
docs/guard.md, "The canary".)"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from _fake_release import FORCE_TRAINABLE

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "fingerprints.py"


def _checkout(tmp_path: Path, flavour: str, edit: tuple[str, str] | None) -> Path:
    """A minimal 'checkout': Lightning's real module source at the path the repository has it."""
    module = sys.modules[f"{flavour}.core.module"]
    source = Path(inspect.getfile(module)).read_text()
    if edit:
        assert edit[0] in source
        source = source.replace(edit[0], edit[1], 1)
    rel = "lightning/pytorch" if flavour == "lightning.pytorch" else "pytorch_lightning"
    target = tmp_path / "src" / rel / "core" / "module.py"
    target.parent.mkdir(parents=True)
    target.write_text(source)
    return tmp_path


def test_fingerprints_of_a_checkout(tmp_path: Path, flavour: str) -> None:
    same = subprocess.run([sys.executable, str(SCRIPT), "--checkout", str(_checkout(tmp_path / "a", flavour, None))],
                          capture_output=True, text=True)
    assert same.returncode == 0 and "known (" in same.stdout, same.stdout + same.stderr
    changed = subprocess.run(
        [sys.executable, str(SCRIPT), "--checkout", str(_checkout(tmp_path / "b", flavour, FORCE_TRAINABLE))],
        capture_output=True, text=True,
    )  # fmt: skip
    assert changed.returncode == 1 and "UNKNOWN" in changed.stdout, changed.stdout + changed.stderr


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def test_canary_workflow_runs_the_nox_session_on_lightning_main() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "canary.yml").read_text())
    triggers = wf.get("on") or wf.get(True)  # YAML 1.1 reads a bare `on` as True
    assert "schedule" in triggers and "workflow_dispatch" in triggers
    assert wf["permissions"] == {"contents": "read"}
    (job,) = wf["jobs"].values()
    steps = _steps(job)
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    assert all(s["with"]["persist-credentials"] is False for s in checkouts)
    lightning = [s for s in checkouts if s["with"].get("repository") == "Lightning-AI/pytorch-lightning"]
    assert lightning and lightning[0]["with"]["ref"] == "master"
    runs = "\n".join(s.get("run", "") for s in steps)
    assert f"nox -s canary -- {lightning[0]['with']['path']}" in runs
    for step in steps:
        if "uses" in step:
            assert len(step["uses"].split("@")[1]) == 40  # pinned by commit SHA
