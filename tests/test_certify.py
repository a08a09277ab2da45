"""An unverified Lightning's way forward (issue 36, points 4 and 5), as users meet it: fresh processes,
piped and on a terminal, in a project of their own.

The releases are copies of the installed ``lightning`` package first on ``PYTHONPATH`` (labelled
2.7.0, ``tests/_fake_release.py``), with one edit to ``LightningModule``: a no-op line (the code, and so
its fingerprint, changes; its semantics do not), another no-op line elsewhere (other code again), or
the toggle forcing the toggled parameters trainable (changed semantics). ``pytorch_lightning`` stays
the installed, verified one.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _fake_release import FORCE_TRAINABLE, NO_OP, NO_OP_UNTOGGLE, release_tree, user_env
from _fixtures import torch_properties_that_apply
from _terminal import run_on_pty

import toggleshim
from toggleshim._known import KNOWN

TOGGLESHIM = [sys.executable, "-m", "toggleshim"]
QUICK = ["--examples", "5"]
# a user's script: toggleshim's warnings and INFO messages shown, one a line; the gate's verdict
IMPORT = """
import logging, sys, warnings
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(levelname)s %(message)s")
for name in ("lightning.pytorch", "lightning.fabric"):
    logging.getLogger(name).setLevel(logging.WARNING)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import toggleshim
    import lightning.pytorch
for w in caught:
    if issubclass(w.category, toggleshim.ToggleshimWarning):
        print("WARNING", w.message)
from toggleshim import _patch
[flavour] = [f for f in _patch._flavours() if f.name == "lightning.pytorch"]
print("GATE", _patch._status(flavour))
"""


def run(args: list[str], cwd: Path, *paths: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env={**user_env(*paths), **env}, capture_output=True, text=True,
                          timeout=600)


def project(root: Path) -> Path:
    """A user's project: a pyproject.toml, and a directory below it they work in."""
    (root / "src").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    return root / "src"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for name, edit in (("no-op", NO_OP), ("other no-op", NO_OP_UNTOGGLE), ("changed", FORCE_TRAINABLE)):
        made[name] = release_tree(tmp_path_factory.mktemp(name.replace(" ", "-")), "lightning.pytorch", (edit,),
                                  "2.7.0")
    return made


@pytest.fixture(scope="module")
def certified(releases: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A project whose no-op release was certified (from a directory below its root), piped:
    (the project's working directory, what certify printed)."""
    work = project(tmp_path_factory.mktemp("certified"))
    proc = run([*TOGGLESHIM, "certify", *QUICK], work, releases["no-op"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work, proc.stdout


def entries(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["certified"])


# certification: accepted on code that keeps the semantics, refused where they changed


def test_a_semantics_preserving_change_is_certified_at_the_projects_root(certified: tuple[Path, str]) -> None:
    work, out = certified
    certificate = work.parent / "toggleshim-certified.json"
    assert not (work / "toggleshim-certified.json").exists()
    [entry] = entries(certificate)
    # its toggle code is new to toggleshim (a no-op line), its untoggle code the verified one
    assert (entry["toggle_optimizer"], entry["untoggle_optimizer"]) not in KNOWN
    assert entry["untoggle_optimizer"] in {u for _, u in KNOWN}
    assert entry["toggleshim"] == toggleshim.__version__ and entry["examples"] == 5
    assert entry["releases"] == ["lightning 2.7.0 (lightning.pytorch)"]
    installed = importlib.metadata.version("pytorch-lightning")
    assert f"pytorch-lightning {installed} (pytorch_lightning): nothing to certify: toggle code verified" in out
    # every property ran, every one passed, and the torch properties
    assert f"OK: {6 + torch_properties_that_apply()} passed, 0 failed" in out
    assert f"CERTIFIED: lightning 2.7.0 (lightning.pytorch): every property passed on its toggle code (fingerprints " \
           f"{entry['toggle_optimizer'][:12]}, {entry['untoggle_optimizer'][:12]}; 6 properties, {entry['worlds']} " \
           "worlds)." in out
    assert f"Recorded in {certificate}: commit it with your project." in out
    assert "\r" not in out and "Your choices" not in out


def test_from_then_on_that_lightning_is_patched_as_verified_said_once(
    certified: tuple[Path, str], releases: dict[str, Path]
) -> None:
    work, _ = certified
    imported, strict = (
        run([sys.executable, "-c", IMPORT], work, releases["no-op"]),
        run([*TOGGLESHIM, "check", "--strict", "--examples", "3"], work, releases["no-op"]),
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "WARNING" not in imported.stdout  # said once, at INFO level: never a warning
    logged = [line for line in imported.stdout.splitlines() if line.startswith("LOG toggleshim")]
    assert len(logged) == 1 and logged[0].startswith("LOG toggleshim INFO lightning 2.7.0 (lightning.pytorch): "
                                                     "toggle code certified locally"), imported.stdout
    assert "GATE ('shim', \"toggle code certified locally: every property of toggleshim" in imported.stdout
    # the check trusts it as verified code: nested blocks are toggleshim's own, and --strict passes
    assert strict.returncode == 0, strict.stdout + strict.stderr
    assert "lightning.pytorch  toggle code certified locally" in strict.stdout
    assert "nesting                pass" in strict.stdout and "NOT verified" not in strict.stdout


def test_other_code_elsewhere_or_another_toggleshim_is_unverified_again(
    certified: tuple[Path, str], releases: dict[str, Path], tmp_path: Path
) -> None:
    work, _ = certified
    certificate = work.parent / "toggleshim-certified.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    older = tmp_path / "older.json"
    older.write_text(json.dumps({"certified": [{**entries(certificate)[0], "toggleshim": "0.0.1"}]}))
    # another no-op line: other code; the certified code, run outside the project, then with the
    # certificate named; a certificate of another toggleshim version
    other, outside, named, version = (
        run([sys.executable, "-c", IMPORT], work, releases["other no-op"]),
        run([sys.executable, "-c", IMPORT], elsewhere, releases["no-op"]),
        run([sys.executable, "-c", IMPORT], elsewhere, releases["no-op"], TOGGLESHIM_CERTIFIED=str(certificate)),
        run([sys.executable, "-c", IMPORT], elsewhere, releases["no-op"], TOGGLESHIM_CERTIFIED=str(older)),
    )
    for proc in (other, outside, version):  # the fallback, and its warning naming the way forward
        assert proc.returncode == 0 and "GATE ('fallback'" in proc.stdout, proc.stdout + proc.stderr
        [warning] = [line for line in proc.stdout.splitlines() if line.startswith("WARNING")]
        assert "(`python -m toggleshim certify`)" in warning and "LOG toggleshim" not in proc.stdout
    assert f"{certificate} certifies other toggle code" in other.stdout
    assert "certif" not in outside.stdout.split("Your choices")[0]  # no certificate applies there
    assert f"{older} certifies this code for toggleshim 0.0.1, not {toggleshim.__version__}: certify it again" in \
           version.stdout
    assert named.returncode == 0 and "GATE ('shim'" in named.stdout, named.stdout + named.stderr
    assert "WARNING" not in named.stdout


def test_changed_semantics_are_refused_and_nothing_is_recorded(releases: dict[str, Path], tmp_path: Path) -> None:
    work = project(tmp_path)
    proc = run([*TOGGLESHIM, "certify", *QUICK], work, releases["changed"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stdout and "Reproduce with:" in proc.stdout
    assert "NOT CERTIFIED: " in proc.stdout and "nothing was recorded" in proc.stdout
    assert not list(tmp_path.rglob("toggleshim-certified.json"))
    forward = proc.stdout.split("NOT CERTIFIED", 1)[1]
    assert 'pip install "lightning==' in forward and "pip install --upgrade toggleshim" in forward
    assert "toggleshim certify" not in forward


def test_a_failing_certification_withdraws_the_same_codes_certificate(
    certified: tuple[Path, str], releases: dict[str, Path], tmp_path: Path
) -> None:
    """The certified code checked again by a toggleshim with a bug (planted): refused, and the
    certificate of that code by this toggleshim is gone; others stay."""
    work, _ = certified
    root = tmp_path / "copy"
    shutil.copytree(work.parent, root)
    certificate = root / "toggleshim-certified.json"
    kept = {**entries(certificate)[0], "toggle_optimizer": "0" * 64}
    certificate.write_text(json.dumps({"certified": [*entries(certificate), kept]}))
    code = ("import sys\nfrom toggleshim.testing import mutants\n"
            "mutants.apply('the exit bypasses an overridden untoggle_optimizer')\n"
            "from toggleshim.__main__ import main\nsys.exit(main(['certify', '--examples', '5']))\n")
    proc = run([sys.executable, "-c", code], root / "src", releases["no-op"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "own-methods" in proc.stdout and f"Its earlier certificate in {certificate} is withdrawn." in proc.stdout
    assert entries(certificate) == [kept]


def test_certify_on_a_terminal(releases: dict[str, Path], tmp_path: Path) -> None:
    work = project(tmp_path)
    rc, out = run_on_pty([*TOGGLESHIM, "certify", *QUICK], cwd=work, env=user_env(releases["no-op"]))
    assert rc == 0, out
    assert "\x1b[2K[" in out and "] " in out  # the progress bar, drawn in place
    assert "CERTIFIED: lightning 2.7.0 (lightning.pytorch)" in out
    assert (tmp_path / "toggleshim-certified.json").is_file()


# what certify refuses to touch


def test_a_broken_certificate_is_named_and_left_alone(releases: dict[str, Path], tmp_path: Path) -> None:
    work = project(tmp_path)
    certificate = tmp_path / "toggleshim-certified.json"
    certificate.write_text("{not json")
    certify, imported = (
        run([*TOGGLESHIM, "certify", *QUICK], work, releases["no-op"]),
        run([sys.executable, "-c", IMPORT], work, releases["no-op"]),
    )
    assert certify.returncode == 2 and "toggleshim check:" not in certify.stdout, certify.stdout + certify.stderr
    assert f"certify: error: the certificate {certificate}: not JSON" in certify.stderr
    assert "fix or delete it (nothing was run)" in certify.stderr
    assert certificate.read_text() == "{not json"
    # at import, no error: the gate says why no certificate applies, and falls back
    assert imported.returncode == 0, imported.stderr
    assert "GATE ('fallback'" in imported.stdout and f"the certificate {certificate}: not JSON" in imported.stdout


def test_nothing_to_certify_on_verified_code(tmp_path: Path) -> None:
    work = project(tmp_path)
    proc = run([*TOGGLESHIM, "certify", *QUICK], work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to certify: the toggle code of every flavour checked is verified" in proc.stdout
    assert "toggleshim check:" not in proc.stdout and not list(tmp_path.rglob("toggleshim-certified.json"))


# check --strict: CI that stops on unverified code


def test_check_strict_stops_on_unverified_code_and_both_name_the_choices(
    releases: dict[str, Path], tmp_path: Path
) -> None:
    args = [*TOGGLESHIM, "check", "--examples", "3", "--json", "report.json"]
    strict = run([*args, "--strict"], tmp_path, releases["no-op"])
    report = json.loads((tmp_path / "report.json").read_text())
    plain = run(args, tmp_path, releases["no-op"])
    assert strict.returncode == 3 and plain.returncode == 0, strict.stdout + plain.stdout
    assert f"FAILED (--strict): {2 * (6 + torch_properties_that_apply())} passed, 0 failed" in strict.stdout
    assert "toggle code not verified: lightning.pytorch" in strict.stdout
    assert not report["ok"] and report["unverified"] == ["lightning.pytorch"]
    for proc in (strict, plain):
        forward = proc.stdout.split("Your choices:", 1)[1]
        assert "lightning 2.7.0 (lightning.pytorch): toggle code toggleshim has not verified; every property " \
               "passed on it." in proc.stdout
        for command in ('pip install "lightning==', "pip install --upgrade toggleshim", "python -m toggleshim certify"):
            assert command in forward, (command, forward)
    assert [c["command"] for c in report["choices"]][1:] == ["pip install --upgrade toggleshim",
                                                           "python -m toggleshim certify"]
